"""Worker.drain() on a real PostgreSQL, with time driven by a FakeDeadline (no sleeping,
except where a handler must really overrun its budget to be interrupted)."""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from leaseq import (
    ConfigurationError,
    DiscardJob,
    JobContext,
    JobLogFields,
    JobRecord,
    QueueClient,
    Registry,
    RetryJob,
    RetryPolicy,
    Worker,
    WorkerConfig,
    connect,
)
from leaseq.kinds.retry import MAX_RETRY_DELAY
from pydantic import BaseModel

from tests.conftest import Database
from tests.library.support import enqueue, event_types, expire_lease, job, jobs, make_ready, states
from tests.support.fakes import FakeDeadline
from tests.support.postgres import Conn


def make_worker(client: QueueClient, registry: Registry, *, owner: str = "worker-1",
                records: list[JobRecord] | None = None, **config: Any) -> Worker:
    """A worker that stops as soon as the queue is empty, unless a test asks it to poll."""
    on_job = records.append if records is not None else None
    config.setdefault("poll_idle", 0)
    return Worker(client, registry, WorkerConfig(owner=owner, **config), on_job=on_job,
                  rand=lambda: 0.5)


def echo_registry() -> Registry:
    registry = Registry()
    registry.register("echo", lambda payload, ctx: {"echo": payload})
    return registry


def test_drain_runs_every_ready_job_and_reports_each_outcome(
        client: QueueClient, owner: Conn) -> None:
    registry = echo_registry()

    @registry.handler("boom")
    def boom(payload: Any, ctx: JobContext) -> None:
        raise RuntimeError("nope")

    tenant = uuid.uuid4()
    echoed = enqueue(client, tenant, 25)
    (failed,) = enqueue(client, tenant, kind="boom", prefix="b")
    (unknown,) = enqueue(client, tenant, kind="nope", prefix="u")

    report = make_worker(client, registry).drain(FakeDeadline(60))

    assert (report.claimed, report.succeeded, report.retried, report.dead) == (27, 25, 1, 1)
    assert (report.lost_leases, report.given_back, report.batches) == (0, 0, 3)
    assert report.stopped == "queue_empty"
    assert report.time_left == 60
    assert job(owner, echoed[7])["result"] == {"echo": {"i": 7}}
    assert job(owner, failed)["state"] == "retry_wait"
    assert job(owner, failed)["last_error"]["code"] == "HANDLER_ERROR"
    assert job(owner, unknown)["state"] == "dead"
    assert states(owner) == {"succeeded": 25, "retry_wait": 1, "dead": 1}


def test_a_handler_that_returns_nothing_leaves_a_json_null_result(
        client: QueueClient, owner: Conn) -> None:
    registry = Registry()
    registry.register("quiet", lambda payload, ctx: None)
    (job_id,) = enqueue(client, uuid.uuid4(), kind="quiet")

    assert make_worker(client, registry).drain(FakeDeadline(60)).succeeded == 1

    row = owner.execute("select result is null as sql_null, jsonb_typeof(result) as type"
                        " from app.jobs where id = %s", (job_id,)).fetchone()
    assert row == {"sql_null": False, "type": "null"}


def test_drain_claims_nothing_when_the_time_left_is_less_than_a_job_may_need(
        client: QueueClient, owner: Conn) -> None:
    (job_id,) = enqueue(client, uuid.uuid4())
    worker = make_worker(client, echo_registry(), job_timeout=10, lease_margin=2)

    # A job may need its 10 s budget, plus the 2 s margin and 1 s to record its outcome.
    report = worker.drain(FakeDeadline(12.9))

    assert (report.claimed, report.batches, report.stopped) == (0, 0, "deadline")
    assert event_types(owner, job_id) == ["created"]
    assert make_worker(client, echo_registry(), job_timeout=10, lease_margin=2).drain(
        FakeDeadline(13.0)).succeeded == 1


