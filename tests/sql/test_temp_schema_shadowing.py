"""A caller's temporary schema can never run code with the schema owner's rights.

PostgreSQL looks up type and table names in the session's temporary schema (pg_temp)
first unless the search path names it explicitly later, and an empty search path does
not name it. An attacker holding any login that may execute a SECURITY DEFINER function
creates ``pg_temp.evil()`` and a domain ``pg_temp.timestamptz`` whose CHECK calls it;
a definer function that declares a ``timestamptz`` variable then runs ``evil()`` as the
owner (which could ``grant <owner> to <attacker>``). The functions pin
``search_path = pg_catalog, pg_temp``, so built-in names resolve in pg_catalog first.

Each test shadows every built-in type name that the functions' sources or signatures
use, then calls every function the login may execute with arguments that do real work
(as the all-duty login, a member of every runtime group, which may call them all, and as
a login of each duty group, which may call its own), and checks who ran the shadow's
code. The first test shows the probe works on this server, so the others could fail.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from tests.conftest import Database
from tests.support import postgres
from tests.support.postgres import Conn

#: Types that must be among the shadowed ones (the review's examples and their kin).
CORE_TYPES = {"timestamptz", "uuid", "text", "interval", "jsonb", "int4", "int8", "bool"}


def _shadowable_types(owner: Conn) -> list[str]:
    """pg_catalog base types named in any app function's source or signature."""
    rows = owner.execute(
        """
        select distinct t.typname::text as name
        from pg_type t
        join pg_proc p on p.pronamespace = 'app'::regnamespace
        where t.typnamespace = 'pg_catalog'::regnamespace
          and t.typtype = 'b' and t.typcategory <> 'A'
          and (p.prosrc ~* ('\\m' || t.typname || '\\M')
               or t.oid = any (p.proargtypes::oid[]) or t.oid = p.prorettype)
        order by 1
        """
    ).fetchall()
    return [r["name"] for r in rows]


def _arm_shadows(conn: Conn, types: list[str]) -> list[str]:
    """Create pg_temp.evil() and a pg_temp domain per type name whose check calls it."""
    conn.execute(
        """
        create function pg_temp.evil() returns boolean language sql as $$
          select set_config('leaseq_test.shadow_ran_as',
                            coalesce(current_setting('leaseq_test.shadow_ran_as', true), '')
                              || current_user || ',', false) is not null
        $$
        """
    )
    armed = []
    for name in types:
        try:
            with conn.transaction():
                conn.execute(
                    sql.SQL("create domain pg_temp.{} as pg_catalog.{} check (pg_temp.evil())")
                    .format(sql.Identifier(name), sql.Identifier(name))
                )
            armed.append(name)
        except Exception:  # noqa: S112 - a type that cannot be a domain's base is skipped
            continue
    return armed


def _ran_as(conn: Conn) -> set[str]:
    row = conn.execute(
        "select coalesce(current_setting('leaseq_test.shadow_ran_as', true), '') as who"
    ).fetchone()
    assert row is not None
    return {who for who in str(row["who"]).split(",") if who}


@pytest.fixture
def shadowed(db: Database, owner: Conn) -> Iterator[Callable[[str], Conn]]:
    """Connections of a given role whose temporary schema shadows the built-in types."""
    types = _shadowable_types(owner)
    opened: list[Conn] = []

    def connect(role: str) -> Conn:
        conn = db.connect(role)
        opened.append(conn)
        armed = _arm_shadows(conn, types)
        assert set(armed) >= CORE_TYPES, f"could not shadow {CORE_TYPES - set(armed)}"
        return conn

    yield connect
    for conn in opened:
        conn.close()


def test_the_probe_runs_as_the_owner_in_a_definer_function_with_an_empty_search_path(
    db: Database, owner: Conn, shadowed: Callable[[str], Conn]
) -> None:
    """The attack as the review found it, against a deliberately unpinned function."""
    owner.execute(
        """
        create function app.unpinned_probe() returns text language plpgsql
        security definer set search_path = '' as $$
        declare v_now timestamptz := pg_catalog.clock_timestamp();
        begin return v_now::text; end $$
        """
    )
    try:
        owner.execute(
            sql.SQL("grant execute on function app.unpinned_probe() to {}").format(
                sql.Identifier(postgres.WORKER)
            )
        )
        worker = shadowed(postgres.WORKER)
        worker.execute("select app.unpinned_probe()")
        assert postgres.OWNER in _ran_as(worker)
    finally:
        owner.execute("drop function app.unpinned_probe()")


