"""Reading template.yaml the way SAM does, and the checks no linter makes.

cfn-lint and ``sam validate`` accept ``rate(30 seconds)`` and ``rate(1 minutes)``, which
EventBridge Scheduler rejects at deploy time, so the schedule grammar is checked here.
"""

from __future__ import annotations

import atexit
import copy
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "template.yaml"


def load_sam_template(path: Path = TEMPLATE) -> dict[str, Any]:
    from samtranslator.yaml_helper import yaml_parse  # type: ignore[import-untyped]

    document: dict[str, Any] = yaml_parse(path.read_text(encoding="utf-8"))
    return document


class _NoManagedPolicies:
    """The translator asks IAM for managed policy ARNs; the template names none."""

    def load(self) -> dict[str, str]:
        return {}

    def get(self, name: str) -> str | None:
        return None


def translate(
    sam: dict[str, Any], *, layer_uri: str = "s3://artifacts/layer.zip"
) -> dict[str, Any]:
    """Expand the SAM template to plain CloudFormation, offline.

    Local CodeUri/ContentUri values are replaced by S3 URIs, as ``sam package`` does; the
    layer's URI is a parameter because SAM derives the layer's logical id from it.
    """
    from samtranslator.translator.transform import transform  # type: ignore[import-untyped]

    document = copy.deepcopy(sam)
    for resource in document["Resources"].values():
        properties = resource.get("Properties", {})
        if resource["Type"] == "AWS::Serverless::Function":
            properties["CodeUri"] = "s3://artifacts/function.zip"
        elif resource["Type"] == "AWS::Serverless::LayerVersion":
            properties["ContentUri"] = layer_uri
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    translated: dict[str, Any] = transform(document, {}, _NoManagedPolicies())
    return translated


def resources_of_type(template: dict[str, Any], type_name: str) -> dict[str, dict[str, Any]]:
    return {
        name: resource
        for name, resource in template["Resources"].items()
        if resource["Type"] == type_name
    }


def parameter_default(template: dict[str, Any], value: Any) -> Any:
    """A literal, or the default of the parameter a Ref names."""
    if isinstance(value, dict) and set(value) == {"Ref"}:
        return template["Parameters"][value["Ref"]]["Default"]
    return value


# ---- the template's Rules, evaluated as CloudFormation does before creating anything -------


def parameter_values(template: dict[str, Any], **given: str) -> dict[str, Any]:
    """Every parameter's value for a deploy: ``given``, else its default (as text, or a
    list of text for a CommaDelimitedList), as CloudFormation hands them to the Rules."""
    values: dict[str, Any] = {}
    for name, parameter in template["Parameters"].items():
        value = given.get(name, parameter.get("Default", ""))
        if parameter.get("Type") == "CommaDelimitedList":
            values[name] = [] if value == "" else str(value).split(",")
        else:
            values[name] = value if isinstance(value, str) else str(value)
    return values


def rule_value(value: Any, parameters: dict[str, Any],
               conditions: dict[str, Any] | None = None) -> Any:
    """A Rules (or Conditions) expression's value: the functions this template uses there,
    and no other; ``{"Condition": name}`` is evaluated from ``conditions``."""
    if isinstance(value, str | int | float | bool):
        return value if isinstance(value, str | bool) else str(value)
    if isinstance(value, list):
        return [rule_value(item, parameters, conditions) for item in value]
    ((function, argument),) = value.items()
    if function == "Ref":
        return parameters[argument]
    if function == "Condition" and conditions is not None:
        return rule_value(conditions[argument], parameters, conditions)
    if function == "Fn::Sub" and isinstance(argument, str):
        return re.sub(r"\$\{([^}!]+)\}",
                      lambda m: _as_text(parameters[m.group(1)]), argument)
    arguments = rule_value(argument, parameters, conditions)
    if function == "Fn::Equals":
        left, right = arguments
        return left == right
    if function == "Fn::Not":
        return not arguments[0]
    if function == "Fn::And":
        return all(arguments)
    if function == "Fn::Or":
        return any(arguments)
    if function == "Fn::Contains":
        values, wanted = arguments
        return wanted in values
    if function == "Fn::Join":
        separator, items = arguments
        return separator.join(items)
    if function == "Fn::Split":
        separator, text = arguments
        return text.split(separator)
    if function == "Fn::Select":
        index, items = arguments
        return items[int(index)]
    raise NotImplementedError(f"rule function {function}: teach rule_value it")


def _as_text(value: Any) -> str:
    return ",".join(value) if isinstance(value, list) else str(value)


def rule_refusals(template: dict[str, Any], **given: str) -> list[str]:
    """The names of the Rules that refuse a deploy with these parameters."""
    parameters = parameter_values(template, **given)
    refused = []
    for name, rule in template.get("Rules", {}).items():
        condition = rule.get("RuleCondition")
        if condition is not None and not rule_value(condition, parameters):
            continue
        if not all(rule_value(a["Assert"], parameters) for a in rule["Assertions"]):
            refused.append(name)
    return refused


# ---- EventBridge Scheduler expressions ------------------------------------------------------

_RATE = re.compile(r"^rate\((?P<value>\d+) (?P<unit>[a-z]+)\)$")
_RATE_UNITS = {"minute", "minutes", "hour", "hours", "day", "days"}
_CRON_FIELDS = (
    ("minutes", re.compile(r"^[0-9,\-*/]+$"), 0, 59),
    ("hours", re.compile(r"^[0-9,\-*/]+$"), 0, 23),
    ("day-of-month", re.compile(r"^[0-9,\-*/?LW]+$"), 1, 31),
    ("month", re.compile(r"^([0-9,\-*/]+|[A-Za-z,\-]+)$"), 1, 12),
    ("day-of-week", re.compile(r"^([1-7,\-*?L#/]+|[A-Za-z,\-#L]+)$"), 1, 7),
    ("year", re.compile(r"^[0-9,\-*/]+$"), 1970, 2199),
)


