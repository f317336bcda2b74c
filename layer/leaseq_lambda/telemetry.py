"""Logs, metrics and traces of the functions: Powertools JSON logs, EMF metrics, X-Ray.

Every line a function writes to stdout or stderr is one JSON document: a log line, or
an EMF metric document. A failed invocation publishes ``InvocationFailed`` before it
re-raises, so Powertools never prints its plain-text "No application metrics to
publish" warning.

* **Job fields.** Every line written while a job's handler runs carries ``job_id``,
  ``tenant_id``, ``kind``, ``attempt`` and ``correlation_id``: the library marks the
  running job in a context variable and :class:`leaseq.JobLogFields`, attached to the
  Powertools handler, copies it onto each record, whichever logger wrote it. Why not
  Powertools' ``append_context_keys``: it changes keys shared by every thread of the
  logger, while a handler that overran its budget off the main thread is abandoned and
  may log later, when the next job's keys would be on; the context variable keeps each
  line with its own job. It also builds the fields only for lines actually written, and
  the core library, which sets the variable, must not import Powertools.
* **Correlation ids.** A job's ``correlation_id`` (given at enqueue, else the enqueue
  request's id) is on every log line of its runs and, as EMF metadata, on its per-job
  metric document. The enqueue function sets it for the whole invocation with
  Powertools' ``set_correlation_id``.
* **The library's loggers.** ``leaseq.*`` stdlib loggers write through the service's
  JSON handler. When the service is named ``leaseq`` they are its children already;
  otherwise a forwarding handler is attached to the ``leaseq`` logger. Why not
  Powertools' ``copy_config_to_registered_loggers``: it replaces the target logger's
  handlers and keeps no record of them, so in a process that builds loggers under more
  than one service name (the local CLI, the tests), the library's lines would go on
  being written under the first other name even after the service is ``leaseq`` again.
* **Metrics.** Names are a contract with the alarms and the dashboard. The invocation's
  document has the single dimension ``service``. Each job adds a document with the
  dimensions ``service`` and ``kind``, where ``kind`` is one of the first
  ``LEASEQ_METRIC_KINDS`` registered kinds by name, or ``other``: its cardinality is
  bounded by code, never by what was enqueued. Tenants never become dimensions (each
  would be a billed metric); they are log fields and metadata instead.
  With the worker pool on, the worker adds ``WorkerPoolSize`` (live places after it
  joined: the alarm's "at MaxWorkers" reading), ``PoolFull`` (1 when it was refused a
  place), ``WorkersStarted`` and ``WorkerStartsFailed`` (fan-out invokes); the enqueue
  function adds ``WorkersStarted`` and ``WorkerStartsFailed`` for its wake.
* **Traces.** Powertools Tracer, active only in Lambda with tracing on. Only botocore
  is patched: the X-Ray SDK's psycopg patch also wraps ``psycopg_pool``, which the
  layer does not ship, and fails half-way without it. Building a Tracer imports the
  X-Ray SDK, whose recorder makes a botocore client at import (about a third of a cold
  import of a function), even when tracing is off; so :class:`LazyTracer` builds it at
  once only when tracing is on, by the rules Powertools itself applies, and otherwise
  on the first use of anything beyond the handler decorator and annotations, which a
  disabled Tracer would ignore anyway.
"""

from __future__ import annotations

import functools
import io
import logging
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import IO, Any, TypeVar, cast, overload

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import EphemeralMetrics, MetricUnit
from aws_lambda_powertools.metrics.base import single_metric
from leaseq import (
    DrainReport,
    JobLogFields,
    JobRecord,
    JobState,
    LeaseqError,
    ReapReport,
    job_log_fields,
)
from leaseq.base.pool import PoolSize
from leaseq.base.queues import QueueOverview

from leaseq_lambda.scaling import FanOutReport

SERVICE = "leaseq"
NAMESPACE = "Leaseq"
LIBRARY_LOGGER = "leaseq"


