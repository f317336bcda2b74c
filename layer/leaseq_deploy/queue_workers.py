"""A named queue's worker, registered in the schema by the queue's own deploy.

A queue declared as a nested application (``infra/queue.yaml``) creates its worker after
the leaseq stack, so neither the enqueue function's environment nor the leaseq stack's
connection budget knows it. Its ``Registration`` custom resource (type
``Custom::LeaseqQueueRegistration``, served by the leaseq stack's migrations function, the
one holder of the schema owner's connection) writes it into ``app.queue_workers``:

* an enqueue that wins the queue's wake ticket starts the registered function
  (``app.queue_worker_function``, ``leaseq_lambda.scaling.wake``);
* the registration is refused, naming the numbers, when the leaseq stack's own connections
  (as its last deploy checked them, ``app.connection_budget``), every other queue's and
  this queue's together exceed what the database allows (``connection_budget.budget``).
  The table is locked while it counts, so two queues deploying at once cannot both pass.

Delete removes the registration (only the one this stack made); the queue's jobs stay.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import psycopg
from leaseq.base.errors import ConfigurationError, LeaseqError
from leaseq.base.limits import queue_name_problem
from leaseq.store.client import queue_connections, register_queue_worker, unregister_queue_worker

from leaseq_deploy.connection_budget import Reservation, budget, read_server_limits

#: The custom resource type of a queue's registration (infra/queue.yaml).
RESOURCE_TYPE: Final = "Custom::LeaseqQueueRegistration"

Connection = psycopg.Connection[dict[str, Any]]


@dataclass(frozen=True)
class QueueWorker:
    """One queue's worker as its Registration resource declares it."""

    queue: str
    function_name: str
    reserved: int
    max_workers: int

    @property
    def connections(self) -> int:
        """Its reserved concurrency, or, unreserved, its pool plus the schedule's tick
        (the least it needs, as the leaseq stack's own worker is counted)."""
        return Reservation("ReservedConcurrency", self.reserved, self.max_workers + 1).counted


def _whole(properties: Mapping[str, Any], key: str, high: int) -> int:
    text = str(properties.get(key, "")).strip()
    if not text.isdigit() or int(text) > high:
        raise ConfigurationError(f"the resource property {key} must be a whole number from 0 "
                                 f"to {high}, not {properties.get(key)!r}")
    return int(text)


def requested_worker(properties: Mapping[str, Any]) -> QueueWorker:
    """The registration's properties, checked before anything connects."""
    queue = str(properties.get("QueueName", "")).strip()
    problem = queue_name_problem(queue)
    if problem is not None:
        raise ConfigurationError(f"the resource property QueueName {problem}")
    function = str(properties.get("WorkerFunction", "")).strip()
    if not function or len(function) > 170:
        raise ConfigurationError("the resource property WorkerFunction must name the queue's "
                                 f"worker function (its name or ARN), not {function!r}")
    worker = QueueWorker(queue, function, _whole(properties, "ReservedConcurrency", 10000),
                         _whole(properties, "MaxWorkers", 1000))
    if worker.reserved and worker.max_workers and worker.reserved < worker.max_workers + 1:
        raise ConfigurationError(
            f"queue {queue}: ReservedConcurrency {worker.reserved} is less than MaxWorkers "
            f"{worker.max_workers} + 1: the pool runs up to {worker.max_workers} invocations "
            f"and the schedule's tick needs one execution more; set ReservedConcurrency to "
            f"{worker.max_workers + 1} or more (0 leaves it unreserved), or lower MaxWorkers")
    return worker


def register(conn: Connection, worker: QueueWorker, stack_id: str) -> str:
    """Register ``worker`` for ``stack_id`` on the owner's connection, within the
    database's connection budget; a summary for the log and the resource's data."""
    state = queue_connections(conn, worker.queue)
    if state is None:
        raise ConfigurationError("the schema has no queue registry yet: deploy the leaseq "
                                 "stack of this release first, then the queue")
    share = budget(read_server_limits(conn), state["proxy_percent"])
    try:
        total = register_queue_worker(conn, worker.queue, worker.function_name,
                                      worker.connections, stack_id, share.limit)
    except LeaseqError as exc:
        if exc.sqlstate not in ("53400", "23505"):
            raise
        raise ConfigurationError(f"{exc.message}; {share.explanation}") from exc
    stack = ("" if state["stack_connections"] is not None else
             " (the leaseq stack has not recorded its own yet: deploy it first)")
    return (f"queue {worker.queue}: worker {worker.function_name} registered, "
            f"{worker.connections} connections; the deployment can open {total} of "
            f"{share.limit}{stack}")


def unregister(conn: Connection, queue: str, stack_id: str) -> str:
    """Remove the registration this stack made (its jobs stay); a summary."""
    removed = unregister_queue_worker(conn, queue, stack_id)
    return f"queue {queue}: worker " + ("unregistered" if removed else "was not registered")
