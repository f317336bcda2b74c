"""A frozen copy of the code under test, taken when the run starts.

A run lasts minutes and the working tree may change meanwhile (SQL and library edits
that belong together). Every process of the run imports leaseq, its Lambda glue and
the worker function from this copy, and applies the SQL files copied with it, so one
run measures one version of the code from its first line to its last.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent.parent

_root: Path | None = None


def freeze(*, stack: bool = False) -> Path:
    """Copy layer/leaseq (with its SQL), layer/leaseq_lambda and functions/worker.

    With ``stack`` (the elastic benchmark, which runs the template's functions on the
    local Lambda service): the whole layer/, every function's folder, template.yaml and
    the local service itself, so that the service reads the copied template and runs
    the copied code (its CodeUri and layer folders resolve next to the template).
    """
    global _root
    if _root is not None:
        return _root
    root = Path(tempfile.mkdtemp(prefix="leaseq-bench-code-"))
    atexit.register(shutil.rmtree, root, True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    # symlinks=False: leaseq/_sql points at the top-level sql/, whose files are copied.
    if stack:
        shutil.copytree(REPO_DIR / "layer", root / "layer", symlinks=False, ignore=ignore)
        shutil.copytree(REPO_DIR / "functions", root / "functions", ignore=ignore)
        shutil.copy2(REPO_DIR / "template.yaml", root / "template.yaml")
        shutil.copytree(REPO_DIR / "local", root / "local", ignore=ignore)
        if (REPO_DIR / "certificates").is_dir():  # a layer of the template (CA bundles)
            shutil.copytree(REPO_DIR / "certificates", root / "certificates", ignore=ignore)
    else:
        for package in ("leaseq", "leaseq_lambda"):
            shutil.copytree(REPO_DIR / "layer" / package, root / "layer" / package,
                            symlinks=False, ignore=ignore)
        worker = REPO_DIR / "functions" / "worker"
        if worker.exists():
            shutil.copytree(worker, root / "functions" / "worker", ignore=ignore)
    paths = [str(root / "layer")] + ([str(root / "local")] if stack else [])
    for path in reversed(paths):
        sys.path.insert(0, path)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (*paths, os.environ.get("PYTHONPATH", "")) if p)
    _root = root
    return root


def template_path() -> Path:
    """The template the local Lambda service reads: the frozen copy's, once frozen."""
    return (_root or REPO_DIR) / "template.yaml"


def layer_dir() -> Path:
    return (_root or REPO_DIR) / "layer"


def worker_function_dir() -> Path:
    return (_root or REPO_DIR) / "functions" / "worker"


def revision() -> str:
    """The checkout's commit, with "+changes" when sql/, layer/, functions/ or the
    template differ."""
    def git(*cmd: str) -> str:
        done = subprocess.run(["git", *cmd], capture_output=True, text=True,
                              cwd=REPO_DIR, check=False)
        return done.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "sql", "layer", "functions", "template.yaml",
                "local")
    return commit + ("+changes" if dirty else "")
