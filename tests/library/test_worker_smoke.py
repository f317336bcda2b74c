import uuid
from typing import Any

from leaseq import EnqueueRequest, QueueClient, Registry, Worker, WorkerConfig, connect
from tests.conftest import Database
from tests.support.fakes import FakeDeadline


def test_drain_runs_registered_handlers_and_reports(db: Database) -> None:
    client = QueueClient(lambda: connect(db.worker_dsn))
    registry = Registry()
    seen: list[Any] = []

    @registry.handler("echo")
    def echo(payload: dict[str, Any], ctx: Any) -> dict[str, Any]:
        seen.append(payload)
        return {"echo": payload}

    @registry.handler("boom")
    def boom(payload: dict[str, Any], ctx: Any) -> None:
        raise RuntimeError("nope")

    tenant = uuid.uuid4()
    reqs = [EnqueueRequest(tenant_id=tenant, operation_key=f"k{i}", kind="echo", payload={"i": i})
            for i in range(25)]
    reqs.append(EnqueueRequest(tenant_id=tenant, operation_key="b", kind="boom", payload={}))
    reqs.append(EnqueueRequest(tenant_id=tenant, operation_key="u", kind="nope", payload={}))
    results = client.enqueue_jobs(reqs)
    assert all(r.created for r in results)
    worker = Worker(client, registry, WorkerConfig(owner="w1"))
    report = worker.drain(FakeDeadline(60))
    assert report.succeeded == 25
    assert report.retried == 1
    assert report.dead == 1
    assert report.stopped == "queue_empty"
