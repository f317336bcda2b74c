"""The steps both drains share (leaseq.drain.steps): one give-back rule, said the same way by
the one-at-a-time drain and the event-loop drain, on a real PostgreSQL."""

from __future__ import annotations

import logging
import uuid

import pytest
from leaseq import QueueClient, Registry, Worker, WorkerConfig
from leaseq.drain.config import FINISH_RESERVE

from tests.library.support import enqueue, states
from tests.support.fakes import FakeDeadline
from tests.support.postgres import Conn

#: The time left: enough to claim (the default kind's budget fits), not for "slow".
TIME_LEFT = 20.0
SLOW_BUDGET = 30.0
MARGIN = 2.0


@pytest.mark.parametrize("sync_concurrency", [1, 4], ids=["in_turn", "event_loop"])
def test_both_drains_give_back_a_job_whose_budget_does_not_fit_and_say_what_it_needed(
        client: QueueClient, owner: Conn, caplog: pytest.LogCaptureFixture,
        sync_concurrency: int) -> None:
    registry = Registry()
    registry.register("slow", lambda payload, ctx: None, timeout=SLOW_BUDGET)
    worker = Worker(client, registry, WorkerConfig(
        owner="steps-worker", job_timeout=5, lease_margin=MARGIN, poll_idle=0,
        concurrency=sync_concurrency, sync_concurrency=sync_concurrency))
    enqueue(client, uuid.uuid4(), 2, kind="slow")

    with caplog.at_level(logging.WARNING, logger="leaseq.worker"):
        report = worker.drain(FakeDeadline(TIME_LEFT))

    warnings = [r for r in caplog.records
                if r.getMessage() == "job given back: its budget does not fit the time left"]
    assert worker.uses_event_loop is (sync_concurrency > 1)
    assert (report.claimed, report.given_back, report.stopped) == (2, 2, "deadline")
    assert warnings
    assert {(r.budget, r.needed, r.time_left) for r in warnings} == {
        (SLOW_BUDGET, SLOW_BUDGET + MARGIN + FINISH_RESERVE, TIME_LEFT)}
    assert states(owner) == {"pending": 2}
