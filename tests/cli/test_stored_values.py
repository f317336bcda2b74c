"""The read commands print any stored row: JSON Python cannot decode is shown as
undecodable, stored text that looks like markup is shown as it is. Filters that show
nothing are refused before anything is asked of the database."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from leaseq import QueueClient, Registry, Worker, WorkerConfig, connect

from tests.cli.conftest import Cli
from tests.conftest import Database
from tests.sql.calls import new_tenant
from tests.support.fakes import FakeDeadline
from tests.support.postgres import Conn


def _insert(owner: Conn, tenant: uuid.UUID, *, kind: str = "echo",
            payload: str = '{"n": 1e5000}', last_error: str | None = None) -> uuid.UUID:
    """As the schema owner, bypassing enqueue: a job with the given stored JSON."""
    row = owner.execute(
        "insert into app.jobs (tenant_id, operation_key, kind, payload, last_error)"
        " values (%s, %s, %s, %s::text::jsonb, %s::text::jsonb) returning id",
        (tenant, f"k-{uuid.uuid4()}", kind, payload, last_error)).fetchone()
    assert row is not None
    job_id: uuid.UUID = row["id"]
    # Written by hand, so the fair claim learns of the tenant as after a reaper pass.
    owner.execute("select * from app.repair_tenant_turns(10000)")
    return job_id


def test_jobs_show_and_status_read_a_job_whose_payload_python_cannot_decode(
        cli: Cli, owner: Conn) -> None:
    tenant = new_tenant()
    job_id = _insert(owner, tenant)

    shown = cli("jobs", "show", str(job_id))
    assert shown.code == 0, shown.err
    assert "undecodable JSON" in shown.out
    assert "4300 digits" in shown.out
    assert "0" * 200 not in shown.out.replace("\n", "")  # only its first characters
    document = cli("jobs", "show", str(job_id), "--json").json()
    payload = document["job"]["payload"]
    assert (payload["undecodable"], payload["length"]) == (True, len('{"n": }') + 5001)
    assert payload["prefix"].startswith('{"n": 1000')

    status = cli("status", "--json")
    assert status.code == 0, status.err
    assert status.json()["totals"]["pending"] == 1


def test_dead_list_shows_the_undecodable_payload_reason_after_a_drain(
        cli: Cli, db: Database, owner: Conn) -> None:
    _insert(owner, new_tenant())
    client = QueueClient(lambda: connect(db.worker_dsn))
    try:
        registry = Registry()
        registry.register("echo", lambda payload, ctx: None)
        report = Worker(client, registry, WorkerConfig(owner="cli-test", poll_idle=0)).drain(
            FakeDeadline(60))
    finally:
        client.close()
    assert report.dead == 1

    listed = cli("dead", "list")
    assert listed.code == 0, listed.err
    assert "UNDECODABLE_PAYLOAD" in listed.out
    (row,) = cli("dead", "list", "--json").json()["jobs"]
    assert row["last_error"]["code"] == "UNDECODABLE_PAYLOAD"


def test_dead_list_shows_an_undecodable_last_error_as_such(cli: Cli, owner: Conn) -> None:
    job_id = _insert(owner, new_tenant(), payload="{}",
                     last_error='{"code": "X", "n": 1e5000}')
    owner.execute("update app.jobs set state = 'dead', completed_at = now() where id = %s",
                  (job_id,))

    listed = cli("dead", "list")
    assert listed.code == 0, listed.err
    assert "undecodable JSON" in listed.out
    (row,) = cli("dead", "list", "--json").json()["jobs"]
    assert row["last_error"]["undecodable"] is True


def test_stored_text_that_looks_like_markup_is_printed_as_it_is(
        cli: Cli, owner: Conn) -> None:
    job_id = _insert(owner, new_tenant(), kind="[/x] report", payload='{"note": "[/b] [bold]"}')

    shown = cli("jobs", "show", str(job_id))

    assert shown.code == 0, shown.err
    assert "[/x] report" in shown.out
    assert '"[/b] [bold]"' in shown.out


@pytest.mark.parametrize("command", [("dead", "list"), ("dead", "retry"), ("cancel",)])
@pytest.mark.parametrize("kind", ["\t", "\u200b", " \ufeff\u2060 "])
def test_a_kind_filter_that_shows_nothing_is_refused_with_exit_2(
        cli: Cli, owner: Conn, command: tuple[str, ...], kind: str) -> None:
    result = cli(*command, "--kind", kind)
    assert result.code == 2
    (line,) = result.error_lines
    assert line.startswith("leaseq: error: --kind must not be blank")


def test_enqueue_with_a_kind_that_shows_nothing_exits_2_and_stores_nothing(
        cli: Cli, owner: Conn) -> None:
    result = cli("enqueue", "--tenant", str(new_tenant()), "--kind", "\u200b")
    assert result.code == 2
    assert "must not be blank" in result.err
    assert owner.execute("select count(*) as n from app.jobs").fetchone() == {"n": 0}


@pytest.mark.parametrize(("payload", "cause"), [
    ('{"n": 1' + "0" * 5000 + "}", "4300 digits"),
    ('{"n": ' * 5000 + "1" + "}" * 5000, "recursion"),
])
def test_an_enqueue_file_line_python_cannot_read_exits_2_naming_the_line(
        cli: Cli, owner: Conn, tmp_path: Path, payload: str, cause: str) -> None:
    good = json.dumps({"tenant_id": str(new_tenant()), "operation_key": "ok", "kind": "k"})
    bad = f'{{"tenant_id": "{new_tenant()}", "operation_key": "bad", "kind": "k", ' \
          f'"payload": {payload}}}'
    path = tmp_path / "jobs.jsonl"
    path.write_text(f"{good}\n{bad}\n", encoding="utf-8")

    result = cli("enqueue", "--file", str(path))

    assert result.code == 2
    (line,) = result.error_lines
    assert line.startswith(f"leaseq: error: {path} line 2 cannot be read (")
    assert cause in line
    assert owner.execute("select count(*) as n from app.jobs").fetchone() == {"n": 0}
