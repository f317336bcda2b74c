"""Cold start of the worker function, this tree against an earlier commit, in one run.

``python3 bench/run.py cold-start --base REV``. For each of the two trees (REV, exported
with ``git archive``, and the working tree as it is), the Lambda layer of this machine's
architecture is built with that tree's own ``layer/Makefile``; then, interleaved so
that the rest of the machine's load falls on both alike:

* **lambda**: ``import app`` of functions/worker on a Python 3.13 that sees only the
  standard library, the function's folder, the built layer and a stand-in for the
  runtime's boto3/botocore (this environment's, compiled for 3.13), writing no bytecode: what a
  cold execution environment of the python3.13 runtime imports, from what the layer
  really holds (with or without its bytecode);
* **lambda, tracing on**: the same with ``LAMBDA_TASK_ROOT`` set, where Powertools'
  Tracer traces and so the X-Ray SDK is imported;
* **meter**: the benchmark's import meter (:func:`harness.secondary.import_time`) on
  the tree's sources with this Python, as the main benchmark reports it.

Wall and CPU time are medians; the ratios compare the two trees within the run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

from harness import secondary

REPO_DIR = Path(__file__).resolve().parent.parent.parent
RESULTS = REPO_DIR / "bench" / "results"
#: The runtime's SDK and what it needs, by import name (linked, not copied).
RUNTIME_SDK = ("boto3", "botocore", "s3transfer", "jmespath", "dateutil", "six", "urllib3")
#: One cold import in the isolated Python: wall and CPU ms, and what it loaded.
_PROBE = """
import json, sys, time
sys.path[:0] = {paths!r}
t = time.perf_counter(); c = time.process_time()
import app
wall, cpu = (time.perf_counter() - t) * 1000, (time.process_time() - c) * 1000
print(json.dumps({{"wall_ms": wall, "cpu_ms": cpu, "modules": len(sys.modules),
                  "xray": "aws_xray_sdk" in sys.modules}}))