def test_drain_stops_claiming_once_time_runs_short_and_leaves_the_rest_untouched(
        client: QueueClient, owner: Conn) -> None:
    deadline = FakeDeadline(30)
    registry = Registry()
    registry.register("echo", lambda payload, ctx: deadline.spend(4))
    enqueue(client, uuid.uuid4(), 10)
    worker = make_worker(client, registry, job_timeout=10, lease_margin=2, batch_size=2)

    report = worker.drain(deadline)

    # Claims at 30, 22 and 14 s left; the sixth job would need 10 + 2 + 1 s at 10 s left.
    assert (report.batches, report.claimed, report.succeeded, report.given_back) == (3, 6, 5, 1)
    assert report.stopped == "deadline"
    assert states(owner) == {"succeeded": 5, "pending": 5}
    assert {row["attempts"] for row in jobs(owner) if row["state"] == "pending"} == {0}


def test_unstarted_jobs_are_given_back_at_once_without_counting_an_attempt(
        client: QueueClient, owner: Conn) -> None:
    deadline = FakeDeadline(20)
    registry = Registry()
    registry.register("echo", lambda payload, ctx: deadline.spend(7))
    ids = enqueue(client, uuid.uuid4(), 5)
    records: list[JobRecord] = []
    worker = make_worker(client, registry, job_timeout=5, lease_margin=2, records=records)

    report = worker.drain(deadline)

    # 20 s left: job 1 runs (to 13), job 2 runs (to 6), job 3 would need 5 + 2 + 1 s.
    assert (report.claimed, report.succeeded, report.given_back, report.batches) == (5, 2, 3, 1)
    assert report.stopped == "deadline"
    given_back = {r.job.id for r in records if r.outcome == "given_back"}
    assert len(given_back) == 3
    assert given_back < set(ids)
    for job_id in given_back:
        row = job(owner, job_id)
        assert (row["state"], row["attempts"], row["lease_owner"]) == ("pending", 0, None)
        assert event_types(owner, job_id) == ["created", "claimed", "released"]
    # Given back, not leased: another worker can take them immediately.
    taken = client.claim_ready_jobs("worker-2", 10, timedelta(seconds=30))
    assert {j.id for j in taken} == given_back


def test_lease_is_the_time_left_minus_the_safety_margin(client: QueueClient, owner: Conn) -> None:
    (job_id,) = enqueue(client, uuid.uuid4())
    make_worker(client, echo_registry(), lease_margin=5).drain(FakeDeadline(100))

    claimed = owner.execute(
        "select created_at, (details ->> 'leaseExpiresAt')::timestamptz as lease_end"
        " from app.job_events where job_id = %s and event_type = 'claimed'", (job_id,)).fetchone()
    assert claimed is not None
    assert claimed["lease_end"] - claimed["created_at"] == timedelta(seconds=95)


def test_lease_never_exceeds_the_cap_and_is_renewed_before_a_job_could_outlive_it(
        client: QueueClient, owner: Conn) -> None:
    deadline = FakeDeadline(100)
    seen: list[dict[str, Any]] = []

    def handler(payload: dict[str, Any], ctx: JobContext) -> None:
        seen.append({
            "job_id": ctx.job.id,
            "claimed_lease_end": ctx.job.lease_expires_at,
            "lease_end_now": job(owner, ctx.job.id)["lease_expires_at"],
            "states": states(owner),
        })
        deadline.spend(3)

    registry = Registry()
    registry.register("echo", handler)
    enqueue(client, uuid.uuid4(), 3)
    worker = make_worker(client, registry, job_timeout=5, lease_margin=5, max_lease=10)

    report = worker.drain(deadline)

    assert report.succeeded == 3
    first = owner.execute(
        "select created_at from app.job_events where job_id = %s"
        " and event_type = 'claimed'", (seen[0]["job_id"],)).fetchone()
    assert first is not None
    assert seen[0]["claimed_lease_end"] - first["created_at"] == timedelta(seconds=10)
    # Jobs 1 and 2 fit in the 10 s lease; job 3 starts 6 s in and could run 5 s more,
    # so the worker records the first two early and renews job 3's lease before it runs.
    assert seen[1]["lease_end_now"] == seen[1]["claimed_lease_end"]
    assert seen[2]["lease_end_now"] > seen[2]["claimed_lease_end"]
    assert seen[2]["states"] == {"succeeded": 2, "running": 1}


