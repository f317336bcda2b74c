"""``leaseq schedules``: add, list, pause, resume, remove and sync, as an operator runs
them, with the one-line errors and exit codes of every command."""

from __future__ import annotations

import uuid

import pytest

from tests.cli.conftest import Cli
from tests.support.postgres import Conn

SHARED = "00000000-0000-0000-0000-000000000000"


def test_add_then_list_shows_the_next_slots_the_last_slot_and_its_job(
        cli: Cli, owner: Conn) -> None:
    tenant = str(uuid.uuid4())
    added = cli("schedules", "add", "nightly", "30 2 * * *", "--kind", "report",
                "--tz", "Europe/Berlin", "--payload", '{"report": "sales"}', "--fill", "2",
                "--tenant", tenant, "--json")
    assert added.code == 0, added.err
    assert added.json()["status"] == "created"
    listed = cli("schedules", "list", "--json")
    [row] = listed.json()["schedules"]
    assert (row["name"], row["kind"], row["time_zone"], row["fill_limit"], row["tenant_id"]) == (
        "nightly", "report", "Europe/Berlin", 2, tenant)
    assert len(row["next_slots"]) == 3
    assert row["last_slot"] is None

    owner.execute("update app.schedules set expression = '* * * * *',"
                  " next_slot = date_trunc('minute', now())")
    assert cli("reap", "--json").code == 0
    [row] = cli("schedules", "list", "--tenant", tenant, "--json").json()["schedules"]
    assert row["last_job_id"] is not None
    assert row["last_job_state"] == "pending"
    text = cli("schedules", "list", "--no-color")
    assert text.code == 0
    assert "nightly" in text.out
    assert row["last_job_id"][:8] in text.out


def test_pause_resume_and_remove_a_shared_schedule(cli: Cli) -> None:
    assert cli("schedules", "add", "cleanup", "@every 10m", "--kind", "cleanup").code == 0
    paused = cli("schedules", "pause", "cleanup", "--json")
    assert paused.code == 0, paused.err
    assert paused.json()["paused"] is True
    [row] = cli("schedules", "list", "--json").json()["schedules"]
    assert (row["tenant_id"], row["paused"], row["next_slots"]) == (SHARED, True, [])
    assert "paused" in cli("schedules", "list").out
    resumed = cli("schedules", "resume", "cleanup", "--json")
    assert resumed.json()["paused"] is False
    assert cli("schedules", "remove", "cleanup").code == 0
    gone = cli("schedules", "remove", "cleanup")
    assert gone.code == 4
    assert gone.error_lines == [
        f"leaseq: error: no schedule named 'cleanup' in tenant {SHARED}; nothing was removed"]
    assert cli("schedules", "pause", "cleanup").code == 4


@pytest.mark.parametrize(("expression", "extra", "message"), [
    ("@every 30s", (), "finer than a minute are not supported"),
    ("0 0 30 2 *", (), "can never fire"),
    ("61 * * * *", (), "minute field '61' is out of range"),
    ("0 3 * * *", ("--tz", "Europe/Berln"), "'Europe/Berln' is not an IANA time zone name"),
    ("0 3 * * *", ("--fill", "5000"), "fill_limit"),
])
def test_a_bad_schedule_is_refused_in_one_line_and_nothing_is_stored(
        cli: Cli, owner: Conn, expression: str, extra: tuple[str, ...], message: str) -> None:
    result = cli("schedules", "add", "bad", expression, "--kind", "report", *extra)
    assert result.code == 2
    [line] = result.error_lines
    assert message in line
    assert owner.execute("select count(*) as n from app.schedules").fetchone() == {"n": 0}


def test_sync_writes_a_handlers_modules_schedules(cli: Cli) -> None:
    synced = cli("schedules", "sync", "--handlers", "tests.cli.periodic_handlers", "--json")
    assert synced.code == 0, synced.err
    assert [(r["name"], r["status"]) for r in synced.json()["schedules"]] == [
        ("cleanup", "created")]
    again = cli("schedules", "sync", "--handlers", "tests.cli.periodic_handlers", "--json")
    assert [r["status"] for r in again.json()["schedules"]] == ["unchanged"]
    [row] = cli("schedules", "list", "--json").json()["schedules"]
    assert (row["source"], row["expression"], row["payload"]) == (
        "code", "*/5 * * * *", {"scope": "all"})
    missing = cli("schedules", "sync", "--handlers", "tests.cli.no_such_module")
    assert missing.code == 2
    assert "cannot import the handlers module" in missing.error_lines[0]
