"""Invoke the real worker and reaper Lambda handlers in this process.

``leaseq drain`` and ``leaseq reap`` call the very ``lambda_handler`` functions that
Lambda calls, with the scheduled event EventBridge Scheduler sends and a context whose
remaining time is the budget the operator chose. Only the environment is local: the
handlers read their settings from environment variables, so DATABASE_URL and
LEASEQ_HANDLERS are set for the duration of each call and restored afterwards.

The handlers log JSON lines (and EMF metrics) to stdout, as in Lambda. Here they go to
``$LEASEQ_HOME/lambda.log``, or to stderr with --verbose, so the command's own output
stays readable and its --json output stays parseable.

The handlers are the package modules the functions' ``app.py`` re-export
(:mod:`leaseq_lambda.handlers.worker` and :mod:`leaseq_lambda.handlers.reaper`), so an
installed wheel runs them as a checkout does, from any directory.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, TextIO

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


def _load_app(function: Function) -> ModuleType:
    """The function's handler module (what its ``functions/<name>/app.py`` re-exports),
    imported once per process as a Lambda execution environment imports it once, and
    only when a command invokes it: what it prints while importing goes to the log sink."""
    with contextlib.redirect_stdout(SINK):
        if function == "worker":
            from leaseq_lambda.handlers import worker

            return worker
        from leaseq_lambda.handlers import reaper

        return reaper


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
