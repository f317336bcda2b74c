"""A throwaway second OS user, for the tests that check another local user is refused."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


@contextmanager
def another_os_user() -> Iterator[str]:
    """A throwaway local user, removed afterwards; skips where none may be made."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a second OS user (useradd) and act as it (runuser); "
                    "run the suite as root to check that another local user is refused")
    if shutil.which("useradd") is None or shutil.which("runuser") is None:
        pytest.skip("useradd or runuser is not installed, so no second OS user can be tried")
    name = f"lqprobe{secrets.token_hex(4)}"
    made = subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name],
                          capture_output=True, text=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"this machine does not allow creating a user: {made.stderr.strip()}")
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], capture_output=True, check=False)


def run_as(user: str, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as ``user`` (runuser), from /, with a bare environment."""
    runuser = shutil.which("runuser")
    assert runuser is not None
    return subprocess.run([runuser, "-u", user, "--", *argv], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, cwd="/",
                          input=stdin, timeout=60, check=False)
