"""CloudFormation custom resource: apply sql/ as the schema owner, ensure the runtime role.

Create and Update run the migrations that the layer carries (applied ones are skipped, so a
re-run is cheap) and then make the runtime login role a member of service_role only. Delete
touches nothing: removing the stack must never drop the schema or its jobs. Every request
is answered: on success, on any exception (the library is imported inside the guarded block,
so even a broken layer is reported), and by a watchdog shortly before the function's own
timeout, which would otherwise leave CloudFormation waiting for its ServiceTimeout.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from cfn_response import FAILED, SUCCESS, Opener, Responder

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
        if event["RequestType"] == "Delete":
            responder.send(
                SUCCESS,
                reason="Delete keeps the schema, its jobs and the runtime role",
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


def _migrate_and_ensure_role(
    event: Mapping[str, Any],
    owner_dsn: Callable[[], str] | None,
    read_secret: Callable[[str], Mapping[str, Any]] | None,
    retry_delays: Sequence[float],
) -> dict[str, str]:
    # Imported here so that a layer that fails to import is answered FAILED, not left hanging.
    from leaseq.db import connect
    from leaseq.errors import ConfigurationError, DatabaseUnavailableError
    from leaseq.migrate import migrate
    from owner_connection import owner_dsn_from_environment, secrets_manager_reader
    from runtime_role import RuntimeRoleSpec, ensure_runtime_role

    reader = read_secret or secrets_manager_reader()
    properties: Mapping[str, Any] = event.get("ResourceProperties") or {}
    iam_auth = _flag(properties.get("RuntimeIamAuth", "true"))
    name = str(properties.get("RuntimeDbUser", "leaseq_worker"))
    password = None
    runtime_secret_arn = str(properties.get("RuntimeSecretArn") or "")
    if not iam_auth and runtime_secret_arn:
        runtime_secret = reader(runtime_secret_arn)
        if runtime_secret.get("username") != name or not runtime_secret.get("password"):
            raise ConfigurationError(
                f"runtime secret {runtime_secret_arn} must hold username {name!r} "
                "(RuntimeDbUser) and a password"
            )
        password = str(runtime_secret["password"])
    spec = RuntimeRoleSpec(
        name=name,
        iam_auth=iam_auth,
        statement_timeout=str(properties.get("RuntimeStatementTimeout") or "15s"),
        password=password,
    )
    dsn = owner_dsn() if owner_dsn is not None else owner_dsn_from_environment(os.environ, reader)

    delays = list(retry_delays)
    while True:
        try:
            conn = connect(dsn, application_name="leaseq-migrations")
            break
        except DatabaseUnavailableError:
            if not delays:
                raise
            delay = delays.pop(0)
            logger.warning("database unavailable; retrying in %.1fs", delay)
            time.sleep(delay)

    with conn:
        report = migrate(conn)
        role = ensure_runtime_role(conn, spec)
    logger.info(
        "schema at version %d (applied now: %s); runtime role %s (%s, rds_iam %s)",
        report.current_version,
        list(report.applied) or "none",
        role.name,
        "created" if role.created else "checked",
        role.rds_iam,
    )
    return {
        "SchemaVersion": str(report.current_version),
        "AppliedVersions": ",".join(str(version) for version in report.applied),
        "RuntimeDbUser": role.name,
        "RdsIam": role.rds_iam,
    }
