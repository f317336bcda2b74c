"""Bring a database's schema up to date from the packaged ``sql/`` directory.

Two kinds of file, two rules (``sql/README.md``, "Migrations"):

* ``sql/migrations/NNNN_name.sql`` change tables, types, indexes, roles and data. They
  are forward-only: each runs once, in its own transaction, and is recorded with a
  SHA-256 of its text in ``app.schema_migrations``. A changed file of an applied
  migration, or a database that has migrations this code does not know, is refused.
* ``sql/functions/<area>.sql`` hold the one current definition of every function, as
  ``CREATE OR REPLACE`` with its settings and grants beside it. They are applied
  together, in one transaction, whenever one of them changed or a migration ran, and
  recorded in ``app.schema_functions``. Re-running with nothing changed is a no-op.

Every transaction first takes a transaction-scoped advisory lock, so two deploys racing
each other serialise and the second finds the work done. After that lock, DDL waits at
most ``lock_timeout`` for the locks it needs: a migration queued behind a long
transaction (say a reader idle in a transaction on ``app.jobs``) would otherwise make
every claim queue behind the migration. It is retried a few times with a growing pause,
then refused with :class:`MigrationBlockedError`, never left waiting.

The statements this module sends are its own bookkeeping (the lock, the two record
tables, the schema version they hold) and the files themselves, written here rather than
in :mod:`leaseq.store.queries` because they exist before and beside the SQL contract, never as
a call of it. It is the one place besides :class:`leaseq.store.client.QueueClient` that sends
SQL.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from importlib import resources
from pathlib import Path
from typing import Any

from leaseq.base.errors import DatabaseError, MigrationBlockedError, SchemaVersionError
from leaseq.store.db import Connection, translate_errors

#: Key of the transaction-scoped advisory lock that serialises migration runs.
MIGRATION_LOCK_KEY = 0x6C65_6173_6571  # "leaseq"

#: How long one migration transaction may wait for a table lock, and how often it tries.
DEFAULT_LOCK_TIMEOUT = timedelta(seconds=5)
DEFAULT_LOCK_ATTEMPTS = 5

_LOCK_NOT_AVAILABLE = "55P03"
_MIGRATION_FILE = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")
_FUNCTION_FILE = re.compile(r"^(?P<name>[a-z][a-z0-9_]*)\.sql$")

_BOOKKEEPING = """
create schema if not exists app;
create table if not exists app.schema_migrations (
  version integer primary key,
  name text not null,
  checksum text not null,
  applied_at timestamptz not null default clock_timestamp(),
  applied_by text not null default current_user
);
create table if not exists app.schema_functions (
  file text primary key,
  checksum text not null,
  applied_at timestamptz not null default clock_timestamp(),
  applied_by text not null default current_user
);
revoke all on app.schema_migrations, app.schema_functions from public;
"""


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Migration:
    """One numbered, forward-only file of ``sql/migrations``."""

    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        """SHA-256 of the file's text, recorded when it is applied."""
        return _sha256(self.sql)


@dataclass(frozen=True)
class FunctionFile:
    """One file of ``sql/functions``: current definitions, re-applied when changed."""

    file: str
    sql: str

    @property
    def checksum(self) -> str:
        """SHA-256 of the file's text, recorded when it is applied."""
        return _sha256(self.sql)


@dataclass(frozen=True)
class MigrationReport:
    """What one :func:`migrate` call did."""

    applied: tuple[int, ...]
    current_version: int
    #: Function files (re-)applied by this call, by file name; empty when none changed.
    functions_applied: tuple[str, ...] = field(default=())

    def as_document(self, database: str) -> dict[str, Any]:
        """What ``leaseq migrate --json`` and ``python -m leaseq migrate --json`` print,
        ``database`` saying which server was migrated."""
        return {"applied": list(self.applied), "version": self.current_version,
                "database": database}

    def describe(self, database: str) -> str:
        """The one line both commands print without ``--json``."""
        if self.applied:
            applied = ", ".join(f"{v:04d}" for v in self.applied)
            return f"applied {applied}; schema version {self.current_version} ({database})"
        return f"schema is up to date at version {self.current_version} ({database})"


