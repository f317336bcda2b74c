"""The project's own functions (template.yaml) in the local service, on the test database."""

from __future__ import annotations

from typing import Any

from tests.conftest import Database
from tests.lambda_local.conftest import REPO, Start, client_for, payload
from tests.support.postgres import OWNER


def _states(db: Database) -> dict[str, int]:
    with db.connect(OWNER) as conn:
        rows = conn.execute("select state::text as state, count(*) as n from app.jobs "
                            "group by state").fetchall()
    return {row["state"]: int(row["n"]) for row in rows}


def test_the_real_enqueue_and_worker_functions_enqueue_and_drain_jobs_through_boto3(
    start_service: Start, db: Database,
) -> None:
    # The worker pool off, so that the tick below drains the jobs and no wake races it
    # (the pool on the real template: tests/cli/test_demo.py, leaseq demo --fan-out).
    service = start_service(template=REPO / "template.yaml", schedules=False,
                            database_url=db.worker_dsn, owner_database_url=db.owner_dsn,
                            handlers="leaseq_cli.demo_handlers",
                            env_vars={"Parameters": {"LEASEQ_MAX_WORKERS": "0"}})
    client = client_for(service.url)
    batch = (REPO / "events" / "enqueue_batch.json").read_bytes()
    tick = (REPO / "events" / "worker_schedule.json").read_bytes()

    enqueued = client.invoke(FunctionName="EnqueueFunction", Payload=batch)
    drained = client.invoke(FunctionName="WorkerFunction", Payload=tick)

    assert "FunctionError" not in enqueued, payload(enqueued)
    assert payload(enqueued)["created"] == 3
    report: dict[str, Any] = payload(drained)
    assert "FunctionError" not in drained, report
    assert (report["task"], report["status"], report["trigger"]) == ("worker", "ok", "scheduler")
    assert (report["claimed"], report["succeeded"]) == (3, 3)
    assert report["owner"].endswith(drained["ResponseMetadata"]["RequestId"])
    assert _states(db) == {"succeeded": 3}
    stats = service.service.stats()["functions"]
    assert stats["WorkerFunction"]["reserved_concurrency"] == 5
    assert stats["WorkerFunction"]["cold_starts"] == 1


def test_the_real_functions_get_the_local_database_instead_of_what_only_aws_has(
    start_service: Start,
) -> None:
    service = start_service(template=REPO / "template.yaml", schedules=False,
                            database_url="postgresql://worker@db/leaseq",
                            owner_database_url="postgresql://owner@db/leaseq")

    worker = service.environment_of("WorkerFunction")
    migrations = service.environment_of("MigrationsFunction")
    assert worker["DATABASE_URL"] == "postgresql://worker@db/leaseq"
    assert migrations["DATABASE_URL"] == "postgresql://owner@db/leaseq"
    for variables in (worker, migrations):
        assert not [k for k in variables if k.startswith("LEASEQ_DB_")]
        assert "LEASEQ_DATABASE_SECRET_ARN" not in variables
    assert worker["LEASEQ_BATCH_SIZE"] == "10"  # the template's own values stay
    assert any("DATABASE_URL (runtime role) instead of LEASEQ_DB_HOST" in note
               for note in service.notes["WorkerFunction"])
    reaper_env = service.environment_of("ReaperFunction")
    assert reaper_env["AWS_ENDPOINT_URL_LAMBDA"] == service.url
    assert reaper_env["AWS_LAMBDA_FUNCTION_NAME"] == "ReaperFunction"
    assert reaper_env["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"] == "256"
    assert reaper_env["LAMBDA_TASK_ROOT"] == str(REPO / "functions" / "reaper")
    assert str(REPO / "layer") in reaper_env["PYTHONPATH"].split(":")
    assert reaper_env["AWS_ACCESS_KEY_ID"] == "LOCALLAMBDAKEY"  # never the developer's
    assert all(isinstance(value, str) for value in reaper_env.values())
