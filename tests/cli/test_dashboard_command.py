"""leaseq dashboard: one command serves the pages on 127.0.0.1, through the same resolver,
to whoever started it: the URL it prints carries the run's key, and nothing else gets in."""

from __future__ import annotations

import getpass
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import pytest

from tests.cli.conftest import LEASEQ, Cli, clean_environment
from tests.conftest import Database
from tests.dashboard.client import Client
from tests.dashboard.seed import Seeded, seed
from tests.sql.calls import events, job
from tests.support.os_users import another_os_user, run_as
from tests.support.postgres import Conn


@dataclass(frozen=True)
class Running:
    """The command's process, the URL it printed, and who it says is looking."""

    pid: int
    login_url: str
    principal: str
    seeded: Seeded

    @property
    def url(self) -> str:
        parts = urlsplit(self.login_url)
        return f"{parts.scheme}://{parts.netloc}"

    @property
    def key(self) -> str:
        return self.login_url.partition("?key=")[2]


@pytest.fixture
def running(db: Database, worker: Conn, owner: Conn) -> Iterator[Running]:
    seeded = seed(worker, owner)
    process = subprocess.Popen(
        [str(LEASEQ), "dashboard", "--port", "0", "--database-url", db.worker_dsn],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=clean_environment())
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        found = re.search(r"on (http://127\.0\.0\.1:\d+/\?key=[A-Za-z0-9_-]{43}) as (\S+)",
                          first)
        assert found, (first, process.stderr.read() if process.poll() is not None else "")
        yield Running(process.pid, found.group(1), found.group(2), seeded)
    finally:
        os.kill(process.pid, signal.SIGINT)
        process.wait(timeout=20)


def test_the_command_serves_the_overview_on_loopback_as_the_local_operator(
    running: Running
) -> None:
    assert running.principal.startswith("local:")
    client = Client(running.url).enter(running.login_url)
    page = client.get("/jobs?state=dead")
    assert page.status == 200
    assert f"{running.principal} · <b>operator</b>" in page.body
    assert "report source missing" in page.body


def test_the_command_lets_in_no_browser_without_the_key_it_printed(running: Running) -> None:
    for path in ("/", "/jobs?state=dead", f"/jobs/{running.seeded.jobs['dead'][1]}"):
        page = Client(running.url).get(path)
        assert page.status == 403
        assert "printed in its terminal" in page.body
        assert "report source missing" not in page.body


def test_a_redrive_through_the_command_is_audited_as_the_os_user_who_started_it(
    running: Running, owner: Conn
) -> None:
    client = Client(running.url).enter(running.login_url)
    dead = running.seeded.jobs["dead"][0]
    token = client.get(f"/jobs/{dead}").csrf()
    done = client.post("/actions/redrive", [("csrf", token), ("job", str(dead)),
                                            ("back", f"/jobs/{dead}"), ("confirmed", "yes")])
    assert done.status == 200
    assert job(owner, dead)["state"] == "pending"
    (event,) = [e for e in events(owner, dead) if e["event_type"] == "redriven"]
    assert event["actor"] == f"dashboard:local:{getpass.getuser()}"
    assert running.principal == f"local:{getpass.getuser()}"


def test_the_key_is_on_the_operators_terminal_only_and_another_os_user_cannot_read_it(
    running: Running
) -> None:
    proc = f"/proc/{running.pid}"
    with another_os_user() as intruder:
        cmdline = run_as(intruder, "cat", f"{proc}/cmdline")
        assert cmdline.returncode == 0, cmdline.stderr  # anyone may read a command line
        assert "dashboard" in cmdline.stdout
        assert running.key not in cmdline.stdout
        for private in (f"{proc}/environ", f"{proc}/fd/1", f"{proc}/mem"):
            tried = run_as(intruder, "cat", private)
            assert tried.returncode != 0, private
            assert "Permission denied" in tried.stderr, (private, tried.stderr)
            assert running.key not in tried.stdout


def test_as_tenant_without_a_reader_login_is_a_usage_error(cli: Cli) -> None:
    result = cli("dashboard", "--as", "tenant")
    assert result.code == 2
    assert "--reader-url" in result.err
