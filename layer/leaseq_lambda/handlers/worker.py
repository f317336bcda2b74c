"""Scheduled worker: drain the queue until the invocation's time runs short or the queue
has stayed empty for LEASEQ_POLL_IDLE_SECONDS.

Job handlers come from the module named in LEASEQ_HANDLERS (see leaseq_lambda.runtime).
With the worker pool on (LEASEQ_MAX_WORKERS above 0) an invocation first takes a place
in the pool and returns at once when the pool is full; while it drains it starts more
invocations of itself as long as the backlog lasts, and it frees its place when it ends
(leaseq_lambda.scaling); one that stopped at its deadline with jobs still ready starts
its successor.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext
from leaseq import DatabaseError, LeaseqError

from leaseq_lambda import runtime, scaling, telemetry
from leaseq_lambda.context import LambdaDeadline, owner_id
from leaseq_lambda.events import InvalidEventError, parse_tick

logger = telemetry.make_logger()
metrics = telemetry.make_metrics()
tracer = telemetry.make_tracer()


@metrics.log_metrics(capture_cold_start_metric=True)
@tracer.capture_lambda_handler
@logger.inject_lambda_context(clear_state=True)
@telemetry.count_failures(metrics, logger)
def lambda_handler(event: Any, context: LambdaContext) -> dict[str, Any]:
    """One drain per schedule tick; every job is logged and counted, the drain's report is
    logged, counted and traced. A database or settings failure raises, so the invocation
    fails and the Errors alarm fires; an event that is no tick is refused."""
    try:
        tick = parse_tick(event, "worker")
    except InvalidEventError as exc:
        logger.error("event rejected", extra={"reason": exc.message})
        telemetry.record_rejected_event(metrics)
        return {"task": "worker", "status": "rejected", "reason": exc.message}
    try:
        rt = runtime.get()
        rt.check()
        owner = owner_id(context, rt.settings.worker.worker_id)
        deadline = LambdaDeadline(context)
        pool = scaling.PoolMembership(rt.worker_client(), rt.settings.pool, owner)
        if not pool.join(tick, deadline):
            size = pool.size()
            why = pool.refusal()
            telemetry.record_pool(metrics, size, full=why == "pool_full")
            refused = {"task": "worker", "status": why, "owner": owner,
                       "queue": rt.settings.pool.queue,
                       "trigger": tick.origin, "pool_live": size.live if size else None}
            logger.info("queue paused: not draining" if why == "paused"
                        else "worker pool full: not draining", extra=refused)
            return refused
        try:
            kinds = telemetry.KindDimension(rt.registry().kinds, rt.settings.worker.metric_kinds)
            worker = rt.worker(owner, on_job=telemetry.JobTelemetry(logger, metrics, kinds),
                               deadline=deadline, poll_idle=pool.poll_idle,
                               on_claim=pool.fan_out)
            size = pool.size()
            report = worker.drain(deadline)
        finally:
            fan_out = pool.finish(deadline)
    except LeaseqError as exc:
        logger.exception("drain failed", extra={"error": exc.message, "sqlstate": exc.sqlstate})
        raise
    try:
        oldest: float | None = rt.oldest_ready_age()
    except DatabaseError as exc:
        oldest = None
        logger.warning("oldest ready job age unavailable", extra={"error": exc.message})
    # Stopped by its deadline with jobs still ready: a successor takes over at once,
    # instead of the backlog waiting for the next tick (the pool's members all stop
    # claiming at about the same time).
    handed_over = bool(report.stopped == "deadline" and oldest and pool.hand_over())
    telemetry.record_drain(metrics, report, oldest)
    telemetry.annotate(tracer, report.as_dict())
    summary = {"task": "worker", "status": "ok", "owner": owner, **report.as_dict(),
               "oldest_ready_age_seconds": oldest, "trigger": tick.origin}
    if fan_out is not None:
        telemetry.record_pool(metrics, size, full=False, fan_out=fan_out)
        summary.update(fan_out.as_dict(), pool_live=size.live if size else None,
                       handed_over=handed_over)
    logger.info("drain finished", extra=summary)
    return summary
