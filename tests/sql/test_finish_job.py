"""Contract of app.complete_job, app.fail_job, app.discard_job and app.finish_jobs."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from tests.sql.calls import (
    WORKER_NAME,
    claim,
    claim_one,
    enqueue,
    enqueue_many,
    event_insert_statements,
    event_types,
    events,
    expire_lease,
    job,
    new_tenant,
    raises_sqlstate,
    snapshot,
)
from tests.support.postgres import Conn


def _running(worker: Conn, *, max_attempts: int = 6) -> dict[str, Any]:
    tenant = new_tenant()
    enqueue(worker, tenant, "op", max_attempts=max_attempts)
    return claim_one(worker, tenant)


def _complete(
    conn: Conn, lease: dict[str, Any], result: Any = None, *,
    tenant: uuid.UUID | None = None, owner: str | None = None, token: uuid.UUID | None = None,
) -> bool:
    row = conn.execute(
        "select app.complete_job(%s, %s, %s, %s, %s) as ok",
        (
            tenant or lease["tenant_id"],
            lease["id"],
            owner or lease["lease_owner"],
            token or lease["lease_token"],
            None if result is None else Jsonb(result),
        ),
    ).fetchone()
    assert row is not None
    return bool(row["ok"])


def _fail(
    conn: Conn, lease: dict[str, Any], error: Any, delay: timedelta | None = timedelta(seconds=5),
    *, tenant: uuid.UUID | None = None, owner: str | None = None, token: uuid.UUID | None = None,
) -> str | None:
    row = conn.execute(
        "select app.fail_job(%s, %s, %s, %s, %s, %s) as state",
        (
            tenant or lease["tenant_id"],
            lease["id"],
            owner or lease["lease_owner"],
            token or lease["lease_token"],
            None if error is None else Jsonb(error),
            delay,
        ),
    ).fetchone()
    assert row is not None
    return row["state"]  # type: ignore[no-any-return]


def _discard(conn: Conn, lease: dict[str, Any], error: Any) -> str | None:
    row = conn.execute(
        "select app.discard_job(%s, %s, %s, %s, %s) as state",
        (lease["tenant_id"], lease["id"], lease["lease_owner"], lease["lease_token"],
         Jsonb(error)),
    ).fetchone()
    assert row is not None
    return row["state"]  # type: ignore[no-any-return]


# complete_job ---------------------------------------------------------------------------


def test_complete_under_live_lease_stores_result_clears_lease_and_writes_one_event(
    worker: Conn, owner: Conn
) -> None:
    lease = _running(worker)

    assert _complete(worker, lease, {"sent": 3})

    done = job(owner, lease["id"])
    assert done["state"] == "succeeded"
    assert done["result"] == {"sent": 3}
    assert (done["lease_owner"], done["lease_token"], done["lease_expires_at"]) == (None,) * 3
    assert done["completed_at"] is not None
    audit = events(owner, lease["id"])
    assert [e["event_type"] for e in audit] == ["created", "claimed", "succeeded"]
    assert audit[-1]["lease_token"] == lease["lease_token"]
    assert audit[-1]["actor"] == WORKER_NAME


def test_second_completion_of_the_same_lease_returns_false_and_writes_nothing(
    worker: Conn, owner: Conn
) -> None:
    lease = _running(worker)
    assert _complete(worker, lease, {"n": 1})
    before = snapshot(owner)

    assert not _complete(worker, lease, {"n": 2})

    assert snapshot(owner) == before


def test_complete_with_null_result_stores_json_null(worker: Conn, owner: Conn) -> None:
    """Reference defect 16: SQL NULL was stored, indistinguishable from 'no result yet'."""
    lease = _running(worker)

    assert _complete(worker, lease, None)

    row = owner.execute(
        "select result is null as sql_null, jsonb_typeof(result) as type from app.jobs"
        " where id = %s",
        (lease["id"],),
    ).fetchone()
    assert row == {"sql_null": False, "type": "null"}


def test_complete_with_result_over_256_kib_raises_22023_and_keeps_the_lease(
    worker: Conn, owner: Conn
) -> None:
    lease = _running(worker)
    before = snapshot(owner)
    with raises_sqlstate("22023", match="result must be at most 262144 bytes"):
        _complete(worker, lease, {"blob": "x" * 262_144})
    assert snapshot(owner) == before


@pytest.mark.parametrize("fence", ["token", "owner", "tenant"])
def test_completion_fenced_by_token_owner_and_tenant_changes_nothing(
    worker: Conn, owner: Conn, fence: str
) -> None:
    lease = _running(worker)
    before = snapshot(owner)
    choices: dict[str, dict[str, Any]] = {
        "token": {"token": uuid.uuid4()},
        "owner": {"owner": "impostor"},
        "tenant": {"tenant": new_tenant()},
    }
    wrong = choices[fence]

    assert not _complete(worker, lease, {"x": 1}, **wrong)
    assert _fail(worker, lease, {"x": 1}, **wrong) is None

    assert snapshot(owner) == before


def test_outcomes_after_the_lease_expired_are_refused(worker: Conn, owner: Conn) -> None:
    lease = _running(worker)
    expire_lease(owner, lease["id"])
    before = snapshot(owner)

    assert not _complete(worker, lease, {"late": True})
    assert _fail(worker, lease, {"late": True}) is None
    assert _discard(worker, lease, {"late": True}) is None

    assert snapshot(owner) == before


# fail_job -------------------------------------------------------------------------------


def test_fail_schedules_a_retry_after_the_delay_with_one_retry_event(
    worker: Conn, owner: Conn
) -> None:
    lease = _running(worker)
    before = datetime.now(UTC)

    assert _fail(worker, lease, {"code": "TIMEOUT"}, timedelta(minutes=2)) == "retry_wait"

    row = job(owner, lease["id"])
    assert row["last_error"] == {"code": "TIMEOUT"}
    assert before + timedelta(seconds=110) < row["available_at"] < before + timedelta(seconds=130)
    assert row["completed_at"] is None
    assert row["lease_token"] is None
    audit = events(owner, lease["id"])
    assert [e["event_type"] for e in audit] == ["created", "claimed", "retry_scheduled"]
    assert audit[-1]["details"]["error"] == {"code": "TIMEOUT"}
    assert audit[-1]["details"]["attempt"] == 1
    assert audit[-1]["lease_token"] == lease["lease_token"]


def test_zero_retry_delay_makes_the_job_ready_now_not_earlier(worker: Conn, owner: Conn) -> None:
    lease = _running(worker)
    before = datetime.now(UTC)
    assert _fail(worker, lease, {}, timedelta(0)) == "retry_wait"
    assert job(owner, lease["id"])["available_at"] >= before - timedelta(seconds=1)
    assert claim(worker, lease["tenant_id"])[0]["attempts"] == 2


def test_fail_at_max_attempts_makes_the_job_dead(worker: Conn, owner: Conn) -> None:
    tenant = new_tenant()
    enqueue(worker, tenant, "op", max_attempts=2)
    first = claim_one(worker, tenant)
    assert _fail(worker, first, {"n": 1}, timedelta(0)) == "retry_wait"
    second = claim_one(worker, tenant)

    assert _fail(worker, second, {"n": 2}, timedelta(0)) == "dead"

    row = job(owner, first["id"])
    assert (row["state"], row["attempts"], row["last_error"]) == ("dead", 2, {"n": 2})
    assert row["completed_at"] is not None
    audit = events(owner, first["id"])
    assert [e["event_type"] for e in audit] == [
        "created", "claimed", "retry_scheduled", "claimed", "dead"
    ]
    assert audit[-1]["details"]["reason"] == "max_attempts"


@pytest.mark.parametrize(
    "delay",
    [None, timedelta(seconds=-1), timedelta(days=-3), timedelta(days=30, seconds=1)],
    ids=["null", "minus-1s", "minus-3-days", "over-30-days"],
)
def test_retry_delay_outside_0_to_30_days_raises_22023_and_changes_nothing(
    worker: Conn, owner: Conn, delay: timedelta | None
) -> None:
    """Reference defect 13: a negative delay jumped the queue, a NULL one lost the failure."""
    lease = _running(worker)
    before = snapshot(owner)

    with raises_sqlstate("22023", match="retry delay must be between 00:00:00 and 30 days"):
        _fail(worker, lease, {"code": "X"}, delay)

    assert snapshot(owner) == before
    # The lease is still held, so the worker can report the failure again correctly.
    assert _fail(worker, lease, {"code": "X"}, timedelta(seconds=1)) == "retry_wait"


@pytest.mark.parametrize(
    ("error", "stored"),
    [
        (None, {"message": None}),
        ("boom", {"message": "boom"}),
        ([1, 2], {"message": [1, 2]}),
        ({"code": "E"}, {"code": "E"}),
    ],
    ids=["null", "string", "array", "object"],
)
def test_any_error_document_is_recorded_as_an_object(
    worker: Conn, owner: Conn, error: Any, stored: dict[str, Any]
) -> None:
    """No failure report is lost because of the shape of its error document."""
    lease = _running(worker)

    assert _fail(worker, lease, error) == "retry_wait"

    assert job(owner, lease["id"])["last_error"] == stored
    assert events(owner, lease["id"])[-1]["details"]["error"] == stored


def test_huge_error_is_truncated_not_refused(worker: Conn, owner: Conn) -> None:
    lease = _running(worker)
    error = {"trace": "frame\n" * 50_000}

    assert _fail(worker, lease, error) == "retry_wait"

    stored = job(owner, lease["id"])["last_error"]
    assert stored["code"] == "ERROR_TRUNCATED"
    assert stored["truncated"].startswith('{"trace": "frame\\nframe')
    assert len(stored["truncated"]) == 8192
    assert events(owner, lease["id"])[-1]["details"]["error"] == stored


#: Documents jsonb accepts and a standard JSON decoder (Python's json) cannot read back:
#: a number of more than 4,300 digits, nesting deeper than the decoder's recursion.
UNREADABLE_DOCUMENTS = {
    "5001-digit-number": ('{"n": 1e5000}', "numbers must be at most 1000 characters as JSON text"),
    "1001-digit-number-at-the-top": ("1e1000",
                                     "numbers must be at most 1000 characters as JSON text"),
    "5000-levels-deep": ("[" * 5000 + "]" * 5000,
                         "must nest at most 100 levels below its top level"),
}


def _as_text(conn: Conn, sql: str, job_id: uuid.UUID) -> list[str]:
    """Columns read as JSON text, so that an unreadable document fails here, not in
    the driver."""
    return [r["text"] for r in conn.execute(sql, (job_id,)).fetchall()]


@pytest.mark.parametrize(("document", "problem"), list(UNREADABLE_DOCUMENTS.values()),
                         ids=list(UNREADABLE_DOCUMENTS))
def test_an_error_document_a_decoder_could_not_read_is_truncated_not_refused(
    worker: Conn, owner: Conn, document: str, problem: str
) -> None:
    lease = _running(worker)

    state = worker.execute(
        "select app.fail_job(%s, %s, %s, %s, %s::text::jsonb) as state",
        (lease["tenant_id"], lease["id"], lease["lease_owner"], lease["lease_token"], document),
    ).fetchone()

    assert state == {"state": "retry_wait"}
    stored = _as_text(owner, "select last_error::text as text from app.jobs where id = %s",
                      lease["id"])
    logged = _as_text(owner, "select (details -> 'error')::text as text from app.job_events"
                             " where job_id = %s and event_type = 'retry_scheduled'", lease["id"])
    assert stored == logged
    error = json.loads(stored[0])
    assert error["code"] == "ERROR_TRUNCATED"
    assert error["problem"] == f"the error document {problem}"
    written = owner.execute("select left(%s::text::jsonb::text, 8192) as text",
                            (document,)).fetchone()
    assert written is not None
    assert error["truncated"] == written["text"]


@pytest.mark.parametrize(
    ("document", "message"),
    [('{"n": 1e5000}', "result numbers must be at most 1000 characters as JSON text"),
     ("1e1000", "result numbers must be at most 1000 characters as JSON text"),
     ('{"a": [' + "1, " * 500 + '-1e1200]}',
      "result numbers must be at most 1000 characters as JSON text"),
     ("[" * 5000 + "]" * 5000, "result must nest at most 100 levels below its top level"),
     ("[" * 102 + "]" * 102, "result must nest at most 100 levels below its top level")],
    ids=["5001-digit-number", "1001-digit-number-at-the-top", "in-a-list", "5000-levels-deep",
         "101-levels-below-the-top"],
)
def test_a_result_a_producer_could_not_decode_is_refused_with_22023_and_keeps_the_lease(
    worker: Conn, owner: Conn, document: str, message: str
) -> None:
    """A worker's credentials must not plant a result that breaks the producer reading it."""
    lease = _running(worker)
    before = snapshot(owner)

    with raises_sqlstate("22023", f"outcome 1: {message}"):
        worker.execute(
            "select app.complete_job(%s, %s, %s, %s, %s::text::jsonb)",
            (lease["tenant_id"], lease["id"], lease["lease_owner"], lease["lease_token"],
             document))

    assert snapshot(owner) == before
    assert _complete(worker, lease, {"n": 10**999, "deep": _nested_list(99)})
    assert job(owner, lease["id"])["result"]["n"] == 10**999


