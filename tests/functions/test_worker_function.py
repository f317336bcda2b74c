"""The worker function (leaseq_lambda.handlers.worker) invoked as Lambda invokes it:
sample events, a context whose remaining time the test sets, settings from the
environment, a real database."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from leaseq import (
    ConfigurationError,
    DatabaseUnavailableError,
    EnqueueRequest,
    QueueClient,
    connect,
)
from leaseq_lambda import runtime

from tests.conftest import Database
from tests.functions import handlers
from tests.functions.conftest import LocalInvokes, Output, load_event
from tests.library.support import job, states
from tests.support.fakes import FakeLambdaContext
from tests.support.postgres import Conn

JOB_FIELDS = ("job_id", "tenant_id", "kind", "attempt", "correlation_id")


def read_messages(lines: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    return [line for line in lines if line["message"] == text]


def enqueue(app: ModuleType, event: str, request_id: str = "enqueue-request-1") -> dict[str, Any]:
    answer: dict[str, Any] = app.lambda_handler(
        load_event(event), FakeLambdaContext(function_name="leaseq-enqueue",
                                             aws_request_id=request_id))
    assert answer["rejected"] == 0, answer
    return answer


def test_the_scheduled_tick_drains_every_ready_job_and_emits_the_metrics(
        worker_app: ModuleType, enqueue_app: ModuleType, owner: Conn,
        read_output: Callable[[], Output]) -> None:
    enqueue(enqueue_app, "enqueue_batch")
    enqueue(enqueue_app, "enqueue_direct")
    read_output()
    context = FakeLambdaContext(remaining_ms=60_000)

    summary = worker_app.lambda_handler(load_event("worker_schedule"), context)

    assert summary["status"] == "ok"
    assert (summary["claimed"], summary["succeeded"], summary["retried"], summary["dead"]) == (
        4, 4, 0, 0)
    assert summary["stopped"] == "queue_empty"
    assert summary["owner"] == f"leaseq-worker:{context.aws_request_id}"
    assert summary["trigger"] == "scheduler"
    assert states(owner) == {"succeeded": 4}
    out = read_output()
    assert [out.metric(name) for name in ("JobsClaimed", "JobsSucceeded", "JobsRetried",
                                          "JobsDead", "LeasesLost", "JobsGivenBack",
                                          "OldestReadyAgeSeconds")] == [
        [4], [4], [0], [0], [0], [0], [0]]
    assert len(out.metric("JobDuration")) == len(out.metric("QueueLag")) == 4
    definitions = out.metric_definitions()
    assert definitions["JobDuration"]["Unit"] == "Milliseconds"
    assert definitions["QueueLag"]["Unit"] == "Milliseconds"
    assert definitions["OldestReadyAgeSeconds"]["Unit"] == "Seconds"
    assert {d["Namespace"] for d in definitions.values()} == {"Leaseq"}
    assert {tuple(map(tuple, d["Dimensions"])) for d in definitions.values()} == {(("service",),)}
    assert {doc["service"] for doc in out.emf} == {"leaseq"}


def test_a_stored_payload_python_cannot_decode_is_dead_and_its_batch_drains(
        worker_app: ModuleType, enqueue_app: ModuleType, owner: Conn,
        read_output: Callable[[], Output]) -> None:
    """Written as the schema owner, past the enqueue checks: a 5,001-digit integer."""
    enqueue(enqueue_app, "enqueue_batch")
    (poison,) = owner.execute(
        "insert into app.jobs (tenant_id, operation_key, kind, payload, available_at)"
        " values (%s, 'poison', 'send_welcome_email', '{\"to\": 1e5000}',"
        " now() - interval '1 minute') returning id", (uuid.uuid4(),)).fetchall()
    owner.execute("select * from app.repair_tenant_turns(10000)")  # as a reaper pass would
    read_output()

    summary = worker_app.lambda_handler(load_event("worker_schedule"),
                                        FakeLambdaContext(remaining_ms=60_000))

    assert (summary["claimed"], summary["succeeded"], summary["dead"]) == (4, 3, 1)
    assert summary["stopped"] == "queue_empty"
    assert states(owner) == {"succeeded": 3, "dead": 1}
    row = owner.execute("select last_error->>'code' as code from app.jobs where id = %s",
                        (poison["id"],)).fetchone()
    assert row == {"code": "UNDECODABLE_PAYLOAD"}
    (line,) = read_messages(read_output().logs, "job finished: dead")
    assert (line["job_id"], line["error"]["code"]) == (str(poison["id"]), "UNDECODABLE_PAYLOAD")
    assert len(line["error"]["prefix"]) == 40


def test_every_job_log_line_carries_the_job_and_the_correlation_id_from_enqueue(
        worker_app: ModuleType, enqueue_app: ModuleType,
        read_output: Callable[[], Output]) -> None:
    enqueue(enqueue_app, "enqueue_direct")                        # correlation_id given
    enqueue(enqueue_app, "enqueue_eventbridge")                   # the event's id
    enqueue(enqueue_app, "enqueue_batch", request_id="req-batch")  # the request id, or given
    read_output()

    worker_app.lambda_handler(load_event("worker_schedule"), FakeLambdaContext())

    logs = read_output().logs
    job_lines = [line for line in logs if "job_id" in line]
    # At INFO: two lines per job from the worker (its start, with the budget, and its
    # outcome), plus what the handlers log themselves.
    assert {line["message"] for line in job_lines} == {"sending the welcome email",
                                                        "job started", "job finished"}
    assert len(read_messages(job_lines, "job finished")) == 6
    started = read_messages(job_lines, "job started")
    assert len(started) == 6
    assert {line["budget"] for line in started} == {5}
    for line in job_lines:
        assert all(line.get(key) is not None for key in JOB_FIELDS), line
        assert line["attempt"] == 1
    assert {line["kind"] for line in job_lines} == {
        "send_welcome_email", "charge_card", "resize_image"}
    by_job: dict[str, set[str]] = {}
    for line in job_lines:
        by_job.setdefault(line["job_id"], set()).add(line["correlation_id"])
    assert all(len(ids) == 1 for ids in by_job.values())  # one id per job, on every line
    assert sorted(ids.pop() for ids in by_job.values()) == sorted([
        "signup-4711",                                                  # enqueue_direct
        "0d9b2f4e-6a1c-4e8b-9f3a-2c5d7e9f1a3b", "0d9b2f4e-6a1c-4e8b-9f3a-2c5d7e9f1a3b",
        "req-batch", "req-batch", "upload-77"])
    handler_line = next(li for li in job_lines if li["message"] == "sending the welcome email")
    assert handler_line["recipient"].endswith("@example.com")
    assert handler_line["level"] == "INFO"
    assert handler_line["function_request_id"]  # Powertools' Lambda context fields too


def test_a_handler_that_overruns_its_budget_is_interrupted_and_its_job_retried(
        worker_app: ModuleType, db: Database, owner: Conn,
        read_output: Callable[[], Output]) -> None:
    client = QueueClient(lambda: connect(db.worker_dsn))
    (stuck,) = client.enqueue_jobs([EnqueueRequest(
        tenant_id=uuid.uuid4(), operation_key="s", kind="stuck", payload={})])
    client.close()

    summary = worker_app.lambda_handler({}, FakeLambdaContext(remaining_ms=60_000))

    assert (summary["claimed"], summary["retried"], summary["trigger"]) == (1, 1, "manual")
    row = job(owner, stuck.job_id)
    assert (row["state"], row["last_error"]["code"]) == ("retry_wait", "JOB_TIMEOUT")
    finished = read_output().messages("job finished")
    assert finished[0]["error"]["code"] == "JOB_TIMEOUT"
    assert finished[0]["duration_ms"] >= 300


@pytest.mark.filterwarnings("ignore:No application metrics to publish")
def test_a_function_timeout_too_short_for_one_job_fails_the_invocation_naming_the_settings(
        worker_app: ModuleType, lambda_env: pytest.MonkeyPatch, enqueue_app: ModuleType,
        owner: Conn, read_output: Callable[[], Output]) -> None:
    """A worker timeout between 10 and 36 s with the template's defaults used to run no
    job and report status ok on every invocation."""
    enqueue(enqueue_app, "enqueue_direct")
    read_output()
    lambda_env.setenv("LEASEQ_WORKER_TIMEOUT_SECONDS", "20")
    runtime.reset()

    with pytest.raises(ConfigurationError) as refused:
        worker_app.lambda_handler(load_event("worker_schedule"),
                                  FakeLambdaContext(remaining_ms=50_000))

    message = refused.value.message
    assert "LEASEQ_WORKER_TIMEOUT_SECONDS (20 s) cannot run a single job" in message
    assert "LEASEQ_JOB_TIMEOUT_SECONDS (30 s) + LEASEQ_LEASE_MARGIN_SECONDS (5 s)" in message
    assert "= 36 s. Raise LEASEQ_WORKER_TIMEOUT_SECONDS to at least 36 s" in message
    assert states(owner) == {"pending": 1}
    (line,) = read_output().messages("drain failed")
    assert line["level"] == "ERROR"


@pytest.mark.filterwarnings("ignore:No application metrics to publish")
def test_without_the_timeout_setting_the_first_invocations_time_is_the_worker_timeout(
        worker_app: ModuleType, lambda_env: pytest.MonkeyPatch, owner: Conn) -> None:
    lambda_env.setenv("LEASEQ_JOB_TIMEOUT_SECONDS", "6")
    lambda_env.setenv("LEASEQ_LEASE_MARGIN_SECONDS", "1")

    # A job may need 6 s, plus the 1 s margin and 1 s to record it: a first invocation
    # with 7.2 s left (a function timeout of 8 s, rounded up) fits; one with 6.9 s does not.
    assert worker_app.lambda_handler({}, FakeLambdaContext(remaining_ms=7_200))["status"] == "ok"
    runtime.reset()
    with pytest.raises(ConfigurationError, match=r"\(7 s\) cannot run a single job"):
        worker_app.lambda_handler({}, FakeLambdaContext(remaining_ms=6_900))


@pytest.mark.filterwarnings("ignore:No application metrics to publish")
def test_a_kind_whose_timeout_no_invocation_can_fit_is_refused_at_cold_start(
        worker_app: ModuleType, lambda_env: pytest.MonkeyPatch) -> None:
    # tests.functions.handlers registers kinds with a 5 s timeout: they need 5 + 1 + 1 s.
    lambda_env.setenv("LEASEQ_WORKER_TIMEOUT_SECONDS", "6")
    lambda_env.setenv("LEASEQ_JOB_TIMEOUT_SECONDS", "2")
    lambda_env.setenv("LEASEQ_LEASE_MARGIN_SECONDS", "1")

    with pytest.raises(ConfigurationError) as refused:
        worker_app.lambda_handler({}, FakeLambdaContext(remaining_ms=6_000))

    message = refused.value.message
    assert "kind 'send_welcome_email' needs 7 s (its timeout 5 s" in message
    assert "the worker's invocation leaves 6 s" in message
    assert "raise the function timeout (WorkerTimeoutSeconds" in message
    assert "lower the kind's timeout" in message


def test_the_slow_worker_and_the_main_worker_drain_their_own_kinds_as_the_template_sets_them(
        worker_app: ModuleType, enqueue_app: ModuleType, lambda_env: pytest.MonkeyPatch,
        owner: Conn, read_output: Callable[[], Output]) -> None:
    """SlowKinds=resize_image: LEASEQ_KINDS on the slow worker, LEASEQ_EXCLUDE_KINDS on
    the main one (template.yaml), the same handlers module."""
    enqueue(enqueue_app, "enqueue_batch")  # charge_card, send_welcome_email, resize_image
    read_output()
    lambda_env.setenv("LEASEQ_KINDS", "resize_image")
    runtime.reset()

    slow = worker_app.lambda_handler(load_event("worker_schedule"),
                                     FakeLambdaContext(remaining_ms=60_000))

    assert (slow["claimed"], slow["succeeded"], slow["stopped"]) == (1, 1, "queue_empty")
    done = owner.execute("select kind from app.jobs where state = 'succeeded'").fetchall()
    assert [row["kind"] for row in done] == ["resize_image"]
    lambda_env.delenv("LEASEQ_KINDS")
    lambda_env.setenv("LEASEQ_EXCLUDE_KINDS", "resize_image")
    runtime.reset()

    main = worker_app.lambda_handler(load_event("worker_schedule"),
                                     FakeLambdaContext(remaining_ms=60_000))

    assert (main["claimed"], main["succeeded"]) == (2, 2)
    assert states(owner) == {"succeeded": 3}


@pytest.mark.filterwarnings("ignore:No application metrics to publish")
def test_a_slow_kind_the_handlers_do_not_register_is_refused_at_cold_start(
        worker_app: ModuleType, lambda_env: pytest.MonkeyPatch, enqueue_app: ModuleType,
        owner: Conn) -> None:
    enqueue(enqueue_app, "enqueue_batch")
    lambda_env.setenv("LEASEQ_KINDS", "resize_image,render_video")
    runtime.reset()

    with pytest.raises(ConfigurationError) as refused:
        worker_app.lambda_handler({}, FakeLambdaContext(remaining_ms=60_000))

    assert "LEASEQ_KINDS (SlowKinds) names 'render_video', which the handlers register no" in (
        refused.value.message)
    assert states(owner) == {"pending": 3}


def test_the_classic_scheduled_event_and_a_manual_invoke_are_accepted(
        worker_app: ModuleType) -> None:
    rule = worker_app.lambda_handler(load_event("worker_eventbridge_rule"), FakeLambdaContext())
    manual = worker_app.lambda_handler({}, FakeLambdaContext())
    assert (rule["status"], rule["trigger"]) == ("ok", "eventbridge-rule")
    assert (manual["status"], manual["trigger"]) == ("ok", "manual")


@pytest.mark.parametrize(("event", "reason"), [
    ({"source": "leaseq.schedule", "task": "reaper"}, "this is the worker function"),
    ({"source": "leaseq.schedule", "task": "worker", "extra": 1}, "Extra inputs"),
    ({"hello": "world"}, "expects a schedule tick"),
    (["not", "an", "object"], "expects a schedule tick"),
])
def test_an_event_that_is_not_a_worker_tick_is_rejected_without_draining(
        worker_app: ModuleType, enqueue_app: ModuleType, owner: Conn, event: Any,
        reason: str, read_output: Callable[[], Output]) -> None:
    enqueue(enqueue_app, "enqueue_direct")
    read_output()

    answer = worker_app.lambda_handler(event, FakeLambdaContext())

    assert answer["status"] == "rejected"
    assert reason in answer["reason"]
    assert states(owner) == {"pending": 1}
    out = read_output()
    (line,) = out.messages("event rejected")
    assert line["level"] == "ERROR"
    assert out.metric("EventsRejected") == [1]


def test_warm_invocations_reuse_one_connection_and_reopen_it_after_it_was_cut(
        worker_app: ModuleType, admin: Conn) -> None:
    worker_app.lambda_handler({}, FakeLambdaContext())
    client = runtime.get().client
    pid = client.connection.info.backend_pid
    worker_app.lambda_handler({}, FakeLambdaContext())
    assert (client.reconnects, client.connection.info.backend_pid) == (1, pid)

    admin.execute("select pg_terminate_backend(%s)", (pid,))  # e.g. a proxy idle timeout
    summary = worker_app.lambda_handler({}, FakeLambdaContext())

    assert summary["status"] == "ok"
    assert client.reconnects == 2
    assert client.connection.info.backend_pid != pid


@pytest.mark.parametrize(("handlers_module", "problem"), [
    (None, "LEASEQ_HANDLERS is not set"),
    ("tests.functions.no_such_module", "cannot be imported"),
    ("tests.functions.conftest", "has no module-level 'registry'"),
    ("tests.functions.empty_handlers", "registers no job kinds"),
])
def test_a_missing_or_broken_handlers_module_fails_the_invocation_clearly(
        worker_app: ModuleType, lambda_env: pytest.MonkeyPatch, handlers_module: str | None,
        problem: str, read_output: Callable[[], Output]) -> None:
    if handlers_module is None:
        lambda_env.delenv("LEASEQ_HANDLERS")
    else:
        lambda_env.setenv("LEASEQ_HANDLERS", handlers_module)

    with pytest.raises(ConfigurationError, match=problem):
        worker_app.lambda_handler({}, FakeLambdaContext())

    (line,) = read_output().messages("drain failed")
    assert problem in line["error"]


def test_invalid_settings_fail_the_invocation_with_the_variable_named(
        worker_app: ModuleType, lambda_env: pytest.MonkeyPatch) -> None:
    lambda_env.setenv("LEASEQ_BATCH_SIZE", "1000")
    with pytest.raises(ConfigurationError, match="LEASEQ_BATCH_SIZE"):
        worker_app.lambda_handler({}, FakeLambdaContext())


def test_at_debug_level_the_librarys_own_lines_carry_the_job_fields_too(
        worker_app: ModuleType, enqueue_app: ModuleType,
        read_output: Callable[[], Output]) -> None:
    enqueue(enqueue_app, "enqueue_direct")
    read_output()
    service_logger = logging.getLogger("leaseq")  # POWERTOOLS_LOG_LEVEL=DEBUG in Lambda
    service_logger.setLevel(logging.DEBUG)
    try:
        worker_app.lambda_handler(load_event("worker_schedule"), FakeLambdaContext())
    finally:
        service_logger.setLevel(logging.INFO)

    lines = read_output().logs
    (started,) = read_messages(lines, "job started")
    (returned,) = read_messages(lines, "job handler returned")
    for line in (started, returned):
        assert {k: line[k] for k in ("kind", "attempt", "correlation_id")} == {
            "kind": "send_welcome_email", "attempt": 1, "correlation_id": "signup-4711"}
    assert started["job_id"] == returned["job_id"]


def test_an_unreachable_database_fails_the_invocation_with_a_structured_log_line(
        worker_app: ModuleType, lambda_env: pytest.MonkeyPatch,
        read_output: Callable[[], Output]) -> None:
    lambda_env.setenv("DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1")

    with pytest.raises(DatabaseUnavailableError, match="database unavailable"):
        worker_app.lambda_handler(load_event("worker_schedule"), FakeLambdaContext())

    (line,) = read_output().messages("drain failed")
    assert line["level"] == "ERROR"
    assert "exception" in line  # with the traceback, for the Errors alarm's investigation
    assert "Check the host, port, credentials" in line["error"]


# The worker pool -----------------------------------------------------------------------------


@pytest.fixture
def pooled(lambda_env: pytest.MonkeyPatch, local_invokes: LocalInvokes) -> LocalInvokes:
    """The pool on, at most two workers, claims of two jobs; the worker function to start
    is the local service's Probe, which records the events it gets."""
    for key, value in {"LEASEQ_MAX_WORKERS": "2", "LEASEQ_WORKER_FUNCTION": "Probe",
                       "LEASEQ_BATCH_SIZE": "2"}.items():
        lambda_env.setenv(key, value)
    runtime.reset()
    return local_invokes


