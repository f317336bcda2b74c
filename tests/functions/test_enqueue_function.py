"""The enqueue function (leaseq_lambda.handlers.enqueue): one job, a batch, or an
EventBridge event in; one result per item out; bad input answered item by item, never
with an unstructured error."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from types import ModuleType
from typing import Any

import pytest
from leaseq import DatabaseUnavailableError, PermissionDeniedError, set_worker_pool_limits
from leaseq_lambda import runtime
from leaseq_lambda.enqueue import EnqueueRejectedError

from tests.conftest import Database
from tests.functions.conftest import LocalInvokes, Output, load_app, load_event
from tests.library.support import job, jobs
from tests.support import postgres
from tests.support.fakes import FakeLambdaContext
from tests.support.postgres import Conn

EVENT_ID = "0d9b2f4e-6a1c-4e8b-9f3a-2c5d7e9f1a3b"


def invoke(app: ModuleType, event: Any, request_id: str = "req-1") -> dict[str, Any]:
    answer: dict[str, Any] = app.lambda_handler(
        event, FakeLambdaContext(function_name="leaseq-enqueue", aws_request_id=request_id))
    return answer


def test_one_job_is_created_and_a_repeat_finds_the_same_job(
        enqueue_app: ModuleType, owner: Conn, read_output: Callable[[], Output]) -> None:
    first = invoke(enqueue_app, load_event("enqueue_direct"))
    again = invoke(enqueue_app, load_event("enqueue_direct"), request_id="req-2")

    assert first["results"][0]["status"] == "created"
    assert (first["created"], first["existing"], first["rejected"]) == (1, 0, 0)
    assert again["results"] == [{"index": 0, "status": "existing", "queue": "default",
                                 "job_id": first["results"][0]["job_id"]}]
    (row,) = jobs(owner)
    assert (str(row["id"]), row["kind"], row["correlation_id"]) == (
        first["results"][0]["job_id"], "send_welcome_email", "signup-4711")
    out = read_output()
    assert out.metric("JobsEnqueued") == [1, 0]
    assert out.metric("EnqueueExisting") == [0, 1]
    (created_line, _) = out.messages("job enqueued")
    assert created_line["job_id"] == first["results"][0]["job_id"]
    assert created_line["correlation_id"] == "signup-4711"


def test_a_batch_gets_the_request_id_as_correlation_id_where_an_item_has_none(
        enqueue_app: ModuleType, owner: Conn) -> None:
    answer = invoke(enqueue_app, load_event("enqueue_batch"), request_id="req-batch")

    assert [r["status"] for r in answer["results"]] == ["created"] * 3
    assert [r["index"] for r in answer["results"]] == [0, 1, 2]
    by_id = {str(row["id"]): row for row in jobs(owner)}
    assert [by_id[r["job_id"]]["correlation_id"] for r in answer["results"]] == [
        "req-batch", "req-batch", "upload-77"]
    assert by_id[answer["results"][0]["job_id"]]["max_attempts"] == 3
    assert [by_id[r["job_id"]]["priority"] for r in answer["results"]] == [8, 5, 5]


@pytest.mark.parametrize("priority", [0, 10, "9", True])
def test_an_item_with_a_priority_outside_1_to_9_is_rejected_with_its_field(
        enqueue_app: ModuleType, owner: Conn, priority: Any) -> None:
    event = load_event("enqueue_batch")
    event["jobs"][1]["priority"] = priority

    answer = invoke(enqueue_app, event)

    assert [r["status"] for r in answer["results"]] == ["created", "rejected", "created"]
    assert [e["field"] for e in answer["results"][1]["errors"]] == ["priority"]
    assert len(jobs(owner)) == 2


def test_an_eventbridge_event_gets_the_event_id_as_correlation_id(
        enqueue_app: ModuleType, owner: Conn) -> None:
    answer = invoke(enqueue_app, load_event("enqueue_eventbridge"))

    assert (answer["created"], answer["rejected"]) == (2, 0)
    assert {row["correlation_id"] for row in jobs(owner)} == {EVENT_ID}


def test_an_eventbridge_event_may_carry_a_single_job(
        enqueue_app: ModuleType, owner: Conn) -> None:
    event = load_event("enqueue_eventbridge")
    event["detail"] = load_event("enqueue_direct")

    answer = invoke(enqueue_app, event)

    assert answer["results"][0]["status"] == "created"
    assert jobs(owner)[0]["correlation_id"] == "signup-4711"


def test_a_conflicting_repeat_is_rejected_naming_the_conflict_but_not_the_job(
        enqueue_app: ModuleType, owner: Conn) -> None:
    original = invoke(enqueue_app, load_event("enqueue_direct"))
    changed = load_event("enqueue_direct")
    changed["payload"]["name"] = "Someone else"

    answer = invoke(enqueue_app, changed)

    (result,) = answer["results"]
    assert result["status"] == "rejected"
    assert result["sqlstate"] == "23505"
    assert "idempotency conflict" in result["reason"]
    # The key alone is no way to learn a job's id: only a repeat of the job gets it.
    assert original["results"][0]["job_id"] not in result["reason"]
    assert "job_id" not in result
    assert job(owner, uuid.UUID(original["results"][0]["job_id"]))["payload"]["name"] == "Ada"


def _batch_with(bad: Any) -> dict[str, Any]:
    """The sample batch with ``bad`` inserted as its second item."""
    event = load_event("enqueue_batch")
    event["jobs"].insert(1, bad)
    return event


def _direct(**changes: Any) -> dict[str, Any]:
    item = load_event("enqueue_direct")
    for key, value in changes.items():
        if value is KeyError:
            del item[key]
        else:
            item[key] = value
    return item


@pytest.mark.parametrize(("bad", "reason"), [
    ("just a string", "a job must be a JSON object (got string)"),
    (None, "a job must be a JSON object (got null)"),
    ([1, 2], "a job must be a JSON object (got array)"),
    (_direct(tenant_id=KeyError), "tenant_id: Field required"),
    (_direct(kind=KeyError, operation_key=KeyError), "operation_key: Field required; kind"),
    (_direct(tenant_id="tenant-7"), "tenant_id: Input should be a valid UUID"),
    (_direct(payload=[1, 2, 3]), "payload: Input should be a valid dictionary"),
    (_direct(payload="{}"), "payload: Input should be a valid dictionary"),
    (_direct(operation_key="a\u0000b"), "operation_key: Value error, must not contain NUL"),
    (_direct(payload={"note": "nul \u0000 byte"}),
     "payload: Value error, $.note: must not contain NUL"),
    (_direct(available_at=(datetime.now(UTC) + timedelta(days=400)).isoformat()),
     "available_at: Value error, must be at most 365 days ahead"),
    (_direct(max_attempts=True), "max_attempts: Input should be a valid integer"),
    (_direct(max_attempts="3"), "max_attempts: Input should be a valid integer"),
    (_direct(kind="\u200b"), "kind: Value error, must not be blank"),
    (_direct(max_attempts=0), "max_attempts: Input should be greater than or equal to 1"),
    (_direct(available_at="2030-01-01T00:00:00"), "available_at: Value error, must include a"),
    (_direct(lane="fast"), "lane: Extra inputs are not permitted"),
    (_direct(queue="Fast"), "queue: Value error, must be a queue name"),
    (_direct(priority=0), "priority: Input should be greater than or equal to 1"),
    (_direct(operation_key="   "), "operation_key: Value error, must not be blank"),
    (_direct(kind="send\nwelcome"), "kind: Value error, must not contain control, format "
     "(invisible or bidirectional) or line separator characters (found U+000A at character "
     "5; remove it)"),
    (_direct(operation_key="signup\u202e4711"), "operation_key: Value error, must not contain "
     "control, format (invisible or bidirectional) or line separator characters (found "
     "U+202E at character 7; remove it)"),
    (_direct(correlation_id="trace\x1b[0m"), "correlation_id: Value error, must not contain "
     "control"),
])
def test_an_invalid_item_is_rejected_with_the_reason_and_its_neighbours_are_enqueued(
        enqueue_app: ModuleType, owner: Conn, bad: Any, reason: str) -> None:
    answer = invoke(enqueue_app, _batch_with(copy.deepcopy(bad)))

    assert [r["status"] for r in answer["results"]] == [
        "created", "rejected", "created", "created"]
    rejected = answer["results"][1]
    assert rejected["index"] == 1
    assert rejected["reason"].startswith(reason), rejected["reason"]
    assert (answer["created"], answer["rejected"]) == (3, 1)
    assert len(jobs(owner)) == 3


def test_kinds_of_letters_of_any_script_are_enqueued(enqueue_app: ModuleType,
                                                      owner: Conn) -> None:
    event = {"jobs": [_direct(kind=kind, operation_key=f"op-{i}")
                      for i, kind in enumerate(("rapport_\u00e9", "\u5831\u544a"))]}

    answer = invoke(enqueue_app, event)

    assert answer["created"] == 2
    assert {row["kind"] for row in jobs(owner)} == {"rapport_\u00e9", "\u5831\u544a"}


def test_a_batch_whose_payloads_pass_the_call_bound_is_rejected_whole_and_stores_nothing(
        enqueue_app: ModuleType, owner: Conn, lambda_env: pytest.MonkeyPatch) -> None:
    """65 payloads of 256 KiB: each is valid, together they pass the 16 MiB the database
    takes in one call. Every job is refused with the database's message, before the
    database is reached (it is unreachable here)."""
    lambda_env.setenv("DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1")
    big = {"d": "x" * (262_144 - 9)}
    event = {"jobs": [_direct(operation_key=f"big-{i}", payload=big) for i in range(64)]
             + [_direct(operation_key="one-more", payload={})]}

    answer = invoke(enqueue_app, event)

    assert (answer["created"], answer["rejected"]) == (0, 65)
    assert {r["reason"] for r in answer["results"]} == {
        "enqueue call too large: its payloads must total at most 16777216 bytes as JSON "
        "text, and job 65 brings them to 16777218; split the batch into smaller calls"}
    assert jobs(owner) == []


@pytest.mark.parametrize(("event", "count", "reason"), [
    ("not an object", 1, "the event must be a JSON object"),
    (["a", "list"], 1, "the event must be a JSON object: one job or"),
    (17, 1, "the event must be a JSON object"),
    ({"jobs": "many"}, 1, "\"jobs\" must be an array (got string)"),
    ({"jobs": []}, 1, "a batch holds 1 to 1000 jobs (got 0)"),
    ({"jobs": [{}] * 1001}, 1001, "a batch holds 1 to 1000 jobs (got 1001)"),
    ({"jobs": [{}], "tenant_id": "x"}, 1, "a batch has only the key \"jobs\""),
])
def test_an_event_of_the_wrong_shape_is_rejected_as_a_whole_with_one_result_per_item(
        enqueue_app: ModuleType, owner: Conn, event: Any, count: int, reason: str) -> None:
    answer = invoke(enqueue_app, event)

    assert len(answer["results"]) == count
    assert [r["index"] for r in answer["results"]] == list(range(count))
    assert {r["status"] for r in answer["results"]} == {"rejected"}
    assert all(r["reason"].startswith(reason) for r in answer["results"]), answer["results"][0]
    assert (answer["created"], answer["existing"], answer["rejected"]) == (0, 0, count)
    assert jobs(owner) == []


def test_an_eventbridge_event_of_another_detail_type_is_rejected(
        enqueue_app: ModuleType) -> None:
    event = load_event("enqueue_eventbridge")
    event["detail-type"] = "order.placed"

    # EventBridge invokes asynchronously: the rejection fails the invocation.
    with pytest.raises(EnqueueRejectedError) as raised:
        invoke(enqueue_app, event)

    assert str(raised.value) == (
        "1 of 1 jobs rejected (the other 0 were enqueued): job 0: EventBridge detail-type "
        "must be 'leaseq.enqueue' (got 'order.placed')")
    with pytest.raises(EnqueueRejectedError, match="job 0: invalid EventBridge event: "
                       "version: Field required"):
        invoke(enqueue_app, {"detail-type": "leaseq.enqueue"})


def test_an_async_batch_with_rejections_stores_the_good_jobs_then_raises_every_reason(
        enqueue_app: ModuleType, owner: Conn, read_output: Callable[[], Output]) -> None:
    event = _batch_with({"operation_key": "no tenant"}) | {"asynchronous": True}

    with pytest.raises(EnqueueRejectedError) as raised:
        invoke(enqueue_app, event)

    assert len(jobs(owner)) == 3
    message = str(raised.value)
    assert message.startswith("1 of 4 jobs rejected (the other 3 were enqueued): job 1: ")
    assert "tenant_id" in message
    out = read_output()
    assert out.metric("EnqueueRejected") == [1]
    assert out.metric("JobsEnqueued") == [3]
    (failed,) = out.messages("asynchronous enqueue failed: jobs rejected")
    assert failed["error"] == message
    (rejected,) = out.messages("job rejected")
    assert rejected["index"] == 1
    assert not out.messages("invocation failed: unexpected error")


def test_the_same_batch_invoked_synchronously_answers_for_each_job_instead(
        enqueue_app: ModuleType, owner: Conn) -> None:
    answer = invoke(enqueue_app, _batch_with({"operation_key": "no tenant"}))

    assert [r["status"] for r in answer["results"]] == [
        "created", "rejected", "created", "created"]
    assert len(jobs(owner)) == 3


def test_async_and_eventbridge_invocations_without_rejections_return_normally(
        enqueue_app: ModuleType, owner: Conn) -> None:
    batch = invoke(enqueue_app, load_event("enqueue_batch") | {"asynchronous": True})
    routed = invoke(enqueue_app, load_event("enqueue_eventbridge"))

    assert (batch["created"], batch["rejected"]) == (3, 0)
    assert (routed["created"], routed["rejected"]) == (2, 0)
    assert len(jobs(owner)) == 5


def test_a_marker_that_is_not_a_boolean_rejects_the_batch(enqueue_app: ModuleType) -> None:
    answer = invoke(enqueue_app, load_event("enqueue_batch") | {"asynchronous": "yes"})

    assert answer["rejected"] == 3
    assert answer["results"][0]["reason"] == '"asynchronous" must be true or false (got string)'


def test_the_reasons_an_async_failure_carries_are_bounded(enqueue_app: ModuleType) -> None:
    from leaseq_lambda.enqueue import MAX_REJECTION_MESSAGE

    event = {"jobs": [{"operation_key": "x" * 200, "n": n} for n in range(1000)],
             "asynchronous": True}

    with pytest.raises(EnqueueRejectedError) as raised:
        invoke(enqueue_app, event)

    message = str(raised.value)
    assert message.startswith("1000 of 1000 jobs rejected")
    assert len(message) <= MAX_REJECTION_MESSAGE + 100
    assert message.endswith("more")


def test_an_item_the_database_refuses_is_rejected_and_the_rest_still_enqueued(
        enqueue_app: ModuleType, owner: Conn, admin: Conn) -> None:
    # A rule of the database that the model does not know (as a newer schema may add):
    # the batch is refused as a whole, then the items are sent one by one.
    admin.execute("alter table app.jobs add constraint test_no_far_future"
                  " check (operation_key <> 'far-future')")
    try:
        answer = invoke(enqueue_app, _batch_with(_direct(operation_key="far-future")))
    finally:
        admin.execute("alter table app.jobs drop constraint test_no_far_future")

    assert [r["status"] for r in answer["results"]] == [
        "created", "rejected", "created", "created"]
    assert "test_no_far_future" in answer["results"][1]["reason"]
    assert len(jobs(owner)) == 3


def test_a_batch_stores_its_good_items_and_rejects_each_bad_one_with_its_field(
        enqueue_app: ModuleType, owner: Conn) -> None:
    """Each bad value here used to fail the whole batch: an offset PostgreSQL refuses
    (22009), a number a worker cannot decode, a NaN (json.dumps writes NaN, 22P02)."""
    far_east = (datetime.now(UTC) + timedelta(days=10)).astimezone(
        timezone(timedelta(hours=16))).replace(microsecond=0)
    event = load_event("enqueue_batch")
    good = event["jobs"]
    event["jobs"] = [
        good[0],
        _direct(operation_key="far-east", available_at=far_east.isoformat()),
        _direct(operation_key="huge", payload={"ids": [1, 10**1500]}),
        _direct(operation_key="nan", payload={"ratio": float("nan")}),
        _direct(operation_key="blank-kind", kind="\t\u2060"),
        good[1],
    ]

    answer = invoke(enqueue_app, event)

    statuses = [r["status"] for r in answer["results"]]
    assert statuses == ["created", "created", "rejected", "rejected", "rejected", "created"]
    huge, nan, blank = answer["results"][2:5]
    assert [e["field"] for e in huge["errors"]] == ["payload"]
    assert "$.ids[1]: an integer of about 1501 digits" in huge["errors"][0]["message"]
    assert "$.ratio: nan is not a JSON number" in nan["errors"][0]["message"]
    assert [(e["field"], e["type"]) for e in blank["errors"]] == [("kind", "value_error")]
    assert "U+2060 WORD JOINER" in blank["reason"]
    assert str(10**20) not in str(huge)  # a rejection never echoes the payload
    stored = {row["operation_key"]: row for row in jobs(owner)}
    assert set(stored) == {good[0]["operation_key"], "far-east", good[1]["operation_key"]}
    assert stored["far-east"]["available_at"] == far_east  # the same instant, in UTC
    assert (answer["created"], answer["rejected"]) == (3, 3)


def test_an_entirely_rejected_event_is_answered_without_touching_the_database(
        enqueue_app: ModuleType, lambda_env: pytest.MonkeyPatch) -> None:
    lambda_env.setenv("DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1")

    answer = invoke(enqueue_app, {"jobs": [{"kind": "x"}]})

    assert answer["rejected"] == 1


def test_an_unreachable_database_fails_the_invocation_so_the_caller_retries(
        enqueue_app: ModuleType, lambda_env: pytest.MonkeyPatch,
        read_output: Callable[[], Output]) -> None:
    lambda_env.setenv("DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1")

    with pytest.raises(DatabaseUnavailableError, match="database unavailable"):
        invoke(enqueue_app, load_event("enqueue_direct"))

    (line,) = read_output().messages("enqueue failed")
    assert line["level"] == "ERROR"
    assert "database unavailable" in line["error"]


# The door's tenants (EnqueueTenants) ----------------------------------------------------------

#: The tenants of the sample batch: two jobs of the first, one of the second.
SAMPLE_TENANT = uuid.UUID("5b1f0c64-2f7e-4a53-9d3e-0c1a2b3c4d5e")
OTHER_TENANT = uuid.UUID("9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d")


@pytest.fixture
def bound_door(db: Database, lambda_env: pytest.MonkeyPatch, owner: Conn) -> ModuleType:
    """The function as the stack deploys it with EnqueueTenants set: its login a member of
    leaseq_tenant_producer bound to that tenant, the same tenant in its environment."""
    owner.execute("insert into app.tenant_producers (role_name, tenant_id) values (%s, %s)",
                  (postgres.TENANT_PRODUCER, SAMPLE_TENANT))
    lambda_env.setenv("DATABASE_URL", db.dsn(postgres.TENANT_PRODUCER))
    lambda_env.setenv("LEASEQ_ENQUEUE_TENANTS", str(SAMPLE_TENANT))
    runtime.reset()
    return load_app("enqueue")


def test_a_door_bound_to_a_tenant_rejects_another_tenants_job_and_stores_nothing_of_it(
        bound_door: ModuleType, owner: Conn, read_output: Callable[[], Output]) -> None:
    answer = invoke(bound_door, load_event("enqueue_batch"))

    assert [r["status"] for r in answer["results"]] == ["created", "created", "rejected"]
    refused = answer["results"][2]
    assert refused["sqlstate"] == "42501"
    assert f"tenant {OTHER_TENANT} is not one this enqueue function may enqueue for" in (
        refused["reason"])
    assert "job_id" not in refused
    assert {row["tenant_id"] for row in jobs(owner)} == {SAMPLE_TENANT}
    (line,) = read_output().messages("job rejected")
    assert line["tenant_id"] == str(OTHER_TENANT)


def test_a_bound_door_answers_nothing_about_another_tenants_key(
        bound_door: ModuleType, owner: Conn) -> None:
    """Not even whether the key exists: a repeat, a conflict and an unknown key of the
    other tenant get the same rejection, and its job's id appears nowhere."""
    (existing,) = owner.execute(
        "select id from app.enqueue_job(%s, 'secret-key', 'charge_card', '{\"n\": 1}')",
        (OTHER_TENANT,)).fetchall()
    probes = [{"tenant_id": str(OTHER_TENANT), "operation_key": key, "kind": "charge_card",
               "payload": payload}
              for key, payload in (("secret-key", {"n": 1}), ("secret-key", {"n": 2}),
                                   ("no-such-key", {"n": 1}))]

    answer = invoke(bound_door, {"jobs": probes})

    reasons = {r["reason"] for r in answer["results"]}
    assert [r["status"] for r in answer["results"]] == ["rejected"] * 3
    assert {r["sqlstate"] for r in answer["results"]} == {"42501"}
    assert len(reasons) == 1
    assert str(existing["id"]) not in str(answer)
    assert len(jobs(owner)) == 1


