"""Named queues the template declares, written at deploy time as the schema owner.

A kind routed to a queue (``app.route_kinds``) goes there whenever its producer names no
queue, and its jobs waiting in ``default`` move with it; a queue's own worker limit
(``app.set_queue_limits``) caps its pool instead of the owner's ``max_workers``. Both are
the owner's, like the pool's limits: no runtime login writes them. The template passes
them in the resource property ``Queues``, a list of maps ``{Name, Kinds, MaxWorkers}``
(``Kinds`` a comma-separated list, empty for none; ``MaxWorkers`` empty to keep the
owner's). That is how the former slow-kinds worker became the queue ``slow`` (its
``SlowKinds`` routed there, its settings kept). A request without the property comes
from a template that predates named queues: nothing is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from leaseq.base.errors import ConfigurationError
from leaseq.base.limits import queue_name_problem
from leaseq.store.client import register_queue_worker, route_kinds, set_queue_limits

#: The custom resource property: a list of queue declarations.
PROPERTY: Final = "Queues"


@dataclass(frozen=True)
class QueueDeclaration:
    """One queue of the template: its name, the kinds routed to it, its worker limit."""

    name: str
    kinds: tuple[str, ...]
    max_workers: int | None
    #: The stack's own worker of the queue (the slow worker), registered with no
    #: connections of its own (the stack's budget counts it): what an enqueue wakes.
    worker_function: str | None = None


def requested_queues(properties: Mapping[str, Any]) -> list[QueueDeclaration] | None:
    """The queues the request declares, checked before anything connects; None when it
    carries none."""
    declared = properties.get(PROPERTY)
    if declared is None:
        return None
    if not isinstance(declared, list):
        raise ConfigurationError(f"the resource property {PROPERTY} must be a list of maps "
                                 f"of Name, Kinds and MaxWorkers, not {declared!r}")
    queues = []
    for position, item in enumerate(declared, 1):
        if not isinstance(item, Mapping):
            raise ConfigurationError(f"{PROPERTY} item {position} must be a map, not {item!r}")
        name = str(item.get("Name", "")).strip()
        problem = queue_name_problem(name)
        if problem is not None:
            raise ConfigurationError(f"{PROPERTY} item {position}: Name {problem}")
        kinds = tuple(k.strip() for k in str(item.get("Kinds", "")).split(",") if k.strip())
        limit_text = str(item.get("MaxWorkers", "")).strip()
        limit = None
        if limit_text:
            if not limit_text.isdigit() or not 0 <= int(limit_text) <= 1000:
                raise ConfigurationError(f"{PROPERTY} item {position}: MaxWorkers must be a "
                                         f"whole number 0 .. 1000, not {limit_text!r}")
            limit = int(limit_text)
        worker = str(item.get("WorkerFunction", "")).strip() or None
        queues.append(QueueDeclaration(name, kinds, limit, worker))
    return queues


def write_queues(conn: Any, queues: list[QueueDeclaration], stack_id: str) -> str:
    """Route each queue's kinds, set its limit and register its worker, on the owner's
    connection; a summary for the log (how many waiting jobs moved)."""
    done = []
    for queue in queues:
        moved = route_kinds(conn, queue.name, queue.kinds) if queue.kinds else 0
        limit = (set_queue_limits(conn, queue.name, queue.max_workers)
                 if queue.max_workers is not None else "the owner's")
        if queue.worker_function is not None:
            register_queue_worker(conn, queue.name, queue.worker_function, 0, stack_id)
        done.append(f"{queue.name} ({len(queue.kinds)} kinds routed, {moved} waiting jobs "
                    f"moved, max workers {limit}"
                    + (f", worker {queue.worker_function})" if queue.worker_function else ")"))
    return "; ".join(done) or "none declared"
