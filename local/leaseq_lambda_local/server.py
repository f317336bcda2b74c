"""The whole local Lambda: template → functions → service, Invoke API and schedules.

``LocalLambda(config)`` binds the Invoke API's port at once (so the URL is known before
any function starts) and ``start()`` begins serving and firing schedules; ``close()``
stops the schedules, stops accepting requests, drops queued events and kills every
execution environment. It is a context manager.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TextIO

from leaseq_lambda_local.invoke_api import InvokeApiServer
from leaseq_lambda_local.overrides import function_variables, process_environment
from leaseq_lambda_local.schedules import Scheduler
from leaseq_lambda_local.service import (
    DEFAULT_ASYNC_RETRY_DELAYS,
    DEFAULT_UNRESERVED_CONCURRENCY,
    LambdaService,
    LocalFunction,
    ServiceSettings,
)
from leaseq_lambda_local.template import DEFAULT_ACCOUNT, DEFAULT_REGION, load_template

LogSink = Callable[[str, str], None]


class LogWriter:
    """Writes every function's output to one stream, each line tagged with its function."""

    def __init__(self, stream: TextIO | None) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def __call__(self, function: str, line: str) -> None:
        if self._stream is None:
            return
        with self._lock:
            self._stream.write(f"[{function}] {line}\n")
            self._stream.flush()


@dataclass(frozen=True)
class LocalConfig:
    """Everything ``LocalLambda`` needs; see overrides.py for what the overrides do."""

    template: Path
    parameter_overrides: Mapping[str, str] = field(default_factory=dict)
    database_url: str | None = None
    owner_database_url: str | None = None
    handlers: str | None = None
    env_vars: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: Folders after the code and the layers on the functions' path (handler modules).
    python_path: tuple[Path, ...] = ()
    port: int = 3001
    schedules: bool = True
    schedule_every: float | None = None
    unreserved_concurrency: int = DEFAULT_UNRESERVED_CONCURRENCY
    async_retry_delays: tuple[float, ...] = DEFAULT_ASYNC_RETRY_DELAYS
    freeze: bool = True
    python: str = sys.executable
    region: str = DEFAULT_REGION
    account: str = DEFAULT_ACCOUNT
    log: LogSink = field(default_factory=lambda: LogWriter(sys.stderr))


class LocalLambda:
    """The service, its Invoke API on 127.0.0.1 and its schedules."""

    def __init__(self, config: LocalConfig) -> None:
        self.config = config
        self.template = load_template(config.template, config.parameter_overrides,
                                      region=config.region, account=config.account)
        #: Per function, what the local overrides changed (shown at start).
        self.notes: dict[str, list[str]] = {}
        functions: dict[str, LocalFunction] = {}
        for name, spec in self.template.functions.items():
            variables, notes = function_variables(
                spec, database_url=config.database_url,
                owner_database_url=config.owner_database_url, handlers=config.handlers,
                env_vars=config.env_vars)
            functions[name] = LocalFunction(spec, variables)
            self.notes[name] = notes
        self._functions = functions
        self._python_path = (*self.template.layer_dirs, *config.python_path)
        settings = ServiceSettings(region=config.region, account=config.account,
                                   unreserved_concurrency=config.unreserved_concurrency,
                                   async_retry_delays=config.async_retry_delays,
                                   freeze=config.freeze, python=config.python)
        self.service = LambdaService(functions, settings, environment_for=self._environment,
                                     log=config.log)
        try:
            self.api = InvokeApiServer(self.service, config.port)
        except OSError:
            self.service.close()
            raise
        schedules = [(name, schedule) for name, spec in self.template.functions.items()
                     for schedule in spec.schedules] if config.schedules else []
        self.scheduler = Scheduler(schedules, self._fire, every=config.schedule_every,
                                   region=config.region, account=config.account)

    @property
    def url(self) -> str:
        """The endpoint for boto3 (``endpoint_url``, ``AWS_ENDPOINT_URL_LAMBDA``)."""
        return self.api.url

    def _environment(self, function: LocalFunction) -> Mapping[str, str]:
        return process_environment(function.spec, function.environment, endpoint_url=self.url,
                                   region=self.config.region, python_path=self._python_path)

    def environment_of(self, function: str) -> Mapping[str, str]:
        """The whole process environment a cold start of ``function`` gets."""
        return self._environment(self._functions[function])

    def _fire(self, function: str, payload: bytes) -> None:
        self.service.submit(function, payload, source="schedule")

    def start(self) -> LocalLambda:
        """Serve the Invoke API and fire the schedules."""
        self.api.start()
        self.scheduler.start()
        return self

    def close(self) -> None:
        """Stop everything this service started (bounded waits)."""
        self.scheduler.stop()
        self.api.stop()
        self.service.close()

    def __enter__(self) -> LocalLambda:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()
