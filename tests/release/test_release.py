"""The release: the sdist and wheel of scripts/build-release, and the wheel installed as a
user installs it, into a new virtual environment outside the checkout, from the file,
its dependencies from the package index by name, with nothing of the checkout on the
path. From that install the command line and the worker Lambda handler drain a job on
the test PostgreSQL.

The artifacts come from ``tests.support.release`` (``LEASEQ_RELEASE_DIST`` or a build).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tarfile
import tomllib
import uuid
import venv
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from tests.conftest import Database
from tests.support import postgres
from tests.support.postgres import Cluster
from tests.support.release import Release, built_release

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
VERSION = PROJECT["project"]["version"]
#: Every package mypy checks strictly is typed, so each ships a py.typed marker (PEP 561).
TYPED_PACKAGES = PROJECT["tool"]["mypy"]["packages"]


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    return built_release(tmp_path_factory.mktemp("dist"))


def sql_files() -> dict[str, bytes]:
    return {str(p.relative_to(ROOT / "sql")): p.read_bytes()
            for p in sorted((ROOT / "sql").rglob("*.sql"))}


def test_the_wheel_carries_the_sql_as_package_data_and_py_typed_in_every_package(
    release: Release,
) -> None:
    with zipfile.ZipFile(release.wheel) as wheel:
        names = set(wheel.namelist())
        packaged = {name.removeprefix("leaseq/_sql/"): wheel.read(name)
                    for name in names if name.startswith("leaseq/_sql/")}
        metadata = Parser().parsestr(wheel.read(f"leaseq-{VERSION}.dist-info/METADATA").decode())

    assert len(sql_files()) > 20
    assert packaged == sql_files()
    assert {f"{package}/py.typed" for package in TYPED_PACKAGES} <= names
    assert {"leaseq_dashboard/templates/base.html", "leaseq/__main__.py",
            "leaseq_cli/main.py"} <= names
    assert (metadata["Name"], metadata["Version"]) == ("leaseq", VERSION)
    assert not [n for n in names if n.startswith(("tests/", "functions/", "bench/"))]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_the_wheel_declares_compatible_ranges_for_everything_but_the_dev_tools(
    release: Release,
) -> None:
    with zipfile.ZipFile(release.wheel) as wheel:
        metadata = Parser().parsestr(wheel.read(f"leaseq-{VERSION}.dist-info/METADATA").decode())
    requirements = [Requirement(text) for text in metadata.get_all("Requires-Dist") or []]
    for_users = [r for r in requirements
                 if r.marker is None or not r.marker.evaluate({"extra": "dev"})
                 or any(r.marker.evaluate({"extra": e}) for e in ("lambda", "dashboard", "local"))]

    assert {r.name for r in for_users} >= {"psycopg", "pydantic", "aws-lambda-powertools"}
    exact = [str(r) for r in for_users if {s.operator for s in r.specifier} & {"==", "==="}]
    assert exact == []


def test_the_deploy_guides_install_lines_name_this_versions_wheel() -> None:
    guide = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")

    assert f"pip install './leaseq-{VERSION}-py3-none-any.whl[lambda]'" in guide
    assert f"leaseq-{VERSION}.tar.gz" in guide
    by_name = re.findall(r"pip install '?leaseq\[[a-z,]+\]'?(?! @)", guide)
    assert by_name == [], "no index serves leaseq by name: install a wheel file or a URL"


def test_the_sdist_is_the_deployable_project_with_the_sql_as_files(release: Release) -> None:
    prefix = f"leaseq-{VERSION}/"
    with tarfile.open(release.sdist) as sdist:
        members = {m.name.removeprefix(prefix): m for m in sdist.getmembers()}

    for path in ("pyproject.toml", "README.md", "template.yaml", "layer/Makefile",
                 "layer/requirements.txt", "layer/requirements-x86_64.lock",
                 "layer/requirements-aarch64.lock", "functions/worker/app.py",
                 "functions/migrations/app.py", "infra/permissions-boundary.json",
                 "docs/deploy.md", "layer/leaseq/py.typed", "certificates/Makefile",
                 "certificates/build_layer.py", "examples/handler-project/template.yaml"):
        assert path in members, path
    for relative in sql_files():
        for path in (f"sql/{relative}", f"layer/leaseq/_sql/{relative}"):
            assert members[path].isfile(), f"{path} is not a plain file in the sdist"
    assert not [n for n in members if "__pycache__" in n or n.endswith(".pyc")]
    assert not [n for n in members if n.startswith(("tests/", ".venv", "bench/"))]


# --- the wheel, installed ---------------------------------------------------------------


@dataclass(frozen=True)
class Install:
    """A virtual environment with the wheel installed, and the unpacked sdist."""

    venv: Path
    source: Path
    home: Path

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    def environment(self, **extra: str) -> dict[str, str]:
        """The user's shell: no checkout, no developer settings, the venv first on PATH."""
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "DATABASE_URL")
               and not (k.startswith("LEASEQ_") and not k.startswith("LEASEQ_TEST_"))}
        path = [p for p in env.get("PATH", "").split(os.pathsep)
                if p and not Path(p).resolve().is_relative_to(ROOT)]
        env.update(PATH=os.pathsep.join([str(self.bin), *path]), LEASEQ_HOME=str(self.home),
                   PIP_DISABLE_PIP_VERSION_CHECK="1")
        env.update(extra)
        return env

    def run(self, program: str, *args: str, env: dict[str, str] | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.bin / program), *args], cwd=self.home,
                              env=env or self.environment(), capture_output=True, text=True,
                              timeout=timeout, check=False)


