"""Colour only on a terminal: a pseudo-terminal gets ANSI colours, a pipe gets no escape
codes at all, NO_COLOR and --no-color drop the colours (bold may stay, as no-color.org
allows), and --json is plain JSON either way."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import uuid

from tests.cli.conftest import LEASEQ, clean_environment, run_process
from tests.conftest import Database
from tests.sql.calls import claim_one, enqueue
from tests.support.postgres import Conn

ANSI = "\x1b["
#: An SGR sequence that sets a foreground colour (30-38 or 90-97).
COLOUR = re.compile(r"\x1b\[(?:\d+;)*(?:3[0-8]|9[0-7])(?:;\d+)*m")


def _on_a_terminal(*args: str, env: dict[str, str]) -> str:
    """Run leaseq with stdout on a pseudo-terminal; return what the terminal received."""
    leader, follower = pty.openpty()
    try:
        done = subprocess.run([str(LEASEQ), *args], env={**env, "COLUMNS": "160"},
                              stdout=follower, stderr=subprocess.PIPE, check=False, timeout=60)
        os.close(follower)
        follower = -1
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        if follower != -1:
            os.close(follower)
        os.close(leader)
    assert done.returncode == 0, done.stderr
    return b"".join(chunks).decode("utf-8", "replace")


def test_output_is_coloured_on_a_terminal_only(db: Database, worker: Conn) -> None:
    tenant = uuid.uuid4()
    enqueue(worker, tenant, "a")
    lease = claim_one(worker, tenant)
    worker.execute("select app.discard_job(%s, %s, %s, %s, '{}')",
                   (tenant, lease["id"], lease["lease_owner"], lease["lease_token"]))
    enqueue(worker, tenant, "b")
    env = clean_environment(DATABASE_URL=db.worker_dsn)
    assert COLOUR.search(_on_a_terminal("status", env=env))
    assert not COLOUR.search(_on_a_terminal("status", env={**env, "NO_COLOR": "1"}))
    assert not COLOUR.search(_on_a_terminal("status", "--no-color", env=env))
    piped = run_process("status", env=env)
    assert piped.code == 0
    assert ANSI not in piped.out
    document = json.loads(_on_a_terminal("status", "--json", env=env))
    assert document["totals"]["pending"] == 1
