"""The library's module paths before its modules moved into sub-packages by duty.

``leaseq.client`` is now ``leaseq.store.client``, ``leaseq.worker`` is
``leaseq.drain.worker``, and so on (:data:`MOVED`). Code written against the old paths
keeps working: importing one gives the moved module itself and warns with a
DeprecationWarning naming the new path. The names of ``leaseq`` itself (``from leaseq
import QueueClient``) never moved and do not warn. The old paths are to be removed in a
later release.

``leaseq.migrate`` is the exception: it is the ``migrate`` function, as it always was, so
the old module path is an alias in ``sys.modules`` (``from leaseq.migrate import
load_migrations`` still works) without a warning: importing it through the finder would
put the module in the function's place.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import Final

#: The old module name (below ``leaseq``) -> the module's path now.
MOVED: Final = {
    **{name: f"leaseq.base.{name}" for name in (
        "deadline", "decoding", "errors", "jobs", "limits", "pool", "results", "schedules",
        "sessions", "storable")},
    **{name: f"leaseq.store.{name}" for name in (
        "client", "db", "duties", "migrate", "queries", "tls")},
    **{name: f"leaseq.kinds.{name}" for name in (
        "job_context", "registry", "retry", "signals")},
    **{name: f"leaseq.drain.{name}" for name in (
        "budget", "config", "execution", "in_turn", "interrupt", "outcomes", "polling",
        "recorder", "report", "slots", "steps", "watchdog", "worker")},
    **{name: f"leaseq.upkeep.{name}" for name in ("reaper", "retention")},
    "views": "leaseq.read.views",
}


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``leaseq.<old name>`` and loads it as the moved module, with a warning."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        """A spec for an old path of :data:`MOVED`; None for every other module."""
        prefix, _, name = fullname.partition(".")
        if prefix != "leaseq" or name not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        """The moved module itself (so its classes are the same objects), after the
        warning."""
        new = MOVED[spec.name.partition(".")[2]]
        warnings.warn(f"{spec.name} moved to {new}: import it from there (or the name "
                      "from leaseq itself); the old path will be removed",
                      DeprecationWarning, stacklevel=_importer_level())
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the moved module ran when it was first imported."""


def _importer_level() -> int:
    """The warning's stack level of the code that imported the old path: past this
    module's frames and the import machinery's."""
    level, frame = 1, sys._getframe(1)
    while frame.f_back is not None and (
            frame.f_code.co_filename == __file__
            or frame.f_code.co_filename.startswith("<frozen importlib")):
        frame, level = frame.f_back, level + 1
    return level


def install() -> None:
    """Serve the old paths (once per process), and alias ``leaseq.migrate``."""
    sys.modules.setdefault("leaseq.migrate", importlib.import_module(MOVED["migrate"]))
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(MovedModules())
