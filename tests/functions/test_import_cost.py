"""What importing a function loads: a cold start pays for every module of it.

Not timed (the timings are in bench/ and docs/benchmarks.md): these check which modules
an import brings, each in a fresh interpreter, because Powertools' Tracer keeps its
configuration for the whole process and a module imported once stays imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aws_lambda_powertools import Tracer
from leaseq_lambda import telemetry

from tests.functions.conftest import HANDLER_MODULES

ROOT = Path(__file__).resolve().parents[2]
FUNCTIONS = ("worker", "reaper", "enqueue")
#: The X-Ray SDK, and the parts of botocore it builds a client with (Powertools itself
#: imports botocore's top-level package, a few small modules, to tag its user agent).
TRACING_MODULES = ("aws_xray_sdk", "botocore.session", "botocore.client", "boto3")


def run_fresh(code: str, **environ: str) -> dict[str, Any]:
    """Run ``code`` in a new interpreter with the environment the stack gives a function."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LEASEQ_", "POWERTOOLS_", "AWS_", "LAMBDA_", "_X_AMZN"))}
    env.update({"PYTHONPATH": os.pathsep.join([str(ROOT / "layer"), str(ROOT)]),
                "POWERTOOLS_SERVICE_NAME": "leaseq", "POWERTOOLS_METRICS_NAMESPACE": "Leaseq",
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_LAMBDA_FUNCTION_NAME": "leaseq-worker",
                "DATABASE_URL": "postgresql://nobody@127.0.0.1:9/none", **environ})
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def import_function(function: str, **environ: str) -> dict[str, Any]:
    """Import functions/<function>/app.py as Lambda does; its tracer is its package
    module's (the adapter only re-exports the handler)."""
    return run_fresh(
        "import json, sys\n"
        f"sys.path.insert(0, {str(ROOT / 'functions' / function)!r})\n"
        "import app\n"
        f"tracer = getattr(sys.modules[{HANDLER_MODULES[function]!r}], 'tracer', None)\n"
        f"print(json.dumps({{'loaded': [m for m in {TRACING_MODULES!r}"
        " if any(n == m or n.startswith(m + '.') for n in sys.modules)],"
        " 'tracing': getattr(tracer, 'enabled', None),"
        " 'built': type(getattr(tracer, '_tracer', None)).__name__}))", **environ)


@pytest.mark.parametrize("function", FUNCTIONS)
def test_importing_a_function_with_tracing_off_loads_no_x_ray_sdk_and_no_botocore_client(
    function: str,
) -> None:
    found = import_function(function)  # outside Lambda: Powertools' Tracer would not trace

    assert found == {"loaded": [], "tracing": False, "built": "NoneType"}


def test_a_function_told_to_disable_tracing_in_lambda_loads_no_x_ray_sdk_either() -> None:
    found = import_function("worker", LAMBDA_TASK_ROOT=str(ROOT),
                            POWERTOOLS_TRACE_DISABLED="true")

    assert found == {"loaded": [], "tracing": False, "built": "NoneType"}


def test_in_lambda_with_tracing_on_the_tracer_is_built_at_import_and_patches_botocore() -> None:
    found = run_fresh(
        "import json, sys\n"
        f"sys.path.insert(0, {str(ROOT / 'functions' / 'worker')!r})\n"
        "import app\n"
        "from aws_xray_sdk.core import patcher\n"
        f"tracer = sys.modules[{HANDLER_MODULES['worker']!r}].tracer\n"
        "print(json.dumps({'tracing': tracer.enabled,"
        " 'built': type(tracer._tracer).__module__,"
        " 'patched': sorted(patcher._PATCHED_MODULES),"
        " 'xray': 'aws_xray_sdk.core' in sys.modules}))",
        LAMBDA_TASK_ROOT=str(ROOT))

    assert found == {"tracing": True, "built": "aws_lambda_powertools.tracing.tracer",
                     "patched": ["botocore"], "xray": True}


def test_a_disabled_tracer_hands_back_the_handler_and_drops_annotations_without_x_ray() -> None:
    found = run_fresh(
        "import json, sys\n"
        "from leaseq_lambda import telemetry\n"
        "tracer = telemetry.make_tracer()\n"
        "def handler(event, context):\n"
        "    return {'ok': event}\n"
        "plain = tracer.capture_lambda_handler(handler)\n"
        "configured = tracer.capture_lambda_handler(capture_response=False)(handler)\n"
        "tracer.put_annotation('claimed', 3)\n"
        "telemetry.annotate(tracer, {'claimed': 3, 'stopped': 'queue_empty'})\n"
        "print(json.dumps({'same': plain is handler and configured is handler,"
        " 'result': plain(1, None), 'xray': 'aws_xray_sdk' in sys.modules}))")

    assert found == {"same": True, "result": {"ok": 1}, "xray": False}


def test_a_disabled_tracer_builds_powertools_tracer_on_first_use_of_anything_else() -> None:
    found = run_fresh(
        "import json, sys\n"
        "from leaseq_lambda import telemetry\n"
        "tracer = telemetry.make_tracer()\n"
        "before = 'aws_xray_sdk' in sys.modules\n"
        "@tracer.capture_method\n"
        "def work(x):\n"
        "    return x + 1\n"
        "print(json.dumps({'before': before, 'after': 'aws_xray_sdk' in sys.modules,"
        " 'disabled': tracer.tracer.disabled, 'work': work(1),"
        " 'service': tracer.tracer.service}))")

    assert found == {"before": False, "after": True, "disabled": True, "work": 2,
                     "service": "leaseq"}


@pytest.mark.parametrize("environ", [
    {},
    {"LAMBDA_TASK_ROOT": "/var/task"},
    {"LAMBDA_TASK_ROOT": "/var/task", "POWERTOOLS_TRACE_DISABLED": "true"},
    {"LAMBDA_TASK_ROOT": "/var/task", "POWERTOOLS_TRACE_DISABLED": "1"},
    {"LAMBDA_TASK_ROOT": "/var/task", "POWERTOOLS_TRACE_DISABLED": "false"},
    {"LAMBDA_TASK_ROOT": "/var/task", "POWERTOOLS_TRACE_DISABLED": "0"},
    {"LAMBDA_TASK_ROOT": "/var/task", "AWS_SAM_LOCAL": "true"},
    {"LAMBDA_TASK_ROOT": "/var/task", "AWS_CHALICE_CLI_MODE": "true"},
    {"POWERTOOLS_TRACE_DISABLED": "false"},
    {"LAMBDA_TASK_ROOT": ""},
])
def test_tracing_is_on_exactly_where_powertools_own_tracer_would_trace(
    environ: dict[str, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key in ("LAMBDA_TASK_ROOT", "POWERTOOLS_TRACE_DISABLED", "AWS_SAM_LOCAL",
                "AWS_CHALICE_CLI_MODE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)

    # Powertools' own check (a private helper): a new Powertools release that changes
    # the rules fails here, instead of leaving a function untraced or paying for X-Ray.
    assert telemetry.tracing_enabled() is (not Tracer._is_tracer_disabled())
    assert telemetry.tracing_enabled(dict(environ)) is telemetry.tracing_enabled()