def _executable(owner: Conn, role: str) -> set[str]:
    rows = owner.execute(
        """
        select p.proname::text as name from pg_proc p
        where p.pronamespace = 'app'::regnamespace
          and has_function_privilege(%s, p.oid, 'EXECUTE')
        """,
        (role,),
    ).fetchall()
    return {r["name"] for r in rows}


def _one(conn: Conn, query: str, params: tuple[Any, ...] = ()) -> dict[str, Any]:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row


Call = Callable[[str, str, tuple[Any, ...]], list[dict[str, Any]]]


def _produce(call: Call, tenant: uuid.UUID, admin: Conn) -> None:
    ids = {}
    for key in ("a", "b", "c", "d", "e", "f"):
        row = call("enqueue_job", "select id from app.enqueue_job(%s, %s, 'email.send', %s)",
                   (tenant, key, Jsonb({"key": key})))
        ids[key] = row[0]["id"]
    call("enqueue_jobs",
         "select * from app.enqueue_jobs(array[%s]::uuid[], array['g'], array['email.send'],"
         " array[%s]::jsonb[], array[pg_catalog.now() + '1 hour']::timestamptz[],"
         " array[3], array['corr-1'])", (tenant, Jsonb({"key": "g"})))
    assert call("get_job_result", "select * from app.get_job_result(%s, %s)",
                (tenant, ids["a"]))
    assert call("get_job_result_by_key", "select * from app.get_job_result_by_key(%s, 'b')",
                (tenant,))
    # After an enqueue, the wake: the pool is empty, so it hands out a ticket; its start
    # failed, so the producer gives it back, and wakes again (within the debounce: NULL).
    (woken,) = call("wake_worker_place", "select app.wake_worker_place() as place", ())
    assert woken["place"] is not None, "the wake gave no ticket"
    call("release_worker_place", "select app.release_worker_place(%s)", (woken["place"],))
    call("wake_worker_place", "select app.wake_worker_place() as place", ())
    # A queue declared in a stack of its own: its registered worker (none here).
    assert call("queue_worker_function", "select app.queue_worker_function('reports') as f",
                ()) == [{"f": None}]


def _work(call: Call, tenant: uuid.UUID, admin: Conn) -> None:
    _pool(call)
    call("ready_tenants", "select * from app.ready_tenants(10)", ())
    call("oldest_ready_at", "select app.oldest_ready_at()", ())
    call("queue_state", "select * from app.queue_state('default')", ())
    call("queue_overview", "select * from app.queue_overview('default')", ())

    def claim(kinds: str = "null, null") -> dict[str, Any]:
        rows = call("claim_jobs", "select id, lease_token from app.claim_jobs(%s, 'w1', 1,"
                    f" '30 seconds', {kinds})", (tenant,))
        assert rows, "nothing left to claim"
        return rows[0]

    job = claim()
    call("renew_job_lease", "select app.renew_job_lease(%s, %s, 'w1', %s, '30 seconds')",
         (tenant, job["id"], job["lease_token"]))
    call("renew_job_lease_status",
         "select * from app.renew_job_lease_status(%s, %s, 'w1', %s, '30 seconds')",
         (tenant, job["id"], job["lease_token"]))
    call("complete_job", "select app.complete_job(%s, %s, 'w1', %s, %s)",
         (tenant, job["id"], job["lease_token"], Jsonb({"ok": True})))
    job = claim()
    call("fail_job", "select app.fail_job(%s, %s, 'w1', %s, %s, '0 seconds')",
         (tenant, job["id"], job["lease_token"], Jsonb({"message": "boom"})))
    job = claim("null, array['report.build']")
    call("discard_job", "select app.discard_job(%s, %s, 'w1', %s, %s)",
         (tenant, job["id"], job["lease_token"], Jsonb({"message": "bad"})))
    job = claim()
    call("finish_jobs",
         "select * from app.finish_jobs('w1', array[%s]::uuid[], array[%s]::uuid[],"
         " array[%s]::uuid[], array['retry'], array[%s]::jsonb[], array['1 second']::interval[])",
         (tenant, job["id"], job["lease_token"], Jsonb({"message": "again"})))
    job = claim("array['email.send'], null")  # a kind filter (its own statements)
    call("release_jobs",
         "select * from app.release_jobs('w1', array[%s]::uuid[], array[%s]::uuid[],"
         " array[%s]::uuid[])", (tenant, job["id"], job["lease_token"]))
    # The fair claim with a kind filter (the kinds' turns), then without one.
    rows = call("claim_ready_jobs", "select id, lease_token from app.claim_ready_jobs('w1', 1,"
                " '30 seconds', array['email.send'])", ())
    assert rows
    call("finish_and_claim_jobs",
         "select * from app.finish_and_claim_jobs('w1', array[%s]::uuid[], array[%s]::uuid[],"
         " array[%s]::uuid[], array['succeeded'], array['{}']::jsonb[],"
         " array[null]::interval[], 1, '30 seconds', null, array['report.build'])",
         (tenant, rows[0]["id"], rows[0]["lease_token"]))
    rows = call("claim_ready_jobs", "select id, lease_token from app.claim_ready_jobs('w1', 2)",
                ())
    assert rows
    call("finish_and_claim_jobs",
         "select * from app.finish_and_claim_jobs('w1', array[%s]::uuid[], array[%s]::uuid[],"
         " array[%s]::uuid[], array['succeeded'], array['{}']::jsonb[],"
         " array[null]::interval[], 1)", (tenant, rows[0]["id"], rows[0]["lease_token"]))


