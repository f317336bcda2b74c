"""Scheduled reaper: release the expired leases of every tenant, check a page of tenants'
turns, then delete finished jobs past their retention (LEASEQ_RETENTION_DAYS), each in
bounded pages and within the invocation's time (see leaseq.upkeep.reaper)."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext
from leaseq import LeaseqError, reap_once

from leaseq_lambda import runtime, telemetry
from leaseq_lambda.context import LambdaDeadline
from leaseq_lambda.events import InvalidEventError, parse_tick

logger = telemetry.make_logger()
metrics = telemetry.make_metrics()
tracer = telemetry.make_tracer()


@metrics.log_metrics(capture_cold_start_metric=True)
@tracer.capture_lambda_handler
@logger.inject_lambda_context(clear_state=True)
@telemetry.count_failures(metrics, logger)
def lambda_handler(event: Any, context: LambdaContext) -> dict[str, Any]:
    """One reaper pass per schedule tick; its report is logged, counted and traced. A
    database or settings failure raises, so the invocation fails and the Errors alarm
    fires; an event that is no tick is refused without touching the database."""
    try:
        tick = parse_tick(event, "reaper")
    except InvalidEventError as exc:
        logger.error("event rejected", extra={"reason": exc.message})
        telemetry.record_rejected_event(metrics)
        return {"task": "reaper", "status": "rejected", "reason": exc.message}
    try:
        rt = runtime.get()
        rt.check()
        reaper = rt.settings.reaper
        report = reap_once(rt.reaper_client(), LambdaDeadline(context), limit=reaper.limit,
                           retention=reaper.retention)
    except LeaseqError as exc:
        logger.exception("reaper pass failed",
                         extra={"error": exc.message, "sqlstate": exc.sqlstate})
        raise
    telemetry.record_reap(metrics, report)
    try:
        overviews = rt.reaper_client().queue_overview()
    except LeaseqError as exc:
        overviews = []
        logger.warning("per-queue metrics unavailable", extra={"error": exc.message})
    telemetry.record_queues(metrics, overviews, rt.settings.reaper.metric_queues)
    telemetry.annotate(tracer, report.as_dict())
    summary = {"task": "reaper", "status": "ok", **report.as_dict(), "trigger": tick.origin}
    if report.released:  # leases ran out: some worker died or overran its invocation
        logger.warning("reaper pass finished", extra=summary)
    else:
        logger.info("reaper pass finished", extra=summary)
    return summary
