"""Lambda adapters of leaseq: the only package that imports Powertools or boto3.

* ``context``   LambdaDeadline (the invocation's remaining time) and the worker owner id;
* ``events``    pydantic models of the schedule ticks, pool starts and enqueue events;
* ``runtime``   cold-start composition: settings, connection, handlers registry;
* ``telemetry`` Powertools logger and EMF metrics, fed by the library's reports;
* ``enqueue``   the enqueue function's per-item results;
* ``invoker``   the Lambda client for invoking other functions (honours
  ``AWS_ENDPOINT_URL_LAMBDA``).
* ``scaling``   the worker pool: fan-out while a backlog lasts, the wake after an enqueue
  (:func:`wake_worker` for producers that enqueue in their own transaction);
* ``producer``  the producers' client: the enqueue function and the enqueue event bus
  (enqueue, read or wait for a job's result, throttles classified);
* ``results``   the enqueue function's result operation (a job's state, result, last error);
* ``dead_letters`` the enqueue dead-letter queue's records, and resubmitting them;
* ``handlers_config`` the handlers' settings from the stack (``handlers_environment``);
* ``demo_handlers`` the demo's job handlers, for a first deployed stack and ``leaseq demo``;
* ``handlers``  the worker, reaper and enqueue functions' handlers, built from these; each
  ``functions/<name>/app.py`` re-exports one, and ``leaseq drain`` and ``reap`` run them.

A producer that enqueues inside its own transaction wakes a worker after the commit::

    from leaseq import EnqueueRequest, enqueue_jobs
    from leaseq_lambda import wake_worker

    with conn.transaction():
        save_order(conn, order)
        enqueue_jobs(conn, [EnqueueRequest(tenant_id=tenant, kind="ship_order",
                                           operation_key=f"ship-{order.id}",
                                           payload={"order": order.id})])
    wake_worker(conn, "my-stack-worker")   # after the commit; cheap when a worker polls
"""

from leaseq_lambda.handlers_config import handlers_environment
from leaseq_lambda.scaling import WorkerStartError, wake_worker

__all__ = ["WorkerStartError", "handlers_environment", "wake_worker"]