class _CurrentStdout(io.TextIOBase):
    """Writes to whatever ``sys.stdout`` is at the time of writing.

    Powertools binds its stream when the logger is first built; a redirected or
    captured stdout (the local CLI, tests) would otherwise miss every later line.
    """

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        return sys.stdout.write(text)

    def flush(self) -> None:
        sys.stdout.flush()


def service_name() -> str:
    """The service every log line and metric is filed under: POWERTOOLS_SERVICE_NAME as
    the stack sets it, else ``leaseq``, so local runs and tests log as deployed."""
    return os.environ.get("POWERTOOLS_SERVICE_NAME") or SERVICE


class _Bridge(logging.Handler):
    """Forwards the library's records to the JSON handler of a differently named service."""

    def __init__(self, target: logging.Handler) -> None:
        super().__init__()
        self.target = target

    def emit(self, record: logging.LogRecord) -> None:
        self.target.handle(record)


def make_logger() -> Logger:
    """The function's Powertools logger, with the library's loggers writing through it.

    Safe to call again in one process under another service name (the local CLI and
    the tests do): a bridge made for an earlier name is replaced, never duplicated.
    """
    library = logging.getLogger(LIBRARY_LOGGER)
    stale = [h for h in library.handlers if isinstance(h, _Bridge)]
    for bridge in stale:
        library.removeHandler(bridge)
    if stale:
        library.propagate = True
    logger = Logger(service=service_name(), stream=cast(IO[str], _CurrentStdout()),
                    use_rfc3339=True)
    # Powertools configures a logger of a given name only once per process; the level
    # is set again so that a process building loggers several times (the local CLI,
    # tests) follows the environment of each build, as a fresh Lambda environment does.
    logger.setLevel(os.environ.get("AWS_LAMBDA_LOG_LEVEL")
                    or os.environ.get("POWERTOOLS_LOG_LEVEL") or "INFO")
    handler = logger.registered_handler
    if not any(isinstance(f, JobLogFields) for f in handler.filters):
        handler.addFilter(JobLogFields())
    if logger.name != LIBRARY_LOGGER and not library.handlers:
        library.addHandler(_Bridge(handler))
        library.setLevel(logger.log_level)
        library.propagate = False
    return logger


def make_metrics() -> Metrics:
    """The invocation's EMF metrics: namespace ``Leaseq`` and service ``leaseq`` by default."""
    return Metrics(namespace=namespace(), service=service_name())


def namespace() -> str:
    """The metrics namespace: POWERTOOLS_METRICS_NAMESPACE, else ``Leaseq``."""
    return os.environ.get("POWERTOOLS_METRICS_NAMESPACE") or NAMESPACE


Handler = TypeVar("Handler", bound=Callable[..., Any])

#: What the tracer patches (see the module's notes).
TRACED_MODULES = ("botocore",)


def tracing_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether Powertools' Tracer would trace here: in Lambda (``LAMBDA_TASK_ROOT``), not
    under ``sam local`` or Chalice's local mode, and not turned off by
    ``POWERTOOLS_TRACE_DISABLED``. The same rules as the Tracer's own check, read from
    the same variables (a test holds the two together)."""
    env = os.environ if environ is None else environ
    if _truthy(env.get("POWERTOOLS_TRACE_DISABLED", "false")):
        return False
    return bool(env.get("LAMBDA_TASK_ROOT")) and not (
        env.get("AWS_SAM_LOCAL") or env.get("AWS_CHALICE_CLI_MODE"))


def _truthy(value: str) -> bool:
    """Powertools' reading of a boolean variable (its ``strtobool``)."""
    return value.strip().lower() in {"1", "y", "yes", "t", "true", "on"}


