"""The public API explains itself: every exported name has a docstring that says why, the
names a handler author meets first show an example, the examples run, and every error
type is raised somewhere.

Public means: the ``__all__`` of ``leaseq``, ``leaseq_lambda`` and ``leaseq_dashboard``,
the public methods of the classes they export, and the public classes and functions of
each of their modules whose name has no leading underscore (a module's own ``__all__``
when it has one). The examples run against the test database: an example that needs one
gets its URL as ``dsn``.
"""

from __future__ import annotations

import ast
import doctest
import importlib
import inspect
import logging
import pkgutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from leaseq.base import errors

from tests.conftest import Database

PACKAGES = ("leaseq", "leaseq_lambda", "leaseq_dashboard")
ROOT = Path(__file__).resolve().parents[2]

#: What a handler author meets first: each shows an example (doctest style).
WITH_EXAMPLES = (
    "leaseq.Registry", "leaseq.JobContext", "leaseq.Worker", "leaseq.WorkerConfig",
    "leaseq.ClaimedJob", "leaseq.JobOutcome", "leaseq.JobState", "leaseq.EnqueueRequest",
    "leaseq.EnqueueResult", "leaseq.RetryPolicy", "leaseq.RetryJob", "leaseq.DiscardJob",
    "leaseq.JobTimeout", "leaseq.ConfigurationError", "leaseq.LeaseqSettings",
    "leaseq.Deadline", "leaseq.MonotonicDeadline", "leaseq.current_job",
)


def public_modules() -> Iterator[ModuleType]:
    for name in PACKAGES:
        package = importlib.import_module(name)
        yield package
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{name}."):
            if not any(part.startswith("_") for part in info.name.split(".")):
                yield importlib.import_module(info.name)


def own_docstring(obj: Any) -> str | None:
    """The object's own docstring: not inherited, not the signature a dataclass or a
    named tuple writes for a class without one."""
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    if inspect.isclass(obj) and doc and doc.startswith(f"{obj.__name__}("):
        return None
    return doc.strip() if isinstance(doc, str) and doc.strip() else None


def exported() -> dict[str, Any]:
    return {f"{name}.{attribute}": getattr(importlib.import_module(name), attribute)
            for name in PACKAGES for attribute in importlib.import_module(name).__all__}


def module_members() -> dict[str, Any]:
    """The public classes and functions of every public module."""
    found = {}
    for module in public_modules():
        names = getattr(module, "__all__", None)
        for attribute in names if names is not None else list(vars(module)):
            obj = getattr(module, attribute)
            if attribute.startswith("_") or not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if names is None and obj.__module__ != module.__name__:
                continue  # imported here, checked where it is defined
            found[f"{module.__name__}.{attribute}"] = obj
    return found


def exported_methods() -> dict[str, Any]:
    found = {}
    for name, cls in exported().items():
        if not inspect.isclass(cls) or not cls.__module__.startswith(PACKAGES):
            continue
        for attribute, member in vars(cls).items():
            if attribute.startswith("_"):
                continue
            function = member.__func__ if isinstance(member, classmethod | staticmethod) else (
                member.fget if isinstance(member, property) else member)
            if inspect.isfunction(function):
                found[f"{name}.{attribute}"] = function
    return found


def test_every_exported_name_has_a_docstring() -> None:
    names = exported()
    assert len(names) > 40
    assert [name for name, obj in names.items()
            if (inspect.isclass(obj) or callable(obj)) and own_docstring(obj) is None] == []


def test_every_public_class_and_function_of_a_public_module_has_a_docstring() -> None:
    members = module_members()
    assert "leaseq.base.limits.Bounds" in members
    assert [name for name, obj in members.items() if own_docstring(obj) is None] == []


def test_every_public_method_of_an_exported_class_has_a_docstring() -> None:
    methods = exported_methods()
    assert "leaseq.Registry.register" in methods
    assert [name for name, function in methods.items() if own_docstring(function) is None] == []


def test_every_public_module_says_what_it_is_for() -> None:
    assert [m.__name__ for m in public_modules() if not (m.__doc__ or "").strip()] == []


def test_the_names_a_handler_author_meets_first_show_an_example() -> None:
    names = exported()
    assert [name for name in WITH_EXAMPLES
            if ">>> " not in (own_docstring(names[name]) or "")] == []


def examples() -> list[doctest.DocTest]:
    finder = doctest.DocTestFinder(exclude_empty=True)
    found: dict[str, doctest.DocTest] = {}
    for module in public_modules():
        for test in finder.find(module):
            if test.examples and test.name.startswith(PACKAGES):
                found.setdefault(test.name, test)
    return sorted(found.values(), key=lambda test: test.name)


@pytest.mark.parametrize("example", examples(), ids=lambda test: test.name)
def test_the_examples_in_the_docstrings_run(
        example: doctest.DocTest, request: pytest.FixtureRequest) -> None:
    if any("dsn" in e.source for e in example.examples):
        db: Database = request.getfixturevalue("db")
        example.globs["dsn"] = db.worker_dsn
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    output: list[str] = []
    # The examples show what a reader sees, not log lines: a Lambda test that ran
    # before may have given the library's loggers a handler that writes to stdout.
    logging.disable(logging.CRITICAL)
    try:
        runner.run(example, out=output.append)
    finally:
        logging.disable(logging.NOTSET)
    assert runner.failures == 0, "".join(output)


def test_there_are_examples_to_run() -> None:
    names = {test.name for test in examples()}
    assert {"leaseq.drain.worker.Worker", "leaseq.kinds.job_context.JobContext",
            "leaseq.kinds.registry.Registry"} <= names


# ---- errors ---------------------------------------------------------------------------------


def constructed_names() -> set[str]:
    """Every name called anywhere in the shipped code but the error module itself: an
    error type is raised where it is built (``raise X(...)``, or built and returned to a
    caller that raises it)."""
    names: set[str] = set()
    sources = [*(ROOT / "layer").rglob("*.py"), *(ROOT / "functions").rglob("*.py"),
               *(ROOT / "local").rglob("*.py")]
    for path in sources:
        if path == ROOT / "layer" / "leaseq" / "base" / "errors.py" or ".aws-sam" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                func = node.func
                names.add(func.id if isinstance(func, ast.Name) else
                          func.attr if isinstance(func, ast.Attribute) else "")
    return names


def error_types() -> list[type[errors.LeaseqError]]:
    return [obj for obj in vars(errors).values()
            if inspect.isclass(obj) and issubclass(obj, errors.LeaseqError)
            and obj.__module__ == errors.__name__]


def test_every_error_type_is_raised_somewhere_or_maps_a_sqlstate() -> None:
    built = constructed_names()
    mapped = {*errors.SQLSTATE_ERRORS.values(), *errors.CLIENT_ERRORS.values()}

    def raised(cls: type[errors.LeaseqError]) -> bool:
        # A base type counts when one of its own types is raised: callers catch it.
        return cls.__name__ in built or cls in mapped or any(
            raised(sub) for sub in cls.__subclasses__())

    never = [cls.__name__ for cls in error_types() if not raised(cls)]

    assert never == []