def _pool(call: Call) -> None:
    """A worker invocation's pool calls: scale up, join taking a reservation, give back
    a reservation whose invoke failed, count, leave, and wake (the pool is empty again,
    so the worker's login gets a ticket of its own)."""
    places = [r["place"] for r in call(
        "reserve_worker_places",
        "select r.place from app.reserve_worker_places(2, 4, '90 seconds') as r(place)", ())]
    assert len(places) == 2, "no room to reserve"
    assert call("join_worker_pool",
                "select app.join_worker_pool('w1', 'fanout', %s, 4, '5 minutes') as joined",
                (places[0],))[0]["joined"]
    call("release_worker_place", "select app.release_worker_place(%s)", (places[1],))
    assert call("worker_pool_size", "select * from app.worker_pool_size()", ())[0]["live"] == 1
    call("leave_worker_pool", "select app.leave_worker_pool('w1')", ())
    call("wake_worker_place", "select app.wake_worker_place() as place", ())


def _reap(call: Call, tenant: uuid.UUID, admin: Conn) -> None:
    # Arranged as the administrator, so that releasing and pruning have work to do.
    admin.execute("update app.leases set expires_at = now() - interval '1 second'"
                  " where tenant_id = %s", (tenant,))
    admin.execute("update app.jobs set completed_at = completed_at - interval '2 days'"
                  " where tenant_id = %s and state = 'succeeded'", (tenant,))
    call("release_expired_jobs", "select app.release_expired_jobs(%s, 1)", (tenant,))
    call("release_all_expired_jobs", "select app.release_all_expired_jobs(10)", ())
    call("prune_retained_jobs", "select * from app.prune_retained_jobs('1 day', 10)", ())
    call("repair_tenant_turns", "select * from app.repair_tenant_turns(10)", ())
    call("roll_event_days", "select * from app.roll_event_days()", ())
    call("end_stalled_sessions", "select * from app.end_stalled_sessions()", ())
    call("admit_held_jobs", "select app.admit_held_jobs(10)", ())
    call("limit_status", "select * from app.limit_status()", ())
    admin.execute("insert into app.schedules (tenant_id, name, kind, expression, next_slot)"
                  " values (%s, 'shadowed', 'report.build', '* * * * *',"
                  " now() - interval '90 seconds')", (tenant,))
    ticked = call("tick_schedules", "select * from app.tick_schedules(10)", ())
    call("queue_overview", "select * from app.queue_overview()", ())
    assert ticked, "no schedule to tick"
    assert ticked[0]["enqueued"] >= 1, "no slot to enqueue"