class LazyTracer:
    """Powertools' :class:`~aws_lambda_powertools.Tracer` for a function, built only when
    it can trace.

    With tracing on it is built at once, as a module-level ``Tracer()`` would be, and
    every call goes to it. With tracing off nothing of the X-Ray SDK is imported: the
    handler decorator returns the handler itself and annotations are dropped, which is
    all a disabled Tracer does with them; any other attribute (``capture_method``,
    ``provider``, ``put_metadata`` ...) builds the (disabled) Tracer on first use and
    is answered by it.
    """

    def __init__(self, service: str, patch_modules: Sequence[str] = TRACED_MODULES) -> None:
        self.service = service
        self.patch_modules = list(patch_modules)
        self.enabled = tracing_enabled()
        self._tracer: Tracer | None = None
        if self.enabled:
            self._tracer = self.tracer

    @property
    def tracer(self) -> Tracer:
        """The Powertools Tracer, built on first use."""
        if self._tracer is None:
            self._tracer = Tracer(service=self.service, patch_modules=self.patch_modules)
        return self._tracer

    @overload
    def capture_lambda_handler(self, lambda_handler: Handler) -> Handler: ...

    @overload
    def capture_lambda_handler(
        self, lambda_handler: None = None, capture_response: bool | None = None,
        capture_error: bool | None = None,
    ) -> Callable[[Handler], Handler]: ...

    def capture_lambda_handler(
        self, lambda_handler: Handler | None = None, capture_response: bool | None = None,
        capture_error: bool | None = None,
    ) -> Handler | Callable[[Handler], Handler]:
        """Powertools' decorator with tracing on; the handler unchanged with it off."""
        if lambda_handler is None:
            return functools.partial(self.capture_lambda_handler,
                                     capture_response=capture_response,
                                     capture_error=capture_error)
        if not self.enabled:
            return lambda_handler
        return cast(Handler, self.tracer.capture_lambda_handler(
            lambda_handler, capture_response=capture_response, capture_error=capture_error))

    def put_annotation(self, key: str, value: str | float | bool) -> None:
        """An annotation on the current segment; nothing with tracing off."""
        if self.enabled:
            self.tracer.put_annotation(key=key, value=cast(Any, value))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.tracer, name)


def make_tracer() -> LazyTracer:
    """The function's X-Ray tracer (see the module's notes on what it patches and when
    the X-Ray SDK is imported)."""
    return LazyTracer(service_name())


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


#: The ``kind`` dimension of every job whose kind is not among the named ones.
OTHER_KIND = "other"


class KindDimension:
    """Maps a job's kind to its metric dimension value: bounded cardinality.

    The first ``limit`` registered kinds in name order keep their name; every other
    kind (registered later in that order, or unknown, as an enqueued typo is) is
    ``other``. Name order rather than "most frequent" keeps each kind's metrics the
    same from one invocation to the next.
    """

    def __init__(self, kinds: Iterable[str], limit: int) -> None:
        self.named = frozenset(sorted(kinds)[:limit])

    def __call__(self, kind: str) -> str:
        return kind if kind in self.named else OTHER_KIND


def _outcome_metric(record: JobRecord) -> str:
    if record.outcome == "given_back":
        return "JobsGivenBack" if record.state is not None else "LeasesLost"
    if record.lease_lost:
        return "LeasesLost"
    if record.state is JobState.SUCCEEDED:
        return "JobsSucceeded"
    if record.state is JobState.DEAD:
        return "JobsDead"
    return "JobsRetried"


