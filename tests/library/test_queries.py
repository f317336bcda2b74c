"""Every call of an ``app.*`` SQL function from Python goes through one client
(leaseq.store.client.QueueClient) with its statement in leaseq/store/queries.py.

Read from the source of everything that ships or runs (layer/, local/, functions/):
SQL that calls an ``app.`` function in any other module's string literal, or another
module importing the statements to send them itself, is a second face of the contract.
The migrator (leaseq/store/migrate.py) writes its own bookkeeping statements and is the one
exception; it says so in its docstring."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("layer", "local", "functions")
#: The statements, their one sender, and the migrator's bookkeeping.
STATEMENTS = Path("layer/leaseq/store/queries.py")
SENDER = Path("layer/leaseq/store/client.py")
MIGRATOR = Path("layer/leaseq/store/migrate.py")

#: A call of a function of the app schema, as SQL writes it: app.name( or APP . name (.
APP_CALL = re.compile(r"\bapp\s*\.\s*[a-z_][a-z0-9_]*\s*\(", re.IGNORECASE)
#: What looks like one and is not: the column list of an INSERT into an app table (the
#: owner's bindings, which the migrations custom resource writes as sql/README.md shows).
INSERT_COLUMNS = re.compile(r"\binto\s+app\s*\.\s*[a-z_][a-z0-9_]*\s*\(", re.IGNORECASE)


def sources() -> list[Path]:
    found = [p.relative_to(REPO) for root in ROOTS for p in (REPO / root).rglob("*.py")]
    assert len(found) > 50  # the tree was found
    return sorted(found)


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the string constants that are docstrings: prose about SQL, never sent."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def app_calls(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of each string literal of ``source`` that calls an app.* function."""
    tree = ast.parse(source)
    prose = _docstrings(tree)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in prose
                and APP_CALL.search(INSERT_COLUMNS.sub("into ", node.value))):
            yield node.lineno, node.value


def imports_of(source: str) -> set[str]:
    """Every module ``source`` imports, and every name it imports from one."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_module_but_the_statements_and_the_migrator_writes_an_app_function_call() -> None:
    found = {str(path): [line for line, _ in app_calls((REPO / path).read_text("utf-8"))]
             for path in sources() if path not in (STATEMENTS, MIGRATOR)}

    assert {path: lines for path, lines in found.items() if lines} == {}


def test_only_the_client_imports_the_statements() -> None:
    importers = [str(path) for path in sources()
                 if "leaseq.store.queries" in imports_of((REPO / path).read_text("utf-8"))
                 and path != SENDER]

    assert importers == []


def test_the_statements_module_holds_the_app_function_calls() -> None:
    calls = list(app_calls((REPO / STATEMENTS).read_text("utf-8")))

    assert len(calls) >= 25  # the scan reads the real statements


@pytest.mark.parametrize(("text", "found"), [
    ('q = "select * from app.claim_jobs(%(tenant_id)s, %(owner)s)"', True),
    ('q = f"SELECT * FROM APP.get_job ({job})"', True),
    ('q = ("select job_id from "\n     "app.redrive_jobs(%s)")', True),
    ('"""Calls app.get_job(id) to read it."""', False),
    ('def f():\n    """app.queue_status(tenant) per tenant."""', False),
    ('q = "select * from app.jobs where id = %s"', False),
    ('app.get("/jobs")', False),
    ('q = "insert into app.tenant_producers (role_name, tenant_id) select %s, t"', False),
    ('q = "insert into app.jobs (id) select id from app.enqueue_job(%s)"', True),
])
def test_the_scan_finds_sql_calls_and_passes_over_prose_and_code(text: str, found: bool) -> None:
    assert bool(list(app_calls(text))) is found


def test_the_scan_finds_a_module_importing_the_statements() -> None:
    assert "leaseq.store.queries" in imports_of("from leaseq.store import queries\n")
    assert "leaseq.store.queries" in imports_of("from leaseq.store.queries import GET_JOB\n")
    assert "leaseq.store.queries" in imports_of("import leaseq.store.queries\n")
