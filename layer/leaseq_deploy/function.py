"""CloudFormation custom resource: apply sql/ as the schema owner, ensure the logins by duty.

Create and Update first check what the stack asks of the database: that its name leaves
room for the names made from it (``stack_name.py``), that the connections its functions
can open fit the database's connection budget (``connection_budget.py``) and that the worker
pool's limits are in range (``pool_limits.py``). Then they run the migrations that the layer
carries (applied ones are skipped, so a re-run is cheap), write the pool's limits to the
owner's settings (which only the owner may change, so no function's login can widen them),
and make each function's login a member of its one duty group: the worker's of
leaseq_worker, the reaper's of leaseq_reaper, the enqueue function's of leaseq_producer (or,
with the ``EnqueueTenants`` property, of leaseq_tenant_producer, bound to exactly those
tenants), the operators' of leaseq_operator and, with the dashboard, the dashboard's of
leaseq_dashboard and one reader login per tenant of its tenant viewers
(``dashboard_logins.py``). Delete touches nothing: removing the
stack must never drop the schema or its jobs. Every request is answered: on success, on any
exception (the library is imported inside the guarded block, so even a broken layer is
reported), and by a watchdog shortly before the function's own timeout, which would
otherwise leave CloudFormation waiting for its ServiceTimeout.

An Update that carries the previous version's properties (one ``RuntimeDbUser`` for every
function) can only come from CloudFormation rolling an update back, while this code is
still deployed. It applies no migration and restores only that login, as a member of
service_role as before, so the previous functions can log in again.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from leaseq_deploy.cfn_response import FAILED, SUCCESS, Opener, Responder

logger = logging.getLogger("leaseq.migrations")
logger.setLevel(logging.INFO)

#: Answer FAILED this long before the Lambda timeout if the work has not finished.
WATCHDOG_MARGIN_SECONDS = 10.0
#: Waits between connection attempts: a new instance may still be settling.
CONNECT_RETRY_DELAYS: tuple[float, ...] = (2.0, 5.0, 10.0)


class LambdaContext(Protocol):
    def get_remaining_time_in_millis(self) -> int: ...


def lambda_handler(event: Mapping[str, Any], context: LambdaContext | None) -> None:
    handle(event, context)


def physical_resource_id(event: Mapping[str, Any]) -> str:
    """Stable across updates: a changed id would make CloudFormation "replace" the schema."""
    existing = event.get("PhysicalResourceId")
    if existing:
        return str(existing)
    stack_parts = str(event.get("StackId", "")).split("/")
    stack = stack_parts[1] if len(stack_parts) > 1 else "leaseq"
    return f"{stack}-{event.get('LogicalResourceId', 'Migrations')}"


def handle(
    event: Mapping[str, Any],
    context: LambdaContext | None,
    *,
    owner_dsn: Callable[[], str] | None = None,
    read_secret: Callable[[str], Mapping[str, Any]] | None = None,
    opener: Opener | None = None,
    watchdog_margin: float = WATCHDOG_MARGIN_SECONDS,
    retry_delays: Sequence[float] = CONNECT_RETRY_DELAYS,
) -> str | None:
    """Serve one request; returns the status sent (None if nothing could be sent)."""
    logger.info(
        "custom resource request %s for %s",
        event.get("RequestType"),
        event.get("LogicalResourceId"),
    )
    responder = Responder(event, opener=opener) if opener else Responder(event)
    physical_id = physical_resource_id(event)
    watchdog = _start_watchdog(responder, context, physical_id, watchdog_margin)
    try:
        if event.get("ResourceType") == "Custom::LeaseqQueueRegistration":
            reason = _registration(event, owner_dsn, read_secret, retry_delays)
            responder.send(SUCCESS, reason=reason, physical_resource_id=physical_id,
                           data={"Registration": reason})
        elif event["RequestType"] == "Delete":
            responder.send(
                SUCCESS,
                reason="Delete keeps the schema, its jobs and the logins",
                physical_resource_id=physical_id,
            )
        else:
            data = _migrate_and_ensure_role(event, owner_dsn, read_secret, retry_delays)
            responder.send(
                SUCCESS,
                reason=f"schema at version {data['SchemaVersion']}",
                physical_resource_id=physical_id,
                data=data,
            )
    except Exception as exc:
        logger.exception("migrations failed")
        responder.send(
            FAILED,
            reason=f"{type(exc).__name__}: {exc}",
            physical_resource_id=physical_id,
        )
    finally:
        if watchdog is not None:
            watchdog.cancel()
    return responder.sent_status


def _registration(
    event: Mapping[str, Any],
    owner_dsn: Callable[[], str] | None,
    read_secret: Callable[[str], Mapping[str, Any]] | None,
    retry_delays: Sequence[float],
) -> str:
    """A queue's Registration request (``queue_workers.py``): register its worker on
    Create and Update (and unregister the old queue when the name changed), unregister on
    Delete. A Delete that cannot reach the database succeeds all the same, saying so: a
    registration left behind only names a worker that no longer exists, and a stack that
    cannot be deleted would be worse."""
    from leaseq.base.errors import DatabaseUnavailableError

    from leaseq_deploy.owner_connection import owner_dsn_from_environment, secrets_manager_reader
    from leaseq_deploy.queue_workers import register, requested_worker, unregister

    properties: Mapping[str, Any] = event.get("ResourceProperties") or {}
    stack_id = str(event.get("StackId", ""))
    deleting = event["RequestType"] == "Delete"
    worker = None if deleting else requested_worker(properties)
    old_queue = str((event.get("OldResourceProperties") or {}).get("QueueName", "")).strip()
    reader = read_secret or secrets_manager_reader()
    dsn = owner_dsn() if owner_dsn is not None else owner_dsn_from_environment(os.environ, reader)
    try:
        conn = _connect_with_retries(dsn, () if deleting else retry_delays)
    except DatabaseUnavailableError as exc:
        if not deleting:
            raise
        logger.warning("queue registration not removed: %s", exc)
        return f"registration not removed: the database is unreachable ({exc})"
    with conn:
        if worker is None:
            summary = unregister(conn, str(properties.get("QueueName", "")).strip(), stack_id)
        else:
            summary = register(conn, worker, stack_id)
            if old_queue and old_queue != worker.queue:
                summary += "; " + unregister(conn, old_queue, stack_id)
    logger.info("%s", summary)
    return summary


def _start_watchdog(
    responder: Responder,
    context: LambdaContext | None,
    physical_id: str,
    margin: float,
) -> threading.Timer | None:
    if context is None:
        return None
    delay = max(0.0, context.get_remaining_time_in_millis() / 1000.0 - margin)

    def answer_before_timeout() -> None:
        responder.send(
            FAILED,
            reason=(
                f"migrations did not finish {margin:.0f}s before the function timeout "
                "(another deploy holding the migration lock, or a slow database); applied "
                "migrations are kept: deploy again to continue"
            ),
            physical_resource_id=physical_id,
        )

    timer = threading.Timer(delay, answer_before_timeout)
    timer.daemon = True
    timer.start()
    return timer


def _flag(value: Any) -> bool:
    return str(value).strip().lower() == "true"


class Duty(NamedTuple):
    """A function's login as the template describes it: which properties, which group."""

    key: str
    user_property: str
    secret_property: str
    group: str