class JobTelemetry:
    """The worker's per-job observer: one log line and one metric document per job.

    The document has the dimensions ``service`` and ``kind`` (see :class:`KindDimension`)
    and, as metadata, the job's id, tenant, attempt and correlation id, so a metric can
    be followed to the job's log lines. The invocation's own document keeps the totals
    with the ``service`` dimension only, which is what the alarms watch.
    """

    def __init__(self, logger: Logger, metrics: Metrics,
                 kinds: KindDimension | None = None) -> None:
        self.logger = logger
        self.metrics = metrics
        self.kinds = kinds or KindDimension((), 0)
        self._job_metrics = EphemeralMetrics(namespace=metrics.namespace,
                                             service=metrics.service)

    def __call__(self, record: JobRecord) -> None:
        fields: dict[str, Any] = {
            **job_log_fields(record.job),
            "outcome": record.outcome,
            "state": record.state.value if record.state is not None else None,
        }
        if record.error is not None:
            fields["error"] = record.error
        timed = not record.lease_lost and record.outcome != "given_back"
        if timed:
            fields["duration_ms"] = _ms(record.duration)
            fields["queue_lag_ms"] = _ms(record.queue_lag)
        try:
            self._log(record, fields)
        finally:
            self._job_metric(record, fields, timed)

    def _log(self, record: JobRecord, fields: dict[str, Any]) -> None:
        if record.lease_lost:
            self.logger.warning("job outcome not recorded: the lease was lost", extra=fields)
        elif record.outcome == "given_back":
            self.logger.info("job given back before it started", extra=fields)
        elif record.state is JobState.DEAD:
            self.logger.warning("job finished: dead", extra=fields)
        else:
            self.logger.info("job finished", extra=fields)
        if "duration_ms" in fields:
            self.metrics.add_metric(name="JobDuration", unit=MetricUnit.Milliseconds,
                                    value=fields["duration_ms"])
            self.metrics.add_metric(name="QueueLag", unit=MetricUnit.Milliseconds,
                                    value=fields["queue_lag_ms"])

    def _job_metric(self, record: JobRecord, fields: dict[str, Any], timed: bool) -> None:
        document = self._job_metrics
        document.add_dimension(name="kind", value=self.kinds(record.job.kind))
        document.add_metric(name=_outcome_metric(record), unit=MetricUnit.Count, value=1)
        if timed:
            document.add_metric(name="JobDuration", unit=MetricUnit.Milliseconds,
                                value=fields["duration_ms"])
            document.add_metric(name="QueueLag", unit=MetricUnit.Milliseconds,
                                value=fields["queue_lag_ms"])
        for key in ("job_id", "tenant_id", "attempt", "correlation_id"):
            if key in fields:
                document.add_metadata(key=key, value=fields[key])
        try:
            document.flush_metrics()
        finally:
            # With metrics disabled (POWERTOOLS_METRICS_DISABLED, POWERTOOLS_DEV) a flush
            # prints nothing and keeps the document, which would then grow with every
            # job of a long-lived worker and see each job's kind as a second dimension.
            document.clear_metrics()


def record_failure(metrics: Metrics, exc: BaseException) -> None:
    """Count a failed invocation: ``InvocationFailed`` in the invocation's document (the
    ``service`` dimension, with the error class as metadata) and in one of its own with
    the dimension ``error``, the exception's class name (bounded by code, not by data)."""
    error = type(exc).__name__
    metrics.add_metric(name="InvocationFailed", unit=MetricUnit.Count, value=1)
    metrics.add_metadata(key="error", value=error)
    with single_metric(name="InvocationFailed", unit=MetricUnit.Count, value=1,
                       namespace=metrics.namespace,
                       default_dimensions={"service": str(metrics.service), "error": error}):
        pass


def count_failures(metrics: Metrics, logger: Logger) -> Callable[[Handler], Handler]:
    """Decorate a handler (inside ``log_metrics`` and ``inject_lambda_context``) so that
    an exception is counted by :func:`record_failure` and then re-raised: Lambda's
    Errors metric and alarm still see the failure, and the invocation's metric document
    is never empty. A leaseq error was logged by the handler with what to do; any other
    exception (a bug) is logged here, with its traceback, as one JSON line."""

    def decorate(handler: Handler) -> Handler:
        @functools.wraps(handler)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return handler(*args, **kwargs)
            except Exception as exc:
                if not isinstance(exc, LeaseqError):
                    logger.exception("invocation failed: unexpected error",
                                     extra={"error_type": type(exc).__name__})
                record_failure(metrics, exc)
                raise

        return cast(Handler, wrapper)

    return decorate


def record_drain(metrics: Metrics, report: DrainReport, oldest_ready_age: float | None) -> None:
    """A worker invocation's counts as metrics (what the alarms and the dashboard read),
    and the age of the oldest ready job when it was measured: the queue's lag, which
    OldestReadyAgeAlarm watches."""
    for name, value in (("JobsClaimed", report.claimed), ("JobsSucceeded", report.succeeded),
                        ("JobsRetried", report.retried), ("JobsDead", report.dead),
                        ("LeasesLost", report.lost_leases), ("JobsGivenBack", report.given_back)):
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)
    if oldest_ready_age is not None:
        metrics.add_metric(name="OldestReadyAgeSeconds", unit=MetricUnit.Seconds,
                           value=round(oldest_ready_age, 3))


