"""Settings, validated once at the edge and passed in explicitly.

``LeaseqSettings.from_env()`` is the only place the library reads the environment;
every variable is declared once, as an alias on the field it fills.

Why plain pydantic models, not pydantic-settings' ``BaseSettings``: every caller hands
the environment over explicitly (the Lambda runtime's injectable mapping, the command
line, the tests' dicts), and ``BaseSettings`` reads ``os.environ`` itself. Feeding it a
mapping takes its underscore-prefixed ``_build_sources`` argument or a custom source
that would redo the three-line filter below (declared names only, empty means unset);
its default is case-insensitive names (``leaseq_batch_size`` would count too), and a
section built by ``default_factory`` would read the process environment behind the
caller's back. It would add pydantic-settings and python-dotenv to the layer to replace
``_known``; validation, bounds and error messages are pydantic's either way.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, ClassVar
from uuid import UUID

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    IPvAnyAddress,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from leaseq.base.errors import ConfigurationError, one_line
from leaseq.base.limits import DEFAULT_QUEUE, queue_name_problem
from leaseq.drain import config
from leaseq.store.client import DEFAULT_MAX_IDLE_SECONDS
from leaseq.store.tls import SslSetting, TlsOptions, choose_tls, libpq_mode
from leaseq.upkeep.reaper import REAPER_LIMIT, RETENTION_DAYS


class DatabaseSettings(BaseModel):
    """Where the database is and how to log in: a DSN, a Secrets Manager secret, or
    host + user with an RDS IAM token (for RDS Proxy)."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    url: SecretStr | None = Field(default=None, alias="DATABASE_URL")
    host: str | None = Field(default=None, alias="LEASEQ_DB_HOST")
    port: int = Field(default=5432, ge=1, le=65535, alias="LEASEQ_DB_PORT")
    #: Where to open the TCP connection when it is not where LEASEQ_DB_HOST resolves to: an
    #: IP address (libpq's ``hostaddr``), such as a local port forward into the VPC, on
    #: LEASEQ_DB_HOSTADDR_PORT (default LEASEQ_DB_PORT). LEASEQ_DB_HOST stays the name TLS
    #: verifies (and whether a network is crossed is decided by it, not by the address)
    #: and the one an IAM token is signed for, with LEASEQ_DB_PORT.
    hostaddr: IPvAnyAddress | None = Field(default=None, alias="LEASEQ_DB_HOSTADDR")
    hostaddr_port: int | None = Field(default=None, ge=1, le=65535,
                                      alias="LEASEQ_DB_HOSTADDR_PORT")
    name: str | None = Field(default=None, alias="LEASEQ_DB_NAME")
    user: str | None = Field(default=None, alias="LEASEQ_DB_USER")
    iam_auth: bool = Field(default=False, alias="LEASEQ_DB_IAM_AUTH")
    #: Unset: verify-full when there are roots to verify with (LEASEQ_DB_SSLROOTCERT, or
    #: an RDS Proxy host); a host across a network without them is refused, unless
    #: ``require-unverified`` says to connect unchecked. See leaseq.store.tls.
    sslmode: SslSetting = Field(default="require", alias="LEASEQ_DB_SSLMODE")
    #: A PEM bundle of the CAs that sign the server's certificate, or ``system``.
    sslrootcert: str | None = Field(default=None, min_length=1, alias="LEASEQ_DB_SSLROOTCERT")
    #: OpenSSL's own override of the system bundle, which ``system`` honours too.
    ssl_cert_file: str | None = Field(default=None, alias="SSL_CERT_FILE")
    ssl_cert_dir: str | None = Field(default=None, alias="SSL_CERT_DIR")
    secret_arn: str | None = Field(default=None, alias="LEASEQ_DATABASE_SECRET_ARN")
    secret_max_age_seconds: int = Field(default=300, ge=0, le=86_400,
                                        alias="LEASEQ_SECRET_MAX_AGE_SECONDS")
    #: A connection unused for longer is pinged before its next use, and replaced if the
    #: network dropped it while the execution environment was frozen.
    max_idle_seconds: float = Field(default=DEFAULT_MAX_IDLE_SECONDS, gt=0,
                                    alias="LEASEQ_DB_MAX_IDLE_SECONDS")

    _tls: TlsOptions | None = PrivateAttr(default=None)
    _tls_by_host: dict[str, TlsOptions] = PrivateAttr(default_factory=dict)

    @property
    def tls(self) -> TlsOptions:
        """The TLS of a host-based connection (secret or IAM); a DSN carries its own."""
        assert self._tls is not None  # set by validation
        return self._tls

    def tls_for(self, host: str) -> TlsOptions:
        """The TLS of a connection to ``host``: :attr:`tls` for LEASEQ_DB_HOST, chosen
        again (once) for a host that only the secret names, because whether a host is
        reached over a network decides what is allowed (leaseq.store.tls)."""
        if host == self.host or self.url is not None:
            return self.tls
        if host not in self._tls_by_host:
            self._tls_by_host[host] = self._choose(host)
        return self._tls_by_host[host]

    def address_of(self, host: str, port: int) -> dict[str, Any]:
        """libpq's ``host`` and ``port`` for a connection to ``host``, with ``hostaddr``
        and its port when LEASEQ_DB_HOSTADDR says where LEASEQ_DB_HOST is reached."""
        if self.hostaddr is None or host != self.host:
            return {"host": host, "port": port}
        return {"host": host, "hostaddr": str(self.hostaddr),
                "port": self.hostaddr_port or port}

    def _choose(self, host: str | None) -> TlsOptions:
        return choose_tls(
            host=host, sslmode=self.sslmode if "sslmode" in self.model_fields_set else None,
            sslrootcert=self.sslrootcert,
            environ={k: v for k, v in (("SSL_CERT_FILE", self.ssl_cert_file),
                                       ("SSL_CERT_DIR", self.ssl_cert_dir)) if v})

    @model_validator(mode="after")
    def _one_way_in(self) -> DatabaseSettings:
        if self._tls is not None:
            # Validated before (pydantic runs this again when the section is passed to
            # LeaseqSettings): the choice, and its warning, are made once.
            return self
        if self.url is None and self.secret_arn is None and not (self.host and self.iam_auth):
            raise ValueError(
                "no database configured: set DATABASE_URL, or LEASEQ_DATABASE_SECRET_ARN, "
                "or LEASEQ_DB_HOST + LEASEQ_DB_USER + LEASEQ_DB_NAME with LEASEQ_DB_IAM_AUTH=true")
        if self.iam_auth and not (self.host and self.user and self.name):
            raise ValueError(
                "LEASEQ_DB_IAM_AUTH=true needs LEASEQ_DB_HOST, LEASEQ_DB_USER and LEASEQ_DB_NAME")
        if self.hostaddr_port is not None and self.hostaddr is None:
            raise ValueError("LEASEQ_DB_HOSTADDR_PORT is the port at LEASEQ_DB_HOSTADDR: set "
                             "LEASEQ_DB_HOSTADDR too, or unset it")
        if self.hostaddr is not None and (self.url is not None or not self.host):
            raise ValueError(
                "LEASEQ_DB_HOSTADDR says where LEASEQ_DB_HOST is reached: set LEASEQ_DB_HOST "
                "(the name TLS verifies); with DATABASE_URL put hostaddr in the URL instead")
        if self.url is not None:
            if self.sslrootcert is not None:
                raise ValueError(
                    "LEASEQ_DB_SSLROOTCERT is not used with DATABASE_URL, which is used as "
                    "given: put sslmode=verify-full&sslrootcert=PATH in the URL instead")
            # A placeholder: the URL's own sslmode is the one libpq uses.
            self._tls = TlsOptions(libpq_mode(self.sslmode))
            return self
        if self.iam_auth and self.sslmode in ("disable", "allow", "prefer"):
            raise ValueError(
                "LEASEQ_DB_IAM_AUTH=true needs TLS: set LEASEQ_DB_SSLMODE to verify-full, "
                f"verify-ca or require-unverified (got {self.sslmode})")
        chosen = self._choose(self.host)
        # The effective mode is what the field reports, explicit or chosen.
        object.__setattr__(self, "sslmode", chosen.setting)
        self._tls = chosen
        return self