def _duties() -> tuple[Duty, ...]:
    from leaseq_deploy.runtime_role import DASHBOARD, OPERATOR, PRODUCER, REAPER, WORKER

    return (
        Duty("worker", "WorkerDbUser", "WorkerDbSecretArn", WORKER),
        Duty("reaper", "ReaperDbUser", "ReaperDbSecretArn", REAPER),
        Duty("enqueue", "EnqueueDbUser", "EnqueueDbSecretArn", PRODUCER),
        Duty("operator", "OperatorDbUser", "OperatorDbSecretArn", OPERATOR),
        # Optional: empty (or absent, from an earlier template) without the dashboard.
        Duty("dashboard", "DashboardDbUser", "DashboardDbSecretArn", DASHBOARD),
    )


#: The duties whose login the template sends only when that part of the stack is on.
OPTIONAL_DUTIES = frozenset({"dashboard"})


def _password(
    reader: Callable[[str], Mapping[str, Any]], secret_arn: str, name: str, parameter: str,
    secret_parameter: str,
) -> str:
    from leaseq.base.errors import ConfigurationError

    secret = reader(secret_arn)
    if secret.get("username") != name or not secret.get("password"):
        raise ConfigurationError(
            f"secret {secret_arn} ({secret_parameter}) must hold username {name!r} "
            f"({parameter}) and a password"
        )
    return str(secret["password"])


