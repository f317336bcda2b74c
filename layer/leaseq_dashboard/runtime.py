"""Cold-start composition of the dashboard Lambda: settings, connections, the resolver.

Built on the first invocation and kept while the execution environment stays warm, like
the worker's runtime (:mod:`leaseq_lambda.runtime`), whose connection factory it uses, so
the dashboard logs in the same three ways (DSN, Secrets Manager secret, RDS IAM token):

* the operator connection with the leaseq database settings (``DATABASE_URL``,
  ``LEASEQ_DATABASE_SECRET_ARN`` or ``LEASEQ_DB_IAM_AUTH``): a member of leaseq_operator;
* the tenant reader connection, only when tenant viewers are configured, with the same
  host and database but the reader's login (``LEASEQ_DASHBOARD_READER_URL``,
  ``LEASEQ_DASHBOARD_READER_SECRET_ARN`` or ``LEASEQ_DASHBOARD_READER_USER``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from aws_lambda_powertools.event_handler import LambdaFunctionUrlResolver
from leaseq import ConfigurationError, DatabaseSettings, LeaseqSettings
from leaseq_lambda.runtime import Dependencies, connection_factory

from leaseq_dashboard.app import build
from leaseq_dashboard.local import ConnectionViewSource
from leaseq_dashboard.settings import DashboardSettings


@dataclass
class DashboardRuntime:
    """What one execution environment keeps: the resolver and its connections."""

    app: LambdaFunctionUrlResolver
    source: ConnectionViewSource


def reader_database(base: DatabaseSettings, dash: DashboardSettings) -> DatabaseSettings:
    """The tenant reader's login on the operator's server and database."""
    if dash.reader_url is None and dash.reader_secret_arn is None and not (
            base.iam_auth and dash.reader_user):
        raise ConfigurationError(
            "tenant viewers are configured but no reader login: set "
            "LEASEQ_DASHBOARD_READER_URL, LEASEQ_DASHBOARD_READER_SECRET_ARN or (with "
            "LEASEQ_DB_IAM_AUTH) LEASEQ_DASHBOARD_READER_USER")
    fields = base.model_dump()
    fields.update(url=dash.reader_url, secret_arn=dash.reader_secret_arn,
                  user=dash.reader_user or base.user)
    if dash.reader_url is not None:  # a URL says where it connects, hostaddr included
        fields.update(hostaddr=None, hostaddr_port=None)
    return DatabaseSettings.model_validate(fields)


def build_runtime(deps: Dependencies | None = None) -> DashboardRuntime:
    """Read the environment, make the connection factories and the resolver."""
    deps = deps or Dependencies()
    environ = os.environ if deps.environ is None else deps.environ
    settings = LeaseqSettings.from_env(environ)
    try:
        dash = DashboardSettings.from_env(environ)
    except ValueError as exc:
        raise ConfigurationError(f"invalid dashboard settings: {exc}") from exc
    name = f"leaseq dashboard {environ.get('AWS_LAMBDA_FUNCTION_NAME', '')}".strip()[:63]
    reader = None
    if dash.has_tenant_viewers:
        reader = connection_factory(reader_database(settings.database, dash), deps, name)
    source = ConnectionViewSource(connection_factory(settings.database, deps, name), reader,
                                  max_idle_seconds=settings.database.max_idle_seconds)
    return DashboardRuntime(build(source, dash.policy), source)


_current: DashboardRuntime | None = None


def get(deps: Dependencies | None = None) -> DashboardRuntime:
    """The execution environment's dashboard, built on first use."""
    global _current
    if _current is None:
        _current = build_runtime(deps)
    return _current


def reset() -> None:
    """Forget the cached dashboard (closing its connections); for tests."""
    global _current
    if _current is not None:
        _current.source.close()
    _current = None