@pytest.fixture(scope="module")
def install(release: Release, tmp_path_factory: pytest.TempPathFactory) -> Install:
    where = tmp_path_factory.mktemp("user")
    assert not where.resolve().is_relative_to(ROOT)
    found = Install(venv=where / "venv", source=where / "source", home=where / "home")
    found.home.mkdir()
    venv.EnvBuilder(with_pip=True).create(found.venv)
    done = found.run("pip", "install", "--quiet", f"{release.wheel}[local]", timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    release.unpack_sdist(found.source)
    return found


def test_the_installed_leaseq_is_the_wheels_not_the_checkouts(install: Install) -> None:
    done = install.run("python", "-c", (
        "import json, sys, importlib.metadata as md, leaseq, leaseq_lambda, leaseq_cli\n"
        "dist = md.distribution('leaseq')\n"
        "print(json.dumps({'files': [leaseq.__file__, leaseq_lambda.__file__,"
        " leaseq_cli.__file__], 'version': dist.version, 'path': sys.path,"
        " 'direct_url': json.loads(dist.read_text('direct_url.json') or '{}')}))"))
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)

    site = install.venv.resolve()
    assert all(Path(f).resolve().is_relative_to(site) for f in found["files"]), found["files"]
    assert found["version"] == VERSION
    assert not [p for p in found["path"] if p and Path(p).resolve().is_relative_to(ROOT)]
    # Installed from the wheel file, not editable and not from the project folder.
    assert found["direct_url"]["url"].endswith(".whl")
    assert "dir_info" not in found["direct_url"]


def test_leaseq_help_runs_from_the_installed_wheel(install: Install) -> None:
    done = install.run("leaseq", "--help")

    assert done.returncode == 0, done.stderr
    for command in ("migrate", "enqueue", "drain", "status", "dashboard"):
        assert command in done.stdout


#: A user's handlers module, in a folder of its own (not the checkout).
HANDLERS = '''
from leaseq import JobContext, Registry
from pydantic import BaseModel

registry = Registry()


class Invoice(BaseModel):
    number: str
    cents: int


@registry.handler("send_invoice", payload=Invoice, timeout=5)
def send_invoice(payload: Invoice, ctx: JobContext) -> dict:
    return {"sent": payload.number, "attempt": ctx.attempt}
'''


