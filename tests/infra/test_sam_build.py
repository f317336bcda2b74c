"""`sam build` of the real template, without Docker, and what the build produced.

This is the offline stand-in for `sam local invoke`: the built layer is imported by a
Python with nothing but the standard library and the layer on its path, as Lambda's
python3.11 runtime would (plus the boto3 that runtime provides, for the functions).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.infra.template_support import ROOT, find_sam, load_sam_template, sam_environment

#: What the python3.11 Lambda runtime itself provides on its path besides the standard library.
RUNTIME_PROVIDED = ("boto3", "botocore", "s3transfer", "jmespath", "dateutil", "six", "urllib3")


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sam_cli = find_sam()
    if sam_cli is None:
        pytest.skip("SAM CLI not found (set SAM_CLI or install aws-sam-cli into .venv-sam)")
    out = tmp_path_factory.mktemp("sam-build")
    result = subprocess.run(
        [sam_cli, "build", "--template-file", "template.yaml", "--build-dir", str(out / "build"),
         "--cache-dir", str(out / "cache"), "--no-use-container"],
        cwd=ROOT, capture_output=True, text=True, env=sam_environment(), timeout=540,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "Build Succeeded" in result.stdout + result.stderr
    return out / "build"


def run_isolated(code: str, paths: list[Path], cwd: Path | None = None) -> dict[str, object]:
    """Run code in a Python that sees only the stdlib and ``paths`` (no site-packages)."""
    prelude = f"import sys, json; sys.path[:0] = {[str(p) for p in paths]!r}\n"
    env = {
        "PATH": os.environ.get("PATH", ""),
        "POWERTOOLS_SERVICE_NAME": "leaseq",
        "POWERTOOLS_METRICS_NAMESPACE": "Leaseq",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_LAMBDA_FUNCTION_NAME": "leaseq-build-check",
    }
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", prelude + code],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=120,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    document: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return document


def test_the_built_layer_carries_every_migration_as_package_data(build_dir: Path) -> None:
    built = build_dir / "LeaseqLayer" / "python" / "leaseq" / "_sql"
    sources = sorted((ROOT / "sql").glob("*.sql"))

    assert built.is_dir()
    assert not built.is_symlink()
    assert sorted(p.name for p in built.glob("*.sql")) == [p.name for p in sources]
    for source in sources:
        assert (built / source.name).read_bytes() == source.read_bytes(), source.name


def test_the_built_layer_alone_imports_leaseq_with_psycopgs_binary_implementation(
    build_dir: Path,
) -> None:
    layer = build_dir / "LeaseqLayer" / "python"

    found = run_isolated(
        "import importlib, psycopg, leaseq, pydantic_core, aws_lambda_powertools\n"
        "migrate = importlib.import_module('leaseq.migrate')\n"
        "print(json.dumps({'impl': psycopg.pq.__impl__, 'libpq': psycopg.pq.version(),"
        " 'psycopg': psycopg.__file__, 'leaseq': leaseq.__file__,"
        " 'migrations': [m.version for m in migrate.load_migrations()]}))",
        [layer],
    )

    assert found["impl"] == "binary"
    assert isinstance(found["libpq"], int)
    assert found["libpq"] >= 150000
    assert str(found["psycopg"]).startswith(str(layer))
    assert str(found["leaseq"]).startswith(str(layer))
    assert found["migrations"] == list(
        range(1, len(list((ROOT / "sql" / "migrations").glob("*.sql"))) + 1))


def test_the_built_layer_carries_the_dashboards_templates(build_dir: Path) -> None:
    layer = build_dir / "LeaseqLayer" / "python"

    found = run_isolated(
        "from leaseq_dashboard import app\n"
        "env = app._environment()\n"
        "names = ['base.html', 'overview.html', 'jobs.html', 'job.html', 'confirm.html',"
        " 'error.html', 'dashboard.css']\n"
        "print(json.dumps({'found': [n for n in names if env.get_template(n)],"
        " 'file': app.__file__}))",
        [layer],
    )

    assert len(found["found"]) == 7
    assert str(found["file"]).startswith(str(layer))


def runtime_provided_dir(tmp_path: Path) -> Path:
    """A folder standing in for the runtime's own boto3 (links into this environment)."""
    import importlib.util

    folder = tmp_path / "runtime"
    folder.mkdir()
    for name in RUNTIME_PROVIDED:
        spec = importlib.util.find_spec(name)
        assert spec is not None, name
        assert spec.origin is not None, name
        origin = Path(spec.origin)
        source = origin.parent if origin.name == "__init__.py" else origin
        (folder / source.name).symlink_to(source)
    return folder


@pytest.mark.parametrize(
    "function",
    sorted(name for name, resource in load_sam_template()["Resources"].items()
           if resource["Type"] == "AWS::Serverless::Function"),
)
def test_each_built_function_imports_its_handler_against_the_layer(
    build_dir: Path, tmp_path: Path, function: str,
) -> None:
    code_dir = build_dir / function
    assert (code_dir / "app.py").is_file(), f"{function}: app.py missing from the build"

    found = run_isolated(
        "import app\n"
        "print(json.dumps({'handler': callable(getattr(app, 'lambda_handler', None)),"
        " 'file': app.__file__}))",
        [code_dir, build_dir / "LeaseqLayer" / "python", runtime_provided_dir(tmp_path)],
        cwd=tmp_path,
    )

    assert found["handler"] is True
    assert str(found["file"]).startswith(str(code_dir))