def test_a_handler_can_renew_its_lease_and_learns_when_it_was_lost(
        client: QueueClient, owner: Conn, admin: Conn) -> None:
    answers: list[bool] = []

    def handler(payload: dict[str, Any], ctx: JobContext) -> None:
        before = job(owner, ctx.job.id)["lease_expires_at"]
        answers.append(ctx.renew_lease())
        assert job(owner, ctx.job.id)["lease_expires_at"] > before
        expire_lease(admin, ctx.job.id)
        answers.append(ctx.renew_lease())

    registry = Registry()
    registry.register("echo", handler)
    (job_id,) = enqueue(client, uuid.uuid4())

    report = make_worker(client, registry).drain(FakeDeadline(60))

    assert answers == [True, False]
    assert (report.succeeded, report.lost_leases) == (0, 1)
    assert job(owner, job_id)["state"] == "running"  # until the reaper releases it


def test_a_lost_lease_is_counted_and_logged_and_the_drain_goes_on(
        client: QueueClient, owner: Conn, admin: Conn, caplog: pytest.LogCaptureFixture) -> None:
    def handler(payload: dict[str, Any], ctx: JobContext) -> str:
        if payload["i"] == 1:
            expire_lease(admin, ctx.job.id)  # as if this worker had stalled past its lease
        return "done"

    registry = Registry()
    registry.register("echo", handler)
    ids = enqueue(client, uuid.uuid4(), 3)
    records: list[JobRecord] = []

    with caplog.at_level(logging.WARNING, logger="leaseq"):
        report = make_worker(client, registry, records=records).drain(FakeDeadline(60))

    assert (report.claimed, report.succeeded, report.lost_leases) == (3, 2, 1)
    assert report.stopped == "queue_empty"
    assert job(owner, ids[1])["state"] == "running"
    assert event_types(owner, ids[1]) == ["created", "claimed"]
    assert [r.job.id for r in records if r.lease_lost] == [ids[1]]
    lost = [r for r in caplog.records if "lease lost" in r.getMessage()]
    assert len(lost) == 1
    assert lost[0].__dict__["job_id"] == str(ids[1])


@pytest.mark.parametrize("where", ["main thread", "other thread"])
def test_a_handler_that_overruns_its_budget_is_interrupted_and_retried(
        client: QueueClient, owner: Conn, where: str) -> None:
    release = threading.Event()

    def stuck(payload: Any, ctx: JobContext) -> None:
        release.wait(30)

    registry = echo_registry()
    registry.register("stuck", stuck, timeout=0.2)
    tenant = uuid.uuid4()
    (stuck_id,) = enqueue(client, tenant, kind="stuck", prefix="s")
    (echo_id,) = enqueue(client, tenant, prefix="e")
    worker = make_worker(client, registry)

    started = time.monotonic()
    try:
        if where == "main thread":
            report = worker.drain(FakeDeadline(60))
        else:
            reports = []
            runner = threading.Thread(target=lambda: reports.append(worker.drain(FakeDeadline(60))))
            runner.start()
            runner.join(20)
            (report,) = reports
    finally:
        release.set()
    elapsed = time.monotonic() - started

    assert elapsed < 10
    assert (report.claimed, report.retried, report.succeeded) == (2, 1, 1)
    row = job(owner, stuck_id)
    assert row["state"] == "retry_wait"
    assert row["last_error"]["code"] == "JOB_TIMEOUT"
    assert "0.2 s" in row["last_error"]["message"]
    assert job(owner, echo_id)["state"] == "succeeded"


def test_an_unknown_kind_is_dead_at_once_with_a_structured_error(
        client: QueueClient, owner: Conn) -> None:
    (job_id,) = enqueue(client, uuid.uuid4(), kind="no.such.kind")

    report = make_worker(client, echo_registry()).drain(FakeDeadline(60))

    assert (report.dead, report.retried) == (1, 0)
    row = job(owner, job_id)
    assert (row["state"], row["attempts"], row["max_attempts"]) == ("dead", 1, 6)
    assert row["last_error"] == {
        "code": "UNKNOWN_KIND",
        "message": "no handler is registered for kind 'no.such.kind'",
        "kind": "no.such.kind",
    }
    assert event_types(owner, job_id) == ["created", "claimed", "dead"]


