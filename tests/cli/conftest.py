"""Drive ``leaseq`` as a user would: in this process through its ``main`` (fast, with
the real argument parsing, output and exit codes), or as a separate process through
the installed console script when what matters is exactly what a terminal would see
(one-line errors, no tracebacks, no colour codes)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from leaseq_cli.main import main

from tests.conftest import Database

# The enqueue function in this process, for `leaseq enqueue resubmit` (tests/cli/test_stack.py).
from tests.functions.conftest import enqueue_app, lambda_env  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
LEASEQ = Path(sys.executable).parent / "leaseq"


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]


Cli = Callable[..., Result]


@pytest.fixture
def cli(db: Database, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Cli:
    """``leaseq ARGS...`` in this process against the session's database, as the worker."""
    monkeypatch.setenv("DATABASE_URL", db.worker_dsn)
    monkeypatch.setenv("LEASEQ_HOME", str(tmp_path / "home"))

    def run(*args: str) -> Result:
        capsys.readouterr()
        code = main(list(args))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


def clean_environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k != "DATABASE_URL" and not (k.startswith("LEASEQ_")
                                           and not k.startswith("LEASEQ_TEST_"))}
    # A colour-capable terminal type, so that output free of colour codes shows that
    # leaseq noticed stdout is not a terminal.
    env.pop("NO_COLOR", None)
    env["TERM"] = "xterm-256color"
    env.update(extra)
    return env


def run_process(*args: str, env: dict[str, str], cwd: Path | None = None,
                timeout: float = 120) -> Result:
    done = subprocess.run([str(LEASEQ), *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, check=False)
    return Result(done.returncode, done.stdout, done.stderr)


@pytest.fixture(scope="session")
def embedded_home() -> Iterator[Path]:
    """One embedded server for the tests that need DATABASE_URL unset, stopped at the end.

    Not under pytest's own temporary root: another pytest session of the same user
    resets that root to mode 0700 when it starts, which would lock the server's OS user
    (as root, ``pgserver``) out of a data directory it is running on.
    """
    home = Path(tempfile.mkdtemp(prefix="leaseq-home-"))
    yield home
    stopped = run_process("db", "stop", env=clean_environment(LEASEQ_HOME=str(home)))
    assert stopped.code == 0, stopped.err
    shutil.rmtree(home, ignore_errors=True)
