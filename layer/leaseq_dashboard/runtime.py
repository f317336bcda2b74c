"""Cold-start composition of the dashboard Lambda: settings, connections, the resolver.

Built on the first invocation and kept while the execution environment stays warm, like
the worker's runtime (:mod:`leaseq_lambda.runtime`), whose connection factory it uses:

* the dashboard's own connection, with the leaseq database settings (``DATABASE_URL``,
  ``LEASEQ_DATABASE_SECRET_ARN`` or ``LEASEQ_DB_IAM_AUTH``): a member of
  leaseq_dashboard;
* for a tenant viewer, a connection as that tenant's reader login
  (:func:`leaseq_dashboard.sources.reader_login`) on the same server and database, with
  an RDS IAM token (or, with ``DATABASE_URL``, the same URL with that user and no
  password: the test suite's and a local server's way). With a Secrets Manager secret
  there is no per-tenant login to read, so tenant viewers are refused at cold start.
  At most ``LEASEQ_DASHBOARD_READER_CONNECTIONS`` of them stay open.

Every event must have the shape of a request through this function's URL in
``AWS_REGION`` (:class:`leaseq_dashboard.origin.FunctionUrlOrigin`) before its identity
is read.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from uuid import UUID

from aws_lambda_powertools.event_handler import LambdaFunctionUrlResolver
from leaseq import ConfigurationError, DatabaseSettings, LeaseqSettings
from leaseq.store.db import Connection
from leaseq_lambda.runtime import Dependencies, connection_factory
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from leaseq_dashboard.app import build
from leaseq_dashboard.origin import FunctionUrlOrigin
from leaseq_dashboard.settings import DashboardSettings
from leaseq_dashboard.sources import DashboardViewSource, reader_login


@dataclass
class DashboardRuntime:
    """What one execution environment keeps: the resolver, its connections, and the
    function URL its requests must come through."""

    app: LambdaFunctionUrlResolver
    source: DashboardViewSource
    origin: FunctionUrlOrigin


def reader_database(base: DatabaseSettings, tenant_id: UUID) -> DatabaseSettings:
    """``tenant_id``'s reader login on the dashboard's server and database."""
    login = reader_login(tenant_id)
    fields = base.model_dump()
    if base.url is not None:
        params = conninfo_to_dict(base.url.get_secret_value())
        params.pop("password", None)
        params["user"] = login
        fields["url"] = make_conninfo("", **params)
    elif base.iam_auth:
        fields["user"] = login
    else:
        raise ConfigurationError(
            "tenant viewers need IAM authentication (LEASEQ_DB_IAM_AUTH=true): each "
            "tenant's reader login authenticates with an RDS IAM token, and there is no "
            "per-tenant secret to read; unset LEASEQ_DASHBOARD_TENANT_VIEWERS or use IAM "
            "authentication")
    return DatabaseSettings.model_validate(fields)


def _reader_factory(base: DatabaseSettings, deps: Dependencies,
                    name: str) -> Callable[[UUID], Connection]:
    # One factory per tenant (the policy's tenants only), so an IAM token generator or
    # a parsed DSN is made once, however often a connection is reopened.
    factories: dict[UUID, Callable[[], Connection]] = {}

    def connect(tenant_id: UUID) -> Connection:
        factory = factories.get(tenant_id)
        if factory is None:
            factory = connection_factory(reader_database(base, tenant_id), deps, name)
            factories[tenant_id] = factory
        return factory()

    return connect


def build_runtime(deps: Dependencies | None = None) -> DashboardRuntime:
    """Read the environment, make the connection factories and the resolver."""
    deps = deps or Dependencies()
    environ = os.environ if deps.environ is None else deps.environ
    settings = LeaseqSettings.from_env(environ)
    try:
        dash = DashboardSettings.from_env(environ)
    except ValueError as exc:
        raise ConfigurationError(f"invalid dashboard settings: {exc}") from exc
    region = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
    if not region:
        raise ConfigurationError("AWS_REGION is not set: the dashboard checks that every "
                                 "request came through its function URL in that region")
    name = f"leaseq dashboard {environ.get('AWS_LAMBDA_FUNCTION_NAME', '')}".strip()[:63]
    readers = None
    if dash.has_tenant_viewers:
        for tenant in dash.tenant_viewers.values():
            reader_database(settings.database, tenant)  # refuse a secret login now
        readers = _reader_factory(settings.database, deps, name)
    source = DashboardViewSource(connection_factory(settings.database, deps, name), readers,
                                 max_readers=dash.reader_connections,
                                 max_idle_seconds=settings.database.max_idle_seconds)
    origin = FunctionUrlOrigin(region, dash.url_id)
    return DashboardRuntime(build(source, dash.policy, identify=origin.principal), source,
                            origin)


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
