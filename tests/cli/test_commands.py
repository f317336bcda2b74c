"""The operator commands against the session's real PostgreSQL, connected as the worker
role (a member of every runtime duty group), as an operator's
terminal with one login for every command would be."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from tests.cli.conftest import Cli
from tests.conftest import Database
from tests.sql.calls import claim_one, enqueue, event_types, events, job, new_tenant
from tests.support.postgres import Conn


def _dead(worker: Conn, tenant: uuid.UUID, key: str, kind: str = "email.send") -> uuid.UUID:
    enqueue(worker, tenant, key, kind=kind)
    lease = claim_one(worker, tenant)
    worker.execute("select app.discard_job(%s, %s, %s, %s, %s)",
                   (tenant, lease["id"], lease["lease_owner"], lease["lease_token"],
                    Jsonb({"code": "DISCARDED", "message": "template missing"})))
    return uuid.UUID(str(lease["id"]))


def _write_jobs(path: Path, items: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(item) + "\n" for item in items), encoding="utf-8")
    return path


# enqueue and status ---------------------------------------------------------------------


def test_enqueue_one_job_then_status_counts_it_for_its_tenant(cli: Cli, owner: Conn) -> None:
    tenant = new_tenant()
    result = cli("enqueue", "--tenant", str(tenant), "--kind", "send_welcome_email",
                 "--payload", '{"to": "ada@example.com"}', "--key", "welcome-ada", "--json")
    assert result.code == 0, result.err
    (created,) = result.json()["jobs"]
    assert created["status"] == "created"
    stored = job(owner, uuid.UUID(created["job_id"]))
    assert (stored["kind"], stored["operation_key"], stored["payload"]) == (
        "send_welcome_email", "welcome-ada", {"to": "ada@example.com"})

    status = cli("status", "--json")
    assert status.code == 0
    (entry,) = status.json()["tenants"]
    assert entry["tenant_id"] == str(tenant)
    assert entry["states"]["pending"] == 1
    assert entry["ready"] == 1
    assert entry["oldest_ready_age"] >= 0
    table = cli("status")
    assert str(tenant) in table.out
    assert "oldest ready" in table.out


def test_enqueue_with_a_priority_stores_it_and_refuses_one_outside_1_to_9(
    cli: Cli, owner: Conn
) -> None:
    tenant = new_tenant()
    result = cli("enqueue", "--tenant", str(tenant), "--kind", "k", "--priority", "8", "--json")
    assert result.code == 0, result.err
    (created,) = result.json()["jobs"]
    assert job(owner, uuid.UUID(created["job_id"]))["priority"] == 8
    for bad in ("0", "10", "high"):
        refused = cli("enqueue", "--tenant", str(tenant), "--kind", "k", "--priority", bad)
        assert refused.code == 2
        assert "--priority" in refused.err
    assert owner.execute("select count(*) as n from app.jobs").fetchone() == {"n": 1}


def test_enqueue_file_lines_carry_their_priority_and_a_bad_one_names_its_line(
    cli: Cli, tmp_path: Path, owner: Conn
) -> None:
    tenant = str(new_tenant())
    path = _write_jobs(tmp_path / "jobs.jsonl", [
        {"tenant_id": tenant, "operation_key": "a", "kind": "k", "payload": {}, "priority": 2},
        {"tenant_id": tenant, "operation_key": "b", "kind": "k", "payload": {}},
    ])
    assert cli("enqueue", "--file", str(path)).code == 0
    stored = owner.execute("select operation_key, priority from app.jobs order by 1").fetchall()
    assert [(r["operation_key"], r["priority"]) for r in stored] == [("a", 2), ("b", 5)]
    with_flag = cli("enqueue", "--file", str(path), "--priority", "9")
    assert with_flag.code == 2
    assert "each line may carry its priority" in with_flag.err
    bad = _write_jobs(tmp_path / "bad.jsonl", [
        {"tenant_id": tenant, "operation_key": "c", "kind": "k", "payload": {}, "priority": 12}])
    refused = cli("enqueue", "--file", str(bad))
    assert refused.code == 2
    assert f"{bad} line 1: priority: Input should be less than or equal to 9" in refused.err


def test_enqueue_from_a_json_lines_file_is_idempotent_when_loaded_again(
    cli: Cli, tmp_path: Path, owner: Conn
) -> None:
    tenant = new_tenant()
    path = _write_jobs(tmp_path / "jobs.jsonl", [
        {"operation_key": f"op-{i}", "kind": "charge_card", "payload": {"n": i}}
        for i in range(25)])
    first = cli("enqueue", "--file", str(path), "--tenant", str(tenant), "--json")
    assert first.code == 0, first.err
    assert first.json()["counts"] == {"created": 25, "existing": 0, "conflict": 0,
                                       "rejected": 0}
    again = cli("enqueue", "--file", str(path), "--tenant", str(tenant), "--json")
    assert again.json()["counts"] == {"created": 0, "existing": 25, "conflict": 0,
                                       "rejected": 0}
    count = owner.execute("select count(*) as n from app.jobs").fetchone()
    assert count == {"n": 25}


def test_enqueue_file_with_a_bad_line_names_the_line_and_enqueues_nothing(
    cli: Cli, tmp_path: Path, owner: Conn
) -> None:
    tenant = str(new_tenant())
    path = _write_jobs(tmp_path / "jobs.jsonl", [
        {"tenant_id": tenant, "operation_key": "ok-1", "kind": "k", "payload": {}},
        {"tenant_id": tenant, "operation_key": "bad", "kind": "k", "payload": [1, 2]},
    ])
    result = cli("enqueue", "--file", str(path))
    assert result.code == 2
    assert result.error_lines == [
        f"leaseq: error: {path} line 2: payload must be a JSON object, such as "
        '{"to": "ada@example.com"}']
    assert owner.execute("select count(*) as n from app.jobs").fetchone() == {"n": 0}


def test_enqueue_file_larger_than_one_call_goes_in_calls_the_database_takes(
    cli: Cli, tmp_path: Path, owner: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """70 payloads of 256 KiB are more than one enqueue call may carry (16 MiB): the
    file is sent as calls within both bounds, and every job is stored."""
    from leaseq.base.storable import json_size
    from leaseq.store.duties import ProducerClient

    calls: list[int] = []
    original = ProducerClient.enqueue_jobs

    def counted(self: ProducerClient, requests: Any) -> Any:
        calls.append(sum(json_size(r.payload) for r in requests))
        return original(self, requests)

    # The command enqueues through the producer's face.
    monkeypatch.setattr(ProducerClient, "enqueue_jobs", counted)
    path = _write_jobs(tmp_path / "big.jsonl", [
        {"operation_key": f"big-{i}", "kind": "import", "payload": {"d": "x" * (262_144 - 9)}}
        for i in range(70)])

    result = cli("enqueue", "--file", str(path), "--tenant", str(new_tenant()), "--json")

    assert result.code == 0, result.err
    assert result.json()["counts"]["created"] == 70
    assert calls == [16_777_216, 6 * 262_144]
    assert owner.execute("select count(*) as n from app.jobs").fetchone() == {"n": 70}


def test_enqueue_file_with_a_control_character_in_a_kind_names_the_line_and_the_code_point(
    cli: Cli, tmp_path: Path, owner: Conn
) -> None:
    tenant = str(new_tenant())
    path = _write_jobs(tmp_path / "jobs.jsonl", [
        {"tenant_id": tenant, "operation_key": "ok-1", "kind": "charge_card", "payload": {}},
        {"tenant_id": tenant, "operation_key": "bad", "kind": "charge\x1b[2Jcard",
         "payload": {}},
    ])
    result = cli("enqueue", "--file", str(path))
    assert result.code == 2
    assert result.error_lines == [
        f"leaseq: error: {path} line 2: kind: Value error, must not contain control, format "
        "(invisible or bidirectional) or line separator characters (found U+001B at "
        "character 7; remove it)"]
    assert "\x1b" not in result.err
    assert owner.execute("select count(*) as n from app.jobs").fetchone() == {"n": 0}


def test_enqueue_with_a_key_that_names_another_job_exits_5(cli: Cli) -> None:
    tenant = str(new_tenant())
    assert cli("enqueue", "--tenant", tenant, "--kind", "a", "--key", "k1").code == 0
    result = cli("enqueue", "--tenant", tenant, "--kind", "b", "--key", "k1")
    assert result.code == 5
    assert len(result.error_lines) == 1
    assert "already name a job with another kind or payload" in result.err


# jobs show ------------------------------------------------------------------------------


def test_jobs_show_prints_the_job_and_its_timeline(cli: Cli, worker: Conn) -> None:
    job_id = _dead(worker, new_tenant(), "a")
    shown = cli("jobs", "show", str(job_id))
    assert shown.code == 0, shown.err
    for text in ("state", "dead", "timeline", "created", "claimed", "template missing"):
        assert text in shown.out
    document = cli("jobs", "show", str(job_id), "--json").json()
    assert document["job"]["state"] == "dead"
    assert [e["event_type"] for e in document["events"]] == ["created", "claimed", "dead"]
    assert "lease_token" not in document["job"]


def test_jobs_show_and_status_say_why_a_pending_job_is_not_running(
    cli: Cli, worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    urgent = enqueue(worker, tenant, "urgent")["id"]
    owner.execute("update app.jobs set priority = 9 where id = %s", (urgent,))
    normal = enqueue(worker, tenant, "normal")["id"]
    later = enqueue(worker, tenant, "later")["id"]
    owner.execute("update app.jobs set available_at = clock_timestamp() + interval '1 hour'"
                  " where id = %s", (later,))

    shown = cli("jobs", "show", str(normal))
    assert shown.code == 0, shown.err
    assert "behind higher-priority work: 1 ahead in its tenant, 1 of higher priority" in (
        " ".join(shown.out.split()))
    document = cli("jobs", "show", str(normal), "--json").json()
    assert (document["wait"]["reason"], document["wait"]["jobs_ahead"],
            document["wait"]["priority"]) == ("behind_priority", 1, 5)
    assert "not yet due, until" in cli("jobs", "show", str(later)).out
    assert cli("jobs", "show", str(urgent), "--json").json()["wait"]["reason"] == "ready"

    status = cli("status", "--tenant", str(tenant), "--json").json()
    (entry,) = status["tenants"]
    assert {reason: w["jobs"] for reason, w in entry["waiting"].items()} == {
        "behind_priority": 1, "ready": 1, "scheduled": 1}
    table = " ".join(cli("status", "--tenant", str(tenant)).out.split())
    for words in ("waiting jobs", "behind higher-priority work", "ready, next in its tenant",
                  "not yet due"):
        assert words in table


def test_jobs_show_of_an_unknown_id_exits_4_with_one_line(cli: Cli) -> None:
    missing = uuid.uuid4()
    result = cli("jobs", "show", str(missing))
    assert result.code == 4
    assert result.error_lines == [
        f"leaseq: error: no job has id {missing}; find ids with leaseq dead list, or in the "
        "output of leaseq enqueue"]


# dead list / dead retry -----------------------------------------------------------------


def test_dead_list_shows_dead_jobs_with_their_reason(cli: Cli, worker: Conn) -> None:
    tenant = new_tenant()
    job_id = _dead(worker, tenant, "a")
    listed = cli("dead", "list", "--json").json()["jobs"]
    assert [(j["id"], j["reason"]) for j in listed] == [(str(job_id), "discarded")]
    assert "template missing" in cli("dead", "list").out
    assert cli("dead", "list", "--tenant", str(new_tenant()), "--json").json()["jobs"] == []


def test_dead_retry_redrives_one_job_with_an_audit_event_naming_the_actor(
    cli: Cli, worker: Conn, owner: Conn
) -> None:
    job_id = _dead(worker, new_tenant(), "a")
    result = cli("dead", "retry", str(job_id), "--reason", "template fixed",
                 "--actor", "ops:grace", "--json")
    assert result.code == 0, result.err
    assert [r["job_id"] for r in result.json()["redriven"]] == [str(job_id)]
    assert job(owner, job_id)["state"] == "pending"
    redriven = events(owner, job_id)[-1]
    assert (redriven["event_type"], redriven["actor"]) == ("redriven", "ops:grace")
    assert redriven["details"]["reason"] == "template fixed"


def test_dead_retry_by_filter_touches_only_matching_jobs(
    cli: Cli, worker: Conn, owner: Conn
) -> None:
    tenant_a, tenant_b = new_tenant(), new_tenant()
    a_charge = _dead(worker, tenant_a, "a1", kind="charge")
    a_email = _dead(worker, tenant_a, "a2", kind="email")
    b_charge = _dead(worker, tenant_b, "b1", kind="charge")
    result = cli("dead", "retry", "--tenant", str(tenant_a), "--kind", "charge", "--json")
    assert [r["job_id"] for r in result.json()["redriven"]] == [str(a_charge)]
    assert [job(owner, j)["state"] for j in (a_charge, a_email, b_charge)] == [
        "pending", "dead", "dead"]
    everything = cli("dead", "retry", "--all", "--json")
    assert {r["job_id"] for r in everything.json()["redriven"]} == {str(a_email), str(b_charge)}


def test_dead_retry_without_a_selection_refuses_to_guess(cli: Cli, worker: Conn) -> None:
    job_id = _dead(worker, new_tenant(), "a")
    result = cli("dead", "retry")
    assert result.code == 2
    assert result.error_lines == [
        "leaseq: error: say which dead jobs to retry: job ids, --tenant and/or --kind, or --all"]
    assert cli("dead", "list", "--json").json()["jobs"][0]["id"] == str(job_id)


def test_dead_retry_of_a_job_that_is_not_dead_exits_5_and_changes_nothing(
    cli: Cli, worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    pending = enqueue(worker, tenant, "p")
    result = cli("dead", "retry", str(pending["id"]))
    assert result.code == 5
    assert result.error_lines == [
        f"leaseq: error: job {pending['id']} is pending, so it was not redriven: only dead "
        "jobs can be redriven"]
    assert event_types(owner, pending["id"]) == ["created"]


# cancel ---------------------------------------------------------------------------------


def test_cancel_ends_a_tenants_pending_jobs_and_leaves_running_ones(
    cli: Cli, worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    enqueue(worker, tenant, "first")
    running = claim_one(worker, tenant)
    waiting = enqueue(worker, tenant, "second")
    result = cli("cancel", "--tenant", str(tenant), "--reason", "tenant offboarded", "--json")
    assert result.code == 0, result.err
    assert [r["job_id"] for r in result.json()["cancelled"]] == [str(waiting["id"])]
    assert job(owner, waiting["id"])["state"] == "cancelled"
    assert job(owner, running["id"])["state"] == "running"
    assert event_types(owner, waiting["id"]) == ["created", "cancelled"]

    finished = _dead(worker, tenant, "third")
    refused = cli("cancel", str(finished))
    assert refused.code == 5
    assert "only pending, retry_wait or running jobs can be cancelled" in refused.err
    assert event_types(owner, finished)[-1] == "dead"


# prune ----------------------------------------------------------------------------------


def test_prune_deletes_old_finished_jobs_and_their_events_in_batches(
    cli: Cli, worker: Conn, owner: Conn, admin: Conn
) -> None:
    tenant = new_tenant()
    old = [_dead(worker, tenant, f"old-{i}") for i in range(5)]
    recent = _dead(worker, tenant, "recent")
    pending = enqueue(worker, tenant, "pending")
    admin.execute("update app.jobs set completed_at = completed_at - interval '45 days'"
                  " where id = any(%s)", (old,))
    result = cli("prune", "--older-than", "30d", "--batch", "2", "--json")
    assert result.code == 0, result.err
    assert result.json() == {"jobs_deleted": 5, "events_deleted": 15, "batches": 3}
    left = {r["id"] for r in owner.execute("select id from app.jobs").fetchall()}
    assert left == {recent, pending["id"]}


def test_prune_with_an_unreadable_age_exits_2(cli: Cli) -> None:
    result = cli("prune", "--older-than", "a month")
    assert result.code == 2
    assert result.error_lines == [
        "leaseq: error: argument --older-than: 'a month' is not a duration; use a number with "
        "a unit, such as 90s, 15m, 12h or 30d (see: leaseq prune --help)"]


# migrate --------------------------------------------------------------------------------


def test_migrate_through_database_url_reports_the_schema_is_current(
    cli: Cli, db: Database
) -> None:
    result = cli("migrate", "--database-url", db.owner_dsn, "--json")
    assert result.code == 0, result.err
    document = result.json()
    assert document["applied"] == []
    assert document["version"] >= 6
