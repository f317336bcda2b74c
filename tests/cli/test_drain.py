"""``leaseq drain`` and ``leaseq reap`` invoke the real Lambda handlers in-process
(leaseq_lambda.handlers.worker and .reaper) against the session's PostgreSQL."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.cli.conftest import REPO, Cli
from tests.sql.calls import claim_one, enqueue, event_types, events, expire_lease, job
from tests.support.postgres import Conn


def _enqueue_file(cli: Cli, path: Path, lines: list[dict[str, object]]) -> list[str]:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    result = cli("enqueue", "--file", str(path), "--json")
    assert result.code == 0, result.err
    return [row["job_id"] for row in result.json()["jobs"]]


def test_drain_runs_the_worker_handler_until_every_job_is_finished(
    cli: Cli, tmp_path: Path, owner: Conn
) -> None:
    tenant = str(uuid.uuid4())
    lines: list[dict[str, object]] = [
        {"tenant_id": tenant, "operation_key": f"mail-{i}", "kind": "send_welcome_email",
         "payload": {"to": f"u{i}@example.com"}} for i in range(8)]
    lines.append({"tenant_id": tenant, "operation_key": "charge-1", "kind": "charge_card",
                  "payload": {"order_id": "o-1", "amount_cents": 500, "fail_times": 1}})
    ids = _enqueue_file(cli, tmp_path / "jobs.jsonl", lines)

    result = cli("drain", "--budget", "20", "--job-timeout", "5", "--json")
    assert result.code == 0, result.err
    totals = result.json()
    assert totals["stopped"] == "queue_empty"
    assert (totals["succeeded"], totals["retried"], totals["dead"]) == (9, 1, 0)
    assert totals["invocations"] >= 2  # the retry became due after the first one ended
    assert totals["left"] == {}
    for job_id in ids:
        assert job(owner, uuid.UUID(job_id))["state"] == "succeeded"
    charged = events(owner, uuid.UUID(ids[-1]))
    assert [e["event_type"] for e in charged] == [
        "created", "claimed", "retry_scheduled", "claimed", "succeeded"]
    # The owner is the Lambda handler's: function name and the invocation's request id.
    assert charged[1]["actor"].startswith("leaseq-worker:local-")
    assert charged[1]["actor"] != charged[3]["actor"]


def test_drain_stops_at_the_invocation_limit_and_says_what_is_left(
    cli: Cli, tmp_path: Path
) -> None:
    tenant = str(uuid.uuid4())
    _enqueue_file(cli, tmp_path / "jobs.jsonl", [
        {"tenant_id": tenant, "operation_key": "charge", "kind": "charge_card",
         "payload": {"order_id": "o-2", "amount_cents": 700, "fail_times": 3}}])
    result = cli("drain", "--budget", "20", "--job-timeout", "5", "--invocations", "1")
    assert result.code == 0, result.err
    assert "stopped after 1 invocations; left: 1 retry_wait" in result.out


def test_drain_does_not_wait_for_jobs_due_later_than_wait(cli: Cli, tmp_path: Path) -> None:
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    _enqueue_file(cli, tmp_path / "jobs.jsonl", [
        {"tenant_id": str(uuid.uuid4()), "operation_key": "later", "kind": "sync_crm",
         "payload": {"account": "a"}, "available_at": later}])
    result = cli("drain", "--budget", "20", "--job-timeout", "5", "--json")
    assert result.code == 0, result.err
    totals = result.json()
    assert totals["stopped"] == "scheduled_later"
    assert totals["claimed"] == 0
    assert totals["left"] == {"pending": 1}
    assert 3500 < totals["next_due_in"] <= 3600


def test_drain_with_a_budget_too_short_to_start_a_job_exits_2(cli: Cli, worker: Conn) -> None:
    enqueue(worker, uuid.uuid4(), "a", kind="send_welcome_email", payload={"to": "a@b.example"})
    result = cli("drain", "--budget", "5")
    assert result.code == 2
    assert result.error_lines == [
        "leaseq: error: a 5 s invocation is too short to start a job: the worker needs the job "
        "timeout plus the lease margin plus 1 s (30 + 5 + 1 = 36 s); raise --budget or lower "
        "--job-timeout"]


def test_drain_with_a_kind_filter_runs_only_its_kinds_and_says_what_it_left(
    cli: Cli, tmp_path: Path, owner: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenant = str(uuid.uuid4())
    mail = [{"tenant_id": tenant, "operation_key": f"mail-{i}", "kind": "send_welcome_email",
             "payload": {"to": f"u{i}@example.com"}} for i in range(3)]
    charge = [{"tenant_id": tenant, "operation_key": f"charge-{i}", "kind": "charge_card",
               "payload": {"order_id": f"o-{i}", "amount_cents": 100}} for i in range(2)]
    _enqueue_file(cli, tmp_path / "jobs.jsonl", [*mail, *charge])
    monkeypatch.setenv("LEASEQ_KINDS", "charge_card")  # replaced by the option below

    slow = cli("drain", "--budget", "20", "--job-timeout", "5", "--wait", "1",
               "--exclude-kind", "charge_card", "--json")
    assert slow.code == 0, slow.err
    assert (slow.json()["succeeded"], slow.json()["stopped"]) == (3, "queue_empty")
    assert slow.json()["left_to_others"] == 2
    text = cli("drain", "--budget", "20", "--job-timeout", "5", "--wait", "1",
               "--exclude-kind", "charge_card")
    assert "no job of the kinds this drain claims is pending" in text.out
    assert "2 of the kinds this drain leaves wait for their own worker" in text.out
    done = cli("drain", "--budget", "20", "--job-timeout", "5", "--kind", "charge_card",
               "--kind", "resize_image", "--json")
    assert done.code == 0, done.err
    assert (done.json()["succeeded"], done.json()["left_to_others"]) == (2, 0)
    rows = owner.execute("select state::text, count(*) as n from app.jobs group by 1").fetchall()
    assert rows == [{"state": "succeeded", "n": 5}]


def test_drain_refuses_both_a_kind_and_a_kind_to_leave(cli: Cli) -> None:
    result = cli("drain", "--kind", "a", "--exclude-kind", "b")
    assert result.code == 2
    assert "not allowed with argument --kind" in result.err


def test_drain_runs_the_example_handlers_named_by_handlers(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, owner: Conn
) -> None:
    monkeypatch.chdir(REPO)
    enqueued = cli("enqueue", "--file", "examples/jobs.jsonl", "--json")
    assert enqueued.code == 0, enqueued.err
    result = cli("drain", "--handlers", "examples.handlers", "--json")
    assert result.code == 0, result.err
    totals = result.json()
    assert (totals["succeeded"], totals["dead"]) == (4, 1)
    (dead,) = owner.execute("select kind, last_error from app.jobs where state = 'dead'"
                            ).fetchall()
    assert dead["kind"] == "webhook.deliver"
    assert dead["last_error"]["code"] == "DISCARDED"


def test_reap_runs_the_reaper_handler_and_releases_expired_leases(
    cli: Cli, worker: Conn, admin: Conn, owner: Conn
) -> None:
    tenant = uuid.uuid4()
    enqueue(worker, tenant, "a")
    lease = claim_one(worker, tenant)
    expire_lease(admin, lease["id"])
    result = cli("reap", "--json")
    assert result.code == 0, result.err
    assert result.json()["released"] == 1
    assert job(owner, lease["id"])["state"] == "retry_wait"
    assert event_types(owner, lease["id"]) == ["created", "claimed", "lease_expired"]
    assert cli("reap").out.strip() == "released 0 expired leases"


def test_drain_keeps_the_handlers_json_logs_out_of_its_own_output(
    cli: Cli, worker: Conn, tmp_path: Path
) -> None:
    enqueue(worker, uuid.uuid4(), "a", kind="send_welcome_email", payload={"to": "a@b.example"})
    result = cli("drain", "--budget", "20", "--job-timeout", "5", "--json")
    assert result.code == 0, result.err
    assert result.json()["succeeded"] == 1  # stdout is exactly one JSON document
    logged = [json.loads(line) for line in
              (tmp_path / "home" / "lambda.log").read_text(encoding="utf-8").splitlines()
              if line.startswith("{") and '"message"' in line]
    finished = [entry for entry in logged if entry["message"] == "job finished"]
    assert finished[0]["kind"] == "send_welcome_email"
    assert any(entry["message"] == "drain finished" for entry in logged)

    verbose = cli("drain", "--budget", "20", "--job-timeout", "5", "--verbose")
    assert verbose.code == 0
    assert '"message":"drain finished"' in verbose.err