class Email(BaseModel):
    to: str
    subject: str


def test_an_invalid_payload_is_dead_at_once_and_the_handler_never_runs(
        client: QueueClient, owner: Conn) -> None:
    calls: list[Any] = []
    registry = Registry()
    registry.register("email", lambda payload, ctx: calls.append(payload), payload=Email)
    tenant = uuid.uuid4()
    (bad,) = client.enqueue_jobs([_request(tenant, "bad", "email", {"to": 5})])[:1]
    (good,) = client.enqueue_jobs([_request(tenant, "good", "email",
                                            {"to": "a@example.com", "subject": "hi"})])

    report = make_worker(client, registry).drain(FakeDeadline(60))

    assert (report.dead, report.succeeded) == (1, 1)
    assert calls == [Email(to="a@example.com", subject="hi")]
    error = job(owner, bad.job_id)["last_error"]
    assert error["code"] == "INVALID_PAYLOAD"
    assert "Email" in error["message"]
    assert {(tuple(e["loc"]), e["type"]) for e in error["errors"]} == {
        (("to",), "string_type"), (("subject",), "missing")}
    assert job(owner, bad.job_id)["attempts"] == 1
    assert job(owner, good.job_id)["state"] == "succeeded"


def test_discard_job_makes_the_job_dead_with_its_reason(client: QueueClient, owner: Conn) -> None:
    def handler(payload: Any, ctx: JobContext) -> None:
        raise DiscardJob("the customer account is closed")

    registry = Registry()
    registry.register("echo", handler)
    (job_id,) = enqueue(client, uuid.uuid4())

    report = make_worker(client, registry).drain(FakeDeadline(60))

    assert report.dead == 1
    row = job(owner, job_id)
    assert row["state"] == "dead"
    assert row["last_error"] == {"code": "DISCARDED", "message": "the customer account is closed"}


def _retry_delay(conn: Conn, job_id: uuid.UUID) -> timedelta:
    """available_at minus the time the retry was recorded (same transaction timestamp)."""
    row = conn.execute(
        "select j.available_at - e.created_at as delay from app.jobs j"
        " join app.job_events e on e.job_id = j.id and e.event_type = 'retry_scheduled'"
        " where j.id = %s order by e.sequence desc limit 1", (job_id,)).fetchone()
    assert row is not None
    delay: timedelta = row["delay"]
    return delay


def test_retry_job_with_a_delay_is_retried_after_that_delay(
        client: QueueClient, owner: Conn) -> None:
    def handler(payload: Any, ctx: JobContext) -> None:
        raise RetryJob("rate limited", delay=120)

    registry = Registry()
    registry.register("echo", handler)
    (job_id,) = enqueue(client, uuid.uuid4())

    report = make_worker(client, registry).drain(FakeDeadline(60))

    assert report.retried == 1
    assert _retry_delay(owner, job_id) == timedelta(seconds=120)
    assert job(owner, job_id)["last_error"] == {"code": "RETRY_REQUESTED",
                                                "message": "rate limited"}


def test_retry_delays_outside_the_sql_bounds_are_clamped_instead_of_failing_the_batch(
        client: QueueClient, owner: Conn) -> None:
    delays = {0: -5.0, 1: 10.0**9}

    def handler(payload: dict[str, Any], ctx: JobContext) -> str:
        if payload["i"] in delays and ctx.attempt == 1:
            raise RetryJob(delay=delays[payload["i"]])
        return "ok"

    registry = Registry()
    registry.register("echo", handler)
    ids = enqueue(client, uuid.uuid4(), 3)

    report = make_worker(client, registry).drain(FakeDeadline(60))

    # The clamped zero delay makes job 0 ready again at once: it succeeds in the same drain.
    assert (report.retried, report.succeeded) == (2, 2)
    assert _retry_delay(owner, ids[0]) == timedelta(0)
    assert _retry_delay(owner, ids[1]) == MAX_RETRY_DELAY


