"""Each named queue's pool and metrics in the Lambda glue: an enqueue wakes the worker
function of each queue it made work ready in, a paused queue's worker returns at once
without draining, and the reaper's per-queue metrics keep the queue dimension bounded."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from leaseq import ConfigurationError, MonotonicDeadline, QueueClient, connect
from leaseq.base.queues import QueueOverview, QueueState
from leaseq.settings import LeaseqSettings, PoolSettings
from leaseq_lambda.events import parse_tick
from leaseq_lambda.scaling import PoolMembership, wake_after_enqueue
from leaseq_lambda.telemetry import OTHER_QUEUES, queue_metrics

from tests.conftest import Database
from tests.functions.conftest import load_event
from tests.support.postgres import OPERATOR, PRODUCER, Conn


class RecordingLambda:
    """A Lambda client that accepts every asynchronous invoke and remembers the names."""

    def __init__(self) -> None:
        self.invoked: list[str] = []

    def invoke(self, *, FunctionName: str, InvocationType: str,
               Payload: bytes) -> dict[str, Any]:
        assert InvocationType == "Event"
        json.loads(Payload)
        self.invoked.append(FunctionName)
        return {"StatusCode": 202}


@pytest.fixture
def client(db: Database) -> Iterator[QueueClient]:
    queue = QueueClient(lambda: connect(db.worker_dsn))
    yield queue
    queue.close()


@pytest.fixture
def producer(db: Database) -> Iterator[QueueClient]:
    """The enqueue function's login."""
    queue = QueueClient(lambda: connect(db.dsn(PRODUCER)))
    yield queue
    queue.close()


@pytest.fixture
def operator(db: Database) -> Iterator[Conn]:
    with db.connect(OPERATOR) as conn:
        yield conn


def pool(**values: Any) -> PoolSettings:
    return PoolSettings(**{"max_workers": 2, "worker_function": "stack-worker",
                           "queue_workers": {"reports": "stack-reports"}, **values})


def test_an_enqueue_wakes_each_queues_own_worker_and_none_for_a_queue_drained_elsewhere(
        client: QueueClient) -> None:
    lam = RecordingLambda()
    started, failed = wake_after_enqueue(client, pool(), lam,
                                         queues=["default", "reports", "nowhere"])
    assert (started, failed) == (True, False)
    assert sorted(lam.invoked) == ["stack-reports", "stack-worker"]


def test_an_enqueue_wakes_a_queue_declared_in_its_own_stack_through_its_registration(
        producer: QueueClient, owner: Conn) -> None:
    """No environment names the pdf queue's worker: its deploy registered it."""
    owner.execute("select app.register_queue_worker('pdf', 'other-stack-pdf', 3, 'stack-b')")
    lam = RecordingLambda()
    started, failed = wake_after_enqueue(producer, pool(), lam, queues=["pdf", "nowhere"])
    assert (started, failed) == (True, False)
    assert lam.invoked == ["other-stack-pdf"]
    # The unregistered queue's ticket was taken, then given back: the next enqueue's
    # producer may wake it again once a worker is registered.
    assert owner.execute("select ticket from app.worker_wakes where queue = 'nowhere'"
                         ).fetchall() == [{"ticket": None}]


def test_a_paused_queue_is_not_woken(client: QueueClient, operator: Conn) -> None:
    operator.execute("select * from app.pause_queue('reports', 'ada')")
    lam = RecordingLambda()
    assert wake_after_enqueue(client, pool(), lam, queues=["reports"]) == (False, False)
    assert lam.invoked == []


def test_a_paused_queues_worker_is_refused_its_place_and_says_the_queue_is_paused(
        client: QueueClient, operator: Conn) -> None:
    operator.execute("select * from app.pause_queue('reports', 'ada')")
    membership = PoolMembership(client, pool(queue="reports"), "reports-1")
    tick = parse_tick(load_event("worker_schedule"), "worker")
    assert not membership.join(tick, MonotonicDeadline(60))
    assert membership.refusal() == "paused"
    other = PoolMembership(client, pool(queue="default"), "default-1")
    assert other.join(tick, MonotonicDeadline(60))
    other.finish(MonotonicDeadline(60))


def test_without_a_pool_a_paused_queues_worker_still_returns_without_draining(
        client: QueueClient, operator: Conn) -> None:
    operator.execute("select * from app.pause_queue('slow', 'ada')")
    tick = parse_tick(load_event("worker_schedule"), "worker")
    paused = PoolMembership(client, pool(max_workers=0, queue="slow"), "slow-1")
    assert not paused.join(tick, MonotonicDeadline(60))
    assert paused.refusal() == "paused"
    running = PoolMembership(client, pool(max_workers=0, queue="default"), "default-1")
    assert running.join(tick, MonotonicDeadline(60))


def test_the_queue_settings_read_the_queue_once_and_its_peers_workers_as_json() -> None:
    settings = LeaseqSettings.from_env({
        "DATABASE_URL": "postgresql://localhost/app", "LEASEQ_QUEUE": "reports",
        "LEASEQ_MAX_WORKERS": "2", "LEASEQ_WORKER_FUNCTION": "stack-reports",
        "LEASEQ_QUEUE_WORKERS": '{"default": "stack-worker"}'})
    assert (settings.worker.queue, settings.pool.queue) == ("reports", "reports")
    assert settings.pool.worker_of("reports") == "stack-reports"
    assert settings.pool.worker_of("default") == "stack-worker"
    assert settings.pool.worker_of("other") is None
    with pytest.raises(ConfigurationError, match="LEASEQ_QUEUE"):
        LeaseqSettings.from_env({"DATABASE_URL": "postgresql://localhost/app",
                                 "LEASEQ_QUEUE": "Reports"})
    with pytest.raises(ConfigurationError, match="LEASEQ_QUEUE_WORKERS"):
        LeaseqSettings.from_env({"DATABASE_URL": "postgresql://localhost/app",
                                 "LEASEQ_QUEUE_WORKERS": "reports=x"})


def overview(name: str, ready: int, *, age: float = 0.0, paused: bool = False,
             now: datetime) -> QueueOverview:
    return QueueOverview(name, ready, 0, 1, 0, 2, now - timedelta(seconds=age) if ready
                         else None, 0, 0, 4,
                         QueueState(name, now if paused else None, "ada" if paused else None,
                                    None))


def test_the_per_queue_metrics_name_the_first_queues_and_sum_the_rest_as_other() -> None:
    now = datetime.now(UTC)
    views = [overview(f"q{n}", n, age=10.0 * n, paused=n == 3, now=now) for n in range(1, 5)]
    rows = dict(queue_metrics(views, 2, now))
    assert list(rows) == ["q1", "q2", OTHER_QUEUES]
    assert rows["q1"]["QueueReadyJobs"] == 1
    assert rows[OTHER_QUEUES]["QueueReadyJobs"] == 3 + 4
    assert rows[OTHER_QUEUES]["QueueDeadJobs"] == 4
    assert rows[OTHER_QUEUES]["QueueOldestReadyAgeSeconds"] == pytest.approx(40.0, abs=0.01)
    assert rows[OTHER_QUEUES]["QueuePaused"] == 1
    assert rows["q2"]["QueuePaused"] == 0
