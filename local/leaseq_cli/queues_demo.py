"""The named-queues demo (``leaseq demo --queues``): three queues of one backlog, two of
them drained in parallel, each by its own worker (``leaseq drain --queue``, the worker
Lambda handler invoked in a process of its own, as each queue's worker function runs in
AWS), while the third stays paused: its jobs wait, untouched, until it is resumed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from leaseq.base.jobs import EnqueueRequest
from leaseq.store.client import QueueClient

#: The demo's queues: two drained at once, one paused all along.
DRAINED = ("demo-emails", "demo-images")
PAUSED = "demo-bulk"
KINDS = {"demo-emails": "send_welcome_email", "demo-images": "resize_image",
         PAUSED: "send_welcome_email"}
TENANT = uuid.UUID("3a1d2c4b-0000-4000-8000-0000000000d1")


def queue_requests(run_id: str, per_queue: int) -> list[EnqueueRequest]:
    """``per_queue`` jobs in each demo queue, named by the producer."""
    requests = []
    for queue, kind in KINDS.items():
        for n in range(per_queue):
            payload: dict[str, Any] = (
                {"url": f"https://img.example/{n}.png", "width": 64, "height": 64}
                if kind == "resize_image" else {"to": f"user{n}@{queue}.example"})
            requests.append(EnqueueRequest(tenant_id=TENANT, kind=kind, payload=payload,
                                           operation_key=f"{queue}-{run_id}-{n}",
                                           queue=queue))
    return requests


@dataclass(frozen=True)
class QueueSample:
    """One look at the three queues: seconds since the workers started, and per queue
    its ready and running jobs."""

    elapsed: float
    queues: dict[str, tuple[int, int]]


@dataclass
class QueuesDemoSummary:
    run_id: str
    per_queue: int
    seconds: float = 0.0
    finished: dict[str, int] = field(default_factory=dict)
    waiting: dict[str, int] = field(default_factory=dict)
    paused_by: str | None = None
    samples: list[QueueSample] = field(default_factory=list)
    workers_ok: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "per_queue": self.per_queue,
                "seconds": round(self.seconds, 3), "finished": self.finished,
                "waiting": self.waiting, "paused_queue": PAUSED, "paused_by": self.paused_by,
                "workers_ok": self.workers_ok,
                "samples": [{"elapsed": s.elapsed, "queues": s.queues} for s in self.samples]}


def _drain_command(queue: str) -> list[str]:
    return [sys.executable, "-c", "import sys; from leaseq_cli.main import main; "
            "sys.exit(main(sys.argv[1:]))", "drain", "--queue", queue, "--wait", "1",
            "--handlers", "leaseq_lambda.demo_handlers", "--json"]


def run(client: QueueClient, worker_dsn: str, *, per_queue: int, actor: str,
        on_sample: Callable[[QueueSample], None], timeout: float = 120.0) -> QueuesDemoSummary:
    """Enqueue the backlog, pause :data:`PAUSED`, drain the two other queues in parallel
    (one worker process each) while sampling every queue, and summarise."""
    run_id = uuid.uuid4().hex[:8]
    summary = QueuesDemoSummary(run_id, per_queue)
    state = client.pause_queue(PAUSED, actor, "the demo: paused while two queues drain")
    summary.paused_by = state.paused_by
    for start in range(0, per_queue * len(KINDS), 1000):
        client.enqueue_jobs(queue_requests(run_id, per_queue)[start:start + 1000])
    env = {**os.environ, "DATABASE_URL": worker_dsn, "LEASEQ_POLL_IDLE_SECONDS": "0"}
    began = time.monotonic()
    workers = [subprocess.Popen(_drain_command(queue), env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL) for queue in DRAINED]
    try:
        while any(w.poll() is None for w in workers) and time.monotonic() - began < timeout:
            summary.samples.append(_sample(client, began))
            on_sample(summary.samples[-1])
            time.sleep(0.5)
    finally:
        for w in workers:
            if w.poll() is None:
                w.terminate()
            w.wait(timeout=30)
    summary.workers_ok = all(w.returncode == 0 for w in workers)
    summary.seconds = time.monotonic() - began
    final = _sample(client, began)
    summary.samples.append(final)
    on_sample(final)
    # A queue without unfinished or dead jobs (and no row of its own) is absent from the
    # overview: nothing of it waits.
    views = {v.queue: v for v in client.queue_overview()}
    for name in KINDS:
        view = views.get(name)
        summary.waiting[name] = 0 if view is None else view.ready + view.scheduled + view.running
        summary.finished[name] = max(0, per_queue - summary.waiting[name])
    return summary


def _sample(client: QueueClient, began: float) -> QueueSample:
    views = {v.queue: v for v in client.queue_overview() if v.queue in KINDS}
    return QueueSample(round(time.monotonic() - began, 2),
                       {name: (views[name].ready, views[name].running) if name in views
                        else (0, 0) for name in KINDS})
