"""examples/handler-project: a team's handlers on leaseq without editing leaseq's template.

It is built with `sam build` here (its handlers layer and the leaseq stack nested in it),
linted, and its handlers module is loaded by leaseq's own registry loader on Python 3.13
from the two built layers, as the worker would load it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.infra.template_support import (
    ROOT,
    load_sam_template,
    require_lambda_python,
    sam_environment,
)
from tests.infra.test_sam_build import host_layer, run_isolated, sam_build, wheel_tags

PROJECT = ROOT / "examples" / "handler-project"
#: What leaseq's layer carries; a handlers layer that shipped them would shadow leaseq's.
LEASEQ_PACKAGES = ("leaseq", "leaseq_lambda", "leaseq_dashboard", "psycopg", "psycopg_binary",
                   "pydantic", "pydantic_core", "aws_lambda_powertools")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sam_build(PROJECT / "template.yaml", tmp_path_factory.mktemp("example-build"),
                     PROJECT)


def application() -> dict[str, Any]:
    resource: dict[str, Any] = load_sam_template(PROJECT / "template.yaml")["Resources"][
        "Leaseq"]
    return resource


def test_the_handlers_layer_holds_the_module_and_its_own_pure_python_packages_only(
    built: Path,
) -> None:
    site = built / "HandlersLayer" / "python"

    assert (site / "invoice_handlers.py").read_bytes() == (
        PROJECT / "handlers" / "invoice_handlers.py").read_bytes()
    tags = wheel_tags(site)
    assert {name.split("-")[0] for name in tags} == {"humanize"}
    assert all(re.fullmatch(r"(py3|py2\.py3)-none-any", tag)
               for dist_tags in tags.values() for tag in dist_tags), tags
    assert [name for name in LEASEQ_PACKAGES if (site / name).exists()] == []


def test_the_leaseq_stack_is_built_as_the_nested_application(built: Path) -> None:
    nested = built / "Leaseq"

    for name in ("LeaseqLayerX8664", "LeaseqLayerArm64", "WorkerFunction", "MigrationsFunction"):
        assert (nested / name).is_dir(), name
    assert (nested / "LeaseqLayerX8664" / "python" / "leaseq" / "_sql" / "migrations").is_dir()
    parent = (built / "template.yaml").read_text(encoding="utf-8")
    assert "Leaseq/template.yaml" in parent


def test_the_worker_loads_the_example_handlers_from_the_two_layers_on_python313(
    built: Path,
) -> None:
    found = run_isolated(
        require_lambda_python(),
        "import os\n"
        "os.environ['LEASEQ_HANDLERS_ENVIRONMENT'] = json.dumps({'CURRENCY': 'CHF'})\n"
        "from leaseq_lambda.runtime import load_registry\n"
        "registry = load_registry('invoice_handlers')\n"
        "import invoice_handlers, humanize\n"
        "print(json.dumps({'kinds': sorted(registry.kinds), 'count': len(registry),"
        " 'currency': invoice_handlers.CURRENCY,"
        " 'humanize': humanize.__file__, 'slow': registry.get('report.monthly').timeout}))",
        [built / "HandlersLayer" / "python", built / "Leaseq" / host_layer() / "python"],
    )

    assert found["kinds"] == ["invoice.render", "report.monthly"]
    assert found["count"] == 2
    assert found["currency"] == "CHF"
    assert found["slow"] == 600
    assert str(found["humanize"]).startswith(str(built / "HandlersLayer"))


def test_both_workers_start_with_the_example_handlers_and_the_stacks_defaults(
    built: Path,
) -> None:
    """The main worker (LEASEQ_EXCLUDE_KINDS, WorkerTimeoutSeconds) and the slow worker
    (LEASEQ_KINDS, SlowWorkerTimeoutSeconds) accept the example's registry; without
    SlowKinds the main worker would refuse report.monthly's 600 s timeout."""
    leaseq = load_sam_template()["Parameters"]
    slow_kinds = application()["Properties"]["Parameters"]["SlowKinds"]
    common = {"LEASEQ_LEASE_MARGIN_SECONDS": str(leaseq["LeaseMarginSeconds"]["Default"])}
    main = {**common, "LEASEQ_EXCLUDE_KINDS": slow_kinds,
            "LEASEQ_JOB_TIMEOUT_SECONDS": str(leaseq["JobTimeoutSeconds"]["Default"]),
            "LEASEQ_WORKER_TIMEOUT_SECONDS": str(leaseq["WorkerTimeoutSeconds"]["Default"])}
    slow = {**common, "LEASEQ_KINDS": slow_kinds,
            "LEASEQ_JOB_TIMEOUT_SECONDS": str(leaseq["SlowJobTimeoutSeconds"]["Default"]),
            "LEASEQ_WORKER_TIMEOUT_SECONDS": str(leaseq["SlowWorkerTimeoutSeconds"]["Default"])}
    alone = {key: value for key, value in main.items() if key != "LEASEQ_EXCLUDE_KINDS"}
    found = run_isolated(
        require_lambda_python(),
        "from leaseq import ConfigurationError, WorkerConfig\n"
        "from leaseq.budget import check_registry\n"
        "from leaseq.settings import WorkerSettings\n"
        "from leaseq_lambda.runtime import load_registry\n"
        "registry = load_registry('invoice_handlers')\n"
        "def starts(env):\n"
        "    values = WorkerSettings.model_validate(env).config_values()\n"
        "    values.pop('retry_base'); values.pop('retry_max')\n"
        "    try:\n"
        "        check_registry(registry, WorkerConfig(owner='w', **values))\n"
        "    except ConfigurationError as exc:\n"
        "        return exc.message\n"
        "    return 'ok'\n"
        f"print(json.dumps({{'main': starts({main!r}), 'slow': starts({slow!r}),"
        f" 'alone': starts({alone!r})}}))",
        [built / "HandlersLayer" / "python", built / "Leaseq" / host_layer() / "python"],
    )

    assert (found["main"], found["slow"]) == ("ok", "ok")
    assert "kind 'report.monthly' needs 606 s" in str(found["alone"])


