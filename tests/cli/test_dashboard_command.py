"""leaseq dashboard: one command serves the pages on 127.0.0.1, through the same resolver."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import urllib.request
from collections.abc import Iterator

import pytest

from tests.cli.conftest import LEASEQ, Cli, clean_environment
from tests.conftest import Database
from tests.dashboard.seed import seed
from tests.support.postgres import Conn


@pytest.fixture
def running(db: Database, worker: Conn, owner: Conn) -> Iterator[tuple[str, str]]:
    seed(worker, owner)
    process = subprocess.Popen(
        [str(LEASEQ), "dashboard", "--port", "0", "--database-url", db.worker_dsn],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=clean_environment())
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        found = re.search(r"on (http://127\.0\.0\.1:\d+) as (\S+)", first)
        assert found, (first, process.stderr.read() if process.poll() is not None else "")
        yield found.group(1), found.group(2)
    finally:
        os.kill(process.pid, signal.SIGINT)
        process.wait(timeout=20)


def test_the_command_serves_the_overview_on_loopback_as_the_local_operator(
    running: tuple[str, str]
) -> None:
    url, principal = running
    assert principal.startswith("local:")
    with urllib.request.urlopen(url + "/jobs?state=dead", timeout=20) as response:  # noqa: S310
        body = response.read().decode()
    assert response.status == 200
    assert f"{principal} · <b>operator</b>" in body
    assert "report source missing" in body


def test_as_tenant_without_a_reader_login_is_a_usage_error(cli: Cli) -> None:
    result = cli("dashboard", "--as", "tenant")
    assert result.code == 2
    assert "--reader-url" in result.err