def test_a_failing_job_backs_off_exponentially(client: QueueClient, owner: Conn,
                                               admin: Conn) -> None:
    def handler(payload: Any, ctx: JobContext) -> None:
        raise ConnectionError("upstream down")

    registry = Registry()
    registry.register("echo", handler, retry=RetryPolicy(base_delay=4, max_delay=100))
    (job_id,) = enqueue(client, uuid.uuid4())
    worker = make_worker(client, registry)  # jitter fixed at the middle (rand = 0.5)

    delays = []
    for _ in range(3):
        worker.drain(FakeDeadline(60))
        delays.append(_retry_delay(owner, job_id).total_seconds())
        make_ready(admin)

    # Ceiling 4, 8, 16 s; half of it fixed, the other half jittered.
    assert delays == [3.0, 6.0, 12.0]
    assert job(owner, job_id)["last_error"] == {
        "code": "HANDLER_ERROR", "message": "upstream down", "type": "ConnectionError"}


def test_a_kinds_max_attempts_makes_the_job_dead_before_the_jobs_own_limit(
        client: QueueClient, owner: Conn) -> None:
    calls: list[int] = []

    def handler(payload: Any, ctx: JobContext) -> None:
        calls.append(ctx.attempt)
        raise ValueError("still broken")

    registry = Registry()
    registry.register("echo", handler,
                      retry=RetryPolicy(base_delay=0, max_delay=0, max_attempts=2))
    (job_id,) = enqueue(client, uuid.uuid4())

    report = make_worker(client, registry).drain(FakeDeadline(60))

    assert calls == [1, 2]  # a zero delay makes it ready again within the same drain
    assert (report.claimed, report.retried, report.dead) == (2, 1, 1)
    row = job(owner, job_id)
    assert (row["state"], row["attempts"], row["max_attempts"]) == ("dead", 2, 6)
    assert row["last_error"]["final"] is True
    dead = owner.execute("select details from app.job_events where job_id = %s"
                         " and event_type = 'dead'", (job_id,)).fetchone()
    assert dead is not None
    assert dead["details"]["reason"] == "max_attempts"  # the kind's retries ran out


def test_the_jobs_own_max_attempts_ends_retries(client: QueueClient, owner: Conn) -> None:
    def handler(payload: Any, ctx: JobContext) -> None:
        raise RetryJob(delay=0)

    registry = Registry()
    registry.register("echo", handler)
    (job_id,) = enqueue(client, uuid.uuid4(), max_attempts=3)

    report = make_worker(client, registry).drain(FakeDeadline(60))

    assert (report.claimed, report.retried, report.dead) == (3, 2, 1)
    assert (job(owner, job_id)["state"], job(owner, job_id)["attempts"]) == ("dead", 3)
    dead = owner.execute("select details from app.job_events where job_id = %s"
                         " and event_type = 'dead'", (job_id,)).fetchone()
    assert dead is not None
    assert dead["details"]["reason"] == "max_attempts"  # not "discarded": retries ran out


class Receipt(BaseModel):
    total: int


def test_one_bad_job_spares_the_rest_of_its_batch(client: QueueClient, owner: Conn) -> None:
    def handler(payload: dict[str, Any], ctx: JobContext) -> Any:
        match payload["i"]:
            case 0:
                raise ValueError("bad byte \x00 in input")
            case 1:
                return {"ratio": math.nan}
            case 2:
                return object()
            case 3:
                return "x" * 300_000
            case 4:
                return Receipt(total=3)
            case 5:
                return {"text": "nul \x00 inside"}
            case _:
                return payload

    registry = Registry()
    registry.register("echo", handler)
    ids = enqueue(client, uuid.uuid4(), 8)

    report = make_worker(client, registry).drain(FakeDeadline(60))

    assert (report.claimed, report.succeeded, report.retried, report.dead) == (8, 3, 1, 4)
    assert job(owner, ids[0])["last_error"]["message"] == "bad byte \ufffd in input"
    assert [job(owner, i)["last_error"]["code"] for i in ids[1:4]] == [
        "RESULT_NOT_JSON", "RESULT_NOT_JSON", "RESULT_TOO_LARGE"]
    assert job(owner, ids[4])["result"] == {"total": 3}
    assert job(owner, ids[5])["last_error"]["code"] == "RESULT_NOT_JSON"
    assert job(owner, ids[7])["result"] == {"i": 7}