def _nested_list(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


# discard_job ----------------------------------------------------------------------------


def test_discard_makes_the_job_dead_at_once_whatever_attempts_remain(
    worker: Conn, owner: Conn
) -> None:
    lease = _running(worker, max_attempts=20)

    assert _discard(worker, lease, {"code": "UNKNOWN_KIND"}) == "dead"

    row = job(owner, lease["id"])
    assert (row["state"], row["attempts"]) == ("dead", 1)
    assert row["last_error"] == {"code": "UNKNOWN_KIND"}
    audit = events(owner, lease["id"])
    assert [e["event_type"] for e in audit] == ["created", "claimed", "dead"]
    assert audit[-1]["details"]["reason"] == "discarded"


# finish_jobs (batch) --------------------------------------------------------------------


def _finish(conn: Conn, owner_name: str, items: list[tuple[Any, ...]]) -> dict[uuid.UUID, str]:
    tenants, ids, tokens, outcomes, details, delays = (list(c) for c in zip(*items, strict=True))
    rows = conn.execute(
        "select * from app.finish_jobs(%s, %s, %s, %s, %s, %s, %s)",
        (owner_name, tenants, ids, tokens, outcomes,
         [None if d is None else Jsonb(d) for d in details], delays),
    ).fetchall()
    return {r["job_id"]: r["state"] for r in rows}


def test_batch_applies_mixed_outcomes_and_skips_a_stale_token(worker: Conn, owner: Conn) -> None:
    tenant = new_tenant()
    enqueue_many(worker, tenant, 4)
    a, b, c, d = claim(worker, tenant, limit=4)

    applied = _finish(
        worker,
        WORKER_NAME,
        [
            (tenant, a["id"], a["lease_token"], "succeeded", {"ok": 1}, None),
            (tenant, b["id"], b["lease_token"], "retry", {"code": "E"}, timedelta(seconds=10)),
            (tenant, c["id"], c["lease_token"], "dead", {"code": "BAD"}, None),
            (tenant, d["id"], uuid.uuid4(), "succeeded", {"ok": 2}, None),
        ],
    )

    assert applied == {a["id"]: "succeeded", b["id"]: "retry_wait", c["id"]: "dead"}
    assert job(owner, d["id"])["state"] == "running"
    assert event_types(owner, a["id"]) == ["created", "claimed", "succeeded"]
    assert event_types(owner, b["id"]) == ["created", "claimed", "retry_scheduled"]
    assert event_types(owner, c["id"]) == ["created", "claimed", "dead"]
    assert event_types(owner, d["id"]) == ["created", "claimed"]


def test_batch_writes_all_its_events_with_one_insert_statement(
    worker: Conn, admin: Conn
) -> None:
    tenant = new_tenant()
    enqueue_many(worker, tenant, 3)
    leases = claim(worker, tenant, limit=3)
    with event_insert_statements(admin, worker) as statements:
        _finish(worker, WORKER_NAME, [
            (tenant, leases[0]["id"], leases[0]["lease_token"], "succeeded", {}, None),
            (tenant, leases[1]["id"], leases[1]["lease_token"], "retry", {}, timedelta(0)),
            (tenant, leases[2]["id"], leases[2]["lease_token"], "dead", {}, None),
        ])
    assert statements == [3]


@pytest.mark.parametrize(
    ("outcome", "token", "message"),
    [
        ("finished", uuid.uuid4(), "must be succeeded, retry, dead or exhausted (got finished)"),
        (None, uuid.uuid4(), "must be succeeded, retry, dead or exhausted (got NULL)"),
        ("succeeded", None, "tenant_id, job_id and token are required"),
    ],
)
def test_batch_refuses_unknown_outcomes_and_missing_fences_with_22023(
    worker: Conn, owner: Conn, outcome: str | None, token: uuid.UUID | None, message: str
) -> None:
    lease = _running(worker)
    before = snapshot(owner)
    with raises_sqlstate("22023", match=f"outcome 2: {message}"):
        _finish(worker, WORKER_NAME, [
            (lease["tenant_id"], lease["id"], lease["lease_token"], "succeeded", {}, None),
            (lease["tenant_id"], lease["id"], token, outcome, {}, None),
        ])
    assert snapshot(owner) == before


def test_batch_with_arrays_of_different_lengths_raises_22023(worker: Conn) -> None:
    with raises_sqlstate("22023", match="finish arrays must all have the same length"):
        worker.execute(
            "select * from app.finish_jobs('w', %s, %s, %s, %s, %s, %s)",
            ([new_tenant()], [uuid.uuid4()], [uuid.uuid4()], ["succeeded", "retry"],
             [Jsonb({})], [None]),
        )


def test_empty_batch_raises_22023(worker: Conn) -> None:
    with raises_sqlstate("22023", match="number of outcomes must be between 1 and 1000"):
        worker.execute(
            "select * from app.finish_jobs('w', '{}', '{}', '{}', '{}', '{}', '{}')"
        )


def test_the_same_job_twice_in_one_batch_is_finished_once_with_one_event(
    worker: Conn, owner: Conn
) -> None:
    lease = _running(worker)
    item = (lease["tenant_id"], lease["id"], lease["lease_token"], "succeeded", {"n": 1}, None)

    applied = _finish(worker, WORKER_NAME, [item, item])

    assert applied == {lease["id"]: "succeeded"}
    assert event_types(owner, lease["id"]) == ["created", "claimed", "succeeded"]
