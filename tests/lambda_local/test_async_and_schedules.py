"""Asynchronous invokes (queue, concurrency, retries, event age) and the schedules."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from leaseq_lambda_local import LocalLambda

from tests.lambda_local.conftest import Start, client_for, records, wait_for


def _stats(service: LocalLambda, function: str) -> dict[str, Any]:
    found: dict[str, Any] = service.service.stats()["functions"][function]
    return found


def test_async_invokes_beyond_the_reservation_wait_for_a_slot_and_all_run(
    service: LocalLambda, client: Any, tmp_path: Path,
) -> None:
    answers = [client.invoke(FunctionName="Limited", InvocationType="Event",
                             Payload=json.dumps({"sleep": 0.4, "n": n})) for n in range(6)]

    assert [a["StatusCode"] for a in answers] == [202] * 6  # accepted at once, never 429
    wait_for(lambda: _stats(service, "Limited")["async_succeeded"] == 6,
             "six asynchronous invocations to run")
    runs = records(tmp_path)
    assert sorted(r["event"]["n"] for r in runs) == list(range(6))
    assert _most_at_once(runs) <= 2  # seen from inside the functions: never above the limit
    stats = _stats(service, "Limited")
    assert stats["peak_concurrency"] == 2
    assert (stats["async_accepted"], stats["async_succeeded"], stats["throttles"]) == (6, 6, 0)
    assert stats["queued_async_events"] == 0


def _most_at_once(runs: list[dict[str, Any]]) -> int:
    """The most handlers running at one moment (a sweep over their start and end times)."""
    moments = sorted([(r["start"], 1) for r in runs] + [(r["end"], -1) for r in runs])
    running = most = 0
    for _, step in moments:
        running += step
        most = max(most, running)
    return most


def test_a_failing_async_event_is_retried_maximum_retry_attempts_times_then_dropped(
    service: LocalLambda, client: Any, tmp_path: Path,
) -> None:
    always = {"fail": "down", "counter": str(tmp_path / "always.count")}
    once = {"fail_until": 1, "counter": str(tmp_path / "once.count")}
    never = {"fail": "down", "counter": str(tmp_path / "never.count")}

    client.invoke(FunctionName="Flaky", InvocationType="Event", Payload=json.dumps(always))
    client.invoke(FunctionName="Flaky", InvocationType="Event", Payload=json.dumps(once))
    client.invoke(FunctionName="NoRetry", InvocationType="Event", Payload=json.dumps(never))
    wait_for(lambda: _stats(service, "Flaky")["async_dropped_retries"] == 1
             and _stats(service, "Flaky")["async_succeeded"] == 1
             and _stats(service, "NoRetry")["async_dropped_retries"] == 1
             and service.service.idle(), "the retries to play out")

    assert (tmp_path / "always.count").read_text() == "3"  # first attempt + 2 retries
    assert (tmp_path / "once.count").read_text() == "2"  # the retry succeeded: no more
    assert (tmp_path / "never.count").read_text() == "1"  # MaximumRetryAttempts: 0
    failed = _stats(service, "Flaky")["failed_async_events"]
    assert [(f["reason"], f["attempts"], f["error"]) for f in failed] == [
        ("retries", 3, "ValueError")]
    assert _stats(service, "Flaky")["async_retries"] == 3  # 2 for one event, 1 for the other


def test_an_async_invocation_that_times_out_is_retried_like_any_function_error(
    service: LocalLambda, client: Any, tmp_path: Path,
) -> None:
    counter = tmp_path / "slow.count"

    client.invoke(FunctionName="Slow", InvocationType="Event",
                  Payload=json.dumps({"sleep": 30, "counter": str(counter)}))
    wait_for(lambda: _stats(service, "Slow")["async_dropped_retries"] == 1,
             "three attempts to time out")

    assert counter.read_text() == "3"  # Lambda's default of 2 retries (no EventInvokeConfig)
    stats = _stats(service, "Slow")
    assert (stats["timeouts"], stats["cold_starts"]) == (3, 3)  # each kill loses the process
    assert stats["failed_async_events"][0]["error"] == "Sandbox.Timedout"


def test_an_async_event_older_than_its_maximum_age_is_dropped_without_running(
    service: LocalLambda, client: Any, tmp_path: Path,
) -> None:
    holder = threading.Thread(target=lambda: client_for(service.url).invoke(
        FunctionName="Single", Payload=json.dumps({"sleep": 2.5, "record": None})))
    holder.start()
    try:
        wait_for(lambda: _stats(service, "Single")["concurrency_in_use"] == 1,
                 "the synchronous invoke to hold the only slot")
        answer = client.invoke(FunctionName="Single", InvocationType="Event",
                               Payload=json.dumps({"n": "late"}))
    finally:
        holder.join(timeout=30)
    wait_for(lambda: _stats(service, "Single")["async_dropped_age"] == 1,
             "the event to pass its 1 s maximum age")

    assert answer["StatusCode"] == 202
    assert not [r for r in records(tmp_path) if r["event"].get("n") == "late"]
    assert [f["reason"] for f in _stats(service, "Single")["failed_async_events"]] == ["age"]
    assert _stats(service, "Single")["async_attempts"] == 0


def test_schedules_fire_as_async_invokes_with_the_event_their_function_expects(
    start_service: Start, tmp_path: Path,
) -> None:
    service = start_service(schedule_every=0.3)

    wait_for(lambda: _stats(service, "Ticker")["async_succeeded"] >= 2
             and _stats(service, "RuleTicker")["async_succeeded"] >= 1,
             "the schedules to fire")

    ticks = [r["event"] for r in records(tmp_path) if r["function"] == "Ticker"]
    assert all(t["source"] == "probe.schedule" for t in ticks)  # never the disabled one
    fired = datetime.strptime(ticks[0]["scheduled_time"], "%Y-%m-%dT%H:%M:%SZ")
    assert abs((fired.replace(tzinfo=UTC) - datetime.now(UTC)).total_seconds()) < 120
    rule = next(r["event"] for r in records(tmp_path) if r["function"] == "RuleTicker")
    assert (rule["detail-type"], rule["source"], rule["detail"]) == (
        "Scheduled Event", "aws.events", {})
    stats = _stats(service, "Ticker")
    assert stats["scheduled"] >= 2
    assert stats["async_succeeded"] >= 2
    assert _stats(service, "Probe")["scheduled"] == 0


def test_the_real_worker_and_reaper_schedules_send_the_events_of_events_dir() -> None:
    from leaseq_lambda_local.schedules import schedule_event
    from leaseq_lambda_local.template import load_template

    root = Path(__file__).resolve().parents[2]
    template = load_template(root / "template.yaml")
    for function, sample in (("WorkerFunction", "worker_schedule.json"),
                             ("ReaperFunction", "reaper_schedule.json")):
        (schedule,) = template.functions[function].schedules
        sent = json.loads(schedule_event(function, schedule, datetime(2026, 11, 29, 17, tzinfo=UTC),
                                         region="us-east-1", account="123456789012"))
        assert sent == json.loads((root / "events" / sample).read_text())


def test_events_still_queued_when_the_service_stops_are_dropped_and_counted(
    start_service: Start,
) -> None:
    service = start_service(schedules=False)
    client = client_for(service.url)
    for _ in range(4):
        client.invoke(FunctionName="Limited", InvocationType="Event",
                      Payload=json.dumps({"sleep": 8}))
    wait_for(lambda: _stats(service, "Limited")["concurrency_in_use"] == 2, "two to start")

    service.close()

    stats = _stats(service, "Limited")
    assert stats["async_dropped_shutdown"] == 4  # two waiting, two killed mid-run
    assert stats["async_succeeded"] == 0
    assert stats["queued_async_events"] == 0
