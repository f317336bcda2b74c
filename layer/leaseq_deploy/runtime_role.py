"""Create or check the database login of each function, one duty group per login.

Least privilege by duty: the worker, reaper, enqueue function, dashboard and operators each
log in as a role of their own, a member of exactly one NOLOGIN duty group
(``leaseq_worker``, ``leaseq_reaper``, ``leaseq_producer`` or ``leaseq_tenant_producer``,
``leaseq_dashboard``, ``leaseq_operator``), so credentials taken from one function cannot do
another's work. A login is refused, not silently "fixed", when it is the schema owner, has a
privileged attribute, or belongs to any other group: revoking memberships someone granted on
purpose is an operator's decision. The one exception is the group a login's own parameters
chose at an earlier deploy: the enqueue login moves between ``leaseq_producer`` (any tenant)
and ``leaseq_tenant_producer`` (bound to the stack's EnqueueTenants) as that parameter
changes, and its tenant bindings (``app.tenant_producers``) are set to exactly those tenants
in the same transaction.

The dashboard's tenant viewers get one reader login per tenant
(``leaseq_tenant_reader_<tenant hex>``, :func:`leaseq_dashboard.sources.reader_login`), a
member of ``authenticated`` bound in ``app.tenant_readers`` to that one tenant and no
other: a binding of it to another tenant is removed, and so is every binding of a reader
login whose tenant is no longer listed (a login bound to nothing sees nothing). Those
logins authenticate with IAM only: there is no secret per tenant to set a password from.
Their idle-in-transaction timeout is capped at 60 s, as ``app.current_tenant_id`` caps it.

``rds_iam`` is the one extra membership: on RDS it switches the login to IAM
authentication, so it is granted with IAM auth on, revoked with it off (a member of rds_iam
cannot log in with a password), and skipped where it does not exist (any PostgreSQL that is
not RDS).

A password is never sent in a statement, where it could reach the server log,
``pg_stat_activity`` or ``pg_stat_statements``: libpq computes the SCRAM-SHA-256 verifier on
this side and only the verifier is sent.

Timeouts are set on the role, per database, because RDS Proxy pins a session that runs SET.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final
from uuid import UUID

import psycopg
from leaseq.base.errors import ConfigurationError
from leaseq.store.duties import DASHBOARD as DASHBOARD
from leaseq.store.duties import DUTY_GROUPS as DUTY_GROUPS
from leaseq.store.duties import OPERATOR as OPERATOR
from leaseq.store.duties import PRODUCER as PRODUCER
from leaseq.store.duties import READER_GROUP as READER_GROUP
from leaseq.store.duties import REAPER as REAPER
from leaseq.store.duties import TENANT_PRODUCER as TENANT_PRODUCER
from leaseq.store.duties import WORKER as WORKER
from leaseq_dashboard.sources import READER_LOGIN_PREFIX, reader_login
from psycopg import sql

ROLE_NAME: Final = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
DURATION: Final = re.compile(r"^[0-9]+(ms|s|min)$")
RDS_IAM: Final = "rds_iam"
#: The group every queue privilege used to be granted to. Deprecated: migration 0017 drops it
#: from a database where no login uses it, and keeps it (a member of the four duty groups)
#: where a login of an earlier release still does. A function's login is never made a
#: member, except the previous version's single login while CloudFormation rolls an update
#: back to it.
SERVICE_ROLE: Final = "service_role"
# The duty groups (PRODUCER ... DASHBOARD, DUTY_GROUPS) and the tenant readers' group
# (READER_GROUP) are leaseq.store.duties' names, imported above and read from this module by
# the resource's handler (function.py).
#: The idle-in-transaction cap of a reader session (app.current_tenant_id applies the same).
READER_IDLE_CAP_MS: Final = 60_000

#: Names a login may never take: a login named like a group would be that group.
RESERVED_NAMES: Final = frozenset({*DUTY_GROUPS, SERVICE_ROLE, READER_GROUP, RDS_IAM, "public"})

Connection = psycopg.Connection[dict[str, Any]]


@dataclass(frozen=True)
class LoginRoleSpec:
    """One function's login: its name, the one group it belongs to, how it authenticates.

    ``group`` is a duty group, ``authenticated`` for a tenant's reader login (``tenant``
    is then its one tenant), or ``service_role`` for the login of a previous version
    (only ever asked for while CloudFormation rolls an update back).
    """

    name: str
    group: str
    iam_auth: bool
    statement_timeout: str = "15s"
    password: str | None = None
    #: The template parameter the name came from, so an error names what to change.
    parameter: str = "the login name"
    #: A tenant reader login's one tenant (group ``authenticated`` only).
    tenant: UUID | None = None
    #: Groups an earlier deploy may have given this login instead of ``group``: revoked,
    #: not refused (the enqueue login's other producer group).
    replaces: frozenset[str] = frozenset()
    #: None: its tenant bindings are not this spec's business. Otherwise the login's
    #: bindings in app.tenant_producers are made exactly these (none: every one removed).
    tenants: frozenset[UUID] | None = None

    def __post_init__(self) -> None:
        if not ROLE_NAME.match(self.name):
            raise ConfigurationError(
                f"{self.parameter} {self.name!r} is not accepted: use 1-63 characters of a-z, "
                "0-9 and _, starting with a letter"
            )
        if self.group == READER_GROUP:
            self._check_reader()
        elif self.group not in (*DUTY_GROUPS, SERVICE_ROLE):
            raise ConfigurationError(
                f"{self.parameter}: {self.group!r} is not a leaseq duty group "
                f"({', '.join(DUTY_GROUPS)})"
            )
        elif self.name.startswith(READER_LOGIN_PREFIX) or self.tenant is not None:
            raise ConfigurationError(
                f"{self.parameter} {self.name!r}: names starting with {READER_LOGIN_PREFIX} "
                "belong to the dashboard's tenant reader logins (the dashboard may connect as "
                "any of them); give the login another name"
            )
        if self.group != SERVICE_ROLE and self.name in RESERVED_NAMES:
            raise ConfigurationError(
                f"{self.parameter} {self.name!r} is the name of a group role; a login needs a "
                f"name of its own (for example {self.group}_login)"
            )
        if self.tenants and self.group != TENANT_PRODUCER:
            raise ConfigurationError(
                f"{self.parameter} {self.name}: only a member of {TENANT_PRODUCER} is bound "
                f"to tenants (got group {self.group})")
        if self.group == TENANT_PRODUCER and not self.tenants:
            raise ConfigurationError(
                f"{self.parameter} {self.name}: a member of {TENANT_PRODUCER} needs at least "
                "one tenant to be bound to")
        if not DURATION.match(self.statement_timeout):
            raise ConfigurationError(
                f"RuntimeStatementTimeout {self.statement_timeout!r} is not accepted: use a "
                "whole number followed by ms, s or min (for example 15s)"
            )
        if self.iam_auth and self.password is not None:
            raise ConfigurationError(
                f"{self.parameter} {self.name}: a login gets either IAM authentication or a "
                "password, not both"
            )

    def _check_reader(self) -> None:
        if self.tenant is None or self.name != reader_login(self.tenant):
            raise ConfigurationError(
                f"{self.parameter}: a tenant reader login is named after its one tenant "
                f"({READER_LOGIN_PREFIX}<tenant hex>), not {self.name!r}"
            )
        if not self.iam_auth or self.password is not None:
            raise ConfigurationError(
                f"{self.parameter}: the dashboard's tenant viewers need IAM authentication "
                "(each tenant's reader login logs in with an RDS IAM token; there is no "
                "secret per tenant). Leave DashboardTenantViewers empty with password "
                "authentication"
            )

    @property
    def idle_timeout(self) -> str:
        """idle_in_transaction_session_timeout: the statement timeout, capped at 60 s for
        a reader (whose idle transaction would hold up a migration's DDL)."""
        if self.group == READER_GROUP and _milliseconds(self.statement_timeout) > (
                READER_IDLE_CAP_MS):
            return f"{READER_IDLE_CAP_MS // 1000}s"
        return self.statement_timeout


def _milliseconds(duration: str) -> int:
    """A DURATION (``15s``, ``500ms``, ``2min``) in milliseconds."""
    found = DURATION.match(duration)
    assert found is not None  # checked by LoginRoleSpec
    unit = found.group(1)
    return int(duration[: -len(unit)]) * {"ms": 1, "s": 1000, "min": 60_000}[unit]


@dataclass(frozen=True)
class LoginRoleReport:
    name: str
    group: str
    created: bool
    #: "granted", "revoked", "absent" (no rds_iam role on this server) or "unused".
    rds_iam: str
    password_set: bool
    #: A tenant reader's bindings to other tenants that were removed.
    unbound: int = 0


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


def check_duty_group_names(conn: Connection) -> None:
    """Refuse, before any migration runs, a login that holds a duty group's name.

    Before the duty groups existed the runtime login was called ``leaseq_worker`` by default.
    The migration that creates the groups would find that login and either fail on a
    circular membership or, worse, hand the worker's privileges to whoever logs in as it.
    Nothing is changed here: docs/deploy.md describes how to move that login out of the way.
    """
    rows = conn.execute(
        "select rolname from pg_roles where rolname = any(%s) and rolcanlogin order by 1",
        (list(DUTY_GROUPS),),
    ).fetchall()
    taken = [str(row["rolname"]) for row in rows]
    if taken:
        raise ConfigurationError(
            f"role {', '.join(taken)} can log in, but that name belongs to a NOLOGIN duty group "
            "the migrations create. It is probably the runtime login of a previous version "
            "(RuntimeDbUser, leaseq_worker by default): move the previous functions to another "
            "login first, then drop or rename it (docs/deploy.md, Upgrading to logins by "
            "duty). Nothing was changed."
        )


def _check_groups_exist(conn: Connection, groups: Iterable[str]) -> None:
    wanted = sorted(set(groups))
    rows = conn.execute(
        "select rolname, rolcanlogin from pg_roles where rolname = any(%s)", (wanted,)
    ).fetchall()
    found = {str(row["rolname"]): bool(row["rolcanlogin"]) for row in rows}
    missing = [group for group in wanted if group not in found]
    if SERVICE_ROLE in missing:
        raise ConfigurationError(
            f"group role {SERVICE_ROLE} does not exist: migration 0017 removed it from this "
            "cluster because no login used it, so the previous version's single login "
            "cannot be restored. Deploy this version again (docs/deploy.md, Upgrading to "
            "logins by duty)")
    if missing:
        raise ConfigurationError(
            f"group role {', '.join(missing)} does not exist: the migrations this layer carries "
            "do not create the duty groups yet, so no login can be made a member of one"
        )
    can_login = [group for group in wanted if found[group]]
    if can_login:
        raise ConfigurationError(
            f"group role {', '.join(can_login)} can log in; a group must be NOLOGIN"
        )


def _refuse_unfit(conn: Connection, spec: LoginRoleSpec, existing: dict[str, Any]) -> None:
    privileged = [
        attribute
        for attribute in ("rolsuper", "rolcreaterole", "rolcreatedb", "rolbypassrls",
                          "rolreplication")
        if existing[attribute]
    ]
    if privileged:
        raise ConfigurationError(
            f"role {spec.name} exists with {', '.join(privileged)}; a function's login must be "
            f"an ordinary role: pick another {spec.parameter} or ALTER ROLE it to remove them"
        )
    owns_schema = _one(
        conn,
        "select 1 as owns from pg_namespace n join pg_roles r on r.oid = n.nspowner"
        " where n.nspname = 'app' and r.rolname = %s",
        (spec.name,),
    )
    if owns_schema is not None:
        raise ConfigurationError(
            f"role {spec.name} owns schema app; a function's login must not be the schema owner"
        )
    extra = _memberships(conn, spec.name) - {spec.group, RDS_IAM, *spec.replaces}
    if extra:
        raise ConfigurationError(
            f"role {spec.name} is also a member of {', '.join(sorted(extra))}; {spec.parameter} "
            f"must be a member of {spec.group} only: REVOKE those memberships or pick another "
            f"{spec.parameter}"
        )


def _bind_tenants(conn: Connection, spec: LoginRoleSpec, tenants: frozenset[UUID]) -> None:
    """Make the login's producer bindings exactly ``tenants``, and check that nothing
    still lets it act as an unbound producer: a revoke of a membership granted by another
    role does nothing (PostgreSQL only warns), and app.check_producer_tenants lets any
    member of leaseq_producer, however indirect, write into every tenant."""
    wanted = sorted(tenants)
    conn.execute(
        "delete from app.tenant_producers where role_name = %s::regrole"
        " and tenant_id <> all(%s::uuid[])", (spec.name, wanted))
    conn.execute(
        "insert into app.tenant_producers (role_name, tenant_id)"
        " select %s::regrole, t from unnest(%s::uuid[]) as t"
        " on conflict (role_name, tenant_id) do nothing", (spec.name, wanted))
    if spec.group != TENANT_PRODUCER:
        return
    unbound = _one(conn, "select pg_has_role(%s, %s, 'MEMBER') as member",
                   (spec.name, PRODUCER))
    if unbound is not None and unbound["member"]:
        raise ConfigurationError(
            f"{spec.parameter} {spec.name} is to be bound to tenants, but it is still a member "
            f"of {PRODUCER} (granted by another role, or through another group), which "
            f"enqueues into every tenant: as an administrator, REVOKE {PRODUCER} FROM "
            f"{spec.name} (GRANTED BY the role that granted it), then deploy again. Nothing "
            "was changed.")


def scram_verifier(conn: Connection, name: str, password: str) -> str:
    """The SCRAM-SHA-256 verifier of ``password``, computed by libpq on this side.

    Asking for the algorithm explicitly keeps libpq from querying the server's
    password_encryption, and the plaintext never leaves this process.
    """
    verifier = conn.pgconn.encrypt_password(
        password.encode("utf-8"), name.encode("utf-8"), b"scram-sha-256"
    )
    return verifier.decode("ascii")


def _ensure_one(conn: Connection, spec: LoginRoleSpec, me: dict[str, Any],
                has_rds_iam: bool) -> LoginRoleReport:
    role = sql.Identifier(spec.name)
    if me["name"] == spec.name:
        raise ConfigurationError(
            f"{spec.parameter} {spec.name} is the schema owner (the user running the "
            "migrations); give each function a login of its own"
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
        if spec.group == SERVICE_ROLE and spec.name in RESERVED_NAMES and not (
                existing["rolcanlogin"]):
            raise ConfigurationError(
                f"the previous version's login {spec.name} cannot be restored: that name is "
                "now a NOLOGIN group role. The previous functions cannot log in until this "
                "version is deployed again (docs/deploy.md, Upgrading to logins by duty)"
            )
        _refuse_unfit(conn, spec, existing)
        if not existing["rolcanlogin"]:
            conn.execute(sql.SQL("alter role {} login").format(role))

    groups = _memberships(conn, spec.name)
    if spec.group not in groups:
        conn.execute(sql.SQL("grant {} to {}").format(sql.Identifier(spec.group), role))
    for earlier in sorted((spec.replaces - {spec.group}) & groups):
        conn.execute(sql.SQL("revoke {} from {}").format(sql.Identifier(earlier), role))
    if spec.tenants is not None:
        _bind_tenants(conn, spec, spec.tenants)

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
        verifier = scram_verifier(conn, spec.name, spec.password)
        conn.execute(sql.SQL("alter role {} password {}").format(role, sql.Literal(verifier)))
    database = sql.Identifier(str(me["db"]))
    for setting, value in (("statement_timeout", spec.statement_timeout),
                           ("idle_in_transaction_session_timeout", spec.idle_timeout)):
        conn.execute(
            sql.SQL("alter role {} in database {} set {} = {}").format(
                role, database, sql.Identifier(setting), sql.Literal(value)
            )
        )
    unbound = 0 if spec.tenant is None else _bind_to_one_tenant(conn, spec.name, spec.tenant)
    return LoginRoleReport(spec.name, spec.group, created=existing is None, rds_iam=rds_iam,
                           password_set=spec.password is not None, unbound=unbound)


def _bind_to_one_tenant(conn: Connection, name: str, tenant: UUID) -> int:
    """Bind the reader login ``name`` to ``tenant`` and to nothing else; how many other
    bindings it had."""
    removed = conn.execute(
        "delete from app.tenant_readers where role_name = %s::regrole and tenant_id <> %s",
        (name, tenant)).rowcount
    conn.execute(
        "insert into app.tenant_readers as binding (role_name, tenant_id)"
        " select %s::regrole, %s"
        " where not exists (select 1 from app.tenant_readers"
        " where role_name = %s::regrole and tenant_id = %s)", (name, tenant, name, tenant))
    return removed


def unbind_unlisted_tenant_readers(conn: Connection, listed: Iterable[str]) -> list[str]:
    """Delete every binding of a tenant reader login (by its name's prefix) that is not
    ``listed``, so a tenant removed from DashboardTenantViewers sees nothing any more;
    the logins whose bindings went."""
    rows = conn.execute(
        "delete from app.tenant_readers r using pg_catalog.pg_roles x"
        " where x.oid = r.role_name::oid and starts_with(x.rolname, %s)"
        " and x.rolname <> all(%s::text[]) returning x.rolname",
        (READER_LOGIN_PREFIX, list(listed))).fetchall()
    return sorted({str(row["rolname"]) for row in rows})


def ensure_login_roles(conn: Connection, specs: Sequence[LoginRoleSpec], *,
                       manage_tenant_readers: bool = False) -> list[LoginRoleReport]:
    """Make each login a member of its one group, all in one transaction.

    Either every login ends up as asked or nothing changes: a refusal of the third login
    rolls back the first two. With ``manage_tenant_readers`` (the request lists the
    dashboard's tenant viewers, maybe none), reader logins not among ``specs`` lose their
    bindings.
    """
    names = [spec.name for spec in specs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ConfigurationError(
            f"login {', '.join(duplicates)} is given for more than one function; each function "
            "needs a login of its own, so that one function's credentials cannot do another's "
            "work"
        )
    with conn.transaction():
        me = _one(conn, "select current_user as name, current_database() as db")
        assert me is not None
        _check_groups_exist(conn, (spec.group for spec in specs))
        has_rds_iam = _one(conn, "select 1 as found from pg_roles where rolname = %s",
                           (RDS_IAM,)) is not None
        reports = [_ensure_one(conn, spec, me, has_rds_iam) for spec in specs]
        if manage_tenant_readers:
            unbind_unlisted_tenant_readers(
                conn, [spec.name for spec in specs if spec.group == READER_GROUP])
        return reports
