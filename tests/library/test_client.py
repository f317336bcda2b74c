"""QueueClient and the enqueue functions: transactions the caller owns, per-item
statuses, and a connection that survives being cut."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from leaseq import (
    DatabaseUnavailableError,
    EnqueueRequest,
    IdempotencyConflictError,
    InvalidRequestError,
    JobContext,
    QueueClient,
    Registry,
    Worker,
    WorkerConfig,
    connect,
    enqueue_job,
    enqueue_jobs,
)
from pydantic import ValidationError

from tests.conftest import Database
from tests.library.support import event_types, job, jobs, states
from tests.support.fakes import FakeDeadline, ManualClock
from tests.support.postgres import Conn


def request(tenant: uuid.UUID, key: str, *, kind: str = "echo",
            payload: dict[str, Any] | None = None, **fields: Any) -> EnqueueRequest:
    return EnqueueRequest(tenant_id=tenant, operation_key=key, kind=kind,
                          payload={"k": key} if payload is None else payload, **fields)


# Enqueue on the caller's connection ---------------------------------------------------------


def test_enqueue_on_the_callers_connection_is_undone_when_the_caller_rolls_back(
        db: Database, owner: Conn) -> None:
    tenant = uuid.uuid4()
    with psycopg.connect(db.worker_dsn) as conn:  # not autocommit: the caller's transaction
        result = enqueue_job(conn, request(tenant, "order-1"))
        assert result.created
        assert jobs(owner) == []  # not visible before the caller commits
        conn.rollback()
    assert jobs(owner) == []


def test_enqueue_on_the_callers_connection_commits_with_the_callers_work(
        db: Database, owner: Conn) -> None:
    tenant = uuid.uuid4()
    with psycopg.connect(db.worker_dsn, autocommit=True) as conn, conn.transaction():
        results = enqueue_jobs(conn, [request(tenant, "a"), request(tenant, "b")])
        assert jobs(owner) == []
    assert {row["id"] for row in jobs(owner)} == {r.job_id for r in results}
    assert all(event_types(owner, r.job_id) == ["created"] for r in results)


def test_enqueue_joins_a_transaction_that_then_fails(db: Database, owner: Conn) -> None:
    tenant = uuid.uuid4()

    def place_order(conn: psycopg.Connection[Any]) -> None:
        with conn.transaction():
            enqueue_job(conn, request(tenant, "a"))
            raise RuntimeError("the caller's own work failed")

    with psycopg.connect(db.worker_dsn, autocommit=True) as conn:
        with pytest.raises(RuntimeError):
            place_order(conn)
        assert jobs(owner) == []


# Batch statuses ------------------------------------------------------------------------------


def test_a_batch_reports_each_item_as_created_existing_or_conflict(
        client: QueueClient, owner: Conn) -> None:
    tenant = uuid.uuid4()
    (first,) = client.enqueue_jobs([request(tenant, "a")])

    results = client.enqueue_jobs([
        request(tenant, "b"),                                # new
        request(tenant, "a"),                                # same key, same job
        request(tenant, "a", payload={"other": True}),       # same key, another payload
        request(tenant, "b"),                                # repeated within the batch
        request(uuid.uuid4(), "a"),                          # same key, another tenant
    ])

    assert [r.index for r in results] == [0, 1, 2, 3, 4]
    assert [r.status for r in results] == ["created", "existing", "conflict", "existing",
                                           "created"]
    assert [r.created for r in results] == [True, False, False, False, True]
    assert results[1].job_id == first.job_id
    assert (results[2].job_id, results[2].state) == (None, None)  # a conflict names no job
    assert results[0].job_id == results[3].job_id
    assert len(jobs(owner)) == 3
    assert job(owner, first.job_id)["payload"] == {"k": "a"}


def test_enqueue_job_raises_on_a_conflicting_repeat_and_returns_the_existing_job_otherwise(
        client: QueueClient) -> None:
    tenant = uuid.uuid4()
    created = client.enqueue_job(request(tenant, "a"))
    again = client.enqueue_job(request(tenant, "a"))
    assert (created.status, again.status, again.job_id) == ("created", "existing", created.job_id)
    with pytest.raises(IdempotencyConflictError, match="operation_key 'a'") as conflict:
        client.enqueue_job(request(tenant, "a", kind="other"))
    assert conflict.value.sqlstate == "23505"
    assert str(created.job_id) not in conflict.value.message


def _unvalidated(tenant: uuid.UUID, key: str, **fields: Any) -> EnqueueRequest:
    """A request built without the model's checks: what the SQL contract refuses even
    when the model's rules and the database's disagree."""
    values: dict[str, Any] = {"tenant_id": tenant, "operation_key": key, "kind": "echo",
                              "payload": {}, "available_at": None, "max_attempts": None,
                              "correlation_id": None, **fields}
    return EnqueueRequest.model_construct(**values)


def test_an_item_the_database_rejects_is_reported_with_its_error_and_the_others_are_stored(
        client: QueueClient, owner: Conn) -> None:
    tenant = uuid.uuid4()
    results = client.enqueue_jobs([request(tenant, "a"), _unvalidated(tenant, "\u200b"),
                                   request(tenant, "c")])

    assert [r.status for r in results] == ["created", "rejected", "created"]
    rejected = results[1]
    assert (rejected.index, rejected.job_id, rejected.state, rejected.rejected) == (
        1, None, None, True)
    assert rejected.error == (
        "job 2: operation_key must be a non-blank text of at most 255 characters")
    assert [r.error for r in (results[0], results[2])] == [None, None]
    assert {row["operation_key"] for row in jobs(owner)} == {"a", "c"}


def test_enqueue_job_raises_invalid_request_for_an_item_the_database_rejects(
        client: QueueClient, owner: Conn) -> None:
    with pytest.raises(InvalidRequestError, match="payload numbers must be at most 1000") as e:
        client.enqueue_job(_unvalidated(uuid.uuid4(), "big", payload={"n": 10**1000}))
    assert e.value.sqlstate == "22023"
    assert jobs(owner) == []


def test_enqueue_passes_schedule_attempts_and_correlation_id_through(
        client: QueueClient, owner: Conn) -> None:
    later = datetime.now(UTC) + timedelta(hours=2)
    (result,) = client.enqueue_jobs([request(uuid.uuid4(), "a", available_at=later,
                                             max_attempts=2, correlation_id="req-7")])
    row = job(owner, result.job_id)
    assert (row["available_at"], row["max_attempts"], row["correlation_id"]) == (
        later, 2, "req-7")


def test_an_empty_batch_makes_no_call(client: QueueClient) -> None:
    assert client.enqueue_jobs([]) == []
    assert client.reconnects == 0  # never even connected


@pytest.mark.parametrize(("fields", "problem"), [
    ({"operation_key": " "}, "must not be blank"),
    ({"kind": "a\x00b"}, "NUL"),
    ({"correlation_id": "\x00"}, "NUL"),
    ({"payload": {"text": "nul \x00"}}, "NUL"),
    ({"payload": {"key\x00": 1}}, "NUL"),
    ({"payload": {"x": float("nan")}}, "not a JSON number"),
    ({"payload": {"when": datetime.now(UTC)}}, "strict JSON"),
    ({"payload": {"blob": "x" * 262_144}}, "at most 262144 bytes"),
    ({"available_at": datetime(2030, 1, 1)}, "time zone"),
    ({"max_attempts": 21}, "less than or equal to 20"),
    ({"unknown": 1}, "Extra inputs are not permitted"),
])
def test_enqueue_requests_refuse_what_the_database_cannot_store(
        fields: dict[str, Any], problem: str) -> None:
    base: dict[str, Any] = {"tenant_id": uuid.uuid4(), "operation_key": "a", "kind": "echo",
                            "payload": {}}
    with pytest.raises(ValidationError, match=problem):
        EnqueueRequest(**{**base, **fields})


# Connection reuse --------------------------------------------------------------------------


def _terminate(admin: Conn, pid: int) -> None:
    row = admin.execute("select pg_terminate_backend(%s) as done", (pid,)).fetchone()
    assert row is not None
    assert row["done"]


def test_check_reconnects_after_the_server_terminated_an_idle_connection(
        db: Database, admin: Conn) -> None:
    clock = ManualClock()
    client = QueueClient(lambda: connect(db.worker_dsn), max_idle_seconds=240, clock=clock)
    try:
        client.check()
        first_pid = client.connection.info.backend_pid
        _terminate(admin, first_pid)
        clock.advance(300)  # frozen for five minutes

        client.check()

        assert client.reconnects == 2
        assert client.connection.info.backend_pid != first_pid
        assert client.enqueue_job(request(uuid.uuid4(), "a")).created
    finally:
        client.close()


def test_check_keeps_a_recently_used_connection_without_a_round_trip(db: Database) -> None:
    clock = ManualClock()
    client = QueueClient(lambda: connect(db.worker_dsn), max_idle_seconds=240, clock=clock)
    try:
        client.check()
        conn = client.connection
        clock.advance(10)
        client.check()
        assert client.connection is conn
        assert client.reconnects == 1
    finally:
        client.close()


def test_a_call_on_a_connection_cut_since_its_last_use_reconnects_once_and_succeeds(
        client: QueueClient, admin: Conn) -> None:
    client.check()
    _terminate(admin, client.connection.info.backend_pid)
    assert client.enqueue_job(request(uuid.uuid4(), "a")).created
    assert client.reconnects == 2


def test_an_unreachable_database_raises_database_unavailable(db: Database) -> None:
    client = QueueClient(lambda: connect(db.worker_dsn, port=1, connect_timeout=1))
    with pytest.raises(DatabaseUnavailableError, match="database unavailable"):
        client.check()


def test_a_drain_survives_its_connection_being_killed_between_batches(
        client: QueueClient, admin: Conn, owner: Conn) -> None:
    runs: dict[uuid.UUID, int] = {}

    def handler(payload: dict[str, Any], ctx: JobContext) -> None:
        runs[ctx.job.id] = runs.get(ctx.job.id, 0) + 1
        if len(runs) in (5, 10, 15):  # the last job of a batch: its outcomes are next
            _terminate(admin, client.connection.info.backend_pid)

    registry = Registry()
    registry.register("echo", handler)
    tenant = uuid.uuid4()
    client.enqueue_jobs([request(tenant, f"k{i}") for i in range(20)])
    worker = Worker(client, registry, WorkerConfig(owner="worker-1", batch_size=5, poll_idle=0))

    report = worker.drain(FakeDeadline(60))

    assert (report.claimed, report.succeeded, report.lost_leases) == (20, 20, 0)
    assert set(runs.values()) == {1}
    assert states(owner) == {"succeeded": 20}
    assert client.reconnects == 4
    events = owner.execute("select event_type, count(*) as n from app.job_events"
                           " group by event_type order by event_type").fetchall()
    assert {e["event_type"]: e["n"] for e in events} == {
        "claimed": 20, "created": 20, "succeeded": 20}



def test_a_priority_given_on_the_callers_connection_orders_the_claim(
        db: Database, client: QueueClient, owner: Conn) -> None:
    tenant = uuid.uuid4()
    with psycopg.connect(db.worker_dsn, autocommit=True) as conn, conn.transaction():
        normal, urgent = enqueue_jobs(conn, [request(tenant, "normal"),
                                             request(tenant, "urgent", priority=9)])
    assert (job(owner, normal.job_id)["priority"], job(owner, urgent.job_id)["priority"]) == (
        5, 9)
    claimed = client.claim_jobs(tenant, "worker-1", 2, timedelta(seconds=30))
    assert [j.id for j in claimed] == [urgent.job_id, normal.job_id]


def test_the_claimed_job_and_its_handler_context_carry_the_jobs_priority(
        client: QueueClient) -> None:
    seen: dict[str, int] = {}

    def handler(payload: dict[str, Any], ctx: JobContext) -> None:
        seen[payload["k"]] = ctx.priority

    tenant = uuid.uuid4()
    client.enqueue_jobs([request(tenant, "urgent", priority=8), request(tenant, "plain"),
                         request(tenant, "later", priority=2)])
    claimed = client.claim_jobs(tenant, "worker-1", 1, timedelta(seconds=30))
    assert [(j.operation_key, j.priority) for j in claimed] == [("urgent", 8)]
    client.release_jobs("worker-1", claimed)
    registry = Registry()
    registry.register("echo", handler)
    Worker(client, registry, WorkerConfig(owner="worker-1", batch_size=5, poll_idle=0)).drain(
        FakeDeadline(60))

    assert seen == {"urgent": 8, "plain": 5, "later": 2}
