"""layer/requirements.txt pins what the Lambda layer ships; pyproject.toml states what the
library accepts. A pin outside those ranges would deploy code the tests never ran against."""

from __future__ import annotations

import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.infra.template_support import ROOT

#: Provided by the python3.13 Lambda runtime, so not bundled.
RUNTIME_PROVIDED = {"boto3"}


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


def test_every_runtime_dependency_is_pinned_exactly_in_the_layer_within_pyprojects_range() -> None:
    pins = layer_pins()
    wanted = project_requirements()

    assert set(wanted) - RUNTIME_PROVIDED == set(pins), "layer and pyproject list other packages"
    for name, pin in pins.items():
        (specifier,) = pin.specifier
        assert specifier.operator == "==", f"{name}: pin an exact version"
        assert wanted[name].specifier.contains(specifier.version), (
            f"{name}=={specifier.version} is outside pyproject's {wanted[name].specifier}")
        assert wanted[name].extras <= pin.extras, f"{name}: extras {wanted[name].extras} missing"


def test_psycopg_is_pinned_with_its_binary_extra_since_lambda_has_no_libpq() -> None:
    assert "binary" in layer_pins()["psycopg"].extras
