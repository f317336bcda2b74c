"""Apply the packaged ``sql/`` migrations in order, exactly once each.

Each migration runs in its own transaction under a transaction-scoped advisory lock,
and is recorded with a SHA-256 of its file in ``app.schema_migrations``. Two deploys
racing each other serialise on the lock; the second finds the work done. A changed
file or a database that is newer than this code is refused instead of guessed at.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from leaseq.db import Connection, translate_errors
from leaseq.errors import SchemaVersionError

#: Key of the transaction-scoped advisory lock that serialises migration runs.
MIGRATION_LOCK_KEY = 0x6C65_6173_6571  # "leaseq"

_FILE_NAME = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")

_BOOKKEEPING = """
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


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class MigrationReport:
    applied: tuple[int, ...]
    current_version: int


def load_migrations(directory: Path | None = None) -> list[Migration]:
    """Read the migration files, from ``directory`` or from the installed package."""
    root = directory if directory is not None else Path(str(resources.files("leaseq") / "_sql"))
    migrations = []
    for path in sorted(root.iterdir()):
        match = _FILE_NAME.match(path.name)
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


def _applied(conn: Connection) -> dict[int, str]:
    rows = conn.execute("select version, checksum from app.schema_migrations").fetchall()
    return {int(row["version"]): str(row["checksum"]) for row in rows}


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


def migrate(conn: Connection, migrations: list[Migration] | None = None) -> MigrationReport:
    """Bring the schema up to date; a no-op when it already is.

    Runs as the schema owner (no superuser needed). ``conn`` must be in autocommit
    mode; every migration gets a transaction of its own.
    """
    known = migrations if migrations is not None else load_migrations()
    applied_now: list[int] = []
    with translate_errors():
        with conn.transaction():
            conn.execute("select pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
            conn.execute(_BOOKKEEPING)
        for migration in known:
            with conn.transaction():
                conn.execute("select pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
                applied = _applied(conn)
                _check_history(known, applied)
                if migration.version in applied:
                    continue
                conn.execute(migration.sql.encode("utf-8"))
                conn.execute(
                    "insert into app.schema_migrations (version, name, checksum)"
                    " values (%s, %s, %s)",
                    (migration.version, migration.name, migration.checksum),
                )
                applied_now.append(migration.version)
        with conn.transaction():
            applied = _applied(conn)
            _check_history(known, applied)
    return MigrationReport(tuple(applied_now), max(applied, default=0))


def pending(conn: Connection, migrations: list[Migration] | None = None) -> list[Migration]:
    """Migrations not yet applied (after checking the applied ones are intact)."""
    known = migrations if migrations is not None else load_migrations()
    with translate_errors():
        exists = conn.execute("select to_regclass('app.schema_migrations') is not null as ok")
        row = exists.fetchone()
        if row is None or not row["ok"]:
            return known
        applied = _applied(conn)
    _check_history(known, applied)
    return [m for m in known if m.version not in applied]
