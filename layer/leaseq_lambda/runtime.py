"""Cold-start composition: settings, the database connection, the job handlers.

Everything is built on the first invocation (never at import, so a bad setting fails
the invocation with a clear ConfigurationError instead of an import error) and kept
while the execution environment stays warm:

* one :class:`leaseq.QueueClient`, i.e. one connection per execution environment,
  checked at the start of each invocation and reopened once if it went stale while
  the environment was frozen;
* the handler registry, imported from the module named in ``LEASEQ_HANDLERS``.

How the connection logs in, in order of precedence:

1. ``DATABASE_URL``: a libpq DSN, used as is;
2. ``LEASEQ_DATABASE_SECRET_ARN``: a Secrets Manager secret in the RDS shape
   (``username``, ``password``, optionally ``host``, ``port``, ``dbname``), read through
   Powertools Parameters with an explicit max age; ``LEASEQ_DB_HOST`` / ``_PORT`` /
   ``_NAME`` win over the secret's own, so an RDS-managed secret can be used through
   RDS Proxy. A connection refused with a cached secret re-reads the secret once, in
   case it was rotated;
3. ``LEASEQ_DB_IAM_AUTH=true``: a fresh RDS IAM token per connect (signed locally by
   boto3, no network), over TLS, as RDS Proxy requires.

The TLS of 2. and 3. is ``LEASEQ_DB_SSLMODE`` / ``LEASEQ_DB_SSLROOTCERT`` as
:mod:`leaseq.store.tls` resolves them (verify-full against the system's roots for an RDS
Proxy host by default); a ``DATABASE_URL`` carries its own.

The handlers module convention: ``LEASEQ_HANDLERS=package.module`` names a module with a
module-level ``registry = leaseq.Registry()`` on which the handlers are registered
(``package.module:attribute`` names another attribute).
"""

from __future__ import annotations

import functools
import importlib
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import ModuleType
from typing import Any, Final

from leaseq import (
    ConfigurationError,
    DatabaseError,
    DatabaseSettings,
    JobRecord,
    LeaseqSettings,
    QueueClient,
    Registry,
    RetryPolicy,
    Worker,
    WorkerConfig,
    WorkerSettings,
    connect,
)
from leaseq.base.deadline import Deadline
from leaseq.drain.worker import ClaimHook
from leaseq.settings import EnqueueSettings
from leaseq.settings import variable as settings_variable
from leaseq.store.duties import ProducerClient, ReaperClient, WorkerClient

Connection = Any  # leaseq.store.db.Connection; kept loose so tests may pass any connect function
ConnectFunction = Callable[..., Connection]

#: The template's parameters behind some worker settings, added to their environment
#: names (WorkerSettings') in the messages of the rules they break, so that a deployer
#: knows which parameter to change.
_TEMPLATE_PARAMETERS = {"job_timeout": "JobTimeoutSeconds", "lease_margin": "LeaseMarginSeconds",
                        "kinds": "SlowKinds", "exclude_kinds": "SlowKinds"}


def _secrets_client() -> Any:
    import boto3

    return boto3.client("secretsmanager")


def _rds_client() -> Any:
    import boto3

    return boto3.client("rds")


@dataclass
class Dependencies:
    """Everything the runtime reaches outside this process, replaceable in tests."""

    connect: ConnectFunction = connect
    secrets_client: Callable[[], Any] = _secrets_client
    rds_client: Callable[[], Any] = _rds_client
    import_module: Callable[[str], ModuleType] = importlib.import_module
    environ: Mapping[str, str] | None = None


def _application_name(environ: Mapping[str, str]) -> str:
    function = environ.get("AWS_LAMBDA_FUNCTION_NAME", "")
    return f"leaseq {function}".strip()[:63]


def _secret_params(secret: Any, db: DatabaseSettings) -> dict[str, Any]:
    if not isinstance(secret, Mapping):
        raise ConfigurationError(
            f"secret {db.secret_arn} must be a JSON object with username and password")
    user = secret.get("username") or db.user
    password = secret.get("password")
    host = db.host or secret.get("host")
    dbname = db.name or secret.get("dbname")
    explicit_port = "port" in db.model_fields_set or not secret.get("port")
    port = db.port if explicit_port else int(secret["port"])
    missing = [name for name, value in (("username", user), ("password", password),
                                        ("host", host), ("dbname", dbname)) if not value]
    if missing:
        raise ConfigurationError(
            f"secret {db.secret_arn} lacks {', '.join(missing)}; add them to the secret or "
            "set LEASEQ_DB_HOST / LEASEQ_DB_NAME / LEASEQ_DB_USER")
    return {**db.address_of(str(host), port), "dbname": dbname, "user": user,
            "password": password, **db.tls_for(str(host)).params()}


def connection_factory(db: DatabaseSettings, deps: Dependencies,
                       application_name: str = "leaseq") -> Callable[[], Connection]:
    """A function that opens one new connection the way the settings say."""
    if db.url is not None:
        dsn = db.url.get_secret_value()
        return lambda: deps.connect(dsn, application_name=application_name)
    if db.secret_arn is not None:
        return _secret_factory(db, deps, application_name)
    return _iam_factory(db, deps, application_name)


