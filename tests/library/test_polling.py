"""The waits between polls of an empty queue, on a manual clock (no sleeping)."""

from __future__ import annotations

from leaseq.drain.config import POLL_IDLE, POLL_MAX, POLL_MIN
from leaseq.drain.polling import PollSchedule

from tests.support.fakes import ManualClock


def _idle_polls(schedule: PollSchedule, clock: ManualClock) -> list[float]:
    """Claim times of one idle stretch: the first empty claim at 0, then each wait."""
    start, times = clock.now, [0.0]
    while (wait := schedule.after_empty()) is not None:
        clock.advance(wait)
        times.append(round(clock.now - start, 3))
    return times


def test_the_default_schedule_polls_14_times_in_its_10_idle_seconds() -> None:
    clock = ManualClock(0.0)
    schedule = PollSchedule(POLL_MIN.default, POLL_MAX.default, POLL_IDLE.default, clock)

    times = _idle_polls(schedule, clock)

    # The figure docs/operations.md gives for an idle invocation: 14 claim statements.
    assert times == [0.0, 0.1, 0.3, 0.7, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5, 9.5, 10.0]
    assert schedule.polls == 14


def test_work_found_starts_the_schedule_and_the_idle_time_again() -> None:
    clock = ManualClock(0.0)
    schedule = PollSchedule(0.1, 1.0, 2.0, clock)
    for _ in range(4):
        clock.advance(schedule.after_empty() or 0)
    schedule.found_work()

    assert schedule.after_empty() == 0.1
    assert _idle_polls(schedule, clock)[-1] == 2.0


def test_while_jobs_run_an_empty_queue_is_polled_without_an_end() -> None:
    clock = ManualClock(0.0)
    schedule = PollSchedule(0.1, 1.0, 0.5, clock)

    waits = []
    for _ in range(6):
        wait = schedule.after_empty(busy=True)
        assert wait is not None
        waits.append(wait)
        clock.advance(wait)

    assert waits == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


def test_no_idle_time_means_one_empty_claim_ends_the_drain() -> None:
    schedule = PollSchedule(0.1, 1.0, 0.0, ManualClock(0.0))
    assert schedule.after_empty() is None