def test_a_result_no_reader_could_decode_is_dead_and_spares_its_batch(
        client: QueueClient, owner: Conn) -> None:
    """Too deep for json.dumps (RecursionError, which used to escape the worker), a
    number longer than the contract's 1,000 characters, a key holding NUL."""
    deep: Any = 1
    for _ in range(5_000):
        deep = [deep]

    def handler(payload: dict[str, Any], ctx: JobContext) -> Any:
        return [deep, {"n": 10**1500}, {"k\x00": 1}, {"n": 10**999}][payload["i"]]

    registry = Registry()
    registry.register("echo", handler)
    ids = enqueue(client, uuid.uuid4(), 4)

    report = make_worker(client, registry).drain(FakeDeadline(60))

    assert (report.claimed, report.succeeded, report.dead) == (4, 1, 3)
    errors = [job(owner, i)["last_error"] for i in ids[:3]]
    assert [e["code"] for e in errors] == ["RESULT_NOT_JSON"] * 3
    assert "recursion" in errors[0]["message"]
    assert "$.n: an integer of about 1501 digits" in errors[1]["message"]
    assert "$: a key must not contain NUL" in errors[2]["message"]
    assert job(owner, ids[3])["result"] == {"n": 10**999}


@pytest.mark.parametrize("where", ["main thread", "other thread"])
def test_log_lines_written_while_a_handler_runs_carry_the_jobs_fields(
        client: QueueClient, where: str) -> None:
    captured: list[logging.LogRecord] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            captured.append(record)

    handler = Capture()
    handler.addFilter(JobLogFields())
    app_logger = logging.getLogger("tests.library.app")
    app_logger.addHandler(handler)
    app_logger.setLevel(logging.INFO)

    def job_handler(payload: Any, ctx: JobContext) -> None:
        app_logger.info("sending the email")

    registry = Registry()
    registry.register("email", job_handler, timeout=5)
    tenant = uuid.uuid4()
    (job_id,) = enqueue(client, tenant, kind="email", correlation_id="req-42")
    worker = make_worker(client, registry)
    try:
        if where == "main thread":
            worker.drain(FakeDeadline(60))
        else:
            runner = threading.Thread(target=lambda: worker.drain(FakeDeadline(60)))
            runner.start()
            runner.join(20)
        app_logger.info("after the job")
    finally:
        app_logger.removeHandler(handler)

    during, after = captured
    assert {k: during.__dict__[k] for k in
            ("job_id", "tenant_id", "kind", "attempt", "correlation_id")} == {
        "job_id": str(job_id), "tenant_id": str(tenant), "kind": "email", "attempt": 1,
        "correlation_id": "req-42"}
    assert not hasattr(after, "job_id")


def test_a_quiet_tenants_job_is_in_the_first_batch_despite_a_noisy_tenants_backlog(
        client: QueueClient, admin: Conn) -> None:
    noisy, quiet = uuid.uuid4(), uuid.uuid4()
    # 100,000 older jobs of one tenant, written directly (an administrator's shortcut).
    admin.execute(
        "insert into app.jobs (tenant_id, operation_key, kind, payload, available_at,"
        " created_at, updated_at)"
        " select %s, 'noisy-' || g, 'echo', '{}'::jsonb,"
        " clock_timestamp() - interval '1 hour' + g * interval '1 millisecond',"
        " clock_timestamp(), clock_timestamp()"
        " from generate_series(1, 100000) g", (noisy,))
    admin.execute("select * from app.repair_tenant_turns(10000)")  # the noisy tenant's turn
    enqueue(client, quiet, prefix="quiet")
    deadline = FakeDeadline(60)
    ran: list[uuid.UUID] = []

    def handler(payload: Any, ctx: JobContext) -> None:
        ran.append(ctx.job.tenant_id)
        if len(ran) == 10:
            deadline.spend(60)  # one batch is all this test needs

    registry = Registry()
    registry.register("echo", handler)

    report = make_worker(client, registry, batch_size=10).drain(deadline)

    assert (report.batches, report.claimed, report.succeeded) == (1, 10, 10)
    assert ran.count(quiet) == 1
    assert ran.count(noisy) == 9


