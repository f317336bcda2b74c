"""``python -m leaseq migrate``: the schema command of a plain ``pip install leaseq``.

A deployment pipeline or a container's entrypoint needs to apply the migrations and
nothing of the ``leaseq`` command line (terminal output, the embedded PostgreSQL, the
Lambda glue), so this entry stands on the core library alone. It means what
``leaseq migrate`` means with a database URL: the migrations are applied as the login
of ``--database-url`` (else ``$DATABASE_URL``), which must be the schema owner;
``--json`` prints the same document; the exit code is 0 when done, 2 for a bad option or
connection string, 3 when the database cannot be reached, refuses the login or the
privilege, or holds a schema newer than this code, 1 for anything else. The other
commands, and the embedded server used when no URL is given, are the ``leaseq`` command
of ``pip install 'leaseq[local]'``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from leaseq.base.errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    LeaseqError,
    PermissionDeniedError,
    SchemaVersionError,
    TlsVerificationError,
)
from leaseq.store.db import connect, describe_dsn
from leaseq.store.migrate import migrate

PROG = "python -m leaseq"


def build_parser() -> argparse.ArgumentParser:
    """``migrate`` and its two options, spelled as the ``leaseq`` command spells them."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="Apply leaseq's SQL migrations with the core library alone; "
        "every other command is the leaseq command of pip install 'leaseq[local]'.")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", dest="command")
    commands.required = True
    run = commands.add_parser("migrate", help="apply the SQL migrations (as the schema owner)",
                              description="Apply the SQL migrations as the schema owner: "
                              "the login of --database-url, else of $DATABASE_URL.")
    run.add_argument("--database-url", metavar="URL",
                     help="the schema owner's connection string (default: $DATABASE_URL)")
    run.add_argument("--json", action="store_true",
                     help="print one JSON document on stdout, for scripts")
    return parser


def exit_code(exc: LeaseqError) -> int:
    """The ``leaseq`` command's exit code for an error of the migration."""
    if isinstance(exc, TlsVerificationError | DatabaseUnavailableError | PermissionDeniedError
                  | SchemaVersionError):
        return 3
    if exc.sqlstate is not None and (exc.sqlstate.startswith("28")
                                     or exc.sqlstate in ("3F000", "42883")):
        return 3
    if isinstance(exc, ConfigurationError):
        return 2
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; a failure is one line on stderr and an exit code."""
    args = build_parser().parse_args(argv)
    dsn = args.database_url or os.environ.get("DATABASE_URL")
    if not dsn:
        sys.stderr.write(
            f"{PROG}: error: say which database to migrate: --database-url URL or "
            "DATABASE_URL, the schema owner's connection string (the embedded PostgreSQL "
            "of `leaseq migrate` comes with pip install 'leaseq[local]')\n")
        return 2
    try:
        # An unusable connection string is a ConfigurationError of connect(), so the
        # string is described only once it is known to parse.
        with connect(dsn, application_name="leaseq-migrate") as conn:
            report = migrate(conn)
    except LeaseqError as exc:
        sys.stderr.write(f"{PROG}: error: {' '.join(exc.message.split())}\n")
        return exit_code(exc)
    database = describe_dsn(dsn)
    if args.json:
        sys.stdout.write(json.dumps(report.as_document(database), indent=2) + "\n")
    else:
        sys.stdout.write(report.describe(database) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