def test_the_database_refuses_a_tenant_the_setting_allows_but_the_login_is_not_bound_to(
        bound_door: ModuleType, lambda_env: pytest.MonkeyPatch, owner: Conn) -> None:
    """The setting is the answer, the binding the fence: a door whose setting lists more
    than the migrations bound fails the invocation (a deployment fault) and stores nothing."""
    lambda_env.setenv("LEASEQ_ENQUEUE_TENANTS", f"{SAMPLE_TENANT},{OTHER_TENANT}")
    runtime.reset()

    with pytest.raises(PermissionDeniedError, match=f"is not bound to tenant {OTHER_TENANT}"):
        invoke(bound_door, load_event("enqueue_batch"))

    assert jobs(owner) == []


def test_a_bound_door_rejecting_an_asynchronous_job_stores_the_others_then_fails_with_why(
        bound_door: ModuleType, owner: Conn) -> None:
    event = {**load_event("enqueue_batch"), "asynchronous": True}

    with pytest.raises(EnqueueRejectedError, match=f"job 2: tenant {OTHER_TENANT} is not one"):
        invoke(bound_door, event)

    assert len(jobs(owner)) == 2


# Waking a worker -----------------------------------------------------------------------------


@pytest.fixture
def pooled(lambda_env: pytest.MonkeyPatch, local_invokes: LocalInvokes) -> LocalInvokes:
    """The pool on; the worker function to wake is the local service's Probe."""
    lambda_env.setenv("LEASEQ_MAX_WORKERS", "2")
    lambda_env.setenv("LEASEQ_WORKER_FUNCTION", "Probe")
    runtime.reset()
    return local_invokes


