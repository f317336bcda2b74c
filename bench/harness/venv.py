"""The benchmark's own environment, so the peers never land in the project's venv.

Standard library only: this module runs under whatever ``python3`` started the
benchmark, builds ``bench/.venv`` when it is missing or its requirements changed, and
re-executes the command inside it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent.parent
REPO_DIR = BENCH_DIR.parent
VENV_DIR = BENCH_DIR / ".venv"
REQUIREMENTS = BENCH_DIR / "requirements.txt"
STAMP = VENV_DIR / ".bench-requirements.sha256"


def venv_python() -> Path:
    return VENV_DIR / "bin" / "python"


def _fingerprint() -> str:
    digest = hashlib.sha256(REQUIREMENTS.read_bytes())
    digest.update((REPO_DIR / "pyproject.toml").read_bytes())
    return digest.hexdigest()


def _inside_venv() -> bool:
    return Path(sys.prefix).resolve() == VENV_DIR.resolve()


def _install() -> None:
    print(f"building the benchmark environment in {VENV_DIR.relative_to(REPO_DIR)} ...", flush=True)
    if not venv_python().exists():
        venv.EnvBuilder(with_pip=True, clear=False).create(VENV_DIR)
    pip = [str(venv_python()), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "-r", str(REQUIREMENTS)], check=True)
    # The Lambda extra brings what the worker handler module imports (for its import time).
    subprocess.run([*pip, "-e", f"{REPO_DIR}[lambda]"], check=True)
    STAMP.write_text(_fingerprint(), encoding="utf-8")


def ensure_and_reexec(argv: list[str]) -> None:
    """Return when running inside an up-to-date ``bench/.venv``; else build it and exec."""
    up_to_date = STAMP.exists() and STAMP.read_text(encoding="utf-8") == _fingerprint()
    if _inside_venv() and up_to_date:
        return
    if not up_to_date:
        _install()
    script = BENCH_DIR / "run.py"
    os.execv(str(venv_python()), [str(venv_python()), str(script), *argv])  # noqa: S606