def enqueue_directly(db: Database, count: int) -> None:
    """Jobs enqueued by a producer of its own (no wake: the pool stays empty)."""
    client = QueueClient(lambda: connect(db.worker_dsn))
    client.enqueue_jobs([EnqueueRequest(
        tenant_id=uuid.uuid4(), operation_key=f"direct-{n}", kind="send_welcome_email",
        payload={"to": f"user{n}@example.com"}) for n in range(count)])
    client.close()


def pool_places(admin: Conn) -> list[dict[str, Any]]:
    return admin.execute("select id, owner, reason, expires_at - clock_timestamp() as left"
                         " from app.worker_pool where expires_at > clock_timestamp()"
                         " order by created_at").fetchall()


def test_with_the_pool_on_a_backlog_starts_another_worker_and_the_invocation_leaves_the_pool(
        worker_app: ModuleType, pooled: LocalInvokes, db: Database, admin: Conn,
        read_output: Callable[[], Output]) -> None:
    enqueue_directly(db, 3)  # the first claim of two is full
    read_output()

    summary = worker_app.lambda_handler(load_event("worker_schedule"), FakeLambdaContext())

    assert (summary["status"], summary["claimed"], summary["succeeded"]) == ("ok", 3, 3)
    assert (summary["workers_started"], summary["worker_starts_failed"]) == (1, 0)
    assert summary["pool_live"] == 1
    (event,) = pooled.events(1)
    (reserved,) = pool_places(admin)  # its own place is gone; the one it reserved waits
    assert event == {"source": "leaseq.pool", "reason": "fanout",
                     "reservation": str(reserved["id"])}
    assert reserved["owner"] is None
    out = read_output()
    assert [out.metric(name) for name in ("WorkerPoolSize", "PoolFull", "WorkersStarted",
                                          "WorkerStartsFailed")] == [[1], [0], [1], [0]]
    assert {d["Unit"] for name, d in out.metric_definitions().items()
            if name in ("WorkerPoolSize", "PoolFull", "WorkersStarted")} == {"Count"}