def schedule_expression_problem(expression: str) -> str | None:
    """Why EventBridge Scheduler would reject a recurring expression, or None."""
    rate = _RATE.match(expression)
    if rate:
        value, unit = int(rate["value"]), rate["unit"]
        if unit not in _RATE_UNITS:
            return f"unit {unit!r}: rates take minute(s), hour(s) or day(s), never seconds"
        if value < 1:
            return "a rate must be at least 1"
        if value == 1 and unit.endswith("s"):
            return f"rate(1 {unit}) must be singular: rate(1 {unit[:-1]})"
        if value > 1 and not unit.endswith("s"):
            return f"rate({value} {unit}) must be plural: rate({value} {unit}s)"
        return None
    if expression.startswith("cron(") and expression.endswith(")"):
        fields = expression[len("cron("):-1].split(" ")
        if len(fields) != len(_CRON_FIELDS):
            return (
                "cron needs 6 fields (minutes hours day-of-month month day-of-week year), "
                f"got {len(fields)}"
            )
        for text, (name, allowed, low, high) in zip(fields, _CRON_FIELDS, strict=True):
            if not allowed.match(text):
                return f"cron {name} field {text!r} has characters that field does not take"
            for number in re.findall(r"(?<![#/])\b\d+\b", text):
                if not low <= int(number) <= high:
                    return f"cron {name} value {number} is outside {low}-{high}"
        day_of_month, day_of_week = fields[2], fields[4]
        if (day_of_month == "?") == (day_of_week == "?"):
            return "cron needs '?' in exactly one of day-of-month and day-of-week"
        return None
    return "a recurring schedule is rate(...) or cron(...)"


# ---- the SAM CLI (installed in its own virtualenv: its pins clash with the project's) -------

#: The one command that installs the SAM CLI where find_sam() looks (scripts/test runs it).
INSTALL_SAM = "scripts/install-sam"
SAM_MISSING = f"SAM CLI not installed: run {INSTALL_SAM} (./scripts/test does on first use)"


def find_sam() -> str | None:
    """SAM_CLI if set, else .venv-sam/bin/sam in the repository, else sam on PATH."""
    candidates = [
        os.environ.get("SAM_CLI"),
        str(ROOT / ".venv-sam" / "bin" / "sam"),
        shutil.which("sam"),
    ]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def require_sam() -> str:
    """The SAM CLI, or skip the test saying how to install it."""
    import pytest

    sam_cli = find_sam()
    if sam_cli is None:
        pytest.skip(SAM_MISSING)
    return sam_cli


# ---- the Lambda runtime's Python --------------------------------------------------------------

#: The Python of the functions' runtime (python3.13): the built layer holds extension modules
#: for it only, so importing the layer needs that interpreter, not the one running the tests.
LAMBDA_PYTHON = "3.13"


def _runs(python: str) -> bool:
    try:
        result = subprocess.run([python, "-c", "import sys; print(sys.version_info[:2])"],
                                capture_output=True, text=True, timeout=30)
    except OSError:
        return False
    major, minor = LAMBDA_PYTHON.split(".")
    return result.returncode == 0 and result.stdout.strip() == f"({major}, {minor})"


def find_lambda_python() -> str | None:
    """LEASEQ_LAMBDA_PYTHON if set, else a working python3.13 on PATH, else pyenv's."""
    candidates = [os.environ.get("LEASEQ_LAMBDA_PYTHON"), shutil.which(f"python{LAMBDA_PYTHON}")]
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += sorted(str(p) for p in pyenv_root.glob(
        f"versions/{LAMBDA_PYTHON}*/bin/python{LAMBDA_PYTHON}"))
    for candidate in candidates:
        if candidate and _runs(candidate):
            return candidate
    return None


def require_lambda_python() -> str:
    import pytest

    python = find_lambda_python()
    if python is None:
        pytest.skip(f"no Python {LAMBDA_PYTHON} to import the built layer with: run "
                    f"`pyenv install {LAMBDA_PYTHON}` (or set LEASEQ_LAMBDA_PYTHON)")
    return python


@functools.cache
def stand_in_rds_bundle() -> Path:
    """A bundle of CAs named like the RDS CAs, made once per run: the certificates layer
    cannot be built without one, and the real one cannot be downloaded here."""
    from tests.support.tls_server import write_rds_like_bundle

    directory = Path(tempfile.mkdtemp(prefix="leaseq-rds-bundle-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return write_rds_like_bundle(directory / "global-bundle.pem")


def sam_environment() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        SAM_CLI_TELEMETRY="0",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_REGION="us-east-1",
        # layer/Makefile runs pip with the first python3 on PATH: the test interpreter's
        # environment, whatever its version (pip is told the target platform and Python).
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        # certificates/Makefile takes the RDS CA bundle from here instead of downloading.
        LEASEQ_RDS_CA_BUNDLE=str(stand_in_rds_bundle()),
    )
    # layer/Makefile compiles the layer's bytecode with a python3.13; without one here the
    # layer is built without it (the tests that look at the bytecode skip, naming why).
    lambda_python = find_lambda_python()
    if lambda_python:
        env["LAMBDA_PYTHON_BIN"] = lambda_python
    else:
        env["LAYER_BYTECODE"] = "no"
    return env
