"""Fixtures of the function tests: the Lambda environment, the handlers as Lambda
imports them, the sample events, and what the functions print (JSON logs and EMF)."""

from __future__ import annotations

import importlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from leaseq_lambda import runtime

from tests.conftest import Database
from tests.functions import handlers

ROOT = Path(__file__).resolve().parents[2]
HANDLERS_MODULE = "tests.functions.handlers"
#: The package module of each function's code; functions/<name>/app.py re-exports its
#: handler (tests/functions/test_adapters.py).
HANDLER_MODULES = {
    "worker": "leaseq_lambda.handlers.worker",
    "reaper": "leaseq_lambda.handlers.reaper",
    "enqueue": "leaseq_lambda.handlers.enqueue",
    "dashboard": "leaseq_dashboard.function",
    "migrations": "leaseq_deploy.function",
}


def load_event(name: str) -> dict[str, Any]:
    event: dict[str, Any] = json.loads((ROOT / "events" / f"{name}.json").read_text())
    return event


def load_app(function: str) -> ModuleType:
    """Import the function's handler module fresh, as a new execution environment would."""
    name = HANDLER_MODULES[function]
    sys.modules.pop(name, None)
    return importlib.import_module(name)


@dataclass
class Output:
    """Stdout of the functions, split into log lines and EMF metric documents."""

    logs: list[dict[str, Any]] = field(default_factory=list)
    emf: list[dict[str, Any]] = field(default_factory=list)

    def metric(self, name: str, dimensions: tuple[str, ...] = ("service",)) -> list[float]:
        """Every value emitted for metric ``name`` with exactly these dimensions (by
        default the invocation's totals), across documents."""
        values: list[float] = []
        for doc in self.documents(dimensions):
            if name in doc:
                value = doc[name]
                values.extend(value if isinstance(value, list) else [value])
        return values

    def documents(self, dimensions: tuple[str, ...]) -> list[dict[str, Any]]:
        """The EMF documents whose one dimension set is ``dimensions`` (in any order)."""
        return [doc for doc in self.emf
                if [sorted(d) for d in doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"]]
                == [sorted(dimensions)]]

    def metric_definitions(self) -> dict[str, dict[str, Any]]:
        found = {}
        for doc in self.emf:
            for directive in doc["_aws"]["CloudWatchMetrics"]:
                for metric in directive["Metrics"]:
                    found[metric["Name"]] = {**metric, "Namespace": directive["Namespace"],
                                             "Dimensions": directive["Dimensions"]}
        return found

    def messages(self, text: str) -> list[dict[str, Any]]:
        return [line for line in self.logs if line.get("message") == text]


@pytest.fixture
def read_output(capsys: pytest.CaptureFixture[str]) -> Callable[[], Output]:
    def read() -> Output:
        output = Output()
        for line in capsys.readouterr().out.splitlines():
            if not line.startswith("{"):
                continue
            document = json.loads(line)
            (output.emf if "_aws" in document else output.logs).append(document)
        return output

    return read


@pytest.fixture
def lambda_env(db: Database, monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """The environment template.yaml gives the functions, pointed at the test database."""
    for key, value in {
        "DATABASE_URL": db.worker_dsn,
        "LEASEQ_HANDLERS": HANDLERS_MODULE,
        "POWERTOOLS_SERVICE_NAME": "leaseq",
        "POWERTOOLS_METRICS_NAMESPACE": "Leaseq",
        "POWERTOOLS_TRACE_DISABLED": "true",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_LAMBDA_FUNCTION_NAME": "leaseq-test",
        # An invocation ends as soon as the queue is empty, unless a test asks it to poll.
        "LEASEQ_POLL_IDLE_SECONDS": "0",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    runtime.reset()
    handlers.release_stuck.clear()
    yield monkeypatch
    handlers.release_stuck.set()
    runtime.reset()


@pytest.fixture
def worker_app(lambda_env: pytest.MonkeyPatch) -> ModuleType:
    return load_app("worker")


@pytest.fixture
def reaper_app(lambda_env: pytest.MonkeyPatch) -> ModuleType:
    return load_app("reaper")


@pytest.fixture
def enqueue_app(lambda_env: pytest.MonkeyPatch) -> ModuleType:
    return load_app("enqueue")


LOCAL_TEMPLATE = ROOT / "tests" / "lambda_local" / "template.yaml"


@dataclass
class LocalInvokes:
    """The local Lambda service the functions' Lambda client reaches
    (``AWS_ENDPOINT_URL_LAMBDA``), whose ``Probe`` function stands in for the worker
    function: it records every event it is invoked with."""

    service: Any
    folder: Path

    def events(self, count: int | None = None, timeout: float = 30.0) -> list[dict[str, Any]]:
        """The events Probe ran with (waiting until ``count`` have run), oldest first."""
        deadline = time.monotonic() + timeout
        while True:
            found = []
            for path in self.folder.glob("*.json"):
                try:
                    found.append(json.loads(path.read_text()))
                except ValueError:
                    continue  # being written
            if count is None or len(found) >= count or time.monotonic() > deadline:
                return [r["event"] for r in sorted(found, key=lambda r: r["start"])]
            time.sleep(0.05)

    def accepted(self, function: str = "Probe") -> int:
        """Asynchronous invokes of ``function`` the service accepted."""
        return int(self.service.service.stats()["functions"][function]["async_accepted"])


@pytest.fixture
def local_invokes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalInvokes]:
    """The local Lambda service on a free port, with the functions' Lambda client
    pointed at it."""
    from leaseq_lambda import invoker
    from leaseq_lambda_local import LocalConfig, LocalLambda

    folder = tmp_path / "invocations"
    folder.mkdir()
    service = LocalLambda(LocalConfig(
        template=LOCAL_TEMPLATE, port=0, schedules=False, log=lambda function, line: None,
        env_vars={"Parameters": {"PROBE_RECORD_DIR": str(folder)}}))
    service.start()
    for key, value in {"AWS_ENDPOINT_URL_LAMBDA": service.url, "AWS_DEFAULT_REGION": "us-east-1",
                       "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)
    invoker.reset()
    try:
        yield LocalInvokes(service, folder)
    finally:
        service.close()
        invoker.reset()
