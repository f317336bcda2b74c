"""The privilege matrix: for every function, table, column and sequence of schema app,
who may do what, written down as data and checked by connecting as each role.

Each decision is checked twice: in the catalog (has_*_privilege, and the ACLs for
PUBLIC) and by trying it. A function or table that exists without a row here fails
the test, and so does any grant added or missing: every object needs an explicit
decision for every role.

Roles, each a login of its own: ``own`` (the schema owner, not a superuser), ``all``
(a login in all four runtime duty groups, as the command line's embedded login is),
``prod`` (leaseq_producer), ``tprod`` (leaseq_tenant_producer), ``work``
(leaseq_worker), ``reap`` (leaseq_reaper), ``oper`` (leaseq_operator), ``read`` (a
login in authenticated), ``out`` (a login with no grant at all: what PUBLIC may do, it
may do). PUBLIC itself is checked in the ACLs. Which groups each login belongs to is
part of the matrix too (``MEMBERSHIPS``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.conftest import Database
from tests.support import postgres
from tests.support.postgres import Conn

ROLES = {"own": postgres.OWNER, "all": postgres.WORKER, "prod": postgres.PRODUCER,
         "tprod": postgres.TENANT_PRODUCER, "work": postgres.DUTY_WORKER,
         "reap": postgres.REAPER, "oper": postgres.OPERATOR, "read": postgres.READER,
         "out": postgres.OUTSIDER}

# x: may execute; .: may not.
FUNCTIONS = """
function                                                                                         own all prod tprod work reap oper read out
app.add_event_day(date)                                                                          x   .   .    .     .    .    .    .    .
app.admit_held(text,integer)                                                                     x   .   .    .     .    .    .    .    .
app.admit_held_jobs(integer)                                                                     x   x   .    .     .    x    x    .    .
app.bucket_room(text)                                                                            x   .   .    .     .    .    .    .    .
app.cancel_jobs(text,uuid,uuid[],text,integer,text)                                              x   x   .    .     .    .    x    .    .
app.cancel_jobs_by_id(text,uuid[],text)                                                          x   x   .    .     .    .    x    .    .
app.character_problem(text)                                                                      x   .   .    .     .    .    .    .    .
app.check_actor(text)                                                                            x   .   .    .     .    .    .    .    .
app.check_array(text,anyarray)                                                                   x   .   .    .     .    .    .    .    .
app.check_claim(text,integer,interval)                                                           x   .   .    .     .    .    .    .    .
app.check_filters(uuid[],text,integer)                                                           x   .   .    .     .    .    .    .    .
app.check_interval(text,interval,interval,interval)                                              x   .   .    .     .    .    .    .    .
app.check_kind_filter(text[],text[])                                                             x   .   .    .     .    .    .    .    .
app.check_lease(interval)                                                                        x   .   .    .     .    .    .    .    .
app.check_limit(text,text,uuid,text,integer,integer,interval,integer)                            x   .   .    .     .    .    .    .    .
app.check_owner(text)                                                                            x   .   .    .     .    .    .    .    .
app.check_producer_tenants(uuid[])                                                               x   .   .    .     .    .    .    .    .
app.check_queue(text,text)                                                                       x   .   .    .     .    .    .    .    .
app.check_range(text,integer,integer,integer)                                                    x   .   .    .     .    .    .    .    .
app.check_reason(text)                                                                           x   .   .    .     .    .    .    .    .
app.check_required(text,anyelement)                                                              x   .   .    .     .    .    .    .    .
app.check_schedule(uuid,text,text,text,text,jsonb,integer,integer)                               x   .   .    .     .    .    .    .    .
app.check_time_zone(text)                                                                        x   .   .    .     .    .    .    .    .
app.claim_jobs(uuid,text,integer,interval,text[],text[],text)                                    x   x   .    .     x    .    .    .    .
app.claim_locked_jobs(tid[],text,interval,timestamp with time zone)                              x   .   .    .     .    .    .    .    .
app.claim_ready_jobs(text,integer,interval,text[],text[],text)                                   x   x   .    .     x    .    .    .    .
app.claimable_added()                                                                            x   .   .    .     .    .    .    .    .
app.claimable_moved()                                                                            x   .   .    .     .    .    .    .    .
app.complete_job(uuid,uuid,text,uuid,jsonb)                                                      x   x   .    .     x    .    .    .    .
app.cron_field(text,text,text,integer,integer,text[])                                            x   .   .    .     .    .    .    .    .
app.current_tenant_id()                                                                          x   .   .    .     .    .    .    x    .
app.dead_jobs(uuid,text,integer)                                                                 x   x   .    .     .    .    x    .    .
app.discard_job(uuid,uuid,text,uuid,jsonb)                                                       x   x   .    .     x    .    .    .    .
app.document_problem(jsonb,text,integer)                                                         x   .   .    .     .    .    .    .    .
app.drop_event_days(timestamp with time zone)                                                    x   .   .    .     .    .    .    .    .
app.due_queues(timestamp with time zone)                                                         x   .   .    .     .    .    .    .    .
app.end_stalled_sessions()                                                                       x   x   .    .     .    x    .    .    .
app.enqueue_items(uuid[],text[],text[],jsonb[],timestamp with time zone[],integer[],text[],integer[],text[],text[])  x   .   .    .     .    .    .    .    .
app.enqueue_job(uuid,text,text,jsonb,timestamp with time zone,integer,integer,text)              x   x   x    x     .    .    .    .    .
app.enqueue_jobs(uuid[],text[],text[],jsonb[],timestamp with time zone[],integer[],text[],integer[],text[],text[])  x   x   x    x     .    .    .    .    .
app.ensure_queue(text)                                                                           x   .   .    .     .    .    .    .    .
app.error_document(jsonb)                                                                        x   .   .    .     .    .    .    .    .
app.explain_invalid_outcome(bigint,uuid,uuid,uuid,text,jsonb,interval)                           x   .   .    .     .    .    .    .    .
app.fail_job(uuid,uuid,text,uuid,jsonb,interval)                                                 x   x   .    .     x    .    .    .    .
app.fill_claim_key()                                                                             x   .   .    .     .    .    .    .    .
app.finish_and_claim_jobs(text,uuid[],uuid[],uuid[],text[],jsonb[],interval[],integer,interval,text[],text[],text)  x   x   .    .     x    .    .    .    .
app.finish_jobs(text,uuid[],uuid[],uuid[],text[],jsonb[],interval[])                             x   x   .    .     x    .    .    .    .
app.get_job(uuid)                                                                                x   x   .    .     .    .    x    .    .
app.get_job_result(uuid,uuid)                                                                    x   x   x    x     .    .    .    .    .
app.get_job_result_by_key(uuid,text)                                                             x   x   x    x     .    .    .    .    .
app.held_until()                                                                                 x   .   .    .     .    .    .    .    .
app.hold_job(uuid,text,text[],timestamp with time zone)                                          x   .   .    .     .    .    .    .    .
app.is_blank(text)                                                                               x   .   .    .     .    .    .    .    .
app.job_activity(uuid,text,interval,integer,integer)                                             x   x   .    .     .    .    x    .    .
app.job_limit_rows(uuid,text,text)                                                               x   .   .    .     .    .    .    .    .
app.job_timeline(uuid,integer)                                                                   x   x   .    .     .    .    x    .    .
app.job_wait_reasons(uuid[])                                                                     x   x   .    .     .    .    x    .    .
app.join_worker_pool(text,text,uuid,integer,interval,text)                                       x   x   .    .     x    .    .    .    .
app.leave_worker_pool(text)                                                                      x   x   .    .     x    .    .    .    .
app.limit_name(text,text,uuid,text)                                                              x   .   .    .     .    .    .    .    .
app.limit_new_jobs(uuid[])                                                                       x   .   .    .     .    .    .    .    .
app.limit_status()                                                                               x   x   .    .     .    x    x    .    .
app.limits_on_state_change()                                                                     x   .   .    .     .    .    .    .    .
app.list_jobs(app.job_state,uuid,text,timestamp with time zone,timestamp with time zone,timestamp with time zone,uuid,integer)  x   x   .    .     .    .    x    .    .
app.list_limits()                                                                                x   x   .    .     .    .    x    .    .
app.list_schedules(uuid,integer)                                                                 x   x   .    .     .    .    x    .    .
app.move_succeeded_event()                                                                       x   .   .    .     .    .    .    .    .
app.next_claimable_at(text,uuid,text)                                                            x   .   .    .     .    .    .    .    .
app.next_schedule_slot(text,text,timestamp with time zone)                                       x   .   .    .     .    .    .    .    .
app.next_start_at(text,integer,interval,integer,timestamp with time zone)                        x   .   .    .     .    .    .    .    .
app.oldest_ready_at()                                                                            x   x   .    .     x    .    x    .    .
app.pause_queue(text,text,text)                                                                  x   x   .    .     .    .    x    .    .
app.pause_schedule(uuid,text,boolean)                                                            x   x   .    .     .    .    x    .    .
app.paused_queues(text)                                                                          x   .   .    .     .    .    .    .    .
app.pool_limits()                                                                                x   .   .    .     .    .    .    .    .
app.priority_step()                                                                              x   .   .    .     .    .    .    .    .
app.prune_jobs(interval,integer)                                                                 x   x   .    .     .    .    x    .    .
app.prune_retained_jobs(interval,integer)                                                        x   x   .    .     .    x    .    .    .
app.put_schedule(uuid,text,text,text,text,jsonb,integer,integer,text)                            x   x   .    .     .    .    x    .    .
app.queue_connections(text)                                                                      x   .   .    .     .    .    .    .    .
app.queue_depth(uuid,text,integer)                                                               x   x   .    .     .    .    x    .    .
app.queue_history(text,integer)                                                                  x   x   .    .     .    .    x    .    .
app.queue_max_workers(text)                                                                      x   .   .    .     .    .    .    .    .
app.queue_overview(text)                                                                         x   x   .    .     x    x    x    .    .
app.queue_state(text)                                                                            x   x   .    .     x    .    x    .    .
app.queue_status(uuid)                                                                           x   x   .    .     .    .    x    .    .
app.queue_worker_function(text)                                                                  x   x   x    x     .    .    .    .    .
app.raise_invalid(text)                                                                          x   .   .    .     .    .    .    .    .
app.reader_get_job(uuid)                                                                         x   .   .    .     .    .    .    x    .
app.reader_job_activity(uuid,text,interval,integer,integer)                                      x   .   .    .     .    .    .    x    .
app.reader_job_timeline(uuid,integer)                                                            x   .   .    .     .    .    .    x    .
app.reader_job_wait_reasons(uuid[])                                                              x   .   .    .     .    .    .    x    .
app.reader_list_jobs(app.job_state,uuid,text,timestamp with time zone,timestamp with time zone,timestamp with time zone,uuid,integer)  x   .   .    .     .    .    .    x    .
app.reader_queue_depth(uuid,text,integer)                                                        x   .   .    .     .    .    .    x    .
app.ready_tenants(integer)                                                                       x   x   .    .     x    .    .    .    .
app.redrive_jobs(text,uuid,uuid[],text,integer,text)                                             x   x   .    .     .    .    x    .    .
app.redrive_jobs_by_id(text,uuid[],text)                                                         x   x   .    .     .    .    x    .    .
app.refresh_claim_key()                                                                          x   .   .    .     .    .    .    .    .
app.register_queue_worker(text,text,integer,text,integer)                                        x   .   .    .     .    .    .    .    .
app.release_all_expired_jobs(integer)                                                            x   x   .    .     .    x    .    .    .
app.release_expired(uuid,integer)                                                                x   .   .    .     .    .    .    .    .
app.release_expired_jobs(uuid,integer)                                                           x   x   .    .     .    x    .    .    .
app.release_jobs(text,uuid[],uuid[],uuid[])                                                      x   x   .    .     x    .    .    .    .
app.release_worker_place(uuid)                                                                   x   x   x    x     x    .    .    .    .
app.remove_limit(text,text,uuid,text)                                                            x   x   .    .     .    .    x    .    .
app.remove_schedule(uuid,text)                                                                   x   x   .    .     .    .    x    .    .
app.renew_job_lease(uuid,uuid,text,uuid,interval)                                                x   x   .    .     x    .    .    .    .
app.renew_job_lease_status(uuid,uuid,text,uuid,interval)                                         x   x   .    .     x    .    .    .    .
app.repair_tenant_turns(integer)                                                                 x   x   .    .     .    x    x    .    .
app.request_job_cancel(text,uuid[],text)                                                         x   x   .    .     .    .    x    .    .
app.reserve_worker_places(integer,integer,interval,text)                                         x   x   .    .     x    .    .    .    .
app.resume_queue(text,text)                                                                      x   x   .    .     .    .    x    .    .
app.role_duration_setting(oid,text)                                                              x   .   .    .     .    .    .    .    .
app.roll_event_days(integer)                                                                     x   x   .    .     .    x    .    .    .
app.route_kinds(text,text[])                                                                     x   .   .    .     .    .    .    .    .
app.schedule_slots(text,text,timestamp with time zone,timestamp with time zone,integer)          x   .   .    .     .    .    .    .    .
app.schedule_spec(text)                                                                          x   .   .    .     .    .    .    .    .
app.set_limit(text,text,text,uuid,text,integer,integer,interval,integer)                         x   x   .    .     .    .    x    .    .
app.set_priority_step(interval)                                                                  x   .   .    .     .    .    .    .    .
app.set_queue_limits(text,integer)                                                               x   .   .    .     .    .    .    .    .
app.set_stack_connections(integer,integer)                                                       x   .   .    .     .    .    .    .    .
app.set_worker_pool_limits(integer,interval,interval)                                            x   .   .    .     .    .    .    .    .
app.settle_turns(text,uuid[],uuid[],text[],timestamp with time zone)                             x   .   .    .     .    .    .    .    .
app.spec_slots(bigint,integer[],integer[],integer[],integer[],integer[],boolean,boolean,boolean,text,timestamp with time zone,timestamp with time zone,integer)  x   .   .    .     .    .    .    .    .
app.start_limited_jobs(uuid[],timestamp with time zone)                                          x   .   .    .     .    .    .    .    .
app.start_reuse(integer,interval,integer)                                                        x   .   .    .     .    .    .    .    .
app.sync_limits(text[],boolean[],integer[],integer[],interval[],integer[])                       x   x   .    .     .    .    x    .    .
app.sync_schedules(uuid[],text[],text[],text[],text[],jsonb[],integer[],integer[])               x   x   .    .     .    .    x    .    .
app.take_limit_slots(uuid,uuid,text,text,timestamp with time zone)                               x   .   .    .     .    .    .    .    .
app.take_slot(text,text,integer,uuid,uuid,timestamp with time zone)                              x   .   .    .     .    .    .    .    .
app.tick_schedules(integer)                                                                      x   x   .    .     .    x    .    .    .
app.turn_bucket(text,uuid)                                                                       x   .   .    .     .    .    .    .    .
app.unregister_queue_worker(text,text)                                                           x   .   .    .     .    .    .    .    .
app.waiting_jobs(uuid)                                                                           x   x   .    .     .    .    x    .    .
app.wake_tenants(text[],uuid[],timestamp with time zone[],text[])                                x   .   .    .     .    .    .    .    .
app.wake_worker_place(text)                                                                      x   x   x    x     x    .    .    .    .
app.worker_pool_size(text)                                                                       x   x   .    .     x    .    x    .    .
"""  # noqa: E501

# S select (every column unless listed under "columns"), I insert, U update, D delete,
# T truncate; -: nothing.
TABLES = """
table                 own    all prod tprod work reap oper read out
app.jobs              SIUDT  -   -    -     -    -    -    S    -
app.claimable         SIUDT  -   -    -     -    -    -    S    -
app.leases            SIUDT  -   -    -     -    -    -    S    -
app.kind_turns        SIUDT  -   -    -     -    -    -    -    -
app.job_events        SIUDT  -   -    -     -    -    -    S    -
app.event_days        SIUDT  -   -    -     -    -    -    -    -
app.event_holds       SIUDT  -   -    -     -    -    -    -    -
app.tenant_readers    SIUDT  -   -    -     -    -    -    S    -
app.tenant_producers  SIUDT  -   -    -     -    -    -    -    -
app.settings          SIUDT  -   -    -     -    -    -    -    -
app.schema_migrations SIUDT  -   -    -     -    -    -    -    -
app.schema_functions  SIUDT  -   -    -     -    -    -    -    -
app.tenant_turns      SIUDT  -   -    -     -    -    -    -    -
app.tenant_turn_sweep SIUDT  -   -    -     -    -    -    -    -
app.worker_pool       SIUDT  -   -    -     -    -    -    -    -
app.worker_pool_state SIUDT  -   -    -     -    -    -    -    -
app.worker_wakes      SIUDT  -   -    -     -    -    -    -    -
app.schedules         SIUDT  -   -    -     -    -    -    -    -
app.queues            SIUDT  -   -    -     -    -    -    -    -
app.queue_events      SIUDT  -   -    -     -    -    -    -    -
app.queue_kinds       SIUDT  -   -    -     -    -    -    -    -
app.limits            SIUDT  -   -    -     -    -    -    -    -
app.limit_slots       SIUDT  -   -    -     -    -    -    -    -
app.limit_starts      SIUDT  -   -    -     -    -    -    -    -
app.held_jobs         SIUDT  -   -    -     -    -    -    S    -
app.limit_turns       SIUDT  -   -    -     -    -    -    -    -
app.queue_workers     SIUDT  -   -    -     -    -    -    -    -
app.connection_budget SIUDT  -   -    -     -    -    -    -    -
"""

#: Columns a role with SELECT on the table may still not read.
HIDDEN_COLUMNS = {
    ("app.job_events", "read"): {"lease_token"},
    ("app.leases", "read"): {"lease_token"},
}

SEQUENCES = """
sequence                      own all prod tprod work reap oper read out
app.job_event_sequence        x   .   .    .     .    .    .    .    .
"""

SCHEMA_USAGE = {role: role != "out" for role in ROLES}

#: The group roles whose privileges each login has (pg_has_role USAGE: a member that
#: inherits, directly or not): a membership granted or lost anywhere in the role graph
#: changes a row here. (The owner created the groups; from PostgreSQL 16 that makes it
#: their administrator, with neither their privileges nor SET ROLE to them.)
GROUP_ROLES = ("authenticated", "leaseq_producer", "leaseq_tenant_producer",
               "leaseq_worker", "leaseq_reaper", "leaseq_operator", "leaseq_dashboard")
MEMBERSHIPS = {
    "own": set(),
    "all": {"leaseq_producer", "leaseq_worker", "leaseq_reaper", "leaseq_operator"},
    "prod": {"leaseq_producer"},
    "tprod": {"leaseq_tenant_producer"},
    "work": {"leaseq_worker"},
    "reap": {"leaseq_reaper"},
    "oper": {"leaseq_operator"},
    "read": {"authenticated"},
    "out": set(),
}

PRIVILEGE_STATEMENTS = {
    "I": "insert into {table} default values",
    # The last column: the first may be an identity column, which refuses updates
    # for another reason before privileges are looked at.
    "U": "update {table} set {column} = {column} where false",
    "D": "delete from {table} where false",
    "T": "truncate {table}",
}
PRIVILEGE_NAMES = {"S": "SELECT", "I": "INSERT", "U": "UPDATE", "D": "DELETE", "T": "TRUNCATE"}


def _matrix(text: str) -> dict[str, dict[str, str]]:
    """Rows of a whitespace-aligned table; the last cells are the role columns."""
    lines = [line.split() for line in text.strip().splitlines()]
    header, rows = lines[0], lines[1:]
    width = len(ROLES)
    roles = header[-width:]
    assert roles == list(ROLES), f"matrix columns {roles} are not {list(ROLES)}"
    return {" ".join(row[:-width]): dict(zip(roles, row[-width:], strict=True))
            for row in rows}


FUNCTION_MATRIX = _matrix(FUNCTIONS)
TABLE_MATRIX = _matrix(TABLES)
SEQUENCE_MATRIX = _matrix(SEQUENCES)


@pytest.fixture(scope="module")
def catalog(migrated_database: Database) -> dict[str, Any]:
    with migrated_database.connect(postgres.OWNER) as conn:
        functions = conn.execute(
            """
            select p.oid::regprocedure::text as signature, p.proname as name,
                   array(select case when t.typname = 'anyarray' then 'text[]'
                                     when t.typtype = 'p' then 'text'
                                     else format_type(t.oid, null) end
                         from unnest(p.proargtypes) with ordinality a(oid, i)
                         join pg_type t on t.oid = a.oid order by a.i) as types,
                   exists (select 1 from aclexplode(coalesce(p.proacl, acldefault('f', p.proowner)))
                           where grantee = 0) as public_execute
            from pg_proc p where p.pronamespace = 'app'::regnamespace
            """).fetchall()
        relations = conn.execute(
            """
            select c.oid::regclass::text as name, c.relkind,
                   array(select a.attname::text from pg_attribute a
                         where a.attrelid = c.oid and a.attnum > 0 and not a.attisdropped
                         order by a.attnum) as columns,
                   array(select a.attname::text from pg_attribute a
                         where a.attrelid = c.oid and a.attnum > 0 and not a.attisdropped
                           and a.attgenerated = ''
                         order by a.attnum) as writable_columns,
                   exists (select 1 from aclexplode(coalesce(c.relacl, acldefault(
                             (case when c.relkind = 'S' then 's' else 'r' end)::"char",
                             c.relowner)))
                           where grantee = 0)
                   or exists (select 1 from pg_attribute a, aclexplode(a.attacl) x
                              where a.attrelid = c.oid and x.grantee = 0) as public_access
            from pg_class c
            where c.relnamespace = 'app'::regnamespace
              and c.relkind in ('r', 'p', 'v', 'm', 'S', 'f')
            """).fetchall()
    return {"functions": {f["signature"]: f for f in functions},
            "relations": {r["name"]: r for r in relations}}


@contextmanager
def _as(db: Database, role: str) -> Iterator[Conn]:
    with db.connect(ROLES[role]) as conn:
        yield conn


def _allowed(conn: Conn, statement: sql.SQL | sql.Composed) -> bool:
    """Try ``statement`` in a transaction that is rolled back; was it permitted?

    Refused by privileges is SQLSTATE 42501; any other outcome (success, a bad
    argument, a constraint) means the role got past the privilege check.
    """
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(statement)
    except psycopg.errors.InsufficientPrivilege:
        return False
    except psycopg.Error:
        return True
    return True


# Every object has a decision -----------------------------------------------------------


def test_every_function_in_app_has_a_decision_in_the_matrix(catalog: dict[str, Any]) -> None:
    existing = set(catalog["functions"])
    assert sorted(existing - set(FUNCTION_MATRIX)) == [], "functions without a decision"
    assert sorted(set(FUNCTION_MATRIX) - existing) == [], "decisions for missing functions"


def test_every_table_and_sequence_in_app_has_a_decision_in_the_matrix(
    catalog: dict[str, Any]
) -> None:
    relations = catalog["relations"]
    tables = {name for name, r in relations.items() if r["relkind"] != "S"}
    sequences = {name for name, r in relations.items() if r["relkind"] == "S"}
    assert tables == set(TABLE_MATRIX)
    assert sequences == set(SEQUENCE_MATRIX)


def test_public_holds_no_privilege_on_any_function_table_or_sequence(
    catalog: dict[str, Any], owner: Conn
) -> None:
    assert [s for s, f in catalog["functions"].items() if f["public_execute"]] == []
    assert [n for n, r in catalog["relations"].items() if r["public_access"]] == []
    row = owner.execute(
        "select has_schema_privilege('public', 'app', 'USAGE') as usage,"
        " has_schema_privilege('public', 'app', 'CREATE') as create").fetchone()
    assert row == {"usage": False, "create": False}


# Functions ---------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ROLES)
def test_function_execute_rights_match_the_matrix_in_the_catalog(
    role: str, catalog: dict[str, Any], owner: Conn
) -> None:
    actual = {}
    for signature in catalog["functions"]:
        row = owner.execute("select has_function_privilege(%s, %s, 'EXECUTE') as ok",
                            (ROLES[role], signature)).fetchone()
        assert row is not None
        actual[signature] = "x" if row["ok"] else "."
    expected = {s: FUNCTION_MATRIX[s][role] for s in catalog["functions"] if s in FUNCTION_MATRIX}
    assert {s: actual[s] for s in expected} == expected


@pytest.mark.parametrize("role", ROLES)
def test_calling_every_function_is_allowed_or_refused_as_the_matrix_says(
    role: str, db: Database, catalog: dict[str, Any]
) -> None:
    """Each function is called with NULL for every argument: a permitted call fails on
    its argument checks (or does nothing), a refused one fails with 42501."""
    outcome = {}
    with _as(db, role) as conn:
        for signature, function in catalog["functions"].items():
            call = sql.SQL("select {}.{}({})").format(
                sql.Identifier("app"), sql.Identifier(function["name"]),
                sql.SQL(", ").join(sql.SQL("null::{}").format(sql.SQL(t))
                                   for t in function["types"]))
            outcome[signature] = "x" if _allowed(conn, call) else "."
    expected = {s: FUNCTION_MATRIX[s][role] for s in outcome if s in FUNCTION_MATRIX}
    assert {s: outcome[s] for s in expected} == expected


# Tables, columns, sequences, the schema ----------------------------------------------------


@pytest.mark.parametrize("role", ROLES)
def test_table_privileges_match_the_matrix_when_tried(
    role: str, db: Database, catalog: dict[str, Any]
) -> None:
    actual: dict[str, str] = {}
    with _as(db, role) as conn:
        for table in TABLE_MATRIX:
            columns = catalog["relations"][table]["columns"]
            schema, name = table.split(".")
            target = sql.Identifier(schema, name)
            granted = ""
            readable = {c for c in columns if _allowed(conn, sql.SQL(
                "select {} from {} limit 0").format(sql.Identifier(c), target))}
            if readable:
                granted += "S"
                assert set(columns) - readable == HIDDEN_COLUMNS.get((table, role), set()), (
                    f"{role} reads the wrong columns of {table}")
            for letter, statement in PRIVILEGE_STATEMENTS.items():
                if _allowed(conn, sql.SQL(statement).format(
                        table=target, column=sql.Identifier(
                            catalog["relations"][table]["writable_columns"][-1]))):
                    granted += letter
            actual[table] = granted or "-"
    assert actual == {table: row[role] for table, row in TABLE_MATRIX.items()}


@pytest.mark.parametrize("role", ROLES)
def test_table_and_column_privileges_match_the_matrix_in_the_catalog(
    role: str, owner: Conn, catalog: dict[str, Any]
) -> None:
    for table, row in TABLE_MATRIX.items():
        for letter, privilege in PRIVILEGE_NAMES.items():
            if letter == "S":
                continue
            granted = owner.execute("select has_table_privilege(%s, %s, %s) as ok",
                                    (ROLES[role], table, privilege)).fetchone()
            assert granted == {"ok": letter in row[role]}, (table, privilege)
        for column in catalog["relations"][table]["columns"]:
            readable = owner.execute("select has_column_privilege(%s, %s, %s, 'SELECT') as ok",
                                     (ROLES[role], table, column)).fetchone()
            expected = "S" in row[role] and column not in HIDDEN_COLUMNS.get((table, role), set())
            assert readable == {"ok": expected}, (table, column)


@pytest.mark.parametrize("role", ROLES)
def test_sequence_and_schema_privileges_match_the_matrix(role: str, db: Database) -> None:
    with _as(db, role) as conn:
        for sequence, row in SEQUENCE_MATRIX.items():
            call = sql.SQL("select nextval({})").format(sql.Literal(sequence))
            assert _allowed(conn, call) is (row[role] == "x"), sequence
        usage = conn.execute("select has_schema_privilege('app', 'USAGE') as ok").fetchone()
        assert usage == {"ok": SCHEMA_USAGE[role]}
        create = _allowed(conn, sql.SQL("create table app.privilege_probe (x int)"))
        assert create is (role == "own")


# Roles -------------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ROLES)
def test_each_login_belongs_to_exactly_the_groups_of_the_matrix(role: str, owner: Conn) -> None:
    rows = owner.execute(
        "select g as group_role from unnest(%s::text[]) g where pg_has_role(%s, g, 'USAGE')",
        (list(GROUP_ROLES), ROLES[role])).fetchall()
    assert {r["group_role"] for r in rows} == MEMBERSHIPS[role]


def test_the_group_roles_cannot_log_in_and_none_contains_another(owner: Conn) -> None:
    rows = owner.execute(
        "select rolname, rolcanlogin, rolsuper, rolcreaterole, rolbypassrls from pg_roles"
        " where rolname = any (%s)", (list(GROUP_ROLES),)).fetchall()
    assert {r["rolname"] for r in rows} == set(GROUP_ROLES)
    assert [r["rolname"] for r in rows
            if r["rolcanlogin"] or r["rolsuper"] or r["rolcreaterole"] or r["rolbypassrls"]] == []
    nested = owner.execute(
        "select m.roleid::regrole::text as group_role, m.member::regrole::text as member"
        " from pg_auth_members m"
        " where m.member::regrole::text = any (%s) and m.roleid::regrole::text = any (%s)",
        (list(GROUP_ROLES), list(GROUP_ROLES))).fetchall()
    assert nested == []


def test_every_privilege_in_app_is_held_by_the_owner_or_a_group_of_the_matrix(
    owner: Conn,
) -> None:
    """No login, and no other group (the legacy service_role included), holds anything
    of its own: a login's rights are exactly its groups', as the matrix says."""
    rows = owner.execute(
        """
        with acl as (
          select 'function ' || p.oid::regprocedure::text as object, a.grantee
          from pg_proc p, aclexplode(p.proacl) a where p.pronamespace = 'app'::regnamespace
          union all
          select 'relation ' || c.oid::regclass::text, a.grantee
          from pg_class c, aclexplode(c.relacl) a where c.relnamespace = 'app'::regnamespace
          union all
          select 'column ' || c.oid::regclass::text || '.' || t.attname, a.grantee
          from pg_class c join pg_attribute t on t.attrelid = c.oid, aclexplode(t.attacl) a
          where c.relnamespace = 'app'::regnamespace
          union all
          select 'schema app', a.grantee from pg_namespace n, aclexplode(n.nspacl) a
          where n.nspname = 'app'
        )
        select object, grantee::regrole::text as grantee from acl
        where grantee = 0 or grantee::regrole::text <> all (%s)
        """, ([postgres.OWNER, *GROUP_ROLES],)).fetchall()
    assert rows == []