def _dashboard(call: Call, tenant: uuid.UUID, admin: Conn) -> None:
    """The deployed dashboard's login: the pages' reads and the actions by job id."""
    dead = call("list_jobs", "select * from app.list_jobs('dead', %s, null, null, null,"
                " null, null, 5)", (tenant,))
    assert dead, "no dead job to look at"
    waiting = call("list_jobs", "select * from app.list_jobs('pending', %s, null, null, null,"
                   " null, null, 5)", (tenant,))
    assert waiting, "no waiting job to cancel"
    call("get_job", "select * from app.get_job(%s)", (dead[0]["id"],))
    call("job_wait_reasons", "select * from app.job_wait_reasons(%s)", ([waiting[0]["id"]],))
    call("job_timeline", "select * from app.job_timeline(%s, 100)", (dead[0]["id"],))
    call("queue_depth", "select * from app.queue_depth(%s, null, 5)", (tenant,))
    call("job_activity", "select * from app.job_activity(%s, null, '1 hour', 6, 5)", (tenant,))
    call("list_schedules", "select * from app.list_schedules(null, 3)", ())
    call("pause_queue", "select * from app.pause_queue('reports', 'operator', 'why')", ())
    call("queue_state", "select * from app.queue_state('reports')", ())
    call("queue_overview", "select * from app.queue_overview()", ())
    call("queue_history", "select * from app.queue_history('reports', 10)", ())
    call("resume_queue", "select * from app.resume_queue('reports', 'operator')", ())
    call("list_limits", "select * from app.list_limits()", ())
    call("limit_status", "select * from app.limit_status()", ())
    call("cancel_jobs_by_id", "select * from app.cancel_jobs_by_id('dash', %s, 'unwanted')",
         ([waiting[0]["id"]],))
    call("request_job_cancel", "select * from app.request_job_cancel('dash', %s, 'unwanted')",
         ([waiting[-1]["id"]],))
    assert call("redrive_jobs_by_id", "select * from app.redrive_jobs_by_id('dash', %s)",
                ([dead[0]["id"]],))
    # Arranged: the operator's duty after this one needs its dead job back.
    admin.execute("update app.jobs set state = 'dead', completed_at = now() where id = %s",
                  (dead[0]["id"],))


def _operate(call: Call, tenant: uuid.UUID, admin: Conn) -> None:
    dead = call("dead_jobs", "select * from app.dead_jobs(%s, null, 10)", (tenant,))
    assert dead, "no dead job to look at"
    call("get_job", "select * from app.get_job(%s)", (dead[0]["id"],))
    call("job_timeline", "select * from app.job_timeline(%s, 100)", (dead[0]["id"],))
    call("redrive_jobs", "select * from app.redrive_jobs('op', %s, null, null, 10, 'fixed')",
         (tenant,))
    call("cancel_jobs", "select * from app.cancel_jobs('op', %s, null, null, 1, 'unwanted')",
         (tenant,))
    call("request_job_cancel", "select * from app.request_job_cancel('op', %s, 'unwanted')",
         ([dead[0]["id"]],))
    call("queue_status", "select * from app.queue_status(%s)", (tenant,))
    call("waiting_jobs", "select * from app.waiting_jobs(%s)", (tenant,))
    call("oldest_ready_at", "select app.oldest_ready_at()", ())
    call("worker_pool_size", "select * from app.worker_pool_size()", ())
    call("repair_tenant_turns", "select * from app.repair_tenant_turns(10)", ())
    call("queue_depth", "select * from app.queue_depth(%s, 'email.send', 5)", (tenant,))
    call("job_activity", "select * from app.job_activity(%s, 'email.send', '1 hour', 6, 5)",
         (tenant,))
    for state in ("pending", "retry_wait", "running", "succeeded", "dead", "cancelled"):
        call("list_jobs", "select * from app.list_jobs(%s, %s, 'email.send', null, null,"
             " null, null, 5)", (state, tenant))
    call("prune_jobs", "select * from app.prune_jobs('0 seconds', 10)", ())
    call("put_schedule", "select * from app.put_schedule(%s, 'nightly', 'report.build',"
         " '30 2 * * *', 'Europe/Berlin', '{}', 1, 6, 'operator')", (tenant,))
    call("pause_schedule", "select * from app.pause_schedule(%s, 'nightly', true)", (tenant,))
    call("list_schedules", "select * from app.list_schedules(%s, 3)", (tenant,))
    call("pause_queue", "select * from app.pause_queue('reports', 'operator', 'why')", ())
    call("queue_state", "select * from app.queue_state('reports')", ())
    call("queue_overview", "select * from app.queue_overview()", ())
    call("queue_history", "select * from app.queue_history('reports', 10)", ())
    call("resume_queue", "select * from app.resume_queue('reports', 'operator')", ())
    call("remove_schedule", "select app.remove_schedule(%s, 'nightly')", (tenant,))
    call("sync_schedules", "select * from app.sync_schedules(array[%s]::uuid[],"
         " array['cleanup'], array['report.build'], array['@every 5m'], array['UTC'],"
         " array['{}']::jsonb[], array[0], array[6])", (tenant,))
    call("set_limit", "select app.set_limit('op', 'kind_tenant', 'report.build', %s, null, 2,"
         " 10, '1 second', 5)", (tenant,))
    call("list_limits", "select * from app.list_limits()", ())
    call("limit_status", "select * from app.limit_status()", ())
    call("admit_held_jobs", "select app.admit_held_jobs(10)", ())
    call("remove_limit", "select app.remove_limit('kind_tenant', 'report.build', %s)", (tenant,))
    call("sync_limits", "select * from app.sync_limits(array['report.build'], array[true],"
         " array[2], array[10], array['1 second']::interval[], array[null]::integer[])", ())


