"""The local Lambda service serves several named queues' worker functions of the real
template: with SlowKinds the stack has two workers, each draining its own queue."""

from __future__ import annotations

import json
from typing import Any

from tests.conftest import Database
from tests.lambda_local.conftest import REPO, Start, client_for, payload
from tests.support.postgres import OWNER


def test_each_queues_worker_function_drains_its_own_queue_in_the_local_service(
    start_service: Start, db: Database,
) -> None:
    service = start_service(template=REPO / "template.yaml", schedules=False,
                            database_url=db.worker_dsn, owner_database_url=db.owner_dsn,
                            handlers="leaseq_lambda.demo_handlers",
                            parameter_overrides={"SlowKinds": "resize_image"},
                            env_vars={"Parameters": {"LEASEQ_MAX_WORKERS": "0"}})
    client = client_for(service.url)
    batch = json.loads((REPO / "events" / "enqueue_batch.json").read_text())
    for item in batch["jobs"]:
        if item["kind"] == "resize_image":
            item["queue"] = "slow"
    tick = (REPO / "events" / "worker_schedule.json").read_bytes()

    enqueued = payload(client.invoke(FunctionName="EnqueueFunction",
                                     Payload=json.dumps(batch).encode()))
    assert [r.get("queue") for r in enqueued["results"]] == ["default", "default", "slow"]
    slow: dict[str, Any] = payload(client.invoke(FunctionName="SlowWorkerFunction",
                                                 Payload=tick))
    main: dict[str, Any] = payload(client.invoke(FunctionName="WorkerFunction", Payload=tick))

    assert (slow["status"], slow["claimed"]) == ("ok", 1)
    assert (main["status"], main["claimed"]) == ("ok", 2)
    with db.connect(OWNER) as conn:
        rows = conn.execute("select kind, queue, state::text as state from app.jobs"
                            " order by kind").fetchall()
    assert {(r["kind"], r["queue"]) for r in rows} == {
        ("charge_card", "default"), ("send_welcome_email", "default"),
        ("resize_image", "slow")}
    assert {r["state"] for r in rows} <= {"succeeded", "retry_wait"}
    stats = service.service.stats()["functions"]
    assert stats["SlowWorkerFunction"]["cold_starts"] == 1
    assert service.environment_of("SlowWorkerFunction")["LEASEQ_QUEUE"] == "slow"
