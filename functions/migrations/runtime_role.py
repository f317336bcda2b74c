"""Create or check the login role the worker, reaper and enqueue functions use.

The runtime role may do exactly what ``service_role`` may (EXECUTE on the queue functions)
and nothing else. So it is refused, not silently "fixed", when it is the schema owner, has
a privileged attribute, or belongs to any other group: revoking memberships someone granted
on purpose is an operator's decision. ``rds_iam`` is the one extra membership: on RDS it
switches the role to IAM authentication, so it is granted with IAM auth on, revoked with it
off (a member of rds_iam cannot log in with a password), and skipped where it does not
exist (any PostgreSQL that is not RDS).

Timeouts are set on the role, per database, because RDS Proxy pins a session that runs SET.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

import psycopg
from leaseq.errors import ConfigurationError
from psycopg import sql

ROLE_NAME: Final = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
DURATION: Final = re.compile(r"^[0-9]+(ms|s|min)$")
SERVICE_ROLE: Final = "service_role"
RDS_IAM: Final = "rds_iam"

Connection = psycopg.Connection[dict[str, Any]]


@dataclass(frozen=True)
class RuntimeRoleSpec:
    name: str
    iam_auth: bool
    statement_timeout: str = "15s"
    password: str | None = None

    def __post_init__(self) -> None:
        if not ROLE_NAME.match(self.name):
            raise ConfigurationError(
                f"RuntimeDbUser {self.name!r} is not accepted: use 1-63 characters of a-z, "
                "0-9 and _, starting with a letter"
            )
        if not DURATION.match(self.statement_timeout):
            raise ConfigurationError(
                f"RuntimeStatementTimeout {self.statement_timeout!r} is not accepted: use a "
                "whole number followed by ms, s or min (for example 15s)"
            )
        if self.iam_auth and self.password is not None:
            raise ConfigurationError(
                "the runtime role gets either IAM authentication or a password, not both"
            )


@dataclass(frozen=True)
class RuntimeRoleReport:
    name: str
    created: bool
    #: "granted", "revoked", "absent" (no rds_iam role on this server) or "unused".
    rds_iam: str


def _one(conn: Connection, query: str, params: tuple[Any, ...] = ()) -> dict[str, Any] | None:
    return conn.execute(query, params).fetchone()


def _memberships(conn: Connection, role: str) -> set[str]:
    rows = conn.execute(
        "select g.rolname from pg_auth_members m"
        " join pg_roles g on g.oid = m.roleid"
        " join pg_roles r on r.oid = m.member"
        " where r.rolname = %s",
        (role,),
    ).fetchall()
    return {str(row["rolname"]) for row in rows}


def _refuse_privileged(conn: Connection, spec: RuntimeRoleSpec, existing: dict[str, Any]) -> None:
    privileged = [
        attribute
        for attribute in ("rolsuper", "rolcreaterole", "rolcreatedb", "rolbypassrls",
                          "rolreplication")
        if existing[attribute]
    ]
    if privileged:
        raise ConfigurationError(
            f"role {spec.name} exists with {', '.join(privileged)}; the runtime role must be "
            "an ordinary role: pick another RuntimeDbUser or ALTER ROLE it to remove them"
        )
    owns_schema = _one(
        conn,
        "select 1 as owns from pg_namespace n join pg_roles r on r.oid = n.nspowner"
        " where n.nspname = 'app' and r.rolname = %s",
        (spec.name,),
    )
    if owns_schema is not None:
        raise ConfigurationError(
            f"role {spec.name} owns schema app; the runtime role must not be the schema owner"
        )
    extra = _memberships(conn, spec.name) - {SERVICE_ROLE, RDS_IAM}
    if extra:
        raise ConfigurationError(
            f"role {spec.name} is also a member of {', '.join(sorted(extra))}; the runtime "
            f"role must be a member of {SERVICE_ROLE} only: REVOKE those memberships or pick "
            "another RuntimeDbUser"
        )


def ensure_runtime_role(conn: Connection, spec: RuntimeRoleSpec) -> RuntimeRoleReport:
    """Make ``spec.name`` a login member of service_role only, in one transaction."""
    role = sql.Identifier(spec.name)
    with conn.transaction():
        me = _one(conn, "select current_user as name, current_database() as db")
        assert me is not None
        if me["name"] == spec.name:
            raise ConfigurationError(
                f"RuntimeDbUser {spec.name} is the schema owner (the user running the "
                "migrations); give the runtime functions a role of their own"
            )
        existing = _one(
            conn,
            "select rolsuper, rolcreaterole, rolcreatedb, rolbypassrls, rolreplication,"
            " rolcanlogin from pg_roles where rolname = %s",
            (spec.name,),
        )
        if existing is None:
            conn.execute(sql.SQL("create role {} login inherit").format(role))
        else:
            _refuse_privileged(conn, spec, existing)
            if not existing["rolcanlogin"]:
                conn.execute(sql.SQL("alter role {} login").format(role))

        groups = _memberships(conn, spec.name)
        if SERVICE_ROLE not in groups:
            conn.execute(sql.SQL("grant {} to {}").format(sql.Identifier(SERVICE_ROLE), role))

        has_rds_iam = _one(conn, "select 1 as found from pg_roles where rolname = %s",
                           (RDS_IAM,)) is not None
        rds_iam = "unused"
        if not has_rds_iam:
            rds_iam = "absent"
        elif spec.iam_auth:
            if RDS_IAM not in groups:
                conn.execute(sql.SQL("grant {} to {}").format(sql.Identifier(RDS_IAM), role))
            rds_iam = "granted"
        elif RDS_IAM in groups:
            conn.execute(sql.SQL("revoke {} from {}").format(sql.Identifier(RDS_IAM), role))
            rds_iam = "revoked"

        if spec.password is not None:
            conn.execute(
                sql.SQL("alter role {} password {}").format(role, sql.Literal(spec.password))
            )
        database = sql.Identifier(str(me["db"]))
        for setting in ("statement_timeout", "idle_in_transaction_session_timeout"):
            conn.execute(
                sql.SQL("alter role {} in database {} set {} = {}").format(
                    role, database, sql.Identifier(setting), sql.Literal(spec.statement_timeout)
                )
            )
    return RuntimeRoleReport(spec.name, created=existing is None, rds_iam=rds_iam)