def test_an_invocation_that_stops_at_its_deadline_with_jobs_ready_starts_its_successor(
        worker_app: ModuleType, pooled: LocalInvokes, lambda_env: pytest.MonkeyPatch,
        db: Database, admin: Conn, owner: Conn) -> None:
    """Members of a pool started together stop claiming together: without a successor
    the rest of a backlog would wait for the next tick."""
    lambda_env.setenv("LEASEQ_JOB_TIMEOUT_SECONDS", "5")  # a job needs 5 + 1 + 1 s
    lambda_env.setenv("LEASEQ_LEASE_MARGIN_SECONDS", "1")
    runtime.reset()
    enqueue_directly(db, 3)
    handlers.on_run = lambda: time.sleep(0.5)  # after one batch of two, under 7 s are left

    try:
        summary = worker_app.lambda_handler(load_event("worker_schedule"),
                                            FakeLambdaContext(remaining_ms=7_700))
    finally:
        handlers.on_run = None

    assert (summary["stopped"], summary["succeeded"], summary["handed_over"]) == (
        "deadline", 2, True)
    events = pooled.events(2)  # the fan-out of its full claim, then its successor
    assert {e["reason"] for e in events} == {"fanout"}
    assert sorted(e["reservation"] for e in events) == sorted(
        str(p["id"]) for p in pool_places(admin))
    assert states(owner) == {"succeeded": 2, "pending": 1}


