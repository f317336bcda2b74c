"""``leaseq demo``: the whole life of a queue in well under a minute.

Sixty jobs for four tenants are enqueued; one of them is claimed by a worker that then
"crashes" (it never finishes, its one-second lease expires); the real worker and reaper
handlers drain everything; a summary per tenant follows. Some jobs fail and are retried
(a flaky payment gateway), one is dead (an image whose payload does not fit its model),
and the crashed worker's job comes back through the reaper and runs again.
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from leaseq.base.jobs import EnqueueRequest
from leaseq.store.duties import OperatorClient, ProducerClient, WorkerClient

DEMO_HANDLERS = "leaseq_lambda.demo_handlers"

#: Stable tenant ids, so repeated demos add to the same four tenants.
_NAMESPACE = uuid.UUID("5f0c3f0e-3c55-4a8e-9d33-6c6561736571")
TENANTS: dict[str, uuid.UUID] = {
    name: uuid.uuid5(_NAMESPACE, name) for name in ("acme", "globex", "initech", "umbrella")
}
TENANT_NAMES = {tenant: name for name, tenant in TENANTS.items()}

#: The worker settings of the demo: short budgets so every step shows in seconds.
DEMO_WORKER_ENV = {
    "LEASEQ_JOB_TIMEOUT_SECONDS": "5",
    "LEASEQ_LEASE_MARGIN_SECONDS": "2",
    "LEASEQ_BATCH_SIZE": "10",
}

CRASHED_OWNER = "demo-worker-that-crashed"
CRASHED_LEASE = timedelta(seconds=1)


def demo_requests(run_id: str) -> list[EnqueueRequest]:
    """Fifteen jobs per tenant; exactly one of all of them is designed to die."""
    requests: list[EnqueueRequest] = []
    for name, tenant in TENANTS.items():
        jobs: list[tuple[str, dict[str, Any]]] = []
        jobs += [("send_welcome_email", {"to": f"user{i}@{name}.example", "name": f"User {i}"})
                 for i in range(6)]
        jobs += [("charge_card", {"order_id": f"{name}-{i}", "amount_cents": 1000 + i * 250,
                                  "fail_times": fail})
                 for i, fail in enumerate((0, 1, 2, 0, 1))]
        jobs += [("resize_image", {"url": f"https://img.{name}.example/{i}.png",
                                   "width": 320, "height": 240})
                 for i in range(3)]
        jobs += [("sync_crm", {"account": f"{name}-crm"})]
        if name == "globex":
            # The one designed to die: width is not a number, and no retry fixes that.
            jobs[-2] = ("resize_image", {"url": "https://img.globex.example/huge.png",
                                         "width": "huge", "height": 240})
        for n, (kind, payload) in enumerate(jobs):
            requests.append(EnqueueRequest(
                tenant_id=tenant, operation_key=f"demo-{run_id}-{name}-{n}", kind=kind,
                payload=payload, correlation_id=f"demo-{run_id}"))
    return requests


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


@dataclass
class TenantSummary:
    tenant: str
    tenant_id: uuid.UUID
    jobs: int = 0
    succeeded: int = 0
    retried: int = 0
    dead: int = 0
    unfinished: int = 0


@dataclass
class DemoSummary:
    run_id: str
    tenants: list[TenantSummary] = field(default_factory=list)
    dead: list[dict[str, Any]] = field(default_factory=list)
    recovered_job: uuid.UUID | None = None

    @property
    def unfinished(self) -> int:
        return sum(t.unfinished for t in self.tenants)


def enqueue_demo(client: ProducerClient, run_id: str) -> list[uuid.UUID]:
    """Enqueue the demo jobs; initech's first welcome email goes in first, on its own, so
    it is the oldest job of its tenant and the one the crashing worker claims."""
    requests = demo_requests(run_id)
    first = next(i for i, r in enumerate(requests) if r.tenant_id == TENANTS["initech"])
    results = client.enqueue_jobs([requests[first]])
    results += client.enqueue_jobs(requests[:first] + requests[first + 1:])
    return [r.job_id for r in results if r.job_id is not None]


def crash_a_worker(client: WorkerClient) -> uuid.UUID | None:
    """Claim one job as a worker that never reports back: its lease simply expires."""
    claimed = client.claim_jobs(TENANTS["initech"], CRASHED_OWNER, 1, CRASHED_LEASE)
    return claimed[0].id if claimed else None


def summarise(client: OperatorClient, run_id: str, job_ids: list[uuid.UUID],
              recovered: uuid.UUID | None) -> DemoSummary:
    summary = DemoSummary(run_id, recovered_job=recovered)
    by_tenant = {tenant: TenantSummary(name, tenant) for name, tenant in TENANTS.items()}
    for job_id in job_ids:
        job = client.get_job(job_id)
        if job is None:
            continue
        row = by_tenant[job["tenant_id"]]
        row.jobs += 1
        state = str(job["state"])
        if state == "succeeded":
            row.succeeded += 1
            if job["attempts"] > 1:
                row.retried += 1
        elif state == "dead":
            row.dead += 1
            summary.dead.append({
                "id": job["id"], "tenant": row.tenant, "kind": job["kind"],
                "attempts": job["attempts"], "error": job["last_error"]})
        else:
            row.unfinished += 1
    summary.tenants = list(by_tenant.values())
    return summary


# The fan-out demo (leaseq demo --fan-out) ---------------------------------------------------

#: The backlog of the fan-out demo: welcome emails of about 40 ms each, enough work that
#: one worker invocation would take several seconds, more invocations a fraction of that.
FANOUT_JOBS = 400
FANOUT_MAX_WORKERS = 4
#: A started worker stops after this long without work (LEASEQ_FANOUT_IDLE_SECONDS), so
#: the demo ends soon after the backlog does.
FANOUT_IDLE_SECONDS = 2.0


def fan_out_items(run_id: str, tenant: uuid.UUID, count: int) -> list[dict[str, Any]]:
    """The backlog as the enqueue function takes it (at most 1,000 jobs per call)."""
    return [{"tenant_id": str(tenant), "operation_key": f"fanout-{run_id}-{n}",
             "kind": "send_welcome_email",
             "payload": {"to": f"user{n}@fanout.example", "name": f"User {n}"},
             "correlation_id": f"fanout-{run_id}"} for n in range(count)]


@dataclass(frozen=True)
class FanOutSample:
    """One look at the drain: seconds since the enqueue, worker invocations holding a
    place in the pool (live) or on their way (reserved), jobs finished."""

    elapsed: float
    live: int
    reserved: int
    finished: int


@dataclass
class FanOutSummary:
    run_id: str
    tenant_id: uuid.UUID
    jobs: int
    max_workers: int
    succeeded: int = 0
    unfinished: int = 0
    seconds: float = 0.0
    samples: list[FanOutSample] = field(default_factory=list)
    #: Worker invocations by what started them (wake, fanout, scheduler...), and those
    #: the pool refused.
    invocations: dict[str, int] = field(default_factory=dict)
    refused: int = 0
    cold_starts: int = 0

    @property
    def peak_workers(self) -> int:
        return max((s.live for s in self.samples), default=0)

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "tenant_id": self.tenant_id, "jobs": self.jobs,
                "max_workers": self.max_workers, "succeeded": self.succeeded,
                "unfinished": self.unfinished, "seconds": round(self.seconds, 3),
                "peak_workers": self.peak_workers, "invocations": self.invocations,
                "refused": self.refused, "cold_starts": self.cold_starts,
                "samples": [s.__dict__ for s in self.samples]}


def tenant_counts(client: OperatorClient, tenant: uuid.UUID) -> dict[str, int]:
    """The tenant's jobs by state."""
    counts: dict[str, int] = {}
    for row in client.queue_status(tenant):
        counts[str(row["state"])] = counts.get(str(row["state"]), 0) + int(row["jobs"])
    return counts


def worker_summaries(lines: list[str], function: str = "WorkerFunction"
                     ) -> list[dict[str, Any]]:
    """The worker's end-of-invocation lines (drained, or refused by a full pool) among
    the local service's log lines."""
    found = []
    prefix = f"[{function}] "
    for line in lines:
        if not line.startswith(prefix + "{"):
            continue
        try:
            document = json.loads(line[len(prefix):])
        except ValueError:
            continue
        if document.get("message") in ("drain finished", "worker pool full: not draining"):
            found.append(document)
    return found