def _is_previous_version(properties: Mapping[str, Any]) -> bool:
    return "RuntimeDbUser" in properties and not any(
        duty.user_property in properties for duty in _duties())


def login_specs(
    properties: Mapping[str, Any], reader: Callable[[str], Mapping[str, Any]],
) -> list[Any]:
    """The login of each function, read from the resource's properties.

    Every name is checked before anything connects, and with password authentication every
    secret is read and checked, so a bad property fails the request having changed nothing.
    """
    from leaseq.base.errors import ConfigurationError

    from leaseq_deploy.runtime_role import PRODUCER, SERVICE_ROLE, TENANT_PRODUCER, LoginRoleSpec

    iam_auth = _flag(properties.get("RuntimeIamAuth", "true"))
    timeout = str(properties.get("RuntimeStatementTimeout") or "15s")
    if _is_previous_version(properties):
        name = str(properties["RuntimeDbUser"])
        secret_arn = str(properties.get("RuntimeSecretArn") or "")
        password = None
        if not iam_auth and secret_arn:
            password = _password(reader, secret_arn, name, "RuntimeDbUser", "RuntimeSecretArn")
        return [LoginRoleSpec(name=name, group=SERVICE_ROLE, iam_auth=iam_auth,
                              statement_timeout=timeout, password=password,
                              parameter="RuntimeDbUser")]
    tenants = enqueue_tenants(properties)
    specs = []
    for duty in _duties():
        name = str(properties.get(duty.user_property) or "")
        if not name and duty.key in OPTIONAL_DUTIES:
            continue
        if not name:
            raise ConfigurationError(f"the resource property {duty.user_property} is missing")
        secret_arn = str(properties.get(duty.secret_property) or "")
        password = None
        if not iam_auth:
            if not secret_arn:
                raise ConfigurationError(
                    f"without IAM authentication {duty.secret_property} is required: the "
                    f"secret whose password {duty.user_property} logs in with"
                )
            password = _password(reader, secret_arn, name, duty.user_property,
                                 duty.secret_property)
        if duty.group == PRODUCER:
            # The enqueue door: any tenant, or exactly EnqueueTenants; it moves between the
            # two producer groups as the property changes.
            specs.append(LoginRoleSpec(
                name=name, group=TENANT_PRODUCER if tenants else PRODUCER, iam_auth=iam_auth,
                statement_timeout=timeout, password=password, parameter=duty.user_property,
                replaces=frozenset({PRODUCER, TENANT_PRODUCER}), tenants=tenants))
            continue
        specs.append(LoginRoleSpec(name=name, group=duty.group, iam_auth=iam_auth,
                                   statement_timeout=timeout, password=password,
                                   parameter=duty.user_property))
    from leaseq_deploy.dashboard_logins import tenant_reader_specs

    specs += tenant_reader_specs(properties, iam_auth=iam_auth, statement_timeout=timeout)
    return specs


def enqueue_tenants(properties: Mapping[str, Any]) -> frozenset[Any]:
    """The tenants of the ``EnqueueTenants`` property (comma-separated tenant ids; empty or
    absent, as from a template before it: none, the door serves every tenant)."""
    from leaseq.base.errors import ConfigurationError
    from leaseq.settings import tenant_list

    try:
        return tenant_list(str(properties.get("EnqueueTenants") or ""))
    except ValueError as exc:
        raise ConfigurationError(f"the resource property EnqueueTenants: {exc}") from exc


def _connect_with_retries(dsn: str, retry_delays: Sequence[float]) -> Any:
    from leaseq.base.errors import DatabaseUnavailableError
    from leaseq.store.db import connect

    delays = list(retry_delays)
    while True:
        try:
            return connect(dsn, application_name="leaseq-migrations")
        except DatabaseUnavailableError:
            if not delays:
                raise
            delay = delays.pop(0)
            logger.warning("database unavailable; retrying in %.1fs", delay)
            time.sleep(delay)