def test_the_example_gives_the_stack_parameters_it_has_with_values_it_accepts() -> None:
    leaseq = load_sam_template()["Parameters"]
    given = application()["Properties"]["Parameters"]

    assert application()["Properties"]["Location"] == "../../template.yaml"
    assert set(given) <= set(leaseq)
    for name, value in given.items():
        if isinstance(value, str):
            pattern = leaseq[name].get("AllowedPattern")
            assert pattern is None or re.fullmatch(pattern, value), (name, value)
    assert given["HandlersLayerArn"] == {"Ref": "HandlersLayer"}
    assert given["Architecture"] == {"Ref": "Architecture"}
    assert (PROJECT / "handlers" / f"{given['HandlersModule']}.py").is_file()
    assert isinstance(json.loads(given["HandlersEnvironment"]), dict)
    config = tomllib.loads((PROJECT / "samconfig.toml").read_text(encoding="utf-8"))
    assert config["default"]["global"]["parameters"]["stack_name"].startswith("leaseq-")
    assert "CAPABILITY_AUTO_EXPAND" in config["default"]["deploy"]["parameters"]["capabilities"]
    layer = load_sam_template(PROJECT / "template.yaml")["Resources"]["HandlersLayer"]
    assert layer["Properties"]["LayerName"] == {"Fn::Sub": "${AWS::StackName}-handlers"}


def test_cfn_lint_finds_nothing_in_the_example() -> None:
    lint = subprocess.run(
        [sys.executable, "-c", "import sys; from cfnlint.runner import main; sys.exit(main())",
         "template.yaml", "--include-checks", "I", "--append-rules",
         "cfn_lint_serverless.rules"],
        cwd=PROJECT, capture_output=True, text=True, env=sam_environment(), timeout=180)

    assert lint.returncode == 0, lint.stdout + lint.stderr