def _secret_factory(db: DatabaseSettings, deps: Dependencies,
                    application_name: str) -> Callable[[], Connection]:
    from aws_lambda_powertools.utilities.parameters import SecretsProvider
    from aws_lambda_powertools.utilities.parameters.exceptions import (
        GetParameterError,
        TransformParameterError,
    )

    provider = SecretsProvider(boto3_client=deps.secrets_client())
    arn = db.secret_arn
    assert arn is not None

    def read(force: bool) -> dict[str, Any]:
        try:
            value = provider.get(arn, transform="json", max_age=db.secret_max_age_seconds,
                                 force_fetch=force)
        except TransformParameterError as exc:
            raise ConfigurationError(f"secret {arn} is not JSON: store a JSON object with "
                                     "username and password") from exc
        except GetParameterError as exc:
            raise ConfigurationError(
                f"cannot read secret {arn}: {exc}. Check the ARN, the function's "
                "secretsmanager:GetSecretValue permission and the network path "
                "(a VPC endpoint or NAT)") from exc
        return _secret_params(value, db)

    def open_connection() -> Connection:
        cached = read(False)
        try:
            return deps.connect("", application_name=application_name, **cached)
        except DatabaseError:
            # libpq reports a refused login without a SQLSTATE, so any failure with a
            # cached secret re-reads it: it may have been rotated since it was cached.
            fresh = read(True)
            if fresh == cached:
                raise
        return deps.connect("", application_name=application_name, **fresh)

    return open_connection


def _iam_factory(db: DatabaseSettings, deps: Dependencies,
                 application_name: str) -> Callable[[], Connection]:
    rds = deps.rds_client()

    def open_connection() -> Connection:
        # A token is valid for 15 minutes to open a connection, so one per connect.
        token = rds.generate_db_auth_token(DBHostname=db.host, Port=db.port,
                                           DBUsername=db.user)
        assert db.host is not None  # IAM authentication needs it (settings)
        return deps.connect("", application_name=application_name,
                            **db.address_of(db.host, db.port), dbname=db.name, user=db.user,
                            password=token, **db.tls.params())

    return open_connection


#: The variables that name a handlers module: the worker's, and the enqueue function's check.
HANDLERS_VARIABLE: Final = settings_variable(WorkerSettings, "handlers_module")
ENQUEUE_HANDLERS_VARIABLE: Final = settings_variable(EnqueueSettings, "handlers_module")


def load_registry(name: str | None, import_module: Callable[[str], ModuleType]
                  = importlib.import_module, variable: str = HANDLERS_VARIABLE) -> Registry:
    """The Registry of the handlers module named by ``variable`` (LEASEQ_HANDLERS)."""
    if not name:
        raise ConfigurationError(
            f"{variable} is not set: name the Python module that registers your job "
            "handlers; it must define a module-level `registry = leaseq.Registry()`")
    module_name, _, attribute = name.partition(":")
    attribute = attribute or "registry"
    try:
        module = import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"{variable}={name!r} cannot be imported ({exc}); ship the module with the "
            "function's code or in a layer, and check its spelling") from exc
    except Exception as exc:
        raise ConfigurationError(
            f"importing the handlers module {module_name!r} failed: "
            f"{type(exc).__name__}: {exc}") from exc
    registry = getattr(module, attribute, None)
    if not isinstance(registry, Registry):
        raise ConfigurationError(
            f"handlers module {module_name!r} has no module-level {attribute!r} that is a "
            f"leaseq.Registry (found {type(registry).__name__}); define "
            f"`{attribute} = leaseq.Registry()` and register the handlers on it")
    if len(registry) == 0:
        raise ConfigurationError(
            f"handlers module {module_name!r} registers no job kinds; register at least one "
            "with registry.register(kind, handler) or @registry.handler(kind)")
    return registry


