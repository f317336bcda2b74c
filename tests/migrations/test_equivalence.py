"""Every path to the current schema ends at the same catalog.

Three databases: one built fresh, one that ran the reference schema as written, and one
at the last migration of the release before function files existed (0001-0009 applied
by that release's runner, which recorded no function files). Each is then migrated. Their
catalogs must be identical: columns, constraints, indexes, types, function sources,
settings and privileges, table privileges and policies. A migration that forgets an
upgrade step, or a function file that relies on what only a fresh build has, shows up
here as a difference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from leaseq.store.db import connect
from leaseq.store.migrate import load_migrations, migrate

from tests.conftest import Database
from tests.migrations.test_reference_upgrade import REFERENCE
from tests.support import postgres
from tests.support.postgres import Conn

#: The last migration of the release whose runner knew no function files.
LAST_MIGRATION_BEFORE_FUNCTION_FILES = 9

#: That release's bookkeeping, as its runner created it.
_PREVIOUS_BOOKKEEPING = """
create schema if not exists app;
create table if not exists app.schema_migrations (
  version integer primary key,
  name text not null,
  checksum text not null,
  applied_at timestamptz not null default clock_timestamp(),
  applied_by text not null default current_user
);
revoke all on app.schema_migrations from public;
"""

_CATALOG_QUERIES = {
    "columns": """
        select c.relname, a.attname, format_type(a.atttypid, a.atttypmod) as type,
               a.attnotnull, pg_get_expr(d.adbin, d.adrelid) as default_value,
               a.attidentity, a.attacl::text as acl
        from pg_attribute a
        join pg_class c on c.oid = a.attrelid
        left join pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum
        where c.relnamespace = 'app'::regnamespace and a.attnum > 0 and not a.attisdropped
        order by 1, 2
    """,
    "relations": """
        select relname, relkind, relacl::text as acl, relrowsecurity, relforcerowsecurity,
               reloptions::text as options, pg_get_userbyid(relowner) as owner
        from pg_class where relnamespace = 'app'::regnamespace
        order by relname
    """,
    "constraints": """
        select conrelid::regclass::text as relation, contypid::regtype::text as domain,
               conname, pg_get_constraintdef(oid) as definition, convalidated
        from pg_constraint where connamespace = 'app'::regnamespace
        order by 1, 2, 3
    """,
    "indexes": """
        select indexname, indexdef from pg_indexes where schemaname = 'app' order by 1
    """,
    "types": """
        select t.typname, t.typtype, format_type(t.typbasetype, t.typtypmod) as base,
               array(select e.enumlabel::text from pg_enum e where e.enumtypid = t.oid
                     order by e.enumsortorder) as labels
        from pg_type t
        where t.typnamespace = 'app'::regnamespace and t.typtype in ('e', 'd')
        order by 1
    """,
    "functions": """
        select oid::regprocedure::text as signature, prosrc, proconfig::text as config,
               prosecdef, provolatile, proacl::text as acl,
               pg_get_function_result(oid) as result,
               pg_get_function_arguments(oid) as arguments,
               pg_get_userbyid(proowner) as owner
        from pg_proc where pronamespace = 'app'::regnamespace
        order by 1
    """,
    "policies": """
        select tablename, policyname, permissive, roles::text, cmd, qual, with_check
        from pg_policies where schemaname = 'app' order by 1, 2
    """,
    "schema": """
        select nspname, nspacl::text as acl, pg_get_userbyid(nspowner) as owner
        from pg_namespace where nspname = 'app'
    """,
}


def _sorted_acl(row: dict[str, Any]) -> dict[str, Any]:
    """The same privileges granted in another order print in another order."""
    acl = row.get("acl")
    if isinstance(acl, str):
        row = {**row, "acl": sorted(acl.strip("{}").split(","))}
    return row


def _catalog(conn: Conn) -> dict[str, list[dict[str, Any]]]:
    return {
        name: [_sorted_acl(row) for row in conn.execute(query).fetchall()]
        for name, query in _CATALOG_QUERIES.items()
    }


def _build_fresh(database: Database) -> None:
    with connect(database.owner_dsn) as conn:
        migrate(conn)


def _build_from_reference(database: Database) -> None:
    postgres.create_service_role(database.cluster)  # the reference grants to it
    with database.connect(postgres.OWNER) as owner:
        owner.execute(REFERENCE.read_bytes())
    with connect(database.owner_dsn) as conn:
        migrate(conn)


def _build_from_previous_release(database: Database) -> None:
    """Apply 0001-0009 and record them the way the previous release's runner did."""
    previous = [m for m in load_migrations() if m.version <= LAST_MIGRATION_BEFORE_FUNCTION_FILES]
    with database.connect(postgres.OWNER) as owner:
        owner.execute(_PREVIOUS_BOOKKEEPING)
        for migration in previous:
            with owner.transaction():
                owner.execute(migration.sql.encode("utf-8"))
                owner.execute(
                    "insert into app.schema_migrations (version, name, checksum)"
                    " values (%s, %s, %s)",
                    (migration.version, migration.name, migration.checksum),
                )
    with connect(database.owner_dsn) as conn:
        migrate(conn)


def _differences(
    expected: dict[str, list[dict[str, Any]]], actual: dict[str, list[dict[str, Any]]]
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    found = {}
    for part, rows in expected.items():
        missing = [r for r in rows if r not in actual[part]]
        extra = [r for r in actual[part] if r not in rows]
        if missing or extra:
            found[part] = {"missing": missing, "extra": extra}
    return found


def _catalog_of(build: Callable[[Database], None], database: Database) -> dict[str, Any]:
    build(database)
    with database.connect(postgres.OWNER) as conn:
        return _catalog(conn)


def test_fresh_reference_and_previous_release_databases_migrate_to_the_same_catalog(
    fresh_database: Callable[[], Database], migrated_database: Database
) -> None:
    fresh = _catalog_of(_build_fresh, fresh_database())
    from_reference = _catalog_of(_build_from_reference, fresh_database())
    from_previous = _catalog_of(_build_from_previous_release, fresh_database())

    assert len(fresh["functions"]) > 30
    assert _differences(fresh, from_reference) == {}
    assert _differences(fresh, from_previous) == {}
