"""Which database a command talks to, and as whom.

With DATABASE_URL (or --database-url) every command uses that connection string; it
must name a member of the command's duty groups (leaseq_producer to enqueue,
leaseq_worker and leaseq_operator to drain, leaseq_reaper to reap, leaseq_operator for
the operator commands; a member of the deprecated service_role has all four), or the
schema owner for ``leaseq migrate``. Without it, the embedded server is started on
demand, migrated as its owner role, and commands connect as its login in all four
groups.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import psycopg
from leaseq.db import Connection, connect
from psycopg.conninfo import conninfo_to_dict

from leaseq_cli import embedded
from leaseq_cli.failures import UsageError


@dataclass(frozen=True)
class Target:
    worker_dsn: str
    owner_dsn: str
    embedded: embedded.EmbeddedDatabase | None

    @property
    def description(self) -> str:
        if self.embedded is not None:
            return f"embedded PostgreSQL in {self.embedded.home / 'pgdata'}"
        params = conninfo_to_dict(self.worker_dsn)
        host = params.get("host") or "localhost"
        return f"DATABASE_URL ({params.get('user') or 'default user'}@{host}/" \
               f"{params.get('dbname') or ''})"

    def connect_worker(self, application_name: str = "leaseq-cli") -> Connection:
        return connect(self.worker_dsn, application_name=application_name)

    def connect_owner(self, application_name: str = "leaseq-cli") -> Connection:
        return connect(self.owner_dsn, application_name=application_name)


def configured_url(override: str | None) -> str | None:
    url = override if override else os.environ.get("DATABASE_URL")
    return url or None


def resolve(override: str | None = None, *, home: Path | None = None,
            apply_migrations: bool = True) -> Target:
    url = configured_url(override)
    if url is None:
        db = embedded.start(home, apply_migrations=apply_migrations)
        return Target(db.worker_dsn, db.owner_dsn, db)
    try:
        conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise UsageError(
            f"DATABASE_URL is not a valid connection string ({exc}); use the form "
            "postgresql://USER:PASSWORD@HOST:5432/DBNAME, or unset it to use the local "
            "embedded server") from exc
    return Target(url, url, None)