def _sql_root() -> Path:
    return Path(str(resources.files("leaseq") / "_sql"))


def load_migrations(directory: Path | None = None) -> list[Migration]:
    """Read the numbered migrations, from ``directory`` or from the installed package."""
    root = directory if directory is not None else _sql_root() / "migrations"
    migrations = []
    for path in sorted(root.iterdir()):
        match = _MIGRATION_FILE.match(path.name)
        if match is None:
            continue
        migrations.append(
            Migration(int(match["version"]), match["name"], path.read_text(encoding="utf-8"))
        )
    versions = [m.version for m in migrations]
    if versions != list(range(1, len(versions) + 1)):
        raise SchemaVersionError(
            f"migration files must be numbered 0001, 0002, ... without gaps; found {versions}"
        )
    return migrations


def load_functions(directory: Path | None = None) -> list[FunctionFile]:
    """Read the function files, in name order, from ``directory`` or the package."""
    root = directory if directory is not None else _sql_root() / "functions"
    return [
        FunctionFile(path.name, path.read_text(encoding="utf-8"))
        for path in sorted(root.iterdir())
        if _FUNCTION_FILE.match(path.name)
    ]


def _applied(conn: Connection) -> dict[int, str]:
    rows = conn.execute("select version, checksum from app.schema_migrations").fetchall()
    return {int(row["version"]): str(row["checksum"]) for row in rows}


def _applied_functions(conn: Connection) -> dict[str, str]:
    exists = conn.execute("select to_regclass('app.schema_functions') is not null as ok")
    row = exists.fetchone()
    if row is None or not row["ok"]:
        return {}
    rows = conn.execute("select file, checksum from app.schema_functions").fetchall()
    return {str(row["file"]): str(row["checksum"]) for row in rows}


def current_version(conn: Connection) -> int:
    """The newest migration the database records as applied (0 for none), without
    applying anything or checking the files: what a deploy being rolled back reports."""
    with translate_errors():
        exists = conn.execute("select to_regclass('app.schema_migrations') is not null as ok")
        row = exists.fetchone()
        if row is None or not row["ok"]:
            return 0
        return max(_applied(conn), default=0)


def _check_history(known: list[Migration], applied: dict[int, str]) -> None:
    by_version = {m.version: m for m in known}
    newer = sorted(v for v in applied if v not in by_version)
    if newer:
        raise SchemaVersionError(
            f"the database has migrations {newer} that this code does not know "
            f"(code knows up to {max(by_version, default=0)}); deploy the newer leaseq "
            "instead of rolling back the schema"
        )
    for version, checksum in applied.items():
        if by_version[version].checksum != checksum:
            migration = by_version[version]
            raise SchemaVersionError(
                f"migration {version:04d}_{migration.name}.sql changed after it was applied; "
                "migrations are forward-only: restore the file and add a new migration"
            )


def _functions_changed(functions: list[FunctionFile], applied: dict[str, str]) -> bool:
    return {f.file: f.checksum for f in functions} != applied


