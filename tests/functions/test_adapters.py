"""Each ``functions/<name>/app.py`` (the template's ``Handler: app.lambda_handler``) only
re-exports the handler of its package module, where the function's code and its tests
live."""

from __future__ import annotations

import ast
import importlib
import importlib.util

import pytest

from tests.functions.conftest import HANDLER_MODULES, ROOT

#: The one function whose code stays in its folder: the migrations custom resource, a
#: set of top-level modules (cfn_response, runtime_role, ...) that its tests import as
#: Lambda does.
FOLDER_FUNCTIONS = {"migrations"}


def test_every_function_folder_but_the_custom_resources_is_an_adapter_of_a_package_module(
) -> None:
    folders = {path.parent.name for path in (ROOT / "functions").glob("*/app.py")}

    assert folders - FOLDER_FUNCTIONS == set(HANDLER_MODULES)


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