#: The duties in the order a job meets them; each arranges what the next one needs.
DUTIES = {"produce": _produce, "work": _work, "reap": _reap, "dashboard": _dashboard,
          "operate": _operate}


def _exercise(conn: Conn, tenant: uuid.UUID, duties: set[str], *, owner: Conn,
              admin: Conn) -> set[str]:
    """Call each function of the given duties on ``conn`` with arguments that make it do
    its work (the duties before them arranged by the owner); return their names."""
    called: set[str] = set()
    last = max(i for i, name in enumerate(DUTIES) if name in duties)
    for i, (name, duty) in enumerate(DUTIES.items()):
        if i > last:
            break
        on = conn if name in duties else owner

        def call(function: str, query: str, params: tuple[Any, ...],
                 on: Conn = on, mine: bool = name in duties) -> list[dict[str, Any]]:
            if mine:
                called.add(function)
            return on.execute(query, params).fetchall()

        duty(call, tenant, admin)
    return called


#: Each login and the duties it may perform; the all-duty login does them all.
LOGINS = {
    "all duties": (postgres.WORKER, set(DUTIES)),
    "producer": (postgres.PRODUCER, {"produce"}),
    "tenant producer": (postgres.TENANT_PRODUCER, {"produce"}),
    "worker": (postgres.DUTY_WORKER, {"work"}),
    "reaper": (postgres.REAPER, {"reap"}),
    "operator": (postgres.OPERATOR, {"dashboard", "operate"}),
    "dashboard": (postgres.DASHBOARD, {"dashboard"}),
}


@pytest.mark.parametrize("login", LOGINS)
def test_no_function_a_runtime_login_may_execute_runs_its_shadow_types_as_the_owner(
    login: str, owner: Conn, admin: Conn, shadowed: Callable[[str], Conn]
) -> None:
    role, duties = LOGINS[login]
    tenant = uuid.uuid4()
    owner.execute("insert into app.tenant_producers (role_name, tenant_id) values (%s, %s)",
                  (postgres.TENANT_PRODUCER, tenant))
    conn = shadowed(role)

    called = _exercise(conn, tenant, duties, owner=owner, admin=admin)

    missing = _executable(owner, role) - called
    assert missing == set(), f"add a real call of {sorted(missing)} to _exercise"
    assert postgres.OWNER not in _ran_as(conn)


def test_a_reader_session_with_shadow_types_sees_only_its_tenant(
    db: Database, owner: Conn, shadowed: Callable[[str], Conn]
) -> None:
    tenant = uuid.uuid4()
    owner.execute("insert into app.tenant_readers (role_name, tenant_id) values (%s, %s)",
                  (postgres.READER, tenant))
    reader = shadowed(postgres.READER)
    reader.execute("select set_config('app.tenant_id', %s, false)", (str(tenant),))

    row = _one(reader, "select app.current_tenant_id() as tenant")
    reader.execute("select id, state from app.jobs")
    # The dashboard's reader forms run with the reader's own rights: a shadow type
    # there can do nothing the reader could not do anyway.
    reader.execute("select * from app.reader_queue_depth(null, null, 5)")
    reader.execute("select * from app.reader_job_activity(null, null, '1 hour', 6, 5)")
    reader.execute("select * from app.reader_list_jobs('pending', null, null, null, null,"
                   " null, null, 5)")

    assert row["tenant"] == tenant
    assert postgres.OWNER not in _ran_as(reader)