#: The dimension value of every queue past the first ``LEASEQ_METRIC_QUEUES`` by name.
OTHER_QUEUES = "other"


def queue_metrics(overviews: Sequence[QueueOverview], limit: int,
                  now: datetime) -> list[tuple[str, dict[str, float]]]:
    """Per queue, the values the reaper reports: ready, running, retrying and dead jobs,
    the oldest ready job's age (0 with none) and whether the queue is paused (1 or 0).
    The dimension is bounded: the first ``limit`` queues by name have a value of their
    own, the others are summed under :data:`OTHER_QUEUES` (their oldest age the
    greatest, paused when any is): a producer naming new queues never makes new metrics
    past the bound."""
    rows: dict[str, dict[str, float]] = {}
    for index, view in enumerate(sorted(overviews, key=lambda v: v.queue)):
        name = view.queue if index < limit else OTHER_QUEUES
        values = {"QueueReadyJobs": float(view.ready), "QueueRunningJobs": float(view.running),
                  "QueueRetryingJobs": float(view.retrying), "QueueDeadJobs": float(view.dead),
                  "QueueOldestReadyAgeSeconds": round(view.oldest_ready_age(now) or 0.0, 3),
                  "QueuePaused": 1.0 if view.paused else 0.0}
        if name in rows:
            merged = rows[name]
            for key, value in values.items():
                if key in ("QueueOldestReadyAgeSeconds", "QueuePaused"):
                    merged[key] = max(merged[key], value)
                else:
                    merged[key] += value
        else:
            rows[name] = values
    return list(rows.items())


def record_queues(metrics: Metrics, overviews: Sequence[QueueOverview], limit: int,
                  now: datetime | None = None) -> None:
    """Each queue's depth and lag as metrics with a ``queue`` dimension (one EMF
    document per queue, beside the invocation's own), for the per-queue alarms and
    dashboards (:func:`queue_metrics` bounds the dimension)."""
    moment = now or datetime.now(UTC)
    for name, values in queue_metrics(overviews, limit, moment):
        document = EphemeralMetrics(namespace=metrics.namespace, service=metrics.service)
        document.add_dimension(name="queue", value=name)
        for key, value in values.items():
            unit = MetricUnit.Seconds if key.endswith("Seconds") else MetricUnit.Count
            document.add_metric(name=key, unit=unit, value=value)
        try:
            document.flush_metrics()
        finally:
            document.clear_metrics()


def record_reap(metrics: Metrics, report: ReapReport) -> None:
    """A reaper pass's counts as metrics: leases released (crashed or killed workers),
    finished jobs pruned (the retention period at work), tenants' turns repaired (a
    defect or a hand edit; anything above 0 is worth a look), sessions ended past their
    caps (a client that lifted its own timeout, or a stuck one; worth a look too), and the
    schedules' slots enqueued and missed (enqueued later than the grace, or skipped: a
    missed tick, an outage, or a schedule resumed with missed slots)."""
    metrics.add_metric(name="JobsReleased", unit=MetricUnit.Count, value=report.released)
    metrics.add_metric(name="JobsPruned", unit=MetricUnit.Count, value=report.pruned_jobs)
    metrics.add_metric(name="TurnsRepaired", unit=MetricUnit.Count, value=report.turns_repaired)
    metrics.add_metric(name="StalledSessionsEnded", unit=MetricUnit.Count,
                       value=report.sessions_ended)
    # Every pass, 0 included: the missed-tick alarm treats no data as breaching.
    metrics.add_metric(name="ScheduleSlotsEnqueued", unit=MetricUnit.Count,
                       value=report.slots_enqueued)
    metrics.add_metric(name="ScheduleSlotsMissed", unit=MetricUnit.Count,
                       value=report.slots_missed)
    metrics.add_metric(name="JobsHeld", unit=MetricUnit.Count, value=report.jobs_held)
    record_limits(metrics, report)


