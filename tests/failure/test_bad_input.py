"""Hostile enqueue input, fuzzed at each entrance: the EnqueueRequest model and the
library call, the SQL functions called directly, and the enqueue Lambda.

Each entrance may refuse only with its documented errors (pydantic's ValidationError
at the model, a per-item "rejected" result from the library, the SQL functions and the
Lambda, SQLSTATE class 22 for a call PostgreSQL cannot even parse), stores exactly the
items it reports created, and leaves a queue the worker still drains to the end.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from types import ModuleType
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from leaseq import (
    EnqueueRequest,
    InvalidRequestError,
    QueueClient,
    Registry,
    Worker,
    WorkerConfig,
    connect,
    enqueue_jobs,
)
from leaseq.base.storable import nesting_depth
from leaseq_lambda import runtime
from leaseq_lambda.enqueue import EnqueueRejectedError
from psycopg.types.json import Jsonb
from pydantic import ValidationError

from tests.conftest import Database
from tests.failure.audit import audit_queue
from tests.failure.bad_input import (
    INVISIBLE_TEXT,
    SQL_FRAGMENTS,
    enqueue_events,
    enqueue_items,
    json_values,
    kinds,
    mostly,
    nasty_text,
    nested_near_the_bound,
    operation_keys,
    plain_text,
    tenant_ids,
    valid_json,
)
from tests.functions.conftest import load_app
from tests.support.fakes import FakeDeadline, FakeLambdaContext
from tests.support.postgres import Conn


def fuzz_settings(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@dataclass(frozen=True)
class Counts:
    jobs: int
    events: int
    created_events: int


def counts(conn: Conn) -> Counts:
    row = conn.execute(
        "select (select count(*) from app.jobs) as jobs,"
        " (select count(*) from app.job_events) as events,"
        " (select count(*) from app.job_events where event_type = 'created') as created_events"
    ).fetchone()
    assert row is not None
    return Counts(row["jobs"], row["events"], row["created_events"])


def as_json_numbers(value: Any) -> Any:
    """``value`` with every number as an exact Decimal: jsonb keeps numbers as decimals
    (1e20 comes back as the integer 100000000000000000000), and compares them so."""
    return json.loads(json.dumps(value), parse_float=Decimal, parse_int=Decimal)


def stored(conn: Conn, job_id: uuid.UUID | str) -> dict[str, Any]:
    row = conn.execute(
        "select tenant_id, operation_key, kind, payload::text as payload, state::text as state"
        " from app.jobs where id = %s", (job_id,)).fetchone()
    assert row is not None, f"job {job_id} was reported but is not stored"
    row["payload"] = json.loads(row["payload"], parse_float=Decimal, parse_int=Decimal)
    return row


def assert_worker_drains_everything(db: Database, admin: Conn) -> None:
    """Whatever the fuzzers stored, a worker runs through it without an error and
    every job ends finished, with an event log that reads right. Jobs scheduled for
    later are brought forward first: the clock is moved, not waited for."""
    admin.execute("update app.jobs set available_at = now() where available_at > now()")
    admin.execute("select * from app.repair_tenant_turns(10000)")  # turns follow the clock
    registry = Registry()
    registry.register("echo", lambda payload, context: {"seen": True})
    client = QueueClient(lambda: connect(db.worker_dsn))
    worker = Worker(client, registry, WorkerConfig(owner="after-fuzz", poll_idle=0))
    try:
        for _ in range(50):
            report = worker.drain(FakeDeadline(120))
            if report.stopped == "queue_empty" and report.claimed == 0:
                break
    finally:
        client.close()
    audit = audit_queue(admin, side_effects=False)
    assert audit.violations == [], "\n".join(audit.violations[:10])
    assert audit.states["succeeded"] + audit.states["dead"] == audit.jobs


# The model and the library ---------------------------------------------------------------


def test_fuzzed_requests_are_stored_or_rejected_item_by_item_with_documented_errors(
    db: Database, worker: Conn, admin: Conn
) -> None:
    outcomes: dict[str, int] = {"invalid": 0, "stored": 0}
    # What the model lets through and the database turns down: none, since both apply
    # the same rules.
    database_only: dict[str, int] = {"refused": 0, "rejected": 0}

    @fuzz_settings(250)
    @given(raw_items=st.lists(enqueue_items(), min_size=1, max_size=5))
    def fuzz(raw_items: list[Any]) -> None:
        requests = []
        for raw in raw_items:
            try:
                requests.append(EnqueueRequest.model_validate(raw))
            except ValidationError:
                outcomes["invalid"] += 1
        if not requests:
            return
        before = counts(admin)
        try:
            results = enqueue_jobs(worker, requests)
        except InvalidRequestError:
            database_only["refused"] += 1
            assert counts(admin) == before, "a refused batch left rows behind"
            return
        outcomes["stored"] += 1
        created = {r.job_id for r in results if r.status == "created"}
        after = counts(admin)
        assert after.jobs - before.jobs == len(created)
        assert after.events - before.events == len(created)
        assert after.created_events - before.created_events == len(created)
        for request, result in zip(requests, results, strict=True):
            if result.rejected:
                database_only["rejected"] += 1
                assert (result.job_id, result.state) == (None, None), result
                assert result.error is not None
                assert result.error.startswith(f"job {result.index + 1}: "), result
                continue
            if result.status == "conflict":
                # A conflict names no job; the key's stored job has another kind or payload.
                assert (result.job_id, result.state) == (None, None), result
                (found,) = admin.execute(
                    "select id from app.jobs where tenant_id = %s and operation_key = %s",
                    (request.tenant_id, request.operation_key)).fetchall()
                row = stored(admin, found["id"])
            else:
                assert result.job_id is not None
                row = stored(admin, result.job_id)
            assert (row["tenant_id"], row["operation_key"]) == (
                request.tenant_id, request.operation_key)
            same = (row["kind"], row["payload"]) == (request.kind,
                                                     as_json_numbers(request.payload))
            assert same is (result.status != "conflict"), (result, row)

    fuzz()
    assert all(outcomes.values()), (outcomes, database_only)
    # The model refuses everything the SQL contract would: a batch it accepted is never
    # refused whole, and no item of it is rejected by the database.
    assert database_only == {"refused": 0, "rejected": 0}, database_only
    assert_worker_drains_everything(db, admin)


def test_sql_fragments_are_stored_as_data_and_read_back_unchanged(
    worker: Conn, admin: Conn
) -> None:
    tenant = uuid.uuid4()
    requests = [EnqueueRequest(tenant_id=tenant, operation_key=fragment, kind=fragment[:128],
                               payload={fragment: fragment})
                for fragment in SQL_FRAGMENTS]
    results = enqueue_jobs(worker, requests)
    assert [r.status for r in results] == ["created"] * len(SQL_FRAGMENTS)
    for request, result in zip(requests, results, strict=True):
        row = stored(admin, result.job_id)
        assert (row["operation_key"], row["kind"], row["payload"]) == (
            request.operation_key, request.kind, as_json_numbers(request.payload))
    assert counts(admin) == Counts(len(SQL_FRAGMENTS), len(SQL_FRAGMENTS), len(SQL_FRAGMENTS))


# The SQL contract, called directly ---------------------------------------------------------

#: PostgreSQL data exceptions (class 22) are the contract's refusals; the client
#: library refuses what it cannot encode (NUL in text, lone surrogates) before sending.
CLIENT_SIDE_REFUSALS = (psycopg.DataError, UnicodeEncodeError)


valid_json_objects = st.dictionaries(plain_text, valid_json, max_size=3).map(json.dumps)


def _json_text(value: Any) -> str:
    """JSON text as a SQL caller may send it: also for an integer json.dumps refuses
    (over Python's digit limit), which PostgreSQL accepts written with an exponent."""
    try:
        return json.dumps(value, allow_nan=True)
    except ValueError:
        return '{"n": 1e5000, "note": "an integer of 5,001 digits once stored"}'


def _payload_texts() -> st.SearchStrategy[str]:
    return st.one_of(
        json_values.map(_json_text),
        st.dictionaries(st.text(max_size=5), json_values, max_size=4).map(_json_text),
        st.sampled_from(['{"a": "\\u0000"}', '{"\\u0000": 1}', "{", "", "[]", "null",
                         '{"a": 1} trailing', '{"a": "\\ud800"}', "NaN"]),
        # jsonb stores these; a worker's decoder could not read the longer ones back.
        st.sampled_from(['{"n": 1e5000}', '{"n": 1e1000}', '{"n": 1e999}',
                         '{"n": [1, {"m": -0.' + "0" * 1000 + '1}]}']),
        nasty_text,
    )


def test_fuzzed_sql_calls_reject_bad_items_or_are_refused_whole_with_data_exceptions(
    db: Database, worker: Conn, admin: Conn
) -> None:
    refusals: dict[str, int] = {}

    @fuzz_settings(250)
    @given(items=st.lists(st.tuples(tenant_ids.map(lambda t: None if t is None else str(t)),
                                    operation_keys.map(lambda k: None if k is None else str(k)),
                                    kinds,
                                    mostly(valid_json_objects, _payload_texts())),
                          min_size=1, max_size=3))
    def fuzz(items: list[tuple[str | None, str | None, str | None, str | None]]) -> None:
        before = counts(admin)
        try:
            rows = worker.execute(
                "select ord, job_id, status, error from app.enqueue_jobs("
                "%s::text[]::uuid[], %s::text[], %s::text[], %s::text[]::jsonb[])",
                ([i[0] for i in items], [i[1] for i in items], [i[2] for i in items],
                 [i[3] for i in items])).fetchall()
        except (psycopg.Error, UnicodeEncodeError) as exc:
            sqlstate = getattr(exc, "sqlstate", None)
            refusal = sqlstate or ("client" if isinstance(exc, CLIENT_SIDE_REFUSALS) else repr(exc))
            refusals[refusal] = refusals.get(refusal, 0) + 1
            problem = f"{refusal}: {exc}"
        else:
            created = {r["job_id"] for r in rows if r["status"] == "created"}
            assert counts(admin).jobs - before.jobs == len(created)
            for row in rows:
                if row["status"] == "rejected":
                    assert row["job_id"] is None, row
                    assert row["error"].startswith(f"job {row['ord']}: "), row
                    refusals["rejected"] = refusals.get("rejected", 0) + 1
            refusals["stored"] = refusals.get("stored", 0) + 1
            return
        assert refusal == "client" or refusal.startswith("22"), problem
        assert counts(admin) == before, "a refused call left rows behind"

    fuzz()
    assert {"rejected", "22P02", "stored", "client"} <= set(refusals), refusals
    assert_worker_drains_everything(db, admin)


def test_a_nul_escape_in_a_payload_is_refused_with_22P05_and_stores_nothing(
    worker: Conn, admin: Conn
) -> None:
    with pytest.raises(psycopg.errors.UntranslatableCharacter):
        worker.execute("select app.enqueue_job(%s, 'k', 'echo', %s::jsonb)",
                       (uuid.uuid4(), '{"a": "x\\u0000y"}'))
    assert counts(admin) == Counts(0, 0, 0)


# The enqueue Lambda ---------------------------------------------------------------------


@pytest.fixture
def enqueue_function(db: Database, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    for key, value in {
        "DATABASE_URL": db.worker_dsn,
        "POWERTOOLS_SERVICE_NAME": "leaseq",
        "POWERTOOLS_METRICS_NAMESPACE": "Leaseq",
        "POWERTOOLS_TRACE_DISABLED": "true",
        "POWERTOOLS_LOG_LEVEL": "ERROR",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_LAMBDA_FUNCTION_NAME": "leaseq-enqueue",
    }.items():
        monkeypatch.setenv(key, value)
    runtime.reset()
    yield load_app("enqueue")
    runtime.reset()


def _items_of(event: Any) -> list[Any] | None:
    """The job items of an event, by the documented shapes; None if it has none."""
    body = event.get("detail") if isinstance(event, dict) and "detail-type" in event else event
    if isinstance(body, dict) and isinstance(body.get("jobs"), list):
        return list(body["jobs"])
    return [body] if isinstance(body, dict) and "jobs" not in body else None


def test_fuzzed_events_get_one_answer_per_item_and_store_exactly_the_created_jobs(
    db: Database, enqueue_function: ModuleType, admin: Conn
) -> None:
    statuses: dict[str, int] = {}

    @fuzz_settings(250)
    @given(event=enqueue_events())
    def fuzz(event: Any) -> None:
        before = counts(admin)
        failure: EnqueueRejectedError | None = None
        try:
            answer = enqueue_function.lambda_handler(
                event, FakeLambdaContext(function_name="leaseq-enqueue"))
        except EnqueueRejectedError as exc:
            failure = exc
        if failure is not None:
            # Asynchronous (EventBridge, or a batch marked so): rejections fail the
            # invocation after the valid jobs are stored, naming each rejected job.
            assert isinstance(event, dict)
            assert "detail-type" in event or event.get("asynchronous") is True
            summary = re.match(r"(\d+) of (\d+) jobs rejected \(the other (\d+) were "
                               r"enqueued\): job \d+: .", str(failure))
            assert summary is not None, str(failure)
            rejected, total, stored_ = (int(n) for n in summary.groups())
            assert 1 <= rejected <= total == rejected + stored_
            assert counts(admin).jobs - before.jobs <= stored_
            statuses["rejected"] = statuses.get("rejected", 0) + rejected
            return
        results = answer["results"]
        assert [r["index"] for r in results] == list(range(len(results)))
        for status in ("created", "existing", "rejected"):
            assert answer[status] == sum(r["status"] == status for r in results)
            statuses[status] = statuses.get(status, 0) + answer[status]
        assert answer["created"] + answer["existing"] + answer["rejected"] == len(results) >= 1
        created = {r["job_id"] for r in results if r["status"] == "created"}
        after = counts(admin)
        assert after.jobs - before.jobs == len(created)
        assert after.events - before.events == len(created)
        items = _items_of(event)
        for result in results:
            if result["status"] == "rejected":
                assert isinstance(result["reason"], str)
                assert result["reason"]
                continue
            assert items is not None
            assert len(results) == len(items)
            item, row = items[result["index"]], stored(admin, result["job_id"])
            assert str(row["tenant_id"]) == str(uuid.UUID(str(item["tenant_id"])))
            assert (row["operation_key"], row["kind"], row["payload"]) == (
                item["operation_key"], item["kind"], as_json_numbers(item.get("payload", {})))

    fuzz()
    assert statuses.get("created"), statuses
    assert statuses.get("rejected"), statuses
    assert_worker_drains_everything(db, admin)


# Nesting deeper than Python's json module can decode is refused at every door --------

DEEP = 2_000


def test_a_payload_too_deep_to_decode_is_refused_at_the_door_and_the_worker_runs_on(
    db: Database, worker: Conn, admin: Conn
) -> None:
    """Stored, it would poison every claim: the worker could not decode the row."""
    tenant = uuid.uuid4()
    deep_text = '{"n":' * DEEP + "1" + "}" * DEEP
    with pytest.raises(psycopg.Error) as refused:
        worker.execute("select app.enqueue_job(%s, 'deep', 'echo', %s::text::jsonb)",
                       (tenant, deep_text))
    assert refused.value.sqlstate == "22023"
    assert "at most 100 levels" in str(refused.value)
    worker.execute("select app.enqueue_job(%s, 'plain', 'echo', %s)", (tenant, Jsonb({})))
    assert_worker_drains_everything(db, admin)
    rows = admin.execute("select operation_key, state::text as state from app.jobs").fetchall()
    assert {r["operation_key"]: r["state"] for r in rows} == {"plain": "succeeded"}


def test_the_nesting_bound_is_the_same_for_the_model_and_the_sql_contract(
    worker: Conn, admin: Conn
) -> None:
    """A payload pydantic accepts must not be refused by SQL, and the reverse: one
    bound, enforced at both doors, so a library caller and a SQL caller agree."""
    seen = set()

    @fuzz_settings(150)
    @given(payload=nested_near_the_bound())
    def fuzz(payload: dict[str, Any]) -> None:
        try:
            EnqueueRequest(tenant_id=uuid.uuid4(), operation_key="deep", kind="echo",
                           payload=payload)
        except ValidationError:
            model_accepts = False
        else:
            model_accepts = True
        try:
            with worker.transaction(force_rollback=True):
                worker.execute("select app.enqueue_job(%s, 'deep', 'echo', %s)",
                               (uuid.uuid4(), Jsonb(payload)))
        except psycopg.errors.InvalidParameterValue:
            sql_accepts = False
        else:
            sql_accepts = True
        assert model_accepts is sql_accepts, f"depth {nesting_depth(payload)}"
        seen.add(model_accepts)

    fuzz()
    assert seen == {True, False}
    assert counts(admin) == Counts(0, 0, 0)


def test_a_payload_nested_too_deep_is_a_validation_error(worker: Conn) -> None:
    from tests.failure.bad_input import nested

    with pytest.raises(ValidationError):
        EnqueueRequest(tenant_id=uuid.uuid4(), operation_key="deep", kind="echo",
                       payload=nested(950))


def test_the_enqueue_function_rejects_an_item_nested_too_deep(
    enqueue_function: ModuleType, admin: Conn
) -> None:
    from tests.failure.bad_input import nested

    event = {"tenant_id": str(uuid.uuid4()), "operation_key": "deep", "kind": "echo",
             "payload": nested(950)}
    answer = enqueue_function.lambda_handler(event, FakeLambdaContext())
    assert answer["rejected"] == 1
    assert counts(admin) == Counts(0, 0, 0)


# The number and blank rules: one answer at both doors ----------------------------------

#: (field, value, the rule's answer). Numbers are measured as PostgreSQL writes them:
#: digits, and a minus sign for a negative number.
RULE_CASES: list[tuple[str, Any, bool]] = [
    ("payload", {"n": 10**1000 - 1}, True),
    ("payload", {"n": 10**1000}, False),
    ("payload", {"n": -(10**999 - 1)}, True),
    ("payload", {"n": -(10**999)}, False),
    ("payload", {"a": [1, {"m": 10**1500}]}, False),
    ("payload", {"tiny": 5e-324, "huge": 1.7976931348623157e308}, True),
    *[(field, text, False) for field in ("kind", "operation_key")
      for text in INVISIBLE_TEXT if text],
    *[(field, text, True) for field in ("kind", "operation_key")
      for text in ("a\u00a0", "\u3000x", "\u0301", "rapport_\u00e9", "\u5831\u544a")],
    # Visible, but holding a control, format or line separator character.
    *[(field, text, False) for field in ("kind", "operation_key")
      for text in ("a\u200b", "\u2060x", "\x1c", "a\nb", "a\x1b[31m", "a\u202eb")],
]


def test_the_number_and_blank_rules_are_the_same_for_the_model_and_the_sql_contract(
    worker: Conn, admin: Conn
) -> None:
    disagreements = []
    for field, value, expected in RULE_CASES:
        item: dict[str, Any] = {"tenant_id": uuid.uuid4(), "operation_key": "k", "kind": "echo",
                                "payload": {}, field: value}
        try:
            EnqueueRequest.model_validate(item)
        except ValidationError:
            model_accepts = False
        else:
            model_accepts = True
        try:
            with worker.transaction(force_rollback=True):
                worker.execute("select app.enqueue_job(%s, %s, %s, %s)",
                               (item["tenant_id"], item["operation_key"], item["kind"],
                                Jsonb(item["payload"])))
        except psycopg.errors.InvalidParameterValue:
            sql_accepts = False
        else:
            sql_accepts = True
        assert model_accepts is expected, (field, repr(value)[:40])
        if sql_accepts is not expected:
            disagreements.append((field, repr(value)[:40]))
    assert disagreements == []
    assert counts(admin) == Counts(0, 0, 0)
