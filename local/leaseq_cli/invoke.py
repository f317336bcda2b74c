"""Invoke the real worker and reaper Lambda handlers in this process.

``leaseq drain`` and ``leaseq reap`` call the very ``lambda_handler`` functions that
Lambda calls, with the scheduled event EventBridge Scheduler sends and a context whose
remaining time is the budget the operator chose. Only the environment is local: the
handlers read their settings from environment variables, so DATABASE_URL and
LEASEQ_HANDLERS are set for the duration of each call and restored afterwards.

The handlers log JSON lines (and EMF metrics) to stdout, as in Lambda. Here they go to
``$LEASEQ_HOME/lambda.log``, or to stderr with --verbose, so the command's own output
stays readable and its --json output stays parseable.

The handlers' code is the ``functions/`` folder of a leaseq checkout (``worker/app.py``,
``reaper/app.py``), which no package installs. :func:`functions_dir` takes it from, in
this order:

1. ``LEASEQ_FUNCTIONS_DIR``, when set (a folder without the functions is an error, never
   passed over);
2. the project folder leaseq was installed from (``pip install -e .`` or
   ``pip install .`` of a checkout), as pip records it in the distribution's
   ``direct_url.json`` (PEP 610), so the command works from any directory;
3. ``functions/`` in the current directory.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import io
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, TextIO
from urllib.parse import unquote, urlsplit

from leaseq_cli.failures import CliError
from leaseq_cli.lambda_context import LocalLambdaContext

Function = Literal["worker", "reaper"]
Handler = Callable[[dict[str, Any], Any], Any]

def scheduled_event(task: Function) -> dict[str, Any]:
    """The payload the schedules in template.yaml send."""
    return {
        "source": "leaseq.schedule",
        "task": task,
        "scheduled_time": datetime.now(UTC).isoformat(timespec="seconds"),
    }


class LogSink(io.TextIOBase):
    """Where the handlers' stdout goes: a file, stderr, or nowhere; switchable later,
    because Powertools binds its log stream once, when the handler module is imported."""

    def __init__(self) -> None:
        self.target: TextIO | None = None

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if self.target is not None:
            self.target.write(text)
        return len(text)

    def flush(self) -> None:
        if self.target is not None:
            self.target.flush()


SINK = LogSink()


#: The setting that names the functions' folder explicitly.
FUNCTIONS_DIR_VARIABLE = "LEASEQ_FUNCTIONS_DIR"
FUNCTIONS: tuple[Function, ...] = ("worker", "reaper")


def _holds_functions(folder: Path) -> bool:
    return all((folder / name / "app.py").is_file() for name in FUNCTIONS)


def installed_from() -> Path | None:
    """The local folder pip installed leaseq from, or None (a wheel from an index)."""
    for dist in importlib.metadata.distributions(name="leaseq"):
        text = dist.read_text("direct_url.json")
        if not text:
            continue
        try:
            url = urlsplit(str(json.loads(text).get("url", "")))
        except (ValueError, AttributeError):
            continue
        if url.scheme == "file" and url.path:
            return Path(unquote(url.path))
    return None


def functions_dir(environ: Mapping[str, str] | None = None, *,
                  project: Path | None = None, cwd: Path | None = None) -> Path:
    """The folder holding ``worker/app.py`` and ``reaper/app.py`` (module doc, in order).

    ``project`` and ``cwd`` default to :func:`installed_from` and the current directory.
    """
    environ = os.environ if environ is None else environ
    explicit = environ.get(FUNCTIONS_DIR_VARIABLE)
    if explicit:
        folder = Path(explicit).expanduser()
        if not _holds_functions(folder):
            raise CliError(
                f"{FUNCTIONS_DIR_VARIABLE}={explicit} holds no worker/app.py and "
                "reaper/app.py: point it at the functions/ folder of a leaseq checkout, "
                "or unset it")
        return folder.resolve()
    project = installed_from() if project is None else project
    candidates = [project / "functions"] if project is not None else []
    candidates.append((Path.cwd() if cwd is None else cwd) / "functions")
    for folder in candidates:
        if _holds_functions(folder):
            return folder.resolve()
    raise CliError(
        "cannot find the Lambda functions' code (functions/worker/app.py): set "
        f"{FUNCTIONS_DIR_VARIABLE} to the functions/ folder of a leaseq checkout, run "
        "leaseq from that checkout, or install leaseq from it (pip install -e '.[local]')")


#: Each app.py once per process, as a Lambda execution environment imports it once.
_loaded: dict[Path, ModuleType] = {}


def _load_app(function: Function) -> ModuleType:
    path = functions_dir() / function / "app.py"
    if path in _loaded:
        return _loaded[path]
    spec = importlib.util.spec_from_file_location(f"leaseq_function_{function}", path)
    if spec is None or spec.loader is None:
        raise CliError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    with contextlib.redirect_stdout(SINK):
        spec.loader.exec_module(module)
    _loaded[path] = module
    return module


def handler(function: Function) -> Handler:
    found: Handler = _load_app(function).lambda_handler
    return found


@contextlib.contextmanager
def environment(values: Mapping[str, str | None]) -> Iterator[None]:
    """Set (or, for None, remove) environment variables for the handlers, and put every
    variable back afterwards.

    Powertools' own variables are left alone: the functions' defaults (service
    ``leaseq``) are what a deployed function logs as.
    """
    saved = {key: os.environ.get(key) for key in values}
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def reset_runtime() -> None:
    """Forget the cached Lambda runtime (settings, connection) between commands."""
    try:
        runtime = importlib.import_module("leaseq_lambda.runtime")
    except ImportError:
        return
    reset = getattr(runtime, "reset", None)
    if callable(reset):
        reset()


class Invoker:
    """Calls one function's handler repeatedly, as its schedule would."""

    def __init__(self, function: Function, *, log: TextIO | None) -> None:
        self.function = function
        self.log = log
        self.handler = handler(function)

    def __call__(self, budget_seconds: float) -> Any:
        context = LocalLambdaContext(budget_seconds, function_name=f"leaseq-{self.function}")
        previous = SINK.target
        SINK.target = self.log
        try:
            with contextlib.redirect_stdout(SINK):
                return self.handler(scheduled_event(self.function), context)
        finally:
            SINK.target = previous
            if self.log is not None:
                self.log.flush()


def open_log(home: Path, verbose: bool) -> contextlib.AbstractContextManager[TextIO | None]:
    """stderr with --verbose, else ``lambda.log`` under the local home (appended)."""
    if verbose:
        return contextlib.nullcontext(sys.stderr)
    try:
        home.mkdir(parents=True, exist_ok=True)
        return (home / "lambda.log").open("a", encoding="utf-8")
    except OSError:
        return contextlib.nullcontext(None)
