"""leaseq queues list, pause and resume, the per-queue part of leaseq status, and the
--queue of enqueue and drain, as an operator types them."""

from __future__ import annotations

from tests.cli.conftest import Cli
from tests.support.postgres import Conn

TENANT = "7d2f3c1e-0000-4000-8000-00000000c001"


def enqueue(cli: Cli, key: str, queue: str | None = None) -> None:
    args = ["enqueue", "--tenant", TENANT, "--key", key, "--kind", "echo", "--json"]
    result = cli(*args, *(["--queue", queue] if queue else []))
    assert result.code == 0, result.err


def test_enqueue_with_a_queue_stores_it_and_a_bad_name_is_refused_before_sending(
        cli: Cli, owner: Conn) -> None:
    enqueue(cli, "r1", "reports")
    enqueue(cli, "d1")
    rows = owner.execute("select operation_key, queue from app.jobs").fetchall()
    assert {r["operation_key"]: r["queue"] for r in rows} == {"r1": "reports", "d1": "default"}
    refused = cli("enqueue", "--tenant", TENANT, "--kind", "echo", "--queue", "Reports")
    assert refused.code == 2
    assert "must be a queue name" in refused.err


def test_queues_pause_audits_the_actor_list_shows_it_and_resume_clears_it(cli: Cli) -> None:
    enqueue(cli, "r1", "reports")
    paused = cli("queues", "pause", "reports", "--reason", "incident 7", "--actor", "ada",
                 "--json")
    assert paused.code == 0, paused.err
    assert paused.json()["paused"] is True
    listed = {q["queue"]: q for q in cli("queues", "list", "--json").json()["queues"]}
    assert listed["reports"]["paused"] is True
    assert listed["reports"]["paused_by"] == "ada"
    assert listed["reports"]["ready"] == 1
    shown = " ".join(cli("queues", "list").out.split())
    assert "paused by ada (incident 7)" in shown
    resumed = cli("queues", "resume", "reports", "--actor", "bob", "--json")
    assert resumed.json()["paused"] is False
    history = cli("queues", "list", "reports", "--json").json()["history"]
    assert [(e["event_type"], e["actor"]) for e in history] == [("resumed", "bob"),
                                                                ("paused", "ada")]


def test_status_shows_each_queues_depth_and_which_are_paused(cli: Cli) -> None:
    enqueue(cli, "r1", "reports")
    enqueue(cli, "d1")
    cli("queues", "pause", "reports")
    status = cli("status", "--json").json()
    queues = {q["queue"]: q for q in status["queues"]}
    assert queues["reports"]["ready"] == 1
    assert queues["reports"]["paused"] is True
    assert queues["default"]["ready"] == 1
    table = " ".join(cli("status").out.split())
    assert "reports" in table
    assert "paused by leaseq-cli:" in table


def test_drain_with_a_queue_runs_that_queues_jobs_and_leaves_the_others(
        cli: Cli, owner: Conn) -> None:
    enqueue(cli, "r1", "reports")
    enqueue(cli, "d1")
    drained = cli("drain", "--queue", "reports", "--wait", "1",
                  "--json")
    assert drained.code == 0, drained.err
    states = {r["operation_key"]: r["state"] for r in owner.execute(
        "select operation_key, state::text from app.jobs").fetchall()}
    assert states["d1"] == "pending"
    assert states["r1"] != "pending"


def test_enqueue_with_handlers_puts_a_kind_in_its_declared_queue_unless_one_is_named(
        cli: Cli, owner: Conn) -> None:
    for key, queue in (("declared", None), ("named", "urgent")):
        args = ["enqueue", "--tenant", TENANT, "--key", key, "--kind", "report.build",
                "--handlers", "tests.cli.queue_handlers", "--json"]
        result = cli(*args, *(["--queue", queue] if queue else []))
        assert result.code == 0, result.err
    rows = owner.execute("select operation_key, queue from app.jobs").fetchall()
    assert {r["operation_key"]: r["queue"] for r in rows} == {"declared": "reports",
                                                              "named": "urgent"}