def _tickets(admin: Conn) -> list[Any]:
    """The wakes' unexpired tickets, each the start of one worker on its way."""
    rows = admin.execute("select ticket from app.worker_wakes where ticket is not null"
                         " and ticket_expires_at > clock_timestamp()").fetchall()
    return [row["ticket"] for row in rows]


def test_a_ready_job_on_an_idle_queue_wakes_one_worker_after_the_commit(
        enqueue_app: ModuleType, pooled: LocalInvokes, owner: Conn, admin: Conn,
        read_output: Callable[[], Output]) -> None:
    answer = invoke(enqueue_app, load_event("enqueue_direct"))

    assert answer["created"] == 1
    (event,) = pooled.events(1)
    (ticket,) = _tickets(admin)
    assert event == {"source": "leaseq.pool", "reason": "wake", "reservation": str(ticket)}
    assert [row["state"] for row in jobs(owner)] == ["pending"]  # committed before the wake
    out = read_output()
    assert (out.metric("WorkersStarted"), out.metric("WorkerStartsFailed")) == ([1], [0])


def test_enqueues_while_a_worker_is_on_its_way_wake_no_other(
        enqueue_app: ModuleType, pooled: LocalInvokes, admin: Conn,
        read_output: Callable[[], Output]) -> None:
    invoke(enqueue_app, load_event("enqueue_direct"))
    invoke(enqueue_app, load_event("enqueue_batch"), request_id="req-2")
    invoke(enqueue_app, load_event("enqueue_eventbridge"), request_id="req-3")

    assert len(_tickets(admin)) == 1
    assert pooled.accepted() == 1
    assert read_output().metric("WorkersStarted") == [1, 0, 0]


