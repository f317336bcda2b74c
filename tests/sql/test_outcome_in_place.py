"""A job's outcome is written in place (sql/README.md, "A job's three tables").

No index of app.jobs names a column a job's success changes, so the claim and the outcome
are both HOT updates and write no index entry; succeeded jobs are found by their
'succeeded' event (job_events_succeeded_idx), dead and cancelled ones by the generated
columns unsuccessful and unsuccessful_at (migration 0032).
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from psycopg.types.json import Jsonb

from tests.sql.calls import WORKER_NAME, claim_one, enqueue, job, new_tenant
from tests.support.postgres import Conn


def _succeed(conn: Conn, tenant: uuid.UUID) -> uuid.UUID:
    claimed = claim_one(conn, tenant)
    conn.execute("select app.complete_job(%s, %s, %s, %s, %s)",
                 (tenant, claimed["id"], WORKER_NAME, claimed["lease_token"], Jsonb({"ok": 1})))
    return uuid.UUID(str(claimed["id"]))


def _discard(conn: Conn, tenant: uuid.UUID) -> uuid.UUID:
    claimed = claim_one(conn, tenant)
    conn.execute("select app.discard_job(%s, %s, %s, %s, %s)",
                 (tenant, claimed["id"], WORKER_NAME, claimed["lease_token"],
                  Jsonb({"message": "no"})))
    return uuid.UUID(str(claimed["id"]))


def test_a_claim_and_a_success_are_both_hot_updates_of_the_job_row(owner: Conn) -> None:
    # One job in one transaction: its page has the room fillfactor 50 keeps, and the
    # transaction's own counters are read before anything else can touch the table.
    tenant = new_tenant()
    with owner.transaction():
        enqueue(owner, tenant, "hot")
        _succeed(owner, tenant)
        counts = owner.execute(
            "select n_tup_upd, n_tup_hot_upd from pg_stat_xact_user_tables"
            " where relid = 'app.jobs'::regclass").fetchone()
    assert counts == {"n_tup_upd": 2, "n_tup_hot_upd": 2}


def test_no_index_of_the_job_table_names_a_column_that_a_success_changes(owner: Conn) -> None:
    tenant = new_tenant()
    job_id = enqueue(owner, tenant, "columns")["id"]
    claim_one(owner, tenant)
    running = owner.execute("select to_jsonb(j) as row from app.jobs j where id = %s",
                            (job_id,)).fetchone()
    claimed = owner.execute("select lease_token from app.leases where job_id = %s",
                            (job_id,)).fetchone()
    assert running is not None
    assert claimed is not None
    owner.execute("select app.complete_job(%s, %s, %s, %s, null)",
                  (tenant, job_id, WORKER_NAME, claimed["lease_token"]))
    done = owner.execute("select to_jsonb(j) as row from app.jobs j where id = %s",
                         (job_id,)).fetchone()
    assert done is not None
    changed = {c for c in running["row"] if running["row"][c] != done["row"][c]}
    assert {"state", "completed_at", "outcome"} <= changed

    # Every column an index keys, includes or filters on (PostgreSQL keeps an update HOT
    # only when none of them changes).
    indexed = owner.execute(
        """
        select i.indexrelid::regclass::text as index, a.attname as column
        from pg_index i
        join pg_attribute a on a.attrelid = i.indrelid and a.attnum > 0
        where i.indrelid = 'app.jobs'::regclass
          and (a.attnum = any (i.indkey)
               or pg_get_expr(i.indpred, i.indrelid) ~ ('\\m' || a.attname || '\\M')
               or pg_get_expr(i.indexprs, i.indrelid) ~ ('\\m' || a.attname || '\\M'))
        """).fetchall()
    assert indexed, "app.jobs has no indexes?"
    assert [r for r in indexed if r["column"] in changed] == []


def test_the_unsuccessful_columns_hold_dead_and_cancelled_jobs_only(
        owner: Conn, worker: Conn, operator: Conn) -> None:
    tenant = new_tenant()
    enqueue(worker, tenant, "ok")
    ok = _succeed(worker, tenant)
    enqueue(worker, tenant, "dead")
    dead = _discard(worker, tenant)
    pending = enqueue(worker, tenant, "cancelled")["id"]
    operator.execute("select * from app.cancel_jobs('op', null, %s, null, 1, null)", ([pending],))

    rows = {r["id"]: r for r in owner.execute(
        "select id, state, completed_at, unsuccessful, unsuccessful_at from app.jobs"
        " where tenant_id = %s", (tenant,)).fetchall()}
    assert (rows[ok]["unsuccessful"], rows[ok]["unsuccessful_at"]) == (None, None)
    assert rows[dead]["unsuccessful"] == "dead"
    assert rows[dead]["unsuccessful_at"] == rows[dead]["completed_at"]
    assert rows[pending]["unsuccessful"] == "cancelled"
    assert rows[pending]["unsuccessful_at"] == rows[pending]["completed_at"]

    operator.execute("select * from app.redrive_jobs('op', %s)", (tenant,))
    again = job(owner, dead)
    assert (again["state"], again["unsuccessful"], again["unsuccessful_at"]) == (
        "pending", None, None)


def test_a_succeeded_jobs_event_follows_a_hand_edit_of_its_completion_and_retention_sees_it(
        worker: Conn, admin: Conn, operator: Conn) -> None:
    tenant = new_tenant()
    enqueue(worker, tenant, "aged")
    aged = _succeed(worker, tenant)
    enqueue(worker, tenant, "fresh")
    fresh = _succeed(worker, tenant)

    admin.execute("update app.jobs set completed_at = completed_at - interval '10 days'"
                  " where id = %s", (aged,))
    moved = admin.execute(
        "select e.created_at = j.completed_at as same from app.job_events e"
        " join app.jobs j on j.id = e.job_id where e.job_id = %s and e.event_type = 'succeeded'",
        (aged,)).fetchall()
    assert moved == [{"same": True}]

    pruned = operator.execute("select * from app.prune_jobs(%s, 1000)",
                              (timedelta(days=5),)).fetchone()
    assert pruned is not None
    assert pruned["jobs_deleted"] >= 1
    left = {r["id"] for r in admin.execute(
        "select id from app.jobs where id = any (%s)", ([aged, fresh],)).fetchall()}
    assert left == {fresh}
    assert admin.execute("select count(*) as n from app.job_events where job_id = %s",
                         (aged,)).fetchone() == {"n": 0}