def test_an_invocation_that_emptied_the_queue_starts_no_successor(
        worker_app: ModuleType, pooled: LocalInvokes, db: Database) -> None:
    enqueue_directly(db, 1)

    summary = worker_app.lambda_handler(load_event("worker_schedule"), FakeLambdaContext())

    assert (summary["stopped"], summary["handed_over"]) == ("queue_empty", False)


def test_an_invocation_started_for_a_reservation_takes_it_and_drains(
        worker_app: ModuleType, pooled: LocalInvokes, db: Database, owner: Conn,
        admin: Conn) -> None:
    enqueue_directly(db, 1)
    client = QueueClient(lambda: connect(db.worker_dsn))
    (reserved,) = client.reserve_worker_places(1, 2, 90)
    client.close()
    seen: list[list[dict[str, Any]]] = []
    handlers.on_run = lambda: seen.append(pool_places(admin))

    try:
        summary = worker_app.lambda_handler(
            {"source": "leaseq.pool", "reason": "fanout", "reservation": str(reserved)},
            FakeLambdaContext(remaining_ms=50_000))
    finally:
        handlers.on_run = None

    assert (summary["status"], summary["trigger"], summary["succeeded"]) == ("ok", "fanout", 1)
    ((place,),) = seen  # while its job ran: the reserved place, now its own
    assert place["id"] == reserved
    assert place["owner"] == summary["owner"]
    assert 45 < place["left"].total_seconds() <= 55  # its time left plus the margin
    assert pool_places(admin) == []
    assert states(owner) == {"succeeded": 1}