class WorkerSettings(BaseModel):
    """The worker's environment. Defaults and bounds are those of
    :class:`leaseq.WorkerConfig` (both read ``leaseq.drain.config``), and the rules relating two
    settings are checked here with the variables' names."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    batch_size: int = Field(alias="LEASEQ_BATCH_SIZE", **config.BATCH_SIZE.field())
    lease_margin_seconds: float = Field(alias="LEASEQ_LEASE_MARGIN_SECONDS",
                                        **config.LEASE_MARGIN.field())
    job_timeout_seconds: float = Field(alias="LEASEQ_JOB_TIMEOUT_SECONDS",
                                       **config.JOB_TIMEOUT.field())
    max_lease_seconds: float | None = Field(alias="LEASEQ_MAX_LEASE_SECONDS",
                                            **config.MAX_LEASE.field())
    worker_id: str | None = Field(default=None, min_length=1, max_length=120,
                                  alias="LEASEQ_WORKER_ID")
    handlers_module: str | None = Field(default=None, alias="LEASEQ_HANDLERS")
    retry_base_seconds: float = Field(alias="LEASEQ_RETRY_BASE_SECONDS",
                                      **config.RETRY_BASE.field())
    retry_max_seconds: float = Field(alias="LEASEQ_RETRY_MAX_SECONDS",
                                     **config.RETRY_MAX.field())
    concurrency: int = Field(alias="LEASEQ_WORKER_CONCURRENCY", **config.CONCURRENCY.field())
    sync_concurrency: int | None = Field(alias="LEASEQ_SYNC_CONCURRENCY",
                                         **config.SYNC_CONCURRENCY.field())
    record_interval_seconds: float = Field(alias="LEASEQ_RECORD_INTERVAL_SECONDS",
                                           **config.RECORD_INTERVAL.field())
    poll_min_seconds: float = Field(alias="LEASEQ_POLL_MIN_SECONDS", **config.POLL_MIN.field())
    poll_max_seconds: float = Field(alias="LEASEQ_POLL_MAX_SECONDS", **config.POLL_MAX.field())
    poll_idle_seconds: float = Field(alias="LEASEQ_POLL_IDLE_SECONDS",
                                     **config.POLL_IDLE.field())
    worker_timeout_seconds: float | None = Field(alias="LEASEQ_WORKER_TIMEOUT_SECONDS",
                                                 **config.WORKER_TIMEOUT.field())
    loop_stall_seconds: float = Field(alias="LEASEQ_LOOP_STALL_SECONDS",
                                      **config.LOOP_STALL.field())
    cancel_grace_seconds: float = Field(alias="LEASEQ_CANCEL_GRACE_SECONDS",
                                        **config.CANCEL_GRACE.field())
    #: How many registered kinds (the first, by name) get a metric dimension value of
    #: their own; the others share ``other``. Each one is a few billed metrics.
    metric_kinds: int = Field(default=10, ge=0, le=100, alias="LEASEQ_METRIC_KINDS")
    #: The worker's kind filter, comma-separated kinds (WorkerConfig.kinds, exclude_kinds):
    #: claim only these kinds, or every kind but these; not both.
    kinds: tuple[str, ...] | None = Field(default=None, alias="LEASEQ_KINDS")
    exclude_kinds: tuple[str, ...] | None = Field(default=None, alias="LEASEQ_EXCLUDE_KINDS")
    #: The named queue this worker drains (WorkerConfig.queue): each queue has a worker
    #: function of its own.
    queue: str = Field(default=DEFAULT_QUEUE, alias="LEASEQ_QUEUE")

    #: WorkerConfig's field -> this model's field.
    CONFIG_FIELDS: ClassVar[dict[str, str]] = {
        "batch_size": "batch_size", "lease_margin": "lease_margin_seconds",
        "job_timeout": "job_timeout_seconds", "max_lease": "max_lease_seconds",
        "concurrency": "concurrency", "sync_concurrency": "sync_concurrency",
        "record_interval": "record_interval_seconds",
        "poll_min": "poll_min_seconds", "poll_max": "poll_max_seconds",
        "poll_idle": "poll_idle_seconds", "worker_timeout": "worker_timeout_seconds",
        "loop_stall": "loop_stall_seconds", "cancel_grace": "cancel_grace_seconds",
        "retry_base": "retry_base_seconds",
        "retry_max": "retry_max_seconds",
        "kinds": "kinds", "exclude_kinds": "exclude_kinds", "queue": "queue",
    }

    @classmethod
    def setting_names(cls) -> dict[str, str]:
        """WorkerConfig's fields named by their environment variables, for messages."""
        return {key: variable(cls, name) for key, name in cls.CONFIG_FIELDS.items()}

    def config_values(self) -> dict[str, Any]:
        """These settings as WorkerConfig's field values."""
        return {key: getattr(self, name) for key, name in self.CONFIG_FIELDS.items()}

    @field_validator("kinds", "exclude_kinds", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        """``a,b`` is two kinds; white space around each is not part of it. An empty
        kind (``a,,b``, a trailing comma) is refused rather than dropped."""
        if not isinstance(value, str):
            return value
        kinds = tuple(kind.strip() for kind in value.split(","))
        if "" in kinds:
            raise ValueError(
                f"kind {kinds.index('') + 1} of {value!r} is empty: separate kinds with single "
                "commas, as in report.build,invoice.render")
        return kinds

    @field_validator("queue")
    @classmethod
    def _queue_name(cls, value: str) -> str:
        problem = queue_name_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("kinds", "exclude_kinds", mode="after")
    @classmethod
    def _kinds(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        problem = config.kind_list_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> WorkerSettings:
        problems = config.contradictions(self.config_values(), self.setting_names())
        if problems:
            raise ValueError("; ".join(problems))
        return self


class ReaperSettings(BaseModel):
    """How much the reaper releases and prunes per pass."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    limit: int = Field(alias="LEASEQ_REAPER_LIMIT", **REAPER_LIMIT.field())
    #: How many queues (the first, by name) get a metric dimension value of their own in
    #: the reaper's per-queue metrics; the others share ``other``.
    metric_queues: int = Field(default=20, ge=0, le=100, alias="LEASEQ_METRIC_QUEUES")
    #: Finished jobs (succeeded, dead, cancelled) and their events are deleted this long
    #: after they finished; 0 keeps them for ever.
    retention_days: float = Field(alias="LEASEQ_RETENTION_DAYS", **RETENTION_DAYS.field())

    @property
    def retention(self) -> timedelta | None:
        """How long finished jobs are kept, or None to keep them for ever (0 days)."""
        return timedelta(days=self.retention_days) if self.retention_days else None


class PoolSettings(BaseModel):
    """The worker pool: how many worker invocations may drain at once, started by busy
    workers (fan-out) and by enqueues on an idle queue (wake). Defaults and bounds are
    ``leaseq.drain.config``'s ``POOL_BOUNDS``.

    ``max_workers`` 0 (the default) turns all of it off: no pool, no fan-out, no wake,
    the scheduled worker alone, as before. Above 0 the invocations to start need the
    worker function's name or ARN (``worker_function``), so that pair is checked here.

    The database holds the pool to the schema owner's limits (``app.settings``, written
    at deploy from the template): ``max_workers`` and ``start_hold_seconds`` can only
    narrow them, and the wake's debounce is the owner's alone.
    """

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    max_workers: int = Field(alias="LEASEQ_MAX_WORKERS", **config.MAX_WORKERS.field())
    #: The worker function's name or ARN, which fan-out and wake invoke.
    worker_function: str | None = Field(default=None, min_length=1, max_length=256,
                                        alias="LEASEQ_WORKER_FUNCTION")
    #: A started (fan-out or wake) invocation stops after this long without work; the
    #: scheduled one keeps LEASEQ_POLL_IDLE_SECONDS.
    fanout_idle_seconds: float = Field(alias="LEASEQ_FANOUT_IDLE_SECONDS",
                                       **config.FANOUT_IDLE.field())
    #: How long a place a worker reserves waits for its invocation before its room is
    #: free again: longer than the asynchronous event may wait (the worker's maximum event
    #: age). The database keeps the shorter of this and the schema owner's start hold.
    start_hold_seconds: float = Field(alias="LEASEQ_START_HOLD_SECONDS",
                                      **config.START_HOLD.field())
    #: The named queue whose pool this worker joins, fans out and wakes (each queue has
    #: its own): the worker's LEASEQ_QUEUE, which :meth:`LeaseqSettings.from_env` copies
    #: here (one variable, read once).
    queue: str = DEFAULT_QUEUE
    #: The enqueue function's wakes: the worker function (name or ARN) of each queue
    #: other than the worker function's own, as a JSON object {"reports": "stack-reports-
    #: worker"}. A job of a queue named nowhere wakes no worker: its tick drains it.
    queue_workers: dict[str, str] = Field(default_factory=dict, alias="LEASEQ_QUEUE_WORKERS")

    @field_validator("queue")
    @classmethod
    def _queue_name(cls, value: str) -> str:
        problem = queue_name_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("queue_workers", mode="before")
    @classmethod
    def _json_object(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise ValueError('must be a JSON object of queue names to worker functions, '
                                 'as in {"reports": "my-stack-reports-worker"}') from None
        if isinstance(value, dict):
            for name in value:
                problem = queue_name_problem(name)
                if problem is not None:
                    raise ValueError(f"key {problem}")
        return value

    def worker_of(self, queue: str) -> str | None:
        """The worker function that drains ``queue``: named in ``queue_workers``, else
        ``worker_function`` for the worker's own queue; None when nothing drains it
        here."""
        if queue in self.queue_workers:
            return self.queue_workers[queue]
        return self.worker_function if queue == self.queue else None

    @property
    def enabled(self) -> bool:
        """Whether there is a pool at all (``max_workers`` above 0)."""
        return self.max_workers > 0

    @model_validator(mode="after")
    def _function_to_start(self) -> PoolSettings:
        if self.max_workers > 0 and self.worker_function is None:
            raise ValueError(
                f"LEASEQ_MAX_WORKERS is {self.max_workers} but LEASEQ_WORKER_FUNCTION is not "
                "set: name the worker function (its name or ARN) that fan-out and wake "
                "invoke, or set LEASEQ_MAX_WORKERS to 0 for the scheduled worker alone")
        return self


#: The most tenants one enqueue door may be bound to (LEASEQ_ENQUEUE_TENANTS, the stack's
#: EnqueueTenants: a CloudFormation parameter holds at most 4,096 characters).
MAX_ENQUEUE_TENANTS = 100


def tenant_list(value: str) -> frozenset[UUID]:
    """The tenants of a comma-separated list of tenant ids (spaces around each allowed,
    empty: none); ValueError naming the first that is not a tenant id, or too many."""
    items = [item.strip() for item in value.split(",")] if value.strip() else []
    tenants = set()
    for position, item in enumerate(items, start=1):
        try:
            tenants.add(UUID(item))
        except ValueError:
            raise ValueError(
                f"item {position} ({item[:40]!r}) is not a tenant id: give tenant ids "
                "(uuids) separated by commas") from None
    if len(tenants) > MAX_ENQUEUE_TENANTS:
        raise ValueError(f"names {len(tenants)} tenants; at most {MAX_ENQUEUE_TENANTS} "
                         "may share one enqueue door")
    return frozenset(tenants)


class EnqueueSettings(BaseModel):
    """The enqueue function's door. By default it enqueues for any tenant: a trusted
    multi-tenant door, because a Lambda invocation carries no caller identity the
    function could check. With tenants set, its login is bound to exactly those tenants
    in the database (the migrations do it: app.tenant_producers), which refuses any
    other; the function rejects another tenant's job itself, item by item, so that the
    rest of a batch is stored and the caller learns why (docs/deploy.md)."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    #: Empty: every tenant. Otherwise the only tenants this door enqueues for.
    tenants: frozenset[UUID] = Field(default=frozenset(), alias="LEASEQ_ENQUEUE_TENANTS")
    #: The handlers module (as LEASEQ_HANDLERS names it) whose registry the door checks
    #: every job against: an unknown kind, or a payload its model refuses, is rejected
    #: before anything is stored. Unset: kinds and payloads are not checked here.
    handlers_module: str | None = Field(default=None, alias="LEASEQ_ENQUEUE_HANDLERS")

    @field_validator("tenants", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        return tenant_list(value) if isinstance(value, str) else value


class LeaseqSettings(BaseModel):
    """Every setting of a leaseq function, read from the environment once, at cold start.

    Each section validates its own variables; a missing or bad one is a
    :class:`ConfigurationError` that names the variable, before any connection is made.

    >>> url = "postgresql://localhost/app"
    >>> LeaseqSettings.from_env({"DATABASE_URL": url, "LEASEQ_BATCH_SIZE": "20"}).worker.batch_size
    20
    >>> try:
    ...     LeaseqSettings.from_env({"DATABASE_URL": url, "LEASEQ_BATCH_SIZE": "500"})
    ... except ConfigurationError as exc:
    ...     print(exc.message)
    invalid leaseq settings: LEASEQ_BATCH_SIZE: Input should be less than or equal to 100
    """

    model_config = ConfigDict(frozen=True)

    database: DatabaseSettings
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    reaper: ReaperSettings = Field(default_factory=ReaperSettings)
    pool: PoolSettings = Field(default_factory=PoolSettings)
    enqueue: EnqueueSettings = Field(default_factory=EnqueueSettings)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LeaseqSettings:
        """The settings in ``environ`` (the process's environment when None); an empty
        variable counts as unset, a variable leaseq does not declare is ignored."""
        env: Mapping[str, Any] = os.environ if environ is None else environ
        try:
            worker = WorkerSettings.model_validate(_known(env, WorkerSettings))
            return cls(
                database=DatabaseSettings.model_validate(_known(env, DatabaseSettings)),
                worker=worker,
                reaper=ReaperSettings.model_validate(_known(env, ReaperSettings)),
                pool=PoolSettings.model_validate({**_known(env, PoolSettings),
                                                  "queue": worker.queue}),
                enqueue=EnqueueSettings.model_validate(_known(env, EnqueueSettings)),
            )
        except ValidationError as exc:
            raise ConfigurationError(
                f"invalid leaseq settings: {one_line(exc, 'settings')}") from exc


def _known(env: Mapping[str, Any], model: type[BaseModel]) -> dict[str, Any]:
    aliases = {f.alias for f in model.model_fields.values() if f.alias}
    return {key: value for key, value in env.items() if key in aliases and value != ""}


def variable(model: type[BaseModel], field: str) -> str:
    """The environment variable that sets ``field`` of the settings ``model`` (its alias):
    code that names a variable in a message, or writes an environment for the functions
    (the command line's local runs), takes the name from here, where it is declared once.

    >>> variable(WorkerSettings, "handlers_module")
    'LEASEQ_HANDLERS'
    """
    alias = model.model_fields[field].alias
    if alias is None:
        raise KeyError(f"{model.__name__}.{field} is read from no environment variable")
    return alias
