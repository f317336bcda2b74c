"""The dashboard's duty group, leaseq_dashboard: the reads its pages use and the two
actions by job id, nothing else.

Every check connects as a login of the group (``tests.support.postgres.DASHBOARD``);
the owner and the worker only arrange jobs. The first tests are this login's column
of the privilege matrix (tests/failure/test_privilege_matrix.py): every function,
table and sequence of schema app gets a decision, so a grant added anywhere shows up.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from tests.conftest import Database
from tests.sql.calls import claim_one, enqueue, event_types, job, new_tenant, raises_sqlstate
from tests.sql.calls import snapshot as queue_snapshot
from tests.support import postgres
from tests.support.postgres import Conn

#: Everything a dashboard login may execute in schema app.
DASHBOARD_FUNCTIONS = {
    "app.queue_depth(uuid,text,integer)",
    "app.job_activity(uuid,text,interval,integer,integer)",
    "app.list_jobs(app.job_state,uuid,text,timestamp with time zone,"
    "timestamp with time zone,timestamp with time zone,uuid,integer)",
    "app.get_job(uuid)",
    "app.job_wait_reasons(uuid[])",
    "app.job_timeline(uuid,integer)",
    "app.redrive_jobs_by_id(text,uuid[],text)",
    "app.cancel_jobs_by_id(text,uuid[],text)",
    "app.request_job_cancel(text,uuid[],text)",
    "app.list_schedules(uuid,integer)",
    "app.pause_queue(text,text,text)",
    "app.resume_queue(text,text)",
    "app.queue_overview(text)",
    "app.queue_history(text,integer)",
    "app.queue_state(text)",
    "app.list_limits()",
    "app.limit_status()",
}
GROUP_ROLES = ("authenticated", "leaseq_producer", "leaseq_tenant_producer",
               "leaseq_worker", "leaseq_reaper", "leaseq_operator", "leaseq_dashboard")
ACTOR = "dashboard:arn:aws:sts::123456789012:assumed-role/OnCall/ada"


@pytest.fixture
def dashboard(db: Database) -> Iterator[Conn]:
    with db.connect(postgres.DASHBOARD) as conn:
        yield conn


def _functions(owner: Conn) -> list[dict[str, Any]]:
    return owner.execute(
        """
        select p.oid::regprocedure::text as signature, p.proname as name,
               array(select case when t.typname = 'anyarray' then 'text[]'
                                 when t.typtype = 'p' then 'text'
                                 else format_type(t.oid, null) end
                     from unnest(p.proargtypes) with ordinality a(oid, i)
                     join pg_type t on t.oid = a.oid order by a.i) as types
        from pg_proc p where p.pronamespace = 'app'::regnamespace
        """).fetchall()


def _permitted(conn: Conn, statement: sql.Composable) -> bool:
    """Run ``statement`` and roll back; False only when privileges refused it (42501)."""
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(statement)
    except psycopg.errors.InsufficientPrivilege:
        return False
    except psycopg.Error:
        return True
    return True


def _dead(worker: Conn, tenant: uuid.UUID, key: str) -> uuid.UUID:
    enqueue(worker, tenant, key)
    leased = claim_one(worker, tenant)
    worker.execute("select app.discard_job(%s, %s, 'worker-1', %s, %s)",
                   (tenant, leased["id"], leased["lease_token"], Jsonb({"message": "boom"})))
    return uuid.UUID(str(leased["id"]))


def _pending(worker: Conn, tenant: uuid.UUID, key: str) -> uuid.UUID:
    return uuid.UUID(str(enqueue(worker, tenant, key)["id"]))


# What the group may execute and touch ------------------------------------------------------


def test_a_dashboard_login_may_execute_exactly_the_pages_reads_and_the_by_id_actions(
    owner: Conn,
) -> None:
    granted = set()
    for function in _functions(owner):
        row = owner.execute("select has_function_privilege(%s, %s, 'EXECUTE') as ok",
                            (postgres.DASHBOARD, function["signature"])).fetchone()
        assert row is not None
        if row["ok"]:
            granted.add(function["signature"])
    assert granted == DASHBOARD_FUNCTIONS


def test_calling_every_function_as_the_dashboard_login_is_allowed_only_for_its_own(
    owner: Conn, dashboard: Conn,
) -> None:
    """Each function is called with NULL arguments: a permitted call fails on its
    argument checks, a refused one with 42501."""
    outcome = set()
    for function in _functions(owner):
        call = sql.SQL("select {}.{}({})").format(
            sql.Identifier("app"), sql.Identifier(function["name"]),
            sql.SQL(", ").join(sql.SQL("null::{}").format(sql.SQL(t))
                               for t in function["types"]))
        if _permitted(dashboard, call):
            outcome.add(function["signature"])
    assert outcome == DASHBOARD_FUNCTIONS


def test_a_dashboard_login_touches_no_table_or_sequence_and_belongs_to_its_group_only(
    owner: Conn, dashboard: Conn,
) -> None:
    relations = owner.execute(
        "select c.oid::regclass::text as name, c.relkind from pg_class c"
        " where c.relnamespace = 'app'::regnamespace and c.relkind in ('r', 'p', 'v', 'S')"
    ).fetchall()
    for relation in relations:
        if relation["relkind"] == "S":
            statement = sql.SQL("select nextval({})").format(sql.Literal(relation["name"]))
        else:
            statement = sql.SQL("select * from {} limit 1").format(
                sql.Identifier(*relation["name"].split(".")))
        assert not _permitted(dashboard, statement), relation["name"]
    groups = owner.execute(
        "select g from unnest(%s::text[]) g where pg_has_role(%s, g, 'USAGE')",
        (list(GROUP_ROLES), postgres.DASHBOARD)).fetchall()
    assert [r["g"] for r in groups] == ["leaseq_dashboard"]
    row = owner.execute("select rolcanlogin, rolsuper, rolcreaterole, rolbypassrls"
                        " from pg_roles where rolname = 'leaseq_dashboard'").fetchone()
    assert row == {"rolcanlogin": False, "rolsuper": False, "rolcreaterole": False,
                   "rolbypassrls": False}


@pytest.mark.parametrize(("what", "statement", "arguments"), [
    ("prune at any age", "select * from app.prune_jobs('0 seconds', 1000)", ()),
    ("prune above the floor", "select * from app.prune_retained_jobs('30 days', 1000)", ()),
    ("redrive by tenant", "select * from app.redrive_jobs(%s, %s, null, null, 1000, null)",
     ("actor", "tenant")),
    ("redrive everything", "select * from app.redrive_jobs(%s)", ("actor",)),
    ("cancel by kind", "select * from app.cancel_jobs(%s, null, null, 'email.send', 1000, null)",
     ("actor",)),
    ("cancel by id through the filtered form",
     "select * from app.cancel_jobs(%s, null, %s, null, 10, null)", ("actor", "ids")),
    ("enqueue", "select * from app.enqueue_job(%s, 'k', 'email.send', '{}')", ("tenant",)),
    ("claim", "select * from app.claim_ready_jobs('me', 10, '30 seconds')", ()),
    ("release expired leases", "select app.release_all_expired_jobs(1000)", ()),
    ("read the command line's status", "select * from app.queue_status(null)", ()),
    ("read the dead list", "select * from app.dead_jobs(null, null, 100)", ()),
    ("read jobs directly", "select id from app.jobs limit 1", ()),
])
def test_a_dashboard_login_is_refused_everything_beyond_its_pages(
    what: str, statement: str, arguments: tuple[str, ...], dashboard: Conn, owner: Conn,
    worker: Conn,
) -> None:
    tenant = new_tenant()
    dead, pending = _dead(worker, tenant, "dead"), _pending(worker, tenant, "pending")
    values = {"actor": ACTOR, "tenant": tenant, "ids": [dead, pending]}
    before = queue_snapshot(owner)

    with raises_sqlstate("42501"):
        dashboard.execute(statement, [values[a] for a in arguments])

    assert queue_snapshot(owner) == before, what


# The reads --------------------------------------------------------------------------------


def test_a_dashboard_login_reads_every_tenants_depth_lists_jobs_and_timelines(
    dashboard: Conn, worker: Conn,
) -> None:
    a, b = new_tenant(), new_tenant()
    dead_a, dead_b = _dead(worker, a, "a"), _dead(worker, b, "b")

    depth = dashboard.execute("select * from app.queue_depth(null, null, 20)").fetchall()
    listed = dashboard.execute(
        "select id from app.list_jobs('dead', null, null, null, null, null, null, 50)"
    ).fetchall()
    one = dashboard.execute("select id, tenant_id from app.get_job(%s)", (dead_b,)).fetchone()
    timeline = dashboard.execute("select event_type from app.job_timeline(%s, 100)",
                                 (dead_a,)).fetchall()
    activity = dashboard.execute(
        "select sum(dead) as dead from app.job_activity(null, null, '1 hour', 4, 5)").fetchone()

    assert {r["tenant_id"] for r in depth if r["dimension"] == "tenant"} == {a, b}
    assert {r["id"] for r in listed} == {dead_a, dead_b}
    assert one == {"id": dead_b, "tenant_id": b}
    assert [r["event_type"] for r in timeline] == ["created", "claimed", "dead"]
    assert activity == {"dead": 2}


# The actions, by id only ---------------------------------------------------------------------


def test_redrive_by_id_redrives_exactly_the_named_dead_jobs_with_the_actor_audited(
    dashboard: Conn, owner: Conn, worker: Conn,
) -> None:
    tenant = new_tenant()
    named, other = _dead(worker, tenant, "named"), _dead(worker, tenant, "other")
    waiting = _pending(worker, tenant, "waiting")

    done = dashboard.execute(
        "select job_id from app.redrive_jobs_by_id(%s, %s, 'fixed the bug')",
        (ACTOR, [named, waiting])).fetchall()

    assert [r["job_id"] for r in done] == [named]
    assert (job(owner, named)["state"], job(owner, other)["state"]) == ("pending", "dead")
    assert job(owner, waiting)["state"] == "pending"
    audit = owner.execute(
        "select actor, details from app.job_events where job_id = %s and event_type = "
        "'redriven'", (named,)).fetchone()
    assert audit is not None
    assert audit["actor"] == ACTOR
    assert audit["details"]["reason"] == "fixed the bug"


def test_cancel_by_id_cancels_exactly_the_named_waiting_jobs(
    dashboard: Conn, owner: Conn, worker: Conn,
) -> None:
    tenant = new_tenant()
    dead = _dead(worker, tenant, "dead")  # first: its claim takes the oldest pending job
    named, other = _pending(worker, tenant, "named"), _pending(worker, tenant, "other")

    done = dashboard.execute("select job_id from app.cancel_jobs_by_id(%s, %s)",
                             (ACTOR, [named, dead])).fetchall()

    assert [r["job_id"] for r in done] == [named]
    assert [job(owner, j)["state"] for j in (named, other, dead)] == [
        "cancelled", "pending", "dead"]
    assert event_types(owner, named)[-1] == "cancelled"


@pytest.mark.parametrize("function", ["redrive_jobs_by_id", "cancel_jobs_by_id"])
@pytest.mark.parametrize(("ids", "message"), [
    (None, "p_job_ids is required"),
    ([], "number of job ids"),
    ("too many", "number of job ids"),
    ("with null", "must not contain NULL"),
])
def test_the_by_id_actions_refuse_no_ids_an_empty_list_and_too_many_changing_nothing(
    function: str, ids: Any, message: str, dashboard: Conn, owner: Conn, worker: Conn,
) -> None:
    """Never "every job": what the filtered forms read as no filter is refused here."""
    tenant = new_tenant()
    dead, pending = _dead(worker, tenant, "dead"), _pending(worker, tenant, "pending")
    if ids == "too many":
        ids = [dead, pending, *(uuid.uuid4() for _ in range(999))]
    elif ids == "with null":
        ids = [dead, pending, None]
    before = queue_snapshot(owner)

    with raises_sqlstate("22023", match=message):
        dashboard.execute(
            sql.SQL("select * from app.{}(%s, %s::uuid[])").format(sql.Identifier(function)),
            (ACTOR, ids))

    assert queue_snapshot(owner) == before
