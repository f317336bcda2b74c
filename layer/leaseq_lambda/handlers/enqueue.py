"""Enqueue jobs for other Lambdas (direct invoke) and EventBridge rules.

Answers for every item: created, existing (the same job was enqueued before), or
rejected with the reason. Bad input is never an unstructured error; an unreachable
database or bad settings are, so that the caller retries and the Errors alarm fires.
An asynchronous invocation (EventBridge, or a batch marked ``"asynchronous": true``)
has nobody to answer: with rejected jobs it raises :class:`EnqueueRejectedError` after
enqueueing the others, so the rejections reach the on-failure destination.
With the worker pool on, a created job that is ready now wakes a worker after the
commit when none is polling (debounced in the database; best effort: a failed wake is
logged and counted, and the scheduled worker runs the job within one tick).

Which tenants: an invocation carries no caller identity this function could check, so
by default it is a trusted multi-tenant door (whoever may invoke it may enqueue for any
tenant). With ``LEASEQ_ENQUEUE_TENANTS`` (the stack's EnqueueTenants) its login is bound
to those tenants in the database, and a job for any other tenant is rejected, nothing
stored for it (docs/deploy.md, "Which tenants the enqueue function serves").

Which jobs: with ``LEASEQ_ENQUEUE_HANDLERS`` (the stack's EnqueueChecksJobs) the function
imports the workers' handlers module and rejects, item by item, a kind it does not
register or a payload its model refuses, before anything is stored; without it, any
kind and payload the queue accepts are stored, and the worker judges them.

Results: an event ``{"operation": "result", "tenant_id": ..., "job_id": ...}`` reads what
became of a job instead, waiting up to its ``wait_seconds`` within this invocation's time
(:mod:`leaseq_lambda.results`); the login's tenant binding decides what it may read.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from aws_lambda_powertools.utilities.typing import LambdaContext
from leaseq import LeaseqError, Registry
from leaseq.store.duties import ProducerClient

from leaseq_lambda import runtime, telemetry
from leaseq_lambda.enqueue import ready_now, ready_queues, rejection_error, response, submit
from leaseq_lambda.events import parse_enqueue
from leaseq_lambda.results import answer_result, is_result_query
from leaseq_lambda.scaling import wake_after_enqueue

logger = telemetry.make_logger()
metrics = telemetry.make_metrics()
tracer = telemetry.make_tracer()


def _client() -> ProducerClient:
    rt = runtime.get()
    rt.check()
    return rt.producer_client()


def _tenants() -> frozenset[UUID]:
    return runtime.get().settings.enqueue.tenants


def _registry() -> Registry | None:
    return runtime.get().enqueue_registry()


def _read_result(event: Any, context: LambdaContext) -> dict[str, Any]:
    answer = answer_result(event, _client,
                           lambda: context.get_remaining_time_in_millis() / 1000)
    fields: dict[str, Any] = {"waited_up_to": round(answer.waited_for, 3)}
    if answer.job is not None:
        fields.update(tenant_id=str(answer.job.tenant_id), job_id=str(answer.job.id),
                      kind=answer.job.kind, state=answer.job.state.value)
    refused = "rejected" in answer.document
    if refused:
        logger.warning("job result refused", extra={
            **fields, "reason": answer.document["rejected"]["reason"]})
    else:
        logger.info("job result read", extra={**fields, "found": answer.job is not None})
    telemetry.record_result_read(metrics, refused=refused)
    return answer.document


@metrics.log_metrics(capture_cold_start_metric=True)
@tracer.capture_lambda_handler(capture_response=False)  # up to 1000 items: too big to trace
@logger.inject_lambda_context(clear_state=True)
@telemetry.count_failures(metrics, logger)
def lambda_handler(event: Any, context: LambdaContext) -> dict[str, Any]:
    """Enqueue one job or a batch; answer every item, log each and count them (see the
    module docstring for what raises)."""
    if is_result_query(event):
        return _read_result(event, context)
    batch = parse_enqueue(event, context.aws_request_id)
    # The id items without their own correlation id get: on every line of the call.
    logger.set_correlation_id(
        str(event.get("id")) if batch.origin == "eventbridge" and isinstance(event, dict)
        and event.get("id") else context.aws_request_id)
    try:
        results = submit(_client, batch, _tenants, _registry)
    except LeaseqError as exc:
        logger.exception("enqueue failed", extra={"error": exc.message, "sqlstate": exc.sqlstate})
        raise
    for item in results:
        fields: dict[str, Any] = {"index": item.index, "status": item.status}
        if item.request is not None:
            fields.update(tenant_id=str(item.request.tenant_id), kind=item.request.kind,
                          correlation_id=item.request.correlation_id)
        if item.job_id is not None:
            fields["job_id"] = str(item.job_id)
        if item.reason is not None:
            logger.warning("job rejected", extra={**fields, "reason": item.reason})
        else:
            logger.info("job enqueued", extra=fields)
    answer = response(results)
    telemetry.record_enqueue(metrics, answer["created"], answer["existing"], answer["rejected"])
    if ready_now(results) and runtime.get().settings.pool.enabled:
        rt = runtime.get()
        started, failed = wake_after_enqueue(rt.producer_client(), rt.settings.pool,
                                             queues=ready_queues(results))
        telemetry.record_wake(metrics, started=started, failed=failed)
    counts = {f"jobs_{status}": answer[status] for status in ("created", "existing", "rejected")}
    logger.info("enqueue finished", extra={"origin": batch.origin, **counts})
    if batch.asynchronous and answer["rejected"]:
        error = rejection_error(results)
        logger.error("asynchronous enqueue failed: jobs rejected",
                     extra={"origin": batch.origin, "error": error.message, **counts})
        raise error
    return answer