def _request(tenant: uuid.UUID, key: str, kind: str, payload: dict[str, Any]) -> Any:
    from leaseq import EnqueueRequest

    return EnqueueRequest(tenant_id=tenant, operation_key=key, kind=kind, payload=payload)


@pytest.mark.parametrize("tenants", [6, 7, 9, 10])
def test_every_ready_tenant_gets_a_job_into_the_first_batch_whatever_their_number(
        client: QueueClient, tenants: int) -> None:
    backlog = [uuid.uuid4() for _ in range(tenants - 1)]
    for tenant in backlog:
        enqueue(client, tenant, 20)
    newcomer = uuid.uuid4()
    enqueue(client, newcomer, prefix="new")  # the newest work of all: served last if unfair
    deadline = FakeDeadline(60)
    ran: list[uuid.UUID] = []

    def handler(payload: Any, ctx: JobContext) -> None:
        ran.append(ctx.job.tenant_id)
        if len(ran) == 10:
            deadline.spend(60)

    registry = Registry()
    registry.register("echo", handler)

    report = make_worker(client, registry, batch_size=10).drain(deadline)

    assert (report.batches, report.claimed) == (1, 10)
    assert set(ran) == {*backlog, newcomer}


def test_an_outcome_the_database_refuses_costs_only_its_own_job(
        client: QueueClient, owner: Conn, caplog: pytest.LogCaptureFixture) -> None:
    # 1e20 is 5 characters in Python's JSON and 21 in PostgreSQL's: under the size
    # bound here, over it there, so the statement recording the batch is refused.
    def handler(payload: dict[str, Any], ctx: JobContext) -> Any:
        return {"values": [1e20] * 30_000} if payload["i"] == 0 else "ok"

    registry = Registry()
    registry.register("echo", handler)
    ids = enqueue(client, uuid.uuid4(), 4)

    with caplog.at_level(logging.ERROR, logger="leaseq"):
        report = make_worker(client, registry).drain(FakeDeadline(60))

    assert (report.succeeded, report.dead, report.lost_leases) == (3, 1, 0)
    row = job(owner, ids[0])
    assert (row["state"], row["last_error"]["code"]) == ("dead", "OUTCOME_NOT_STORABLE")
    assert row["last_error"]["intended"] == "succeeded"
    assert "at most 262144 bytes" in row["last_error"]["message"]
    assert {job(owner, i)["state"] for i in ids[1:]} == {"succeeded"}
    assert "outcomes refused as a batch" in caplog.text