"""


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/run.py cold-start", description=__doc__)
    p.add_argument("--base", default="HEAD", help="the commit to compare with (%(default)s)")
    p.add_argument("--repeats", type=int, default=9, help="imports per tree and mode")
    p.add_argument("--lambda-python", default=None,
                   help="a Python 3.13 (default: python3.13 on PATH, else pyenv's)")
    p.add_argument("--out", type=Path, default=None, help="JSON results file")
    return p.parse_args(argv)


def find_python313(given: str | None) -> str:
    candidates = [given, shutil.which("python3.13")]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += sorted(str(p) for p in pyenv.glob("versions/3.13*/bin/python3.13"))
    for candidate in filter(None, candidates):
        done = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2])"],
                              capture_output=True, text=True, check=False)
        if done.returncode == 0 and done.stdout.strip() == "(3, 13)":
            return candidate
    raise SystemExit("no Python 3.13 found: pass --lambda-python")


def export(rev: str | None, into: Path) -> Path:
    """The tree of ``rev`` (git archive), or of the working tree when ``rev`` is None."""
    into.mkdir(parents=True)
    if rev is None:
        for name in ("layer", "functions", "sql"):
            shutil.copytree(REPO_DIR / name, into / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        return into
    archive = subprocess.run(["git", "archive", rev, "layer", "functions", "sql"],
                             cwd=REPO_DIR, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def host_layer() -> str:
    machine = os.uname().machine
    return {"x86_64": "LeaseqLayerX8664", "aarch64": "LeaseqLayerArm64"}[machine]


def build_layer(tree: Path, python313: str) -> Path:
    out = tree / "built"
    subprocess.run(["make", "-s", "-C", str(tree / "layer"), f"build-{host_layer()}",
                    f"ARTIFACTS_DIR={out}", f"LAMBDA_PYTHON_BIN={python313}",
                    f"PYTHON={sys.executable}"], check=True, capture_output=True)
    return out / "python"


def runtime_stand_in(into: Path, python313: str) -> Path:
    """A copy of this environment's boto3 and what it needs, compiled by the Python 3.13
    (the runtime ships its SDK with bytecode: without it, every traced import would
    compile botocore)."""
    into.mkdir()
    for name in RUNTIME_SDK:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise SystemExit(f"{name} is not installed here (the runtime's SDK stand-in)")
        origin = Path(spec.origin)
        if origin.name == "__init__.py":
            shutil.copytree(origin.parent, into / origin.parent.name,
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(origin, into / origin.name)
    subprocess.run([python313, "-m", "compileall", "-q", "-j", "0", str(into)],
                   capture_output=True, check=True)
    return into


def probe(python313: str, paths: list[Path], *, tracing: bool) -> dict[str, Any]:
    env = {"PATH": os.environ.get("PATH", ""), "AWS_DEFAULT_REGION": "us-east-1",
           "POWERTOOLS_SERVICE_NAME": "leaseq", "POWERTOOLS_METRICS_NAMESPACE": "Leaseq",
           "AWS_LAMBDA_FUNCTION_NAME": "leaseq-worker",
           "DATABASE_URL": "postgresql://bench@127.0.0.1:9/none"}
    if tracing:
        env["LAMBDA_TASK_ROOT"] = str(paths[0])
    code = _PROBE.format(paths=[str(p) for p in paths])
    done = subprocess.run([python313, "-I", "-S", "-B", "-c", code], env=env, cwd=paths[0],
                          capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def summarise(samples: list[dict[str, Any]]) -> dict[str, Any]:
    return {"wall_median_ms": statistics.median(s["wall_ms"] for s in samples),
            "cpu_median_ms": statistics.median(s["cpu_ms"] for s in samples),
            "wall_min_ms": min(s["wall_ms"] for s in samples),
            "modules": samples[0]["modules"], "xray": samples[0]["xray"]}


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    python313 = find_python313(args.lambda_python)
    base = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=REPO_DIR,
                          capture_output=True, text=True, check=True).stdout.strip()
    scratch = Path(tempfile.mkdtemp(prefix="leaseq-cold-start-"))
    try:
        trees = {"base": export(args.base, scratch / "base"),
                 "current": export(None, scratch / "current")}
        runtime = runtime_stand_in(scratch / "runtime", python313)
        layers = {name: build_layer(tree, python313) for name, tree in trees.items()}
        samples: dict[str, list[dict[str, Any]]] = {}
        meters: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
        for _ in range(args.repeats):
            for name, tree in trees.items():
                paths = [tree / "functions" / "worker", layers[name], runtime]
                for tracing in (False, True):
                    key = f"{name}/lambda{'-traced' if tracing else ''}"
                    samples.setdefault(key, []).append(probe(python313, paths, tracing=tracing))
                meters[name].append(secondary.import_time(
                    1, function_dir=tree / "functions" / "worker", layer_dir=tree / "layer",
                    profiles=0))
        results: dict[str, Any] = {
            "base": base, "repeats": args.repeats, "python313": python313,
            "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "layer_bytes": {name: sum(p.stat().st_size for p in layer.rglob("*") if p.is_file())
                            for name, layer in layers.items()},
            "modes": {key: summarise(runs) for key, runs in samples.items()},
        }
        for name, runs in meters.items():
            results["modes"][f"{name}/meter"] = {
                "wall_median_ms": statistics.median(r["median_ms"] for r in runs),
                "cpu_median_ms": statistics.median(r["cpu_median_ms"] for r in runs)}
        for name, tree in trees.items():
            results[f"{name}_by_package"] = secondary.import_time(
                1, function_dir=tree / "functions" / "worker", layer_dir=tree / "layer",
                profiles=5)["by_package"]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(render(results))
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = args.out or RESULTS / f"cold-start-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(results, indent=2), encoding="utf-8")
    print(f"\nresults: {out}")
    return 0


def render(results: dict[str, Any]) -> str:
    modes = results["modes"]
    lines = [f"cold import of functions/worker/app.py, {results['repeats']} runs each, "
             f"base {results['base']} vs the working tree",
             "", "| mode | base wall | base CPU | now wall | now CPU | CPU now/base |",
             "|---|--:|--:|--:|--:|--:|"]
    for mode in ("lambda", "lambda-traced", "meter"):
        before, after = modes[f"base/{mode}"], modes[f"current/{mode}"]
        lines.append(f"| {mode} | {before['wall_median_ms']:.0f} ms | "
                     f"{before['cpu_median_ms']:.0f} ms | {after['wall_median_ms']:.0f} ms | "
                     f"{after['cpu_median_ms']:.0f} ms | "
                     f"{after['cpu_median_ms'] / before['cpu_median_ms']:.2f}× |")
    sizes = results["layer_bytes"]
    lines.append(f"\nlayer ({host_layer()}) unpacked: base {sizes['base'] / 2**20:.1f} MiB, "
                 f"now {sizes['current'] / 2**20:.1f} MiB")
    for name in ("base", "current"):
        top = ", ".join(f"{m['package']} {m['self_ms']:.0f}"
                        for m in results[f"{name}_by_package"][:8])
        lines.append(f"meter by package ({name}, ms, median of 5): {top}")
    return "\n".join(lines)
