"""Who may do what: PUBLIC nothing, the runtime groups only EXECUTE, readers only their tenant.

Every check connects as the role whose rights it is about; the owner and the
administrator only arrange data.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from psycopg import sql

from tests.conftest import Database
from tests.sql.calls import claim_one, enqueue, new_tenant, raises_sqlstate
from tests.support import postgres
from tests.support.postgres import Conn

#: The runtime contract: these functions are executable by a login of every runtime duty.
SERVICE_FUNCTIONS = {
    "app.enqueue_job(uuid,text,text,jsonb,timestamp with time zone,integer,integer,text)",
    "app.enqueue_jobs(uuid[],text[],text[],jsonb[],timestamp with time zone[],integer[],text[],"
    "integer[],text[],text[])",
    "app.claim_jobs(uuid,text,integer,interval,text[],text[],text)",
    "app.claim_ready_jobs(text,integer,interval,text[],text[],text)",
    "app.ready_tenants(integer)",
    "app.oldest_ready_at()",
    "app.repair_tenant_turns(integer)",
    "app.renew_job_lease(uuid,uuid,text,uuid,interval)",
    "app.complete_job(uuid,uuid,text,uuid,jsonb)",
    "app.fail_job(uuid,uuid,text,uuid,jsonb,interval)",
    "app.discard_job(uuid,uuid,text,uuid,jsonb)",
    "app.finish_jobs(text,uuid[],uuid[],uuid[],text[],jsonb[],interval[])",
    "app.release_expired_jobs(uuid,integer)",
    "app.release_all_expired_jobs(integer)",
}

TABLES = ["jobs", "job_events", "tenant_readers", "schema_migrations", "tenant_turns",
          "kind_turns"]


def _app_functions(conn: Conn) -> list[dict[str, Any]]:
    return conn.execute(
        """
        select p.oid, p.oid::regprocedure::text as signature, p.proname as name,
               array(select t.typname::text from unnest(p.proargtypes) with ordinality a(oid, i)
                     join pg_type t on t.oid = a.oid order by a.i) as types,
               array(select n.nspname::text from unnest(p.proargtypes) with ordinality a(oid, i)
                     join pg_type t on t.oid = a.oid join pg_namespace n on n.oid = t.typnamespace
                     order by a.i) as type_schemas
        from pg_proc p
        where p.pronamespace = 'app'::regnamespace
          and p.prorettype <> 'trigger'::regtype  -- only a trigger calls these
        order by 2
        """
    ).fetchall()


def _executable_by(conn: Conn, role: str) -> set[str]:
    rows = conn.execute(
        """
        select p.oid::regprocedure::text as signature
        from pg_proc p
        where p.pronamespace = 'app'::regnamespace
          and has_function_privilege(%s, p.oid, 'EXECUTE')
        """,
        (role,),
    ).fetchall()
    return {r["signature"] for r in rows}


def _call_with_nulls(conn: Conn, function: dict[str, Any]) -> None:
    """Call an app function with typed NULL arguments (the privilege check comes first)."""
    arguments = [
        sql.SQL("null::{}").format(sql.Identifier(schema, name))
        for schema, name in zip(function["type_schemas"], function["types"], strict=True)
    ]
    conn.execute(
        sql.SQL("select * from {}.{}({})").format(
            sql.Identifier("app"), sql.Identifier(function["name"]), sql.SQL(", ").join(arguments)
        )
    )


@pytest.fixture
def outsider(db: Database) -> Iterator[Conn]:
    """A login role with no grants at all: exactly what PUBLIC may do."""
    with db.connect(postgres.OUTSIDER) as conn:
        yield conn


@pytest.fixture
def other_reader(db: Database) -> Iterator[Conn]:
    with db.connect(postgres.OTHER_READER) as conn:
        yield conn


# Functions ------------------------------------------------------------------------------


def test_public_can_execute_no_function_in_app(owner: Conn) -> None:
    """Reference defect 8: the REVOKE ran before the functions existed."""
    functions = _app_functions(owner)
    assert len(functions) > len(SERVICE_FUNCTIONS)
    assert _executable_by(owner, "public") == set()
    assert _executable_by(owner, postgres.OUTSIDER) == set()


def test_a_login_without_grants_is_refused_every_app_function(
    owner: Conn, outsider: Conn
) -> None:
    for function in _app_functions(owner):
        if "anyelement" in function["types"]:
            continue  # cannot be called with an untyped NULL; covered by the catalog check
        with raises_sqlstate("42501"):
            _call_with_nulls(outsider, function)


def test_the_runtime_duties_execute_the_queue_functions_and_no_internal_function(
    owner: Conn,
) -> None:
    """Reference defect 6: workers had no USAGE on schema app and could call nothing."""
    schema = owner.execute(
        "select has_schema_privilege(%s, 'app', 'USAGE') as usage,"
        " has_schema_privilege(%s, 'app', 'CREATE') as can_create",
        (postgres.WORKER, postgres.WORKER),
    ).fetchone()
    assert schema == {"usage": True, "can_create": False}
    executable = _executable_by(owner, postgres.WORKER)
    assert executable >= SERVICE_FUNCTIONS
    # Whatever later migrations add to the worker's contract runs as the owner, behind
    # the same checks; invoker-rights functions (argument checks, the shared release
    # body, the tenant lookup) stay internal.
    definer = {
        r["signature"]
        for r in owner.execute(
            "select oid::regprocedure::text as signature from pg_proc"
            " where pronamespace = 'app'::regnamespace and prosecdef"
        ).fetchall()
    }
    assert executable <= definer
    assert not executable & {
        "app.release_expired(uuid,integer)",
        "app.current_tenant_id()",
        "app.raise_invalid(text)",
        "app.check_lease(interval)",
        "app.error_document(jsonb)",
    }


def test_every_function_searches_pg_catalog_first_and_the_temporary_schema_last(
    owner: Conn,
) -> None:
    """An empty search_path still looks in pg_temp first for types and tables.

    So a caller's temporary domain named timestamptz would run inside a SECURITY DEFINER
    function with the owner's rights (tests/sql/test_temp_schema_shadowing.py shows the
    attack). Every function of the schema, definer or not, must pin the path.
    """
    rows = owner.execute(
        "select oid::regprocedure::text as signature, prosecdef, proconfig from pg_proc"
        " where pronamespace = 'app'::regnamespace"
    ).fetchall()
    assert sum(r["prosecdef"] for r in rows) >= len(SERVICE_FUNCTIONS)
    unpinned = [
        r["signature"] for r in rows
        if "search_path=pg_catalog, pg_temp" not in (r["proconfig"] or [])
    ]
    assert unpinned == []


#: What a tenant reader may execute: the tenant lookup and the dashboard's reader forms,
#: which run with the reader's rights (SECURITY INVOKER), so row-level security filters.
READER_FUNCTIONS = {
    "app.current_tenant_id()",
    "app.reader_queue_depth(uuid,text,integer)",
    "app.reader_job_activity(uuid,text,interval,integer,integer)",
    "app.reader_list_jobs(app.job_state,uuid,text,timestamp with time zone,"
    "timestamp with time zone,timestamp with time zone,uuid,integer)",
    "app.reader_get_job(uuid)",
    "app.reader_job_wait_reasons(uuid[])",
    "app.reader_job_timeline(uuid,integer)",
}


def test_readers_execute_only_the_tenant_lookup(owner: Conn, reader: Conn) -> None:
    assert _executable_by(owner, "authenticated") == READER_FUNCTIONS
    invoker = {
        r["signature"]
        for r in owner.execute(
            "select oid::regprocedure::text as signature from pg_proc"
            " where pronamespace = 'app'::regnamespace and not prosecdef"
        ).fetchall()
    }
    assert invoker >= READER_FUNCTIONS
    readable = {s.split("(")[0].removeprefix("app.") for s in READER_FUNCTIONS}
    for function in _app_functions(owner):
        if function["name"] in readable or "anyelement" in function["types"]:
            continue
        with raises_sqlstate("42501", match="permission denied for function"):
            _call_with_nulls(reader, function)


def test_internal_functions_are_not_callable_by_workers(worker: Conn) -> None:
    with raises_sqlstate("42501", match="permission denied for function"):
        worker.execute("select app.release_expired(null, 10)")
    with raises_sqlstate("42501", match="permission denied for function"):
        worker.execute("select app.error_document('{}')")


# Tables ---------------------------------------------------------------------------------


@pytest.mark.parametrize("role", [*postgres.RUNTIME_GROUPS, "leaseq_tenant_producer"])
def test_no_runtime_group_has_any_table_privilege(owner: Conn, role: str) -> None:
    rows = owner.execute(
        """
        select c.oid::regclass::text as name, p.privilege
        from pg_class c
        cross join unnest(array['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE',
                                'REFERENCES', 'TRIGGER']) as p(privilege)
        where c.relnamespace = 'app'::regnamespace and c.relkind in ('r', 'p', 'v', 'S')
          and case when c.relkind = 'S'
                   then has_sequence_privilege(%(role)s, c.oid, 'USAGE')
                   else has_table_privilege(%(role)s, c.oid, p.privilege) end
        """,
        {"role": role},
    ).fetchall()
    assert rows == []


@pytest.mark.parametrize("table", TABLES)
def test_worker_cannot_read_or_write_tables_directly(
    worker: Conn, owner: Conn, table: str
) -> None:
    tenant = new_tenant()
    enqueue(owner, tenant, "a")
    name = sql.Identifier("app", table)
    statements = [
        sql.SQL("select count(*) from {}").format(name),
        sql.SQL("delete from {}").format(name),
        sql.SQL("update {} set tenant_id = tenant_id").format(name)
        if table != "schema_migrations"
        else sql.SQL("update {} set name = name").format(name),
        sql.SQL("insert into {} default values").format(name),
    ]
    for statement in statements:
        with raises_sqlstate("42501", match="permission denied"):
            worker.execute(statement)
    assert owner.execute("select count(*) as n from app.jobs").fetchone() == {"n": 1}


def test_readers_cannot_write_tables(reader: Conn, owner: Conn) -> None:
    tenant = new_tenant()
    owner.execute(
        "insert into app.tenant_readers (role_name, tenant_id) values (%s, %s)",
        (postgres.READER, tenant),
    )
    reader.execute("select set_config('app.tenant_id', %s, false)", (str(tenant),))
    for statement in (
        "update app.jobs set state = 'succeeded'",
        "delete from app.job_events",
        "insert into app.tenant_readers (role_name, tenant_id)"
        " values ((select oid::regrole from pg_roles where rolname = current_user),"
        " gen_random_uuid())",
    ):
        with raises_sqlstate("42501", match="permission denied"):
            reader.execute(statement)


# Tenant isolation -------------------------------------------------------------------------


def _bind(owner: Conn, role: str, tenant: uuid.UUID) -> None:
    owner.execute(
        "insert into app.tenant_readers (role_name, tenant_id) values (%s, %s)", (role, tenant)
    )


def _visible(reader: Conn, setting: str | None) -> tuple[set[uuid.UUID], set[uuid.UUID]]:
    """Job ids and event job ids the reader sees with this app.tenant_id setting."""
    reader.execute("reset app.tenant_id")
    if setting is not None:
        reader.execute("select set_config('app.tenant_id', %s, false)", (setting,))
    jobs = reader.execute("select id from app.jobs").fetchall()
    events = reader.execute("select job_id from app.job_events").fetchall()
    return {r["id"] for r in jobs}, {r["job_id"] for r in events}


@pytest.fixture
def two_tenants(worker: Conn, owner: Conn) -> tuple[uuid.UUID, uuid.UUID, uuid.UUID, uuid.UUID]:
    """Tenant A (reader bound) and B (bound to the other reader), one claimed job each."""
    a, b = new_tenant(), new_tenant()
    job_a = enqueue(worker, a, "a")["id"]
    job_b = enqueue(worker, b, "b")["id"]
    claim_one(worker, a)
    claim_one(worker, b)
    _bind(owner, postgres.READER, a)
    _bind(owner, postgres.OTHER_READER, b)
    return a, b, job_a, job_b


def test_reader_queries_run_because_readers_may_execute_the_tenant_lookup(
    reader: Conn, owner: Conn
) -> None:
    """Reference defect 7: current_tenant_id() lost EXECUTE, so every reader query errored."""
    tenant = new_tenant()
    _bind(owner, postgres.READER, tenant)
    reader.execute("select set_config('app.tenant_id', %s, false)", (str(tenant),))
    assert reader.execute("select app.current_tenant_id() as t").fetchone() == {"t": tenant}
    assert reader.execute("select id from app.jobs").fetchall() == []


def test_reader_sees_only_its_bound_tenants_jobs_and_events(
    reader: Conn, two_tenants: tuple[uuid.UUID, uuid.UUID, uuid.UUID, uuid.UUID]
) -> None:
    a, _, job_a, _ = two_tenants
    jobs, events = _visible(reader, str(a))
    assert jobs == {job_a}
    assert events == {job_a}
    rows = reader.execute("select event_type from app.job_events order by sequence").fetchall()
    assert [r["event_type"] for r in rows] == ["created", "claimed"]


def test_setting_another_tenants_id_shows_nothing(
    reader: Conn, two_tenants: tuple[uuid.UUID, uuid.UUID, uuid.UUID, uuid.UUID]
) -> None:
    """Reference defect 10: isolation rested on a setting any reader could change."""
    _, b, _, _ = two_tenants
    assert _visible(reader, str(b)) == (set(), set())


@pytest.mark.parametrize(
    "setting",
    [None, "", "   ", "not-a-uuid", "1234", "00000000-0000-0000-0000-00000000000g",
     "'; select 1; --", "null", str(uuid.UUID(int=0)), "\t" + str(uuid.UUID(int=1)) + "\n"],
    ids=["unset", "empty", "blank", "words", "short", "bad-hex", "injection", "null-word",
         "nil-uuid", "unbound-with-tab"],
)
def test_missing_or_malformed_tenant_setting_shows_nothing_without_error(
    reader: Conn, two_tenants: tuple[uuid.UUID, uuid.UUID, uuid.UUID, uuid.UUID],
    setting: str | None,
) -> None:
    """Reference defect 10: a malformed setting raised an error instead of showing nothing."""
    assert _visible(reader, setting) == (set(), set())


@pytest.mark.parametrize(
    "spell",
    [lambda t: f"  {t}  ", lambda t: f"\t{t}\n", str.upper, lambda t: t.replace("-", "")],
    ids=["spaces", "tab-newline", "upper-case", "no-hyphens"],
)
def test_bound_tenant_id_is_recognised_in_any_valid_spelling(
    reader: Conn, two_tenants: tuple[uuid.UUID, uuid.UUID, uuid.UUID, uuid.UUID],
    spell: Callable[[str], str],
) -> None:
    a, _, job_a, _ = two_tenants
    assert _visible(reader, spell(str(a))) == ({job_a}, {job_a})


def test_reader_bound_to_two_tenants_sees_the_one_it_selects(
    reader: Conn, owner: Conn,
    two_tenants: tuple[uuid.UUID, uuid.UUID, uuid.UUID, uuid.UUID],
) -> None:
    a, b, job_a, job_b = two_tenants
    _bind(owner, postgres.READER, b)
    assert _visible(reader, str(a))[0] == {job_a}
    assert _visible(reader, str(b))[0] == {job_b}


def test_reader_sees_only_its_own_bindings(
    reader: Conn, two_tenants: tuple[uuid.UUID, uuid.UUID, uuid.UUID, uuid.UUID]
) -> None:
    a, _, _, _ = two_tenants
    rows = reader.execute("select role_name, tenant_id from app.tenant_readers").fetchall()
    assert rows == [{"role_name": postgres.READER, "tenant_id": a}]


def test_worker_sees_no_rows_even_through_the_policies(worker: Conn, owner: Conn) -> None:
    """A runtime login is not a reader: binding it changes nothing, it has no SELECT."""
    tenant = new_tenant()
    enqueue(worker, tenant, "a")
    _bind(owner, postgres.WORKER, tenant)
    worker.execute("select set_config('app.tenant_id', %s, false)", (str(tenant),))
    with raises_sqlstate("42501"):
        worker.execute("select id from app.jobs")


# Lease tokens -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "statement",
    [
        "select lease_token from app.leases",
        "select * from app.leases",
        "select lease_token from app.job_events",
        "select * from app.job_events",
    ],
)
def test_reader_can_never_select_a_lease_token(
    reader: Conn, two_tenants: tuple[uuid.UUID, uuid.UUID, uuid.UUID, uuid.UUID], statement: str
) -> None:
    """Reference defect 9: readers could read tokens and forge completions."""
    a, _, _, _ = two_tenants
    reader.execute("select set_config('app.tenant_id', %s, false)", (str(a),))
    with raises_sqlstate("42501", match="permission denied"):
        reader.execute(statement.encode())


def test_claimed_event_details_carry_no_lease_token(
    reader: Conn, two_tenants: tuple[uuid.UUID, uuid.UUID, uuid.UUID, uuid.UUID]
) -> None:
    a, _, _, _ = two_tenants
    reader.execute("select set_config('app.tenant_id', %s, false)", (str(a),))
    rows = reader.execute(
        "select details from app.job_events where event_type = 'claimed'"
    ).fetchall()
    assert len(rows) == 1
    assert "leaseToken" not in rows[0]["details"]
    assert "token" not in str(rows[0]["details"]).lower()


# Referential integrity -------------------------------------------------------------------


def test_every_event_carries_the_tenant_of_its_job(worker: Conn, admin: Conn) -> None:
    """Reference defect 17 (events naming a job of another tenant). The events no longer
    have a foreign key to app.jobs (its row locks cost WAL on every event, and retention
    drops days of events, not rows): the functions that write them are what keeps each
    event's tenant its job's."""
    tenant = new_tenant()
    enqueue(worker, tenant, "a")
    claim_one(worker, tenant)
    rows = admin.execute(
        "select e.tenant_id = j.tenant_id as same from app.job_events e"
        " left join app.jobs j on j.id = e.job_id where e.tenant_id = %s", (tenant,)
    ).fetchall()
    assert rows == [{"same": True}, {"same": True}]
    fk = admin.execute(
        "select count(*) as n from pg_constraint c"
        " where c.conrelid = 'app.job_events'::regclass and c.contype = 'f'"
    ).fetchone()
    assert fk == {"n": 0}


def test_owner_is_not_a_superuser_and_does_not_bypass_rls(owner: Conn) -> None:
    """The suite runs the schema owner as on RDS, so the checks above mean something."""
    row = owner.execute(
        "select rolsuper, rolbypassrls from pg_roles where rolname = current_user"
    ).fetchone()
    assert row == {"rolsuper": False, "rolbypassrls": False}
    forced = owner.execute(
        "select relname, relrowsecurity, relforcerowsecurity from pg_class"
        " where relnamespace = 'app'::regnamespace and relkind in ('r', 'p') order by relname"
    ).fetchall()
    assert {r["relname"]: (r["relrowsecurity"], r["relforcerowsecurity"]) for r in forced} == {
        "claimable": (True, False),
        "event_days": (True, False),
        "event_holds": (True, False),
        "held_jobs": (True, False),
        "job_events": (True, False),
        "jobs": (True, False),
        "kind_turns": (True, False),
        "leases": (True, False),
        "queue_events": (True, False),
        "queue_kinds": (True, False),
        "queue_workers": (True, False),
        "connection_budget": (True, False),
        "queues": (True, False),
        "limit_slots": (True, False),
        "limit_starts": (True, False),
        "limit_turns": (True, False),
        "limits": (True, False),
        "schedules": (True, False),
        "schema_functions": (False, False),
        "schema_migrations": (False, False),
        "settings": (False, False),
        "tenant_producers": (False, False),
        "tenant_readers": (True, False),
        "tenant_turn_sweep": (True, False),
        "tenant_turns": (True, False),
        "worker_pool": (True, False),
        "worker_pool_state": (True, False),
        "worker_wakes": (True, False),
    }
