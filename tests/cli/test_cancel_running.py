"""leaseq cancel JOB_ID on a running job: the request is recorded (who, when), shown by
jobs show and status, and the job ends cancelled at its worker's next outcome."""

from __future__ import annotations

import uuid

from psycopg.types.json import Jsonb

from tests.cli.conftest import Cli
from tests.sql.calls import claim_one, enqueue, event_types, events, job, new_tenant
from tests.support.postgres import Conn


def test_cancel_of_a_running_job_records_a_request_and_its_outcome_ends_it_cancelled(
    cli: Cli, worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    enqueue(worker, tenant, "export")
    lease = claim_one(worker, tenant)
    waiting = enqueue(worker, tenant, "later")

    result = cli("cancel", str(lease["id"]), str(waiting["id"]), "--actor", "ops:ada",
                 "--reason", "wrong report", "--json")

    assert result.code == 0, result.err
    document = result.json()
    assert [r["job_id"] for r in document["cancelled"]] == [str(waiting["id"])]
    (requested,) = document["cancel_requested"]
    assert (requested["job_id"], requested["cancel_requested_by"]) == (str(lease["id"]),
                                                                       "ops:ada")
    assert job(owner, lease["id"])["state"] == "running"
    event = events(owner, lease["id"])[-1]
    assert (event["event_type"], event["actor"], event["details"]["reason"]) == (
        "cancel_requested", "ops:ada", "wrong report")

    table = cli("cancel", str(lease["id"]))  # again: the first request stands
    assert table.code == 0, table.err
    assert "cancel requested for 1 running job" in table.out
    assert "requested by ops:ada" in table.out

    finished = worker.execute(
        "select state::text as state from app.finish_jobs(%s, %s, %s, %s, %s, %s, %s)",
        (lease["lease_owner"], [tenant], [lease["id"]], [lease["lease_token"]],
         ["succeeded"], [Jsonb({"ok": True})], [None])).fetchall()
    assert finished == [{"state": "cancelled"}]
    assert event_types(owner, lease["id"])[-2:] == ["cancel_requested", "cancelled"]


def test_jobs_show_and_status_say_a_running_job_has_a_cancel_request(
    cli: Cli, worker: Conn
) -> None:
    tenant = new_tenant()
    enqueue(worker, tenant, "export")
    lease = claim_one(worker, tenant)
    assert cli("cancel", str(lease["id"]), "--actor", "ops:ada").code == 0

    shown = cli("jobs", "show", str(lease["id"]))
    assert shown.code == 0, shown.err
    assert "cancel requested" in shown.out
    assert "by ops:ada at" in shown.out
    assert "cancel_requested" in shown.out  # the timeline's event
    document = cli("jobs", "show", str(lease["id"]), "--json").json()
    assert document["job"]["cancel_requested_by"] == "ops:ada"
    assert document["job"]["cancel_requested_at"] is not None

    status = cli("status", "--tenant", str(tenant), "--json").json()
    assert status["cancel_requested"] == 1
    (entry,) = status["tenants"]
    assert (entry["states"]["running"], entry["cancel_requested"]) == (1, 1)
    table = cli("status", "--tenant", str(tenant))
    assert "1 running with a cancel requested" in table.out


def test_cancel_of_an_unknown_running_id_exits_4_and_cancels_nothing(
    cli: Cli, worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    enqueue(worker, tenant, "export")
    lease = claim_one(worker, tenant)

    result = cli("cancel", str(lease["id"]), str(uuid.uuid4()))

    assert result.code == 4
    assert job(owner, lease["id"])["cancel_requested_at"] is None