def test_a_second_delivery_of_a_pool_start_while_the_pool_is_full_returns_without_claiming(
        worker_app: ModuleType, pooled: LocalInvokes, db: Database, owner: Conn,
        read_output: Callable[[], Output]) -> None:
    enqueue_directly(db, 1)
    client = QueueClient(lambda: connect(db.worker_dsn))
    (reserved,) = client.reserve_worker_places(1, 2, 90)
    # The first delivery's invocation took the place and is still running; another
    # worker holds the second place.
    assert client.join_worker_pool("first-delivery", "fanout", reserved, 2, 60)
    assert client.join_worker_pool("scheduled", "schedule", None, 2, 60)
    client.close()
    read_output()

    answer = worker_app.lambda_handler(
        {"source": "leaseq.pool", "reason": "fanout", "reservation": str(reserved)},
        FakeLambdaContext())

    assert (answer["status"], answer["trigger"], answer["pool_live"]) == (
        "pool_full", "fanout", 2)
    assert states(owner) == {"pending": 1}
    out = read_output()
    assert (out.metric("PoolFull"), out.metric("WorkerPoolSize")) == ([1], [2])
    (line,) = out.messages("worker pool full: not draining")
    assert line["level"] == "INFO"


def test_a_started_invocation_polls_for_the_pool_idle_time_and_a_scheduled_one_its_own(
        worker_app: ModuleType, pooled: LocalInvokes, lambda_env: pytest.MonkeyPatch) -> None:
    lambda_env.setenv("LEASEQ_FANOUT_IDLE_SECONDS", "0.6")  # LEASEQ_POLL_IDLE_SECONDS is 0
    runtime.reset()

    woken = worker_app.lambda_handler(
        {"source": "leaseq.pool", "reason": "wake", "reservation": str(uuid.uuid4())},
        FakeLambdaContext())
    scheduled = worker_app.lambda_handler(load_event("worker_schedule"), FakeLambdaContext())

    assert (woken["status"], woken["stopped"], scheduled["stopped"]) == (
        "ok", "queue_empty", "queue_empty")
    assert woken["polls"] > 1  # kept looking for LEASEQ_FANOUT_IDLE_SECONDS
    assert scheduled["polls"] == 1  # stopped at the first empty poll, as configured


