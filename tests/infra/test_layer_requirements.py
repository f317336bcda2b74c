"""layer/requirements.txt pins what the Lambda layer ships; pyproject.toml states what the
library accepts. A pin outside those ranges would deploy code the tests never ran against.

layer/requirements-<arch>.lock (scripts/lock-layer) is what a build installs: every
package of the layer at one version with the hash of one wheel. The built layer itself is
checked against the locks in test_sam_build.py.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from tests.infra.template_support import ROOT

#: Provided by the python3.13 Lambda runtime, so not bundled: boto3 and what only it and
#: botocore need (distribution names). See layer/requirements.txt for why.
RUNTIME_SDK = frozenset({"boto3", "botocore", "s3transfer", "urllib3", "python-dateutil", "six"})
ARCHITECTURES = ("x86_64", "aarch64")


def layer_pins() -> dict[str, Requirement]:
    pins: dict[str, Requirement] = {}
    for line in (ROOT / "layer" / "requirements.txt").read_text(encoding="utf-8").splitlines():
        text = line.split("#", 1)[0].strip()
        if text:
            requirement = Requirement(text)
            pins[canonicalize_name(requirement.name)] = requirement
    return pins


def project_requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    texts = [*project["dependencies"], *extras["lambda"], *extras["dashboard"]]
    # The dashboard extra names leaseq[lambda] itself: covered by the line above.
    return {canonicalize_name(Requirement(t).name): Requirement(t) for t in texts
            if canonicalize_name(Requirement(t).name) != "leaseq"}


@dataclass(frozen=True)
class Locked:
    """One package of a lock: its pin, its hashes and the wheel file it names."""

    requirement: Requirement
    hashes: tuple[str, ...]
    wheel: str

    @property
    def version(self) -> str:
        (specifier,) = self.requirement.specifier
        return specifier.version


_HASH = re.compile(r"--hash=(sha256:[0-9a-f]{64})")


def read_lock(arch: str) -> dict[str, Locked]:
    """The packages of layer/requirements-<arch>.lock, by canonical name."""
    text = (ROOT / "layer" / f"requirements-{arch}.lock").read_text(encoding="utf-8")
    entries: dict[str, Locked] = {}
    for block in re.split(r"\n(?=\S)", text):
        head = block.split("\n", 1)[0]
        if head.startswith("#") or not head.strip():
            continue
        requirement = Requirement(head.rstrip("\\ "))
        wheels = re.findall(r"^\s+# (\S+\.whl)$", block, flags=re.MULTILINE)
        entries[canonicalize_name(requirement.name)] = Locked(
            requirement, tuple(_HASH.findall(block)), wheels[0] if wheels else "")
    return entries


def test_every_runtime_dependency_is_pinned_exactly_in_the_layer_within_pyprojects_range() -> None:
    pins = layer_pins()
    wanted = project_requirements()

    assert set(wanted) - {"boto3"} == set(pins), "layer and pyproject list other packages"
    for name, pin in pins.items():
        (specifier,) = pin.specifier
        assert specifier.operator == "==", f"{name}: pin an exact version"
        assert wanted[name].specifier.contains(specifier.version), (
            f"{name}=={specifier.version} is outside pyproject's {wanted[name].specifier}")
        assert wanted[name].extras <= pin.extras, f"{name}: extras {wanted[name].extras} missing"


def test_psycopg_is_pinned_with_its_binary_extra_since_lambda_has_no_libpq() -> None:
    assert "binary" in layer_pins()["psycopg"].extras


def test_the_librarys_own_ranges_are_compatible_ranges_never_exact_pins() -> None:
    """Users install leaseq into their own projects: an exact pin there would clash. (The
    dev extra pins its linters on purpose: it is the project's own tool set.)"""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    texts = [*project["dependencies"], *extras["lambda"], *extras["dashboard"], *extras["local"]]
    requirements = [Requirement(t) for t in texts]
    for requirement in (r for r in requirements if canonicalize_name(r.name) != "leaseq"):
        name = requirement.name
        operators = {s.operator for s in requirement.specifier}
        assert not operators & {"==", "==="}, f"{name}: {requirement}"
        assert any(op in (">=", "~=") for op in operators), f"{name}: no lower bound"
        assert any(op in ("<", "~=") for op in operators), f"{name}: no upper bound"


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_each_lock_names_one_wheel_for_its_architecture_with_its_hash(arch: str) -> None:
    lock = read_lock(arch)

    assert len(lock) > len(layer_pins()), "the lock lists the transitive packages too"
    for name, entry in lock.items():
        assert len(entry.hashes) == 1, f"{name}: one hash, of the wheel a build takes"
        (specifier,) = entry.requirement.specifier
        assert specifier.operator == "==", name
        wheel_name, wheel_version, _, tags = parse_wheel_filename(entry.wheel)
        assert (wheel_name, str(wheel_version)) == (name, entry.version), entry.wheel
        platforms = {tag.platform for tag in tags}
        assert platforms == {"any"} or all(p.endswith(f"_{arch}") for p in platforms), (
            f"{entry.wheel} is not for {arch}")


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_each_lock_holds_every_top_level_pin_and_none_of_the_runtimes_sdk(arch: str) -> None:
    lock = read_lock(arch)

    for name, pin in layer_pins().items():
        assert name in lock, f"{name} is pinned in requirements.txt but not locked"
        assert lock[name].requirement.specifier == pin.specifier, (
            f"{name}: requirements.txt says {pin.specifier}, the lock "
            f"{lock[name].requirement.specifier}: run scripts/lock-layer")
    assert sorted(RUNTIME_SDK & set(lock)) == []
    assert {"typing-extensions", "wrapt", "pydantic-core", "psycopg-binary"} <= set(lock)


def test_the_lock_script_leaves_out_the_same_runtime_packages_as_these_tests() -> None:
    spec = importlib.util.spec_from_file_location("lock_layer", ROOT / "scripts" / "lock_layer.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]

    assert frozenset(module.RUNTIME_SDK) == RUNTIME_SDK
    assert tuple(module.ARCHITECTURES) == ARCHITECTURES


def test_a_build_refuses_a_wheel_whose_hash_is_not_the_locked_one(tmp_path: Path) -> None:
    """layer/Makefile installs with --require-hashes: a changed file never gets in."""
    layer = tmp_path / "layer"
    shutil.copytree(ROOT / "layer", layer, symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    lock = layer / "requirements-x86_64.lock"
    good = read_lock("x86_64")["typing-extensions"].hashes[0]
    lock.write_text(lock.read_text(encoding="utf-8").replace(good, "sha256:" + "0" * 64),
                    encoding="utf-8")

    done = subprocess.run(
        ["make", "-C", str(layer), "build-LeaseqLayerX8664", "LAYER_BYTECODE=no",
         f"ARTIFACTS_DIR={tmp_path / 'out'}", f"PYTHON={sys.executable}"],
        capture_output=True, text=True, timeout=300, check=False)

    assert done.returncode != 0
    assert "DO NOT MATCH THE HASHES" in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "out" / "python" / "typing_extensions.py").exists()