def _migrate_and_ensure_role(
    event: Mapping[str, Any],
    owner_dsn: Callable[[], str] | None,
    read_secret: Callable[[str], Mapping[str, Any]] | None,
    retry_delays: Sequence[float],
) -> dict[str, str]:
    # Imported here so that a layer that fails to import is answered FAILED, not left hanging.
    from leaseq.store.migrate import current_version, migrate

    from leaseq_deploy.connection_budget import (
        check_connection_budget,
        record_stack_connections,
        stack_connections,
    )
    from leaseq_deploy.dashboard_logins import check_access_patterns, manages_tenant_readers
    from leaseq_deploy.owner_connection import owner_dsn_from_environment, secrets_manager_reader
    from leaseq_deploy.pool_limits import describe, requested_pool_limits, write_pool_limits
    from leaseq_deploy.queue_routes import requested_queues, write_queues
    from leaseq_deploy.runtime_role import check_duty_group_names, ensure_login_roles
    from leaseq_deploy.stack_name import check_stack_name

    reader = read_secret or secrets_manager_reader()
    properties: Mapping[str, Any] = event.get("ResourceProperties") or {}
    rolling_back = _is_previous_version(properties)
    check_access_patterns(properties)
    specs = login_specs(properties, reader)
    # Rolling back to a template without the budget: nothing to check (and nothing to fail).
    stack = None if rolling_back else stack_connections(properties)
    pool = None if rolling_back else requested_pool_limits(properties)
    queues = None if rolling_back else requested_queues(properties)
    if stack is not None:
        check_stack_name(str(event.get("StackId", "")))
    dsn = owner_dsn() if owner_dsn is not None else owner_dsn_from_environment(os.environ, reader)

    conn = _connect_with_retries(dsn, retry_delays)
    budget = "not checked: the request carries no ConnectionBudget (an earlier template)"
    pool_limits = "left as they are: the request carries no WorkerPool (an earlier template)"
    with conn:
        applied: tuple[int, ...] = ()
        if rolling_back:
            version = current_version(conn)
        else:
            if stack is not None:
                budget = check_connection_budget(conn, stack)
            check_duty_group_names(conn)
            report = migrate(conn)
            applied, version = report.applied, report.current_version
            if stack is not None:
                record_stack_connections(conn, stack)
            if pool is not None:
                pool_limits = describe(write_pool_limits(conn, pool))
            if queues is not None:
                logger.info("named queues: %s",
                            write_queues(conn, queues, str(event.get("StackId") or "leaseq")))
        logins = ensure_login_roles(conn, specs,
                                    manage_tenant_readers=manages_tenant_readers(properties))
    for login in logins:
        logger.info("login %s (%s): %s, rds_iam %s%s%s", login.name, login.group,
                    "created" if login.created else "checked", login.rds_iam,
                    ", password set from its secret" if login.password_set else "",
                    f", {login.unbound} binding(s) to other tenants removed"
                    if login.unbound else "")
    for spec in specs:
        if spec.tenants is not None:
            logger.info("enqueue door %s: %s", spec.name,
                        f"bound to {len(spec.tenants)} tenants" if spec.tenants
                        else "every tenant (trusted multi-tenant door)")
    logger.info("schema at version %d (applied now: %s)%s", version, list(applied) or "none",
                "; rolled back to the previous version's login" if rolling_back else "")
    data = {
        "SchemaVersion": str(version),
        "AppliedVersions": ",".join(str(v) for v in applied),
        "RdsIam": logins[0].rds_iam,
    }
    if rolling_back:
        data["RuntimeDbUser"] = logins[0].name
    else:
        logger.info("connection budget: %s", budget)
        logger.info("worker pool limits: %s", pool_limits)
        data["ConnectionBudget"] = budget
        data["WorkerPoolLimits"] = pool_limits
        for spec, login in zip(specs, logins, strict=True):
            if spec.tenant is None:
                data[spec.parameter] = login.name
        data["TenantReaderLogins"] = str(sum(1 for spec in specs if spec.tenant is not None))
    return data
