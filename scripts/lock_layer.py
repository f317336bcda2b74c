"""Write the Lambda layer's locks: layer/requirements-<arch>.lock from layer/requirements.txt.

A lock lists every package the layer holds for one architecture, transitive ones
included, at one version, with the sha256 of the one wheel pip installs for that
platform. Two tools, each for what it does best:

1. ``uv pip compile`` resolves requirements.txt for the target itself (python3.13 on
   manylinux_2_34 of the architecture), so environment markers are evaluated for 3.13
   and not for the machine's Python, which is what pip would do. It leaves out the
   packages the Lambda runtime provides (``RUNTIME_SDK``; see requirements.txt for why).
   Its hashes cover every file of each release, for every platform (uv has no option
   to keep only the target's).
2. ``pip install --dry-run --report`` with exactly the options layer/Makefile passes
   (``make pip-target-<arch>``) then picks the wheel a build takes, checking it against
   uv's hashes, and its report gives that file's name and sha256: the lock keeps that
   one hash, so a lock names the exact bytes of its layer.

``--check`` writes nothing and exits 1 when a committed lock differs from a fresh one
(new wheels uploaded for a pinned version, or a pin changed without relocking). Both
modes need the package index.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parent.parent
LAYER = ROOT / "layer"
ARCHITECTURES = ("x86_64", "aarch64")
#: Amazon Linux 2023's glibc: the manylinux level uv resolves for.
GLIBC = "2_34"
#: The Lambda runtime's SDK: boto3 and what only it and botocore need. Never locked.
RUNTIME_SDK = ("boto3", "botocore", "s3transfer", "urllib3", "python-dateutil", "six")

_PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==(?P<version>\S+)")


def lock_path(arch: str) -> Path:
    return LAYER / f"requirements-{arch}.lock"


def pip_target(arch: str) -> list[str]:
    """The pip options layer/Makefile installs with for ``arch``."""
    done = subprocess.run(["make", "-s", "-C", str(LAYER), f"pip-target-{arch}"],
                          capture_output=True, text=True, check=True)
    return done.stdout.split()


def resolve(arch: str, work: Path) -> str:
    """uv's resolution for python3.13 on ``arch``, with every file's hash."""
    out = work / f"{arch}.resolved.txt"
    command = [sys.executable, "-m", "uv", "pip", "compile", str(LAYER / "requirements.txt"),
               "--python-version", "3.13", "--python-platform", f"{arch}-manylinux_{GLIBC}",
               "--only-binary", ":all:", "--generate-hashes", "--no-header",
               "--output-file", str(out), "--quiet"]
    for name in RUNTIME_SDK:
        command += ["--no-emit-package", name]
    subprocess.run(command, check=True, cwd=ROOT)
    return out.read_text(encoding="utf-8")


@dataclass(frozen=True)
class Chosen:
    """The wheel pip takes for one package on the target."""

    version: str
    filename: str
    sha256: str


def choose(arch: str, resolved: str, work: Path) -> dict[str, Chosen]:
    """What a build of ``resolved`` installs: pip's own choice, as layer/Makefile runs it."""
    requirements = work / f"{arch}.requirements.txt"
    requirements.write_text(resolved, encoding="utf-8")
    report = work / f"{arch}.report.json"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--disable-pip-version-check", "--require-hashes", "--no-deps", *pip_target(arch),
         "--target", str(work / f"{arch}.target"), "--report", str(report),
         "--requirement", str(requirements)],
        check=True)
    chosen = {}
    for item in json.loads(report.read_text(encoding="utf-8"))["install"]:
        info = item["download_info"]
        chosen[canonical(item["metadata"]["name"])] = Chosen(
            version=item["metadata"]["version"],
            filename=unquote(Path(urlsplit(info["url"]).path).name),
            sha256=info["archive_info"]["hashes"]["sha256"])
    return chosen


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def render(arch: str, resolved: str, chosen: dict[str, Chosen]) -> str:
    """The lock: uv's pins and their "via" notes, each with the one hash pip took."""
    lines = [
        f"# The leaseq Lambda layer's packages for python3.13 on Amazon Linux 2023, {arch}.",
        "# Written by scripts/lock-layer from requirements.txt; do not edit by hand.",
        "# layer/Makefile installs it with --require-hashes --no-deps: each hash is the one",
        "# wheel a build takes for this platform. Left out (provided by the Lambda runtime):",
        f"# {', '.join(RUNTIME_SDK)}.",
    ]
    seen = set()
    for line in resolved.splitlines():
        pin = _PIN.match(line)
        if pin:
            name = canonical(pin["name"])
            wheel = chosen[name]
            if wheel.version != pin["version"]:
                raise SystemExit(f"{name}: uv resolved {pin['version']}, pip took {wheel.version}")
            seen.add(name)
            lines += [f"{line.split(' ', 1)[0]} \\", f"    --hash=sha256:{wheel.sha256}",
                      f"    # {wheel.filename}"]
        elif line.lstrip().startswith("#"):
            lines.append(line)
    if seen != set(chosen):
        raise SystemExit(f"pip installed what uv did not list: {sorted(set(chosen) - seen)}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with the committed locks instead of writing them")
    args = parser.parse_args(argv)
    stale = []
    with tempfile.TemporaryDirectory(prefix="leaseq-lock-") as scratch:
        work = Path(scratch)
        for arch in ARCHITECTURES:
            resolved = resolve(arch, work)
            text = render(arch, resolved, choose(arch, resolved, work))
            path = lock_path(arch)
            if args.check:
                if not path.is_file() or path.read_text(encoding="utf-8") != text:
                    stale.append(path.name)
            else:
                path.write_text(text, encoding="utf-8")
                print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print(f"out of date: {', '.join(stale)}; run scripts/lock-layer", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
