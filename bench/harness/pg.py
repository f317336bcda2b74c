"""The server under test: one throw-away database per measured run, and server facts."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

Conn = psycopg.Connection[dict[str, Any]]


def connect(dsn: str) -> Conn:
    return psycopg.connect(dsn, autocommit=True, row_factory=dict_row)


@dataclass(frozen=True)
class Server:
    """A server we may administer (the benchmark creates and drops databases)."""

    admin_dsn: str

    def dsn(self, dbname: str) -> str:
        return make_conninfo(self.admin_dsn, dbname=dbname)

    def facts(self) -> dict[str, Any]:
        """What a reader needs to reproduce a number: version and the settings that move it."""
        names = [
            "server_version", "shared_buffers", "synchronous_commit", "fsync",
            "full_page_writes", "wal_level", "wal_compression", "checkpoint_timeout",
            "max_wal_size", "autovacuum", "max_connections",
        ]
        with connect(self.admin_dsn) as conn:
            rows = conn.execute(
                "select name, setting, unit from pg_settings where name = any(%s)", (names,)
            ).fetchall()
            version = conn.execute("select version() as v").fetchone()
        facts: dict[str, Any] = {
            r["name"]: f"{r['setting']}{'' if r['unit'] in (None, '') else ' ' + r['unit']}"
            for r in rows
        }
        facts["version"] = version["v"] if version else "?"
        facts["cpus"] = os.cpu_count()
        return facts

    def has_extension(self, name: str) -> bool:
        with connect(self.admin_dsn) as conn:
            row = conn.execute(
                "select count(*) as n from pg_available_extensions where name = %s", (name,)
            ).fetchone()
        return bool(row and row["n"])

    @contextmanager
    def database(self, name: str, *, keep: bool = False) -> Iterator[str]:
        """A fresh database for one run; dropped afterwards unless ``keep``."""
        with connect(self.admin_dsn) as conn:
            conn.execute(sql.SQL("drop database if exists {} with (force)").format(
                sql.Identifier(name)))
            conn.execute(sql.SQL("create database {} template template0").format(
                sql.Identifier(name)))
        try:
            yield self.dsn(name)
        finally:
            if not keep:
                with connect(self.admin_dsn) as conn:
                    conn.execute(sql.SQL("drop database if exists {} with (force)").format(
                        sql.Identifier(name)))

    def checkpoint(self) -> None:
        with connect(self.admin_dsn) as conn:
            conn.execute("checkpoint")


#: Appended to every database a run creates: two benchmark runs on one server (two
#: checkouts, two people) must never create, drain or drop each other's databases.
RUN_TAG = f"_{os.getpid()}"


def run_database(base: str) -> str:
    """The name of this run's database ``base`` (PostgreSQL's 63-byte limit kept)."""
    return f"{base[:63 - len(RUN_TAG)]}{RUN_TAG}"


def analyze(dsn: str, tables: list[str]) -> None:
    """Planner statistics as autovacuum would leave them after a bulk enqueue.

    Run after the jobs were enqueued and before the drain, identically for every
    system; no VACUUM, as a job is normally claimed long before autovacuum reaches it.
    """
    with connect(dsn) as conn:
        for table in tables:
            # A table of a later schema than the one installed (--sql-upto) is skipped.
            found = conn.execute("select to_regclass(%s) is not null as ok", (table,)).fetchone()
            if found is None or not found["ok"]:
                continue
            conn.execute(sql.SQL("analyze {}").format(sql.Identifier(*table.split("."))))


def dbname_of(dsn: str) -> str:
    return str(conninfo_to_dict(dsn).get("dbname", ""))


def find_pgbench() -> str | None:
    found = shutil.which("pgbench")
    if found:
        return found
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin/pgbench"), reverse=True):
        return str(candidate)
    return None


def as_url(dsn: str) -> str:
    """The DSN as a postgresql:// URL (asyncpg accepts no key=value strings)."""
    from urllib.parse import quote, urlencode

    params = {k: str(v) for k, v in conninfo_to_dict(dsn).items() if v is not None}
    user = quote(params.pop("user", ""), safe="")
    password = params.pop("password", "")
    host = params.pop("host", "127.0.0.1")
    port = params.pop("port", "5432")
    dbname = quote(params.pop("dbname", ""), safe="")
    auth = f"{user}:{quote(password, safe='')}@" if password else (f"{user}@" if user else "")
    query = f"?{urlencode(params)}" if params else ""
    return f"postgresql://{auth}{host}:{port}/{dbname}{query}"