class _Locked:
    """Runs one unit of schema work in a transaction under the migration lock.

    The advisory lock is taken before ``lock_timeout`` is set, so a deploy still waits
    for another deploy as long as it takes; only the DDL's own lock waits are bounded.
    """

    def __init__(self, conn: Connection, lock_timeout: timedelta, attempts: int,
                 sleep: Callable[[float], None]) -> None:
        if lock_timeout <= timedelta(0) or attempts < 1:
            raise ValueError("lock_timeout must be positive and attempts at least 1")
        self._conn = conn
        self._timeout_ms = max(1, int(lock_timeout.total_seconds() * 1000))
        self._attempts = attempts
        self._sleep = sleep

    def run(self, what: str, work: Callable[[], None]) -> None:
        for attempt in range(1, self._attempts + 1):
            try:
                with translate_errors(), self._conn.transaction():
                    self._conn.execute("select pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
                    self._conn.execute(
                        "select set_config('lock_timeout', %s, true)", (f"{self._timeout_ms}ms",)
                    )
                    work()
                return
            except DatabaseError as exc:
                if exc.sqlstate != _LOCK_NOT_AVAILABLE:
                    raise
                if attempt == self._attempts:
                    raise MigrationBlockedError(
                        f"{what} could not take the locks it needs within "
                        f"{self._timeout_ms} ms, {self._attempts} times: another session "
                        "holds a lock on a leaseq table (often a transaction left open; "
                        "look for state 'idle in transaction' in pg_stat_activity). End "
                        "that session or wait for it, then run the migration again; "
                        "nothing of this step was applied.",
                        sqlstate=exc.sqlstate,
                    ) from exc
                self._sleep(min(0.5 * 2 ** (attempt - 1), 8.0))


def migrate(
    conn: Connection,
    migrations: list[Migration] | None = None,
    functions: list[FunctionFile] | None = None,
    *,
    lock_timeout: timedelta = DEFAULT_LOCK_TIMEOUT,
    lock_attempts: int = DEFAULT_LOCK_ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
) -> MigrationReport:
    """Bring the schema up to date; a no-op when it already is.

    Runs as the schema owner (no superuser needed). ``conn`` must be in autocommit
    mode; every migration gets a transaction of its own, and the function files one
    transaction together, after the migrations.
    """
    known = migrations if migrations is not None else load_migrations()
    definitions = functions if functions is not None else load_functions()
    locked = _Locked(conn, lock_timeout, lock_attempts, sleep)
    applied_now: list[int] = []
    functions_now: list[str] = []

    locked.run("creating the migration records", lambda: _bookkeeping(conn))
    for migration in known:
        def apply(migration: Migration = migration) -> None:
            applied = _applied(conn)
            _check_history(known, applied)
            if migration.version in applied:
                return
            conn.execute(migration.sql.encode("utf-8"))
            conn.execute(
                "insert into app.schema_migrations (version, name, checksum)"
                " values (%s, %s, %s)",
                (migration.version, migration.name, migration.checksum),
            )
            applied_now.append(migration.version)

        locked.run(f"migration {migration.version:04d}_{migration.name}.sql", apply)

    def apply_functions() -> None:
        _check_history(known, _applied(conn))
        if not applied_now and not _functions_changed(definitions, _applied_functions(conn)):
            return
        # Function bodies may call functions of a later file; they are checked when
        # first run (and by the tests), not when created, as pg_dump restores them.
        conn.execute("select set_config('check_function_bodies', 'off', true)")
        for definition in definitions:
            conn.execute(definition.sql.encode("utf-8"))
        conn.execute("delete from app.schema_functions")
        for definition in definitions:
            conn.execute(
                "insert into app.schema_functions (file, checksum) values (%s, %s)",
                (definition.file, definition.checksum),
            )
        functions_now.extend(d.file for d in definitions)

    locked.run("the function definitions (sql/functions)", apply_functions)
    with translate_errors(), conn.transaction():
        applied = _applied(conn)
        _check_history(known, applied)
    return MigrationReport(tuple(applied_now), max(applied, default=0), tuple(functions_now))


def _bookkeeping(conn: Connection) -> None:
    conn.execute(_BOOKKEEPING)


def pending(
    conn: Connection,
    migrations: list[Migration] | None = None,
    functions: list[FunctionFile] | None = None,
) -> list[Migration | FunctionFile]:
    """What :func:`migrate` would apply (after checking the applied migrations are intact).

    The migrations not yet applied, then every function file when any of them differs
    from what the database recorded (they are applied together).
    """
    known = migrations if migrations is not None else load_migrations()
    definitions = functions if functions is not None else load_functions()
    with translate_errors():
        exists = conn.execute("select to_regclass('app.schema_migrations') is not null as ok")
        row = exists.fetchone()
        if row is None or not row["ok"]:
            return [*known, *definitions]
        applied = _applied(conn)
        applied_functions = _applied_functions(conn)
    _check_history(known, applied)
    todo: list[Migration | FunctionFile] = [m for m in known if m.version not in applied]
    if todo or _functions_changed(definitions, applied_functions):
        todo.extend(definitions)
    return todo