def test_a_job_for_later_or_one_that_existed_wakes_nobody(
        enqueue_app: ModuleType, pooled: LocalInvokes, owner: Conn, admin: Conn,
        read_output: Callable[[], Output]) -> None:
    set_worker_pool_limits(owner, wake_debounce=0)  # any wake asked for would start one
    later = {**load_event("enqueue_direct"), "operation_key": "later",
             "available_at": (datetime.now(UTC) + timedelta(hours=1)).isoformat()}
    invoke(enqueue_app, later)
    assert (_tickets(admin), pooled.accepted()) == ([], 0)
    invoke(enqueue_app, load_event("enqueue_direct"))  # created: wakes one
    # That worker came (using the ticket) and went.
    admin.execute("update app.worker_wakes set ticket = null, ticket_expires_at = null")

    again = invoke(enqueue_app, load_event("enqueue_direct"), request_id="req-2")

    assert again["existing"] == 1
    assert _tickets(admin) == []
    assert pooled.accepted() == 1
    assert read_output().metric("WorkersStarted") == [1]


def test_a_wake_that_fails_never_fails_the_enqueue(
        enqueue_app: ModuleType, pooled: LocalInvokes, lambda_env: pytest.MonkeyPatch,
        owner: Conn, admin: Conn, read_output: Callable[[], Output]) -> None:
    lambda_env.setenv("LEASEQ_WORKER_FUNCTION", "NoSuchFunction")
    runtime.reset()

    answer = invoke(enqueue_app, load_event("enqueue_direct"))

    assert answer["created"] == 1
    assert [row["state"] for row in jobs(owner)] == ["pending"]
    assert _tickets(admin) == []  # the ticket it took is given back
    out = read_output()
    assert (out.metric("WorkersStarted"), out.metric("WorkerStartsFailed")) == ([0], [1])
    (line,) = out.messages("waking a worker failed; the scheduled worker runs the jobs")
    assert line["level"] == "WARNING"
    assert "NoSuchFunction" in line["error"]


def test_with_the_pool_off_an_enqueue_wakes_nothing_and_reports_no_wake_metrics(
        enqueue_app: ModuleType, local_invokes: LocalInvokes, admin: Conn,
        read_output: Callable[[], Output]) -> None:
    invoke(enqueue_app, load_event("enqueue_direct"))

    assert _tickets(admin) == []
    assert local_invokes.accepted() == 0
    assert "WorkersStarted" not in read_output().metric_definitions()
