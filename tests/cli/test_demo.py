"""The README's first command, exactly as a user runs it after installing the project:
``leaseq demo`` with DATABASE_URL unset, so the embedded PostgreSQL is started in a
fresh LEASEQ_HOME, migrated, and used by the real worker and reaper handlers; then the
commands the summary points to, and ``leaseq db stop``."""

from __future__ import annotations

import re
from pathlib import Path

from tests.cli.conftest import REPO, clean_environment, run_process


def test_leaseq_demo_runs_on_the_embedded_server_and_summarises_per_tenant(
    embedded_home: Path, tmp_path: Path
) -> None:
    env = clean_environment(LEASEQ_HOME=str(embedded_home))
    demo = run_process("demo", env=env, cwd=REPO)
    assert demo.code == 0, demo.out + demo.err
    assert "Traceback" not in demo.err
    assert "\x1b[" not in demo.out  # not a terminal: no colour codes

    # Per tenant: 15 jobs, some retried, one dead in globex; the dead job's reason and
    # the exact command to inspect it.
    for tenant in ("acme", "globex", "initech", "umbrella"):
        row = re.search(rf"^{tenant} \S+\s*│\s*(\d+)\s*│\s*(\d+)\s*│\s*(\d+)\s*│\s*(\d+)",
                        demo.out, re.MULTILINE)
        assert row is not None, demo.out
        jobs, succeeded, retried, dead = map(int, row.groups())
        assert jobs == 15
        assert succeeded + dead == 15
        # Two charge_card jobs fail once and one twice; in initech, the crashed worker's
        # job runs a second time too.
        assert retried == (4 if tenant == "initech" else 3)
        assert dead == (1 if tenant == "globex" else 0)
    assert "INVALID_PAYLOAD" in demo.out
    inspect = re.search(r"inspect it:\s+leaseq jobs show ([0-9a-f-]{36})", demo.out)
    assert inspect is not None, demo.out
    recovered = re.search(r"lease recovered by the reaper: leaseq jobs show ([0-9a-f-]{36})",
                          demo.out)
    assert recovered is not None, demo.out

    # The command the summary names works, against the same embedded server.
    shown = run_process("jobs", "show", inspect[1], "--json", env=env)
    assert shown.code == 0, shown.err
    document = shown.json()
    assert document["job"]["state"] == "dead"
    assert document["job"]["last_error"]["code"] == "INVALID_PAYLOAD"
    assert [e["event_type"] for e in document["events"]] == ["created", "claimed", "dead"]

    crashed = run_process("jobs", "show", recovered[1], "--json", env=env).json()
    assert crashed["job"]["state"] == "succeeded"
    assert crashed["job"]["kind"] == "send_welcome_email"
    events = [e["event_type"] for e in crashed["events"]]
    assert events[:3] == ["created", "claimed", "lease_expired"]
    assert events[-1] == "succeeded"
    assert crashed["events"][2]["actor"] == "watchdog"

    status = run_process("status", "--json", env=env)
    assert status.code == 0
    totals = status.json()["totals"]
    assert totals["pending"] == totals["running"] == totals["retry_wait"] == 0

    # The server keeps running between commands and stops on request.
    assert run_process("db", "status", "--json", env=env).json()["running"] is True
    stopped = run_process("db", "stop", "--json", env=env)
    assert stopped.code == 0
    assert stopped.json()["was_running"] is True
    assert run_process("db", "status", "--json", env=env).json()["running"] is False


def test_leaseq_demo_fan_out_drains_a_backlog_across_several_workers_on_the_local_lambda(
    embedded_home: Path,
) -> None:
    """``leaseq demo --fan-out``: the enqueue function's wake starts one worker on the
    local Lambda service, its full claims start more, never more than --max-workers."""
    env = clean_environment(LEASEQ_HOME=str(embedded_home))

    done = run_process("demo", "--fan-out", "--jobs", "300", "--max-workers", "3", "--json",
                       env=env, cwd=REPO, timeout=240)

    assert done.code == 0, done.out + done.err
    document = done.json()
    assert (document["jobs"], document["succeeded"], document["unfinished"]) == (300, 300, 0)
    assert 1 < document["peak_workers"] <= 3
    assert document["invocations"]["wake"] == 1  # no schedule: the enqueue woke the first
    assert document["invocations"]["fanout"] >= 1
    assert all(s["live"] + s["reserved"] <= 3 for s in document["samples"])
    assert document["samples"][-1]["finished"] == 300
    assert (embedded_home / "lambda.log").read_text().count("START RequestId") >= 3

    shown = run_process("demo", "--fan-out", "--jobs", "40", "--max-workers", "2",
                        env=env, cwd=REPO, timeout=240)
    assert shown.code == 0, shown.out + shown.err
    assert "drained 40 of 40 jobs in " in shown.out
    assert re.search(r"with up to [12] worker invocations at once \(MaxWorkers 2\)", shown.out)
    assert re.search(r"worker invocations: .*1 by wake", shown.out)
    assert "enqueueing 40 jobs through the enqueue function" in shown.err
    assert "\x1b[" not in shown.out
    stopped = run_process("db", "stop", "--json", env=env)
    assert stopped.code == 0
