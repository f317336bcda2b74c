"""The module paths from before the library's sub-packages by duty still import (each as
the moved module itself) and warn; ``leaseq.migrate`` stays the function."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import leaseq
import pytest
from leaseq._moved import MOVED

LIBRARY = Path(leaseq.__file__).parent


def fresh(code: str) -> dict[str, object]:
    """Run ``code`` in a new interpreter (its own sys.modules); its last line is JSON."""
    done = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code],
                          capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_every_old_path_names_a_module_that_moved_and_no_file_is_left_at_it() -> None:
    assert len(MOVED) == 36
    assert [name for name in MOVED if (LIBRARY / f"{name}.py").exists()] == []
    assert all((LIBRARY / new.removeprefix("leaseq.").replace(".", "/")).with_suffix(".py")
               .is_file() for new in MOVED.values())


@pytest.mark.parametrize("old", ["client", "duties", "worker", "jobs", "reaper", "views"])
def test_an_old_path_imports_the_moved_module_itself_with_a_deprecation_warning(
        old: str) -> None:
    found = fresh(
        "import importlib, json, warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        f"    old = importlib.import_module('leaseq.{old}')\n"
        f"new = importlib.import_module({MOVED[old]!r})\n"
        "print(json.dumps({'same': old is new, 'warnings': [\n"
        "    (w.category.__name__, str(w.message)) for w in caught]}))")

    assert found["same"] is True
    assert found["warnings"] == [[
        "DeprecationWarning",
        f"leaseq.{old} moved to {MOVED[old]}: import it from there (or the name from leaseq "
        "itself); the old path will be removed"]]


def test_the_public_names_and_the_new_paths_import_without_a_warning() -> None:
    """``-W error::DeprecationWarning``: any warning fails the import."""
    found = fresh("import json\nfrom leaseq import QueueClient, Worker, migrate\n"
                  "from leaseq.store.duties import ProducerClient\n"
                  "print(json.dumps({'ok': True}))")

    assert found == {"ok": True}


def test_leaseq_migrate_stays_the_function_and_its_module_path_still_imports() -> None:
    found = fresh("import json, leaseq.migrate\nfrom leaseq.migrate import load_migrations\n"
                  "import leaseq, leaseq.store.migrate as module\n"
                  "print(json.dumps({'function': callable(leaseq.migrate)\n"
                  "                  and leaseq.migrate is module.migrate,\n"
                  "                  'same': load_migrations is module.load_migrations}))")

    assert found == {"function": True, "same": True}
