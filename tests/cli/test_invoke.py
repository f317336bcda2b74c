"""Where ``leaseq drain``, ``reap`` and ``demo`` find the Lambda functions' code: an
explicit setting first, then the checkout leaseq was installed from, then the current
directory; never a guess from where the package's own files happen to be."""

from __future__ import annotations

from pathlib import Path

import pytest
from leaseq_cli import invoke
from leaseq_cli.failures import CliError

from tests.cli.conftest import REPO, Cli


def _functions(root: Path, released: int = 0) -> Path:
    """A functions/ folder whose reaper answers ``released`` without a database."""
    folder = root / "functions"
    for name in ("worker", "reaper"):
        (folder / name).mkdir(parents=True)
        (folder / name / "app.py").write_text(
            "def lambda_handler(event, context):\n"
            f"    return {{'task': {name!r}, 'released': {released}}}\n", encoding="utf-8")
    return folder


def test_the_setting_names_the_functions_folder_before_the_checkout_and_the_directory(
    tmp_path: Path,
) -> None:
    chosen = _functions(tmp_path / "chosen")

    found = invoke.functions_dir({"LEASEQ_FUNCTIONS_DIR": str(chosen)}, project=REPO,
                                 cwd=REPO)

    assert found == chosen.resolve()


def test_a_setting_naming_a_folder_without_the_functions_is_refused_not_passed_over(
    tmp_path: Path,
) -> None:
    (tmp_path / "empty").mkdir()

    with pytest.raises(CliError, match=r"LEASEQ_FUNCTIONS_DIR=.* holds no worker/app\.py"):
        invoke.functions_dir({"LEASEQ_FUNCTIONS_DIR": str(tmp_path / "empty")},
                             project=REPO, cwd=REPO)


def test_without_the_setting_the_installed_checkouts_functions_serve_from_any_directory(
    tmp_path: Path,
) -> None:
    _functions(tmp_path)  # the current directory's own functions/ come second

    assert invoke.functions_dir({}, project=REPO, cwd=tmp_path) == (REPO / "functions")


def test_without_setting_or_checkout_the_current_directorys_functions_serve(
    tmp_path: Path,
) -> None:
    here = _functions(tmp_path / "here")

    found = invoke.functions_dir({}, project=tmp_path / "wheel-install", cwd=here.parent)

    assert found == here.resolve()


def test_no_functions_anywhere_is_one_error_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(CliError, match="set LEASEQ_FUNCTIONS_DIR"):
        invoke.functions_dir({}, project=tmp_path / "a", cwd=tmp_path / "b")


def test_this_test_environment_is_installed_from_this_checkout() -> None:
    assert invoke.installed_from() == REPO


def test_reap_runs_the_reaper_of_the_folder_the_setting_names(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LEASEQ_FUNCTIONS_DIR", str(_functions(tmp_path, released=42)))

    result = cli("reap", "--json")

    assert result.code == 0, result.err
    assert result.json() == {"task": "reaper", "released": 42}
