"""The release artifacts of scripts/build-release, built once per test module.

``LEASEQ_RELEASE_DIST`` names a folder scripts/build-release already filled (CI builds
once and tests what it built); otherwise the artifacts are built into a temporary folder.
The release tests install the wheel; the example handler project's tests deploy leaseq
from the unpacked sdist, as a user of a release does.
"""

from __future__ import annotations

import os
import subprocess
import tarfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VERSION: str = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))[
    "project"]["version"]


@dataclass(frozen=True)
class Release:
    """The two files a release is."""

    wheel: Path
    sdist: Path

    def unpack_sdist(self, into: Path) -> Path:
        """Unpack the source release into ``into`` (its top folder stripped), as a user
        unpacks it into a project; returns ``into``."""
        prefix = f"leaseq-{VERSION}/"
        into.mkdir(parents=True, exist_ok=True)
        with tarfile.open(self.sdist) as sdist:
            members = [m for m in sdist.getmembers() if m.name.startswith(prefix)]
            for member in members:
                member.name = member.name.removeprefix(prefix)
            sdist.extractall(into, members=[m for m in members if m.name], filter="data")
        return into


def built_release(scratch: Path) -> Release:
    """The release in ``LEASEQ_RELEASE_DIST``, or one built into ``scratch`` now."""
    prebuilt = os.environ.get("LEASEQ_RELEASE_DIST")
    folder = Path(prebuilt) if prebuilt else scratch
    if not prebuilt:
        done = subprocess.run([str(ROOT / "scripts" / "build-release"), str(folder)],
                              capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-4000:]
    found = Release(folder / f"leaseq-{VERSION}-py3-none-any.whl",
                    folder / f"leaseq-{VERSION}.tar.gz")
    assert found.wheel.is_file(), f"no wheel of version {VERSION} in {folder}"
    assert found.sdist.is_file(), f"no sdist of version {VERSION} in {folder}"
    return found
