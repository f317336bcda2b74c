"""app.finish_and_claim_jobs: one call records a batch's outcomes and claims the next."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from psycopg.types.json import Jsonb

from tests.sql.calls import (
    WORKER_NAME,
    claim,
    enqueue_many,
    event_types,
    expire_lease,
    job,
    new_tenant,
    raises_sqlstate,
    snapshot,
)
from tests.support.postgres import Conn

LEASE = timedelta(seconds=30)


def finish_and_claim(conn: Conn, done: list[dict[str, Any]], outcomes: list[str], *,
                     limit: int | None = 10) -> list[dict[str, Any]]:
    return conn.execute(
        "select * from app.finish_and_claim_jobs(%s, %s::uuid[], %s::uuid[], %s::uuid[],"
        " %s::text[], %s::jsonb[], %s::interval[], %s, %s)",
        (WORKER_NAME, [j["tenant_id"] for j in done], [j["id"] for j in done],
         [j["lease_token"] for j in done], outcomes, [Jsonb({"ok": True}) for _ in done],
         [timedelta(seconds=60) for _ in done], limit, LEASE),
    ).fetchall()


def test_outcomes_come_first_then_the_next_batch_claimed_in_the_same_call(
        worker: Conn, owner: Conn) -> None:
    tenant = new_tenant()
    enqueue_many(worker, tenant, 5)
    first = claim(worker, tenant, limit=2)

    rows = finish_and_claim(worker, first, ["succeeded", "retry"], limit=2)

    finished = [r for r in rows if not r["claimed"]]
    claimed = [r for r in rows if r["claimed"]]
    assert [r["claimed"] for r in rows] == [False, False, True, True]
    assert {r["id"]: r["state"] for r in finished} == {
        first[0]["id"]: "succeeded", first[1]["id"]: "retry_wait"}
    assert len(claimed) == 2
    assert all(r["state"] == "running" and r["lease_token"] is not None for r in claimed)
    assert {r["id"] for r in claimed}.isdisjoint({j["id"] for j in first})
    assert event_types(owner, first[0]["id"]) == ["created", "claimed", "succeeded"]
    assert event_types(owner, claimed[0]["id"]) == ["created", "claimed"]


def test_a_stale_token_gives_no_outcome_row_and_the_claim_still_happens(
        worker: Conn, admin: Conn) -> None:
    tenant = new_tenant()
    enqueue_many(worker, tenant, 3)
    (stale,) = claim(worker, tenant, limit=1)
    expire_lease(admin, stale["id"])

    rows = finish_and_claim(worker, [stale], ["succeeded"], limit=10)

    assert [r for r in rows if not r["claimed"]] == []
    assert len([r for r in rows if r["claimed"]]) == 2
    assert job(admin, stale["id"])["state"] == "running"  # the reaper's to release


def test_limit_zero_only_records_and_an_empty_batch_only_claims(worker: Conn) -> None:
    tenant = new_tenant()
    enqueue_many(worker, tenant, 3)
    (first,) = claim(worker, tenant, limit=1)

    only_finished = finish_and_claim(worker, [first], ["succeeded"], limit=0)
    only_claimed = finish_and_claim(worker, [], [], limit=10)

    assert [(r["claimed"], r["state"]) for r in only_finished] == [(False, "succeeded")]
    assert [r["claimed"] for r in only_claimed] == [True, True]


def test_a_refused_outcome_refuses_the_claim_and_changes_nothing(
        worker: Conn, owner: Conn) -> None:
    tenant = new_tenant()
    enqueue_many(worker, tenant, 3)
    first = claim(worker, tenant, limit=1)
    before = snapshot(owner)

    with raises_sqlstate("22023", match="must be succeeded, retry, dead or exhausted"):
        finish_and_claim(worker, first, ["finished"])
    with raises_sqlstate("22023", match="p_limit must be between 0 and 100"):
        finish_and_claim(worker, first, ["succeeded"], limit=101)

    assert snapshot(owner) == before


def test_a_reader_may_not_call_it(reader: Conn) -> None:
    with raises_sqlstate("42501"):
        reader.execute("select * from app.finish_and_claim_jobs('w', '{}', '{}', '{}', '{}',"
                       " '{}', '{}', 1, '30 seconds')")


def test_unknown_tenant_ids_are_refused_by_the_fence_not_by_an_error(worker: Conn) -> None:
    tenant = new_tenant()
    enqueue_many(worker, tenant, 1)
    (first,) = claim(worker, tenant, limit=1)
    forged = {**first, "tenant_id": uuid.uuid4()}

    rows = finish_and_claim(worker, [forged], ["succeeded"], limit=0)

    assert rows == []