class CountingClient(QueueClient):
    """The real client, counting which statements a drain sends."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[str] = []

    def claim_ready_jobs(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append("claim")
        return super().claim_ready_jobs(*args, **kwargs)

    def finish_jobs(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append("finish")
        return super().finish_jobs(*args, **kwargs)

    def finish_and_claim_jobs(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append("finish+claim")
        return super().finish_and_claim_jobs(*args, **kwargs)


def test_each_batch_is_recorded_by_the_statement_that_claims_the_next(
        db: Database, owner: Conn) -> None:
    counting = CountingClient(lambda: connect(db.worker_dsn))
    registry = Registry()
    registry.register("echo", lambda payload, ctx: {"i": payload["i"]})
    enqueue(counting, uuid.uuid4(), 25)

    report = make_worker(counting, registry, batch_size=10).drain(FakeDeadline(60))
    counting.close()

    # 3 batches: claim, then two finish+claim (the last claims nothing), then nothing
    # is left to record: 3 statements for 25 jobs instead of 6.
    assert counting.calls == ["claim", "finish+claim", "finish+claim", "finish+claim"]
    assert (report.claimed, report.succeeded, report.batches) == (25, 25, 3)
    assert states(owner) == {"succeeded": 25}


def test_the_last_batch_is_recorded_on_its_own_when_time_runs_short(
        db: Database, owner: Conn) -> None:
    counting = CountingClient(lambda: connect(db.worker_dsn))
    deadline = FakeDeadline(60)
    registry = Registry()

    def slow(payload: Any, ctx: JobContext) -> None:
        deadline.spend(5)  # each job uses 5 s of the invocation's budget

    registry.register("echo", slow)
    enqueue(counting, uuid.uuid4(), 20)

    report = make_worker(counting, registry, batch_size=5, job_timeout=10,
                         lease_margin=5).drain(deadline)
    counting.close()

    assert counting.calls[0] == "claim"
    assert counting.calls[-1] == "finish"
    assert report.stopped == "deadline"
    assert report.succeeded == report.claimed - report.given_back
    assert states(owner).get("running", 0) == 0


# A worker of some kinds only, and one of every kind but those ----------------------------


def slow_and_quick_registry(*, slow_timeout: float | None = None) -> Registry:
    registry = echo_registry()
    registry.register("report.build", lambda payload, ctx: {"built": payload["i"]},
                      timeout=slow_timeout)
    return registry


@pytest.mark.parametrize("concurrency", [1, 4], ids=["in-turn", "event-loop"])
def test_a_slow_worker_and_a_main_worker_each_drain_only_their_kinds(
        client: QueueClient, owner: Conn, concurrency: int) -> None:
    tenants = [uuid.uuid4() for _ in range(3)]
    for tenant in tenants:
        enqueue(client, tenant, 7, kind="report.build", prefix="slow")
        enqueue(client, tenant, 9, prefix="quick")
    registry = slow_and_quick_registry()
    records: list[JobRecord] = []

    # Batches of 4: the claims after the first carry the outcomes (finish_and_claim).
    slow = make_worker(client, registry, records=records, batch_size=4,
                       concurrency=concurrency, kinds=("report.build",)).drain(FakeDeadline(60))
    assert {r.job.kind for r in records} == {"report.build"}
    assert (slow.claimed, slow.succeeded) == (21, 21)
    assert states(owner) == {"succeeded": 21, "pending": 27}

    records.clear()
    main = make_worker(client, registry, records=records, batch_size=4,
                       concurrency=concurrency, exclude_kinds=("report.build",)).drain(
        FakeDeadline(60))
    assert {r.job.kind for r in records} == {"echo"}
    assert (main.claimed, main.succeeded) == (27, 27)
    assert states(owner) == {"succeeded": 48}


def test_the_main_worker_leaves_slow_jobs_ready_and_stops_when_only_they_are_left(
        client: QueueClient, owner: Conn) -> None:
    (slow_job,) = enqueue(client, uuid.uuid4(), kind="report.build", prefix="slow")

    report = make_worker(client, slow_and_quick_registry(),
                         exclude_kinds=("report.build",)).drain(FakeDeadline(60))

    assert (report.claimed, report.stopped) == (0, "queue_empty")
    assert event_types(owner, slow_job) == ["created"]


def test_a_worker_whose_kinds_have_no_handler_is_refused_before_it_claims_anything(
        client: QueueClient, owner: Conn) -> None:
    (job_id,) = enqueue(client, uuid.uuid4(), kind="report.render", prefix="r")

    with pytest.raises(ConfigurationError) as refused:
        make_worker(client, slow_and_quick_registry(), kinds=("report.build", "report.render"))

    message = refused.value.message
    assert "kinds names 'report.render', which the handlers register no handler for" in message
    assert "they register 'echo', 'report.build'" in message
    assert "make them dead as unknown kinds" in message
    assert event_types(owner, job_id) == ["created"]


def test_only_the_kinds_a_worker_claims_must_fit_its_invocation(client: QueueClient) -> None:
    """The main worker's short timeout does not refuse the slow kinds it leaves alone."""
    registry = slow_and_quick_registry(slow_timeout=600)

    make_worker(client, registry, worker_timeout=60, exclude_kinds=("report.build",))
    make_worker(client, registry, worker_timeout=900, kinds=("report.build",))
    with pytest.raises(ConfigurationError) as refused:
        make_worker(client, registry, worker_timeout=60)
    assert "kind 'report.build' needs 606 s" in refused.value.message
    assert "leave the kind to a worker of its own with a longer one (exclude_kinds" in (
        refused.value.message)