@pytest.fixture
def user_database(cluster: Cluster, fresh_database: Callable[[], Database],
                  install: Install, tmp_path: Path) -> tuple[Database, Path]:
    """An empty database migrated by the installed ``python -m leaseq migrate``, and a
    folder holding the user's handlers module."""
    database = fresh_database()
    done = install.run("python", "-m", "leaseq", "migrate", "--database-url",
                       database.owner_dsn, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["applied"], done.stdout
    postgres.grant_group_roles(cluster)
    project = tmp_path / "project"
    project.mkdir()
    (project / "invoice_handlers.py").write_text(HANDLERS, encoding="utf-8")
    return database, project


def test_the_installed_cli_migrates_enqueues_drains_reaps_and_reports_on_the_test_database(
    install: Install, user_database: tuple[Database, Path],
) -> None:
    database, project = user_database
    tenant = str(uuid.uuid4())
    # The handlers come with the wheel (leaseq_lambda.handlers): no checkout, no setting
    # naming one, and the current directory (the user's home) holds no functions/.
    env = install.environment(DATABASE_URL=database.worker_dsn, PYTHONPATH=str(project))
    assert not (install.home / "functions").exists()

    enqueued = install.run("leaseq", "enqueue", "--tenant", tenant, "--kind", "send_invoice",
                           "--payload", '{"number": "INV-7", "cents": 1200}', "--json", env=env)
    assert enqueued.returncode == 0, enqueued.stderr
    drained = install.run("leaseq", "drain", "--handlers", "invoice_handlers", "--budget", "20",
                          "--job-timeout", "5", "--json", env=env)
    assert drained.returncode == 0, drained.stderr
    reaped = install.run("leaseq", "reap", "--json", env=env)
    assert reaped.returncode == 0, reaped.stderr
    status = install.run("leaseq", "status", "--json", env=env)
    assert status.returncode == 0, status.stderr

    assert json.loads(enqueued.stdout)["jobs"][0]["status"] == "created"
    assert (json.loads(reaped.stdout)["status"], json.loads(reaped.stdout)["released"]) == (
        "ok", 0)
    assert (json.loads(drained.stdout)["succeeded"], json.loads(drained.stdout)["dead"]) == (1, 0)
    (entry,) = json.loads(status.stdout)["tenants"]
    assert (entry["tenant_id"], entry["states"]["succeeded"], entry["ready"]) == (tenant, 1, 0)


def test_the_installed_cli_runs_the_demo_on_the_test_database_without_a_checkout(
    install: Install, user_database: tuple[Database, Path],
) -> None:
    database, _ = user_database
    env = install.environment(DATABASE_URL=database.worker_dsn)

    demo = install.run("leaseq", "demo", "--json", env=env)

    assert demo.returncode == 0, demo.stderr[-4000:]
    document = json.loads(demo.stdout)
    assert sum(tenant["jobs"] for tenant in document["tenants"]) == sum(
        tenant["succeeded"] + tenant["dead"] for tenant in document["tenants"])
    assert document["lease_recovered_job"] is not None  # the reaper ran, from the wheel
    assert document["drain"]["reaper_invocations"] >= 1


#: What Lambda does with the worker function: import app.py next to the layer's packages
#: (here: the installed wheel) and call its handler with a scheduled event and a context.
LAMBDA_RUN = '''
import json, sys, time, uuid
from leaseq import EnqueueRequest, connect, enqueue_jobs


class Context:
    function_name = "leaseq-worker"
    function_version = "$LATEST"
    memory_limit_in_mb = "256"
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:leaseq-worker"
    aws_request_id = str(uuid.uuid4())
    log_group_name = log_stream_name = "local"
    deadline = time.time() + 60

    def get_remaining_time_in_millis(self):
        return max(0, int((self.deadline - time.time()) * 1000))


tenant = uuid.UUID(sys.argv[1])
with connect(sys.argv[2]) as conn:
    enqueue_jobs(conn, [EnqueueRequest(tenant_id=tenant, kind="send_invoice",
                                       operation_key="inv-8",
                                       payload={"number": "INV-8", "cents": 5})])
sys.path.insert(0, sys.argv[3])
import app

event = {"source": "leaseq.schedule", "task": "worker", "scheduled_time": "2026-01-01T00:00:00Z"}
print(json.dumps(app.lambda_handler(event, Context())), file=sys.stderr)
'''


def test_the_worker_lambda_handler_drains_with_the_installed_library(
    install: Install, user_database: tuple[Database, Path], tmp_path: Path,
) -> None:
    database, project = user_database
    script = tmp_path / "invoke_worker.py"
    script.write_text(LAMBDA_RUN, encoding="utf-8")
    env = install.environment(
        DATABASE_URL=database.worker_dsn, LEASEQ_HANDLERS="invoice_handlers",
        PYTHONPATH=str(project), POWERTOOLS_SERVICE_NAME="leaseq",
        AWS_DEFAULT_REGION="us-east-1", AWS_LAMBDA_FUNCTION_NAME="leaseq-worker",
        LEASEQ_POLL_IDLE_SECONDS="0", LEASEQ_JOB_TIMEOUT_SECONDS="5")

    done = install.run("python", str(script), str(uuid.uuid4()), database.worker_dsn,
                       str(install.source / "functions" / "worker"), env=env)

    assert done.returncode == 0, done.stderr[-4000:]
    summary: dict[str, Any] = json.loads(done.stderr.strip().splitlines()[-1])
    assert (summary["status"], summary["succeeded"], summary["claimed"]) == ("ok", 1, 1)
    logs = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert any(line.get("message") == "job finished" and line.get("kind") == "send_invoice"
               for line in logs)
