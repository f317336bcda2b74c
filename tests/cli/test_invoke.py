"""What ``leaseq drain``, ``reap`` and ``demo`` run: the handlers of the package modules the
functions' ``app.py`` re-export, wherever the command runs; and where ``leaseq lambda
serve`` finds the template when none is given."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
from leaseq_cli import checkout, invoke

from tests.cli.conftest import REPO, Cli


def _adapter(function: str) -> ModuleType:
    """functions/<function>/app.py, imported as Lambda imports it (by its file)."""
    spec = importlib.util.spec_from_file_location(
        f"leaseq_test_{function}_adapter", REPO / "functions" / function / "app.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("function", ["worker", "reaper"])
def test_the_commands_invoke_the_very_handler_the_functions_app_py_exposes(
    function: invoke.Function,
) -> None:
    assert invoke.handler(function) is _adapter(function).lambda_handler


def test_reap_runs_the_packaged_reaper_from_a_directory_without_a_checkout_and_no_setting(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A functions/ folder here whose reaper would answer without a database, and the
    # setting that once pointed the commands at such a folder: neither is looked at.
    fake = tmp_path / "functions" / "reaper"
    fake.mkdir(parents=True)
    (fake / "app.py").write_text(
        "def lambda_handler(event, context):\n    return {'released': 42}\n", encoding="utf-8")
    monkeypatch.setenv("LEASEQ_FUNCTIONS_DIR", str(tmp_path / "functions"))
    monkeypatch.chdir(tmp_path)

    result = cli("reap", "--json")

    assert result.code == 0, result.err
    assert (result.json()["task"], result.json()["status"], result.json()["released"]) == (
        "reaper", "ok", 0)


def test_this_test_environment_is_installed_from_this_checkout() -> None:
    assert checkout.installed_from() == REPO


def test_the_template_of_the_installed_checkout_comes_before_the_current_directorys(
    tmp_path: Path,
) -> None:
    (tmp_path / "template.yaml").write_text("Resources: {}\n", encoding="utf-8")

    assert checkout.default_template(tmp_path, project=REPO) == REPO / "template.yaml"


def test_without_a_checkout_the_current_directorys_template_serves(tmp_path: Path) -> None:
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "template.yaml").write_text("Resources: {}\n", encoding="utf-8")

    found = checkout.default_template(tmp_path / "here", project=tmp_path / "wheel-install")

    assert found == tmp_path / "here" / "template.yaml"


def test_no_template_anywhere_is_none(tmp_path: Path) -> None:
    assert checkout.default_template(tmp_path / "b", project=tmp_path / "a") is None