def test_a_failed_fan_out_is_counted_and_its_place_given_back_while_the_drain_goes_on(
        worker_app: ModuleType, pooled: LocalInvokes, db: Database, admin: Conn,
        lambda_env: pytest.MonkeyPatch, read_output: Callable[[], Output]) -> None:
    lambda_env.setenv("LEASEQ_WORKER_FUNCTION", "NoSuchFunction")
    runtime.reset()
    enqueue_directly(db, 3)
    read_output()

    summary = worker_app.lambda_handler(load_event("worker_schedule"), FakeLambdaContext())

    assert (summary["status"], summary["succeeded"]) == ("ok", 3)
    assert (summary["workers_started"], summary["worker_starts_failed"]) == (0, 1)
    assert pool_places(admin) == []
    out = read_output()
    assert out.metric("WorkerStartsFailed") == [1]
    (line,) = out.messages("worker start failed")
    assert line["level"] == "WARNING"
    assert "ResourceNotFoundException" in line["error"]


def test_an_invocation_that_fails_after_joining_still_leaves_the_pool(
        worker_app: ModuleType, pooled: LocalInvokes, lambda_env: pytest.MonkeyPatch,
        admin: Conn) -> None:
    lambda_env.setenv("LEASEQ_HANDLERS", "tests.functions.no_such_module")
    runtime.reset()

    with pytest.raises(ConfigurationError, match="cannot be imported"):
        worker_app.lambda_handler(load_event("worker_schedule"), FakeLambdaContext())

    assert pool_places(admin) == []


def test_with_the_pool_off_the_worker_joins_nothing_and_reports_no_pool_metrics(
        worker_app: ModuleType, enqueue_app: ModuleType, admin: Conn,
        read_output: Callable[[], Output]) -> None:
    enqueue(enqueue_app, "enqueue_batch")
    read_output()

    summary = worker_app.lambda_handler(load_event("worker_schedule"), FakeLambdaContext())

    assert summary["status"] == "ok"
    assert "workers_started" not in summary
    assert pool_places(admin) == []
    names = read_output().metric_definitions()
    assert not {"WorkerPoolSize", "PoolFull", "WorkersStarted", "WorkerStartsFailed"} & set(names)