def record_limits(metrics: Metrics, report: ReapReport) -> None:
    """Each limit the reaper read, with the dimension ``limit`` (its name as declared,
    ``kind:report/tenant:*``, never a tenant's instance of it unless an operator set a
    limit naming that tenant): ``LimitRunning``, ``LimitBlocked`` (jobs it holds back)
    and ``LimitOldestBlockedAge`` (seconds the oldest of them has waited); at most
    :data:`leaseq.reaper.LIMIT_METRICS` limits, those holding the most jobs first."""
    for state in report.limits:
        dimensions = {"service": str(metrics.service), "limit": state.name}
        for name, unit, value in (
                ("LimitRunning", MetricUnit.Count, float(state.running)),
                ("LimitBlocked", MetricUnit.Count, float(state.blocked)),
                ("LimitOldestBlockedAge", MetricUnit.Seconds, state.oldest_blocked_age)):
            with single_metric(name=name, unit=unit, value=value, namespace=metrics.namespace,
                               default_dimensions=dimensions):
                pass


def record_enqueue(metrics: Metrics, created: int, existing: int, rejected: int) -> None:
    """An enqueue invocation's items as metrics: new jobs, repeats of jobs enqueued before
    (idempotent retries of a producer), and items refused with a reason."""
    metrics.add_metric(name="JobsEnqueued", unit=MetricUnit.Count, value=created)
    metrics.add_metric(name="EnqueueExisting", unit=MetricUnit.Count, value=existing)
    metrics.add_metric(name="EnqueueRejected", unit=MetricUnit.Count, value=rejected)


def record_result_read(metrics: Metrics, *, refused: bool) -> None:
    """A producer's read of a job's result through the enqueue function: ``ResultReads``
    (found or not), ``ResultReadsRefused`` (a query that did not validate, or a tenant its
    login may not read)."""
    metrics.add_metric(name="ResultReads", unit=MetricUnit.Count, value=0 if refused else 1)
    metrics.add_metric(name="ResultReadsRefused", unit=MetricUnit.Count,
                       value=1 if refused else 0)


def record_pool(metrics: Metrics, size: PoolSize | None, *, full: bool,
                fan_out: FanOutReport | None = None) -> None:
    """A pooled worker invocation: the live places (``WorkerPoolSize``, when it could be
    read), whether it was refused a place (``PoolFull``), and what its fan-out started
    (``WorkersStarted``) or failed to start (``WorkerStartsFailed``)."""
    if size is not None:
        metrics.add_metric(name="WorkerPoolSize", unit=MetricUnit.Count, value=size.live)
    metrics.add_metric(name="PoolFull", unit=MetricUnit.Count, value=int(full))
    if fan_out is not None:
        metrics.add_metric(name="WorkersStarted", unit=MetricUnit.Count, value=fan_out.started)
        metrics.add_metric(name="WorkerStartsFailed", unit=MetricUnit.Count,
                           value=fan_out.failed)


def record_wake(metrics: Metrics, *, started: bool, failed: bool) -> None:
    """The enqueue function's wake: a worker started (``WorkersStarted``) or a start
    that failed (``WorkerStartsFailed``; the jobs are stored either way)."""
    metrics.add_metric(name="WorkersStarted", unit=MetricUnit.Count, value=int(started))
    metrics.add_metric(name="WorkerStartsFailed", unit=MetricUnit.Count, value=int(failed))


def record_rejected_event(metrics: Metrics) -> None:
    """A worker or reaper invoked with an event that is no schedule tick (a wiring fault)."""
    metrics.add_metric(name="EventsRejected", unit=MetricUnit.Count, value=1)


def annotate(tracer: LazyTracer | Tracer, summary: dict[str, Any]) -> None:
    """Put an invocation's counts on its trace as annotations, which X-Ray can search."""
    for key, value in summary.items():
        if isinstance(value, bool | int | float | str):
            tracer.put_annotation(key=key, value=cast(Any, value))
