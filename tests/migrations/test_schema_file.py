"""sql/schema.sql is the schema the migrations build, on every server version we support.

The file is generated (scripts/write-schema) from a freshly migrated database; these tests
migrate a fresh database of the session's server (the embedded PostgreSQL 18, or
LEASEQ_TEST_DSN's) as an ordinary owner and render it the same way. A migration that
changes a table without the file following fails here with the difference and the one
command that brings the file up to date.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from leaseq.store.db import connect
from leaseq.store.migrate import migrate

from tests.conftest import Database
from tests.support import postgres

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def write_schema() -> Iterator[ModuleType]:
    """scripts/write_schema.py, which lives outside the packages (a tool of the checkout)."""
    spec = importlib.util.spec_from_file_location("write_schema",
                                                  ROOT / "scripts" / "write_schema.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def _migrated(make: Callable[[], Database]) -> Database:
    database = make()
    with connect(database.owner_dsn) as conn:
        migrate(conn)
    return database


def test_the_committed_schema_file_is_what_the_migrations_build(
    write_schema: ModuleType, fresh_database: Callable[[], Database]
) -> None:
    database = _migrated(fresh_database)

    current = write_schema.render(database.admin_dsn)

    problem = write_schema.stale(write_schema.SCHEMA_FILE.read_text(encoding="utf-8"), current)
    assert problem is None, problem


def test_a_schema_change_the_file_does_not_follow_fails_with_the_difference_and_the_command(
    write_schema: ModuleType, fresh_database: Callable[[], Database]
) -> None:
    database = _migrated(fresh_database)
    with database.connect(postgres.OWNER) as conn:  # what a new migration might do
        conn.execute("alter table app.jobs add column weight integer not null default 0")
        conn.execute("create index jobs_weight_idx on app.jobs (weight)")

    problem = write_schema.stale(write_schema.SCHEMA_FILE.read_text(encoding="utf-8"),
                                 write_schema.render(database.admin_dsn))

    assert problem is not None
    assert "run scripts/write-schema and commit the file" in problem
    assert "\n+    weight integer DEFAULT 0 NOT NULL,\n" in problem
    assert "\n+CREATE INDEX jobs_weight_idx ON app.jobs USING btree (weight);\n" in problem


def test_each_table_is_read_in_one_place_with_its_comments_keys_indexes_policies_and_grants(
    migrated_database: Database,
) -> None:
    text = (ROOT / "sql" / "schema.sql").read_text(encoding="utf-8")
    sections = dict(re.findall(r"^-- app\.(\w+)\n-- =+\n(.*?)(?=^-- =+\n-- app\.|\Z)", text,
                               re.MULTILINE | re.DOTALL))
    with migrated_database.connect(postgres.OWNER) as conn:
        tables = [row["relname"] for row in conn.execute(
            "select relname from pg_class where relnamespace = 'app'::regnamespace"
            " and relkind in ('r', 'p') order by 1")]
        pieces = conn.execute(
            "select tablename as table, indexname as name from pg_indexes"
            " where schemaname = 'app'"
            " union all select tablename, policyname from pg_policies where schemaname = 'app'"
            " union all select conrelid::regclass::text, conname from pg_constraint"
            " where connamespace = 'app'::regnamespace and conrelid <> 0 and contype <> 'n'"
        ).fetchall()

    assert sorted(sections) == tables
    for piece in pieces:
        table = piece["table"].removeprefix("app.")
        assert re.search(rf"\b{piece['name']}\b", sections[table]), (
            f"{piece['name']} is not in the section of app.{table}")
    leases = sections["leases"].splitlines()
    lease_token = leases.index("    lease_token uuid NOT NULL,")
    assert leases[lease_token - 1].startswith("    -- "), "the lease token's column comment"
    assert "Never granted to tenant readers." in "".join(leases[lease_token - 3:lease_token])
    assert "GRANT SELECT(tenant_id) ON TABLE app.leases TO authenticated;" in sections["leases"]
    assert "lease_token" not in "".join(
        line for line in sections["leases"].splitlines() if line.startswith("GRANT"))
