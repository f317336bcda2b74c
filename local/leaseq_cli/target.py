"""Which database a command talks to, and as whom.

With ``--stack NAME`` the commands reach that deployed stack's database as its operators'
login, signing in with an RDS IAM token (see leaseq_cli.aws). With DATABASE_URL (or
--database-url) every command uses that connection string; it must name a member of
the command's duty groups (leaseq_producer to enqueue, leaseq_worker and leaseq_operator
to drain, leaseq_reaper to reap, leaseq_operator for the operator commands; a login of an
earlier release, still in the deprecated service_role, has all four), or the schema owner
for ``leaseq migrate``. Without either, the embedded server is started on demand,
migrated as its owner role, and commands connect as its login in all four groups.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import psycopg
from leaseq.store.db import Connection, connect, describe_dsn
from psycopg.conninfo import conninfo_to_dict

from leaseq_cli import embedded
from leaseq_cli.aws import AwsClients, StackDatabase, stack_database
from leaseq_cli.failures import UsageError


@dataclass(frozen=True)
class Target:
    """The database a command uses, and how it logs in."""

    worker_dsn: str
    owner_dsn: str
    embedded: embedded.EmbeddedDatabase | None
    #: A deployed stack reached with IAM tokens: every connection gets a fresh token.
    stack: StackDatabase | None = None

    @property
    def description(self) -> str:
        if self.stack is not None:
            return self.stack.description
        if self.embedded is not None:
            return f"embedded PostgreSQL in {self.embedded.home / 'pgdata'}"
        return describe_dsn(self.worker_dsn)

    def connect_worker(self, application_name: str = "leaseq-cli") -> Connection:
        dsn = self.stack.dsn() if self.stack is not None else self.worker_dsn
        return connect(dsn, application_name=application_name)

    def connect_owner(self, application_name: str = "leaseq-cli") -> Connection:
        if self.stack is not None:
            raise UsageError(
                f"--stack logs in as the operators' login, never as the schema owner: the "
                f"stack {self.stack.stack} applies its migrations itself at deploy time")
        return connect(self.owner_dsn, application_name=application_name)


def configured_url(override: str | None) -> str | None:
    url = override if override else os.environ.get("DATABASE_URL")
    return url or None


def resolve(override: str | None = None, *, home: Path | None = None,
            apply_migrations: bool = True, stack: str | None = None,
            clients: AwsClients | None = None, sslrootcert: str = "system",
            tunnel: tuple[str, int] | None = None) -> Target:
    if stack:
        if override:
            raise UsageError("give either --stack or --database-url, not both")
        database = stack_database(stack, clients or AwsClients(), sslrootcert=sslrootcert,
                                  tunnel=tunnel)
        dsn = database.dsn()
        return Target(dsn, dsn, None, database)
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