@dataclass
class Runtime:
    """What one execution environment keeps between invocations."""

    settings: LeaseqSettings
    client: QueueClient
    deps: Dependencies = field(default_factory=Dependencies)
    _registry: Registry | None = None
    _enqueue_registry: Registry | None = None
    #: Seconds every invocation starts with, fixed at the first invocation.
    _worker_timeout: float | None = None

    def check(self) -> None:
        """Start of an invocation: make sure the connection still works."""
        self.client.check()

    @functools.cached_property
    def _producer_face(self) -> ProducerClient:
        return ProducerClient(self.client)

    @functools.cached_property
    def _worker_face(self) -> WorkerClient:
        return WorkerClient(self.client)

    @functools.cached_property
    def _reaper_face(self) -> ReaperClient:
        return ReaperClient(self.client)

    def producer_client(self) -> ProducerClient:
        """The enqueue function's face of the client: the producer's calls only (enqueue,
        read results, wake a worker)."""
        return self._producer_face

    def worker_client(self) -> WorkerClient:
        """The worker function's face of the client: the worker's calls only, over the
        environment's one connection (one face per environment, like the client)."""
        return self._worker_face

    def reaper_client(self) -> ReaperClient:
        """The reaper function's face of the client: the reaper's calls only."""
        return self._reaper_face

    def registry(self) -> Registry:
        """The handlers' registry, imported on first use (a worker's; the reaper never
        imports the handlers module, the enqueue function only through
        :meth:`enqueue_registry`)."""
        if self._registry is None:
            self._registry = load_registry(self.settings.worker.handlers_module,
                                           self.deps.import_module)
        return self._registry

    def enqueue_registry(self) -> Registry | None:
        """The registry the enqueue function checks jobs against, imported on first use
        from LEASEQ_ENQUEUE_HANDLERS; None when it is unset (no check)."""
        name = self.settings.enqueue.handlers_module
        if name is None:
            return None
        if self._enqueue_registry is None:
            self._enqueue_registry = load_registry(name, self.deps.import_module,
                                                   ENQUEUE_HANDLERS_VARIABLE)
        return self._enqueue_registry

    def worker(self, owner: str, *,
               on_job: Callable[[JobRecord], None] | None = None,
               deadline: Deadline | None = None,
               poll_idle: float | None = None,
               on_claim: ClaimHook | None = None) -> Worker:
        """A worker for one invocation: the cached client and registry, this owner id.

        The worker's invocation time is LEASEQ_WORKER_TIMEOUT_SECONDS, else the time
        left at the start of the first invocation (``deadline``'s remaining time; Lambda
        timeouts are whole seconds, so rounded up): settings that cannot run a job, and kinds whose
        timeout no invocation can fit, fail the invocation with a ConfigurationError; so
        does a kind of LEASEQ_KINDS that the handlers module has no handler for. The kind
        filter (LEASEQ_KINDS, LEASEQ_EXCLUDE_KINDS) reaches the config with the rest.
        ``poll_idle`` replaces LEASEQ_POLL_IDLE_SECONDS for this invocation only (an
        invocation started by fan-out or wake stops sooner on an empty queue than the
        scheduled one). ``on_claim`` is told every claim (the worker pool's fan-out,
        :class:`leaseq_lambda.scaling.FanOut`).
        """
        ws = self.settings.worker
        if self._worker_timeout is None:
            time_left = deadline.remaining() if deadline is not None else None
            self._worker_timeout = ws.worker_timeout_seconds or (
                float(math.ceil(time_left)) if time_left else None)
        values = {**ws.config_values(), "worker_timeout": self._worker_timeout}
        retry = RetryPolicy(base_delay=values.pop("retry_base"),
                            max_delay=values.pop("retry_max"))
        names = WorkerSettings.setting_names()
        for key, parameter in _TEMPLATE_PARAMETERS.items():
            names[key] = f"{names[key]} ({parameter})"
        names["worker_timeout"] = (f"the function timeout (WorkerTimeoutSeconds, "
                                   f"{names['worker_timeout']})")
        if poll_idle is not None:
            values["poll_idle"] = poll_idle
            names["poll_idle"] = f"this invocation's poll_idle (in place of {names['poll_idle']})"
        config = WorkerConfig(owner=owner, retry=retry, setting_names=names, **values)
        return Worker(self.worker_client(), self.registry(), config, on_job=on_job,
                      on_claim=on_claim)

    def oldest_ready_age(self, now: datetime | None = None) -> float:
        """Seconds the oldest claimable job of any tenant has waited (0 when none).

        One index probe (app.oldest_ready_at) that sees every tenant; the tenant listing
        it replaces stopped at 10,000 tenants and missed the ones after them."""
        oldest = self.worker_client().oldest_ready_at()
        if oldest is None:
            return 0.0
        return max(0.0, ((now or datetime.now(UTC)) - oldest).total_seconds())

    def close(self) -> None:
        """Close the connection (the environment is being reset)."""
        self.client.close()


def build(deps: Dependencies | None = None) -> Runtime:
    """A new runtime from the environment: settings validated (a ConfigurationError
    naming the variable otherwise) and a client that connects on first use, so a cold
    start with a bad setting fails before any connection is tried."""
    deps = deps or Dependencies()
    environ = os.environ if deps.environ is None else deps.environ
    settings = LeaseqSettings.from_env(environ)
    factory = connection_factory(settings.database, deps, _application_name(environ))
    client = QueueClient(factory, max_idle_seconds=settings.database.max_idle_seconds)
    return Runtime(settings, client, deps)


_current: Runtime | None = None
_dependencies: Dependencies | None = None


def get() -> Runtime:
    """The execution environment's runtime, built on first use."""
    global _current
    if _current is None:
        _current = build(_dependencies)
    return _current


def reset(dependencies: Dependencies | None = None) -> None:
    """Forget the cached runtime (closing its connection); the next get() rebuilds it,
    with ``dependencies`` if given. For tests and the local CLI, which run many
    "execution environments" in one process."""
    global _current, _dependencies
    if _current is not None:
        try:
            _current.close()
        finally:
            _current = None
    _dependencies = dependencies
