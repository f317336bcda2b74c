"""Logs and metrics of the functions: Powertools JSON logs and EMF metrics on stdout.

* Every line written while a job's handler runs carries ``job_id``, ``tenant_id``,
  ``kind``, ``attempt`` and ``correlation_id``: the library marks the running job in a
  context variable and :class:`leaseq.JobLogFields`, attached to the Powertools handler,
  copies it onto each record, whichever logger wrote it.
* The library's own ``leaseq.*`` stdlib loggers write through the same JSON handler.
  When the service is named ``leaseq`` they are its children already; otherwise the
  handler is attached to the ``leaseq`` logger too.
* Metric names are a contract with the alarms; the only dimension is ``service``.
  Tenants never become dimensions (each one would be a billed metric); they are log
  fields instead.
"""

from __future__ import annotations

import io
import logging
import os
import sys
from typing import IO, Any, cast

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from leaseq import (
    DrainReport,
    JobLogFields,
    JobRecord,
    JobState,
    ReapReport,
    job_log_fields,
)

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
    return Metrics(namespace=os.environ.get("POWERTOOLS_METRICS_NAMESPACE") or NAMESPACE,
                   service=service_name())


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


class JobTelemetry:
    """The worker's per-job observer: one log line and the timing metrics per job."""

    def __init__(self, logger: Logger, metrics: Metrics) -> None:
        self.logger = logger
        self.metrics = metrics

    def __call__(self, record: JobRecord) -> None:
        fields: dict[str, Any] = {
            **job_log_fields(record.job),
            "outcome": record.outcome,
            "state": record.state.value if record.state is not None else None,
        }
        if record.error is not None:
            fields["error"] = record.error
        if record.lease_lost:
            self.logger.warning("job outcome not recorded: the lease was lost", extra=fields)
            return
        if record.outcome == "given_back":
            self.logger.info("job given back before it started", extra=fields)
            return
        fields["duration_ms"] = _ms(record.duration)
        fields["queue_lag_ms"] = _ms(record.queue_lag)
        if record.state is JobState.DEAD:
            self.logger.warning("job finished: dead", extra=fields)
        else:
            self.logger.info("job finished", extra=fields)
        self.metrics.add_metric(name="JobDuration", unit=MetricUnit.Milliseconds,
                                value=fields["duration_ms"])
        self.metrics.add_metric(name="QueueLag", unit=MetricUnit.Milliseconds,
                                value=fields["queue_lag_ms"])


def record_drain(metrics: Metrics, report: DrainReport, oldest_ready_age: float | None) -> None:
    for name, value in (("JobsClaimed", report.claimed), ("JobsSucceeded", report.succeeded),
                        ("JobsRetried", report.retried), ("JobsDead", report.dead),
                        ("LeasesLost", report.lost_leases), ("JobsGivenBack", report.given_back)):
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)
    if oldest_ready_age is not None:
        metrics.add_metric(name="OldestReadyAgeSeconds", unit=MetricUnit.Seconds,
                           value=round(oldest_ready_age, 3))


def record_reap(metrics: Metrics, report: ReapReport) -> None:
    metrics.add_metric(name="JobsReleased", unit=MetricUnit.Count, value=report.released)
    metrics.add_metric(name="JobsPruned", unit=MetricUnit.Count, value=report.pruned_jobs)


def record_enqueue(metrics: Metrics, created: int, existing: int, rejected: int) -> None:
    metrics.add_metric(name="JobsEnqueued", unit=MetricUnit.Count, value=created)
    metrics.add_metric(name="EnqueueExisting", unit=MetricUnit.Count, value=existing)
    metrics.add_metric(name="EnqueueRejected", unit=MetricUnit.Count, value=rejected)


def record_rejected_event(metrics: Metrics) -> None:
    """A worker or reaper invoked with an event that is no schedule tick (a wiring fault)."""
    metrics.add_metric(name="EventsRejected", unit=MetricUnit.Count, value=1)
