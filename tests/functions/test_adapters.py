"""Each ``functions/<name>/app.py`` (the template's ``Handler: app.lambda_handler``) only
re-exports the handler of its package module, where the function's code and its tests
live."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import subprocess
import sys

import pytest

from tests.functions.conftest import HANDLER_MODULES, ROOT


def test_every_function_folder_is_an_adapter_of_a_package_module() -> None:
    """The migrations custom resource too: no function keeps code in its folder."""
    folders = {path.name for path in (ROOT / "functions").glob("*")
               if path.is_dir() and path.name != "__pycache__"}

    assert folders == set(HANDLER_MODULES)
    assert all(sorted(p.name for p in (ROOT / "functions" / f).glob("*.py")) == ["app.py"]
               for f in folders)


@pytest.mark.parametrize(("function", "module"), sorted(HANDLER_MODULES.items()))
def test_a_functions_app_py_exposes_its_package_modules_handler(
    function: str, module: str,
) -> None:
    path = ROOT / "functions" / function / "app.py"
    spec = importlib.util.spec_from_file_location(f"leaseq_test_{function}_adapter", path)
    assert spec is not None
    assert spec.loader is not None
    adapter = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(adapter)

    assert adapter.lambda_handler is importlib.import_module(module).lambda_handler


@pytest.mark.parametrize("function", sorted(HANDLER_MODULES))
def test_a_functions_app_py_holds_no_code_of_its_own(function: str) -> None:
    tree = ast.parse((ROOT / "functions" / function / "app.py").read_text(encoding="utf-8"))
    statements = tree.body[1:] if ast.get_docstring(tree) else tree.body

    kinds = [type(statement).__name__ for statement in statements]

    assert kinds == ["ImportFrom", "Assign"]
    assert ast.unparse(statements[0]) == (
        f"from {HANDLER_MODULES[function]} import lambda_handler")
    assert ast.unparse(statements[1]) == "__all__ = ['lambda_handler']"


def test_the_migrations_handler_imports_with_the_standard_library_alone() -> None:
    """The custom resource must answer CloudFormation even when the rest of the layer
    cannot be imported (it imports the library inside its guarded block): importing its
    handler loads neither the library nor psycopg."""
    code = ("import json, sys\n"
            f"sys.path.insert(0, {str(ROOT / 'functions' / 'migrations')!r})\n"
            "import app\n"
            "print(json.dumps(sorted({n.split('.')[0] for n in sys.modules})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))

    assert "leaseq_deploy" in loaded
    assert not loaded & {"leaseq", "leaseq_lambda", "leaseq_dashboard", "psycopg", "pydantic"}
