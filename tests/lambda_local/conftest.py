"""The local Lambda service under test: started on a free port of 127.0.0.1, reached with
boto3's real Lambda client, and stopped after each test with a check that every runtime
process it started is gone."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from leaseq_lambda_local import LocalConfig, LocalLambda

HERE = Path(__file__).resolve().parent
TEST_TEMPLATE = HERE / "template.yaml"
REPO = HERE.parents[1]

#: Generous bounds: long enough for a loaded two-core machine, short enough to end a hang.
WAIT_SECONDS = 30.0


class Lines:
    """Collects the functions' output, for failure messages."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, function: str, line: str) -> None:
        with self._lock:
            self.lines.append(f"[{function}] {line}")

    def tail(self, count: int = 40) -> str:
        with self._lock:
            return "\n".join(self.lines[-count:])


def client_for(url: str | None = None) -> Any:
    """boto3's Lambda client as an application would build it, without retries, so a
    throttle shows as the first answer."""
    return boto3.client("lambda", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing",
                        config=Config(retries={"total_max_attempts": 1}, read_timeout=60))


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan's zombie waits for init)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_for(condition: Callable[[], Any], what: str, timeout: float = WAIT_SECONDS) -> Any:
    """Poll until ``condition()`` is truthy (bounded); its value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def payload(answer: dict[str, Any]) -> Any:
    return json.loads(answer["Payload"].read())


def environment_pids(service: LocalLambda) -> list[int]:
    return [e["pid"] for f in service.service.stats()["functions"].values()
            for e in f["environments"] if e["pid"]]


Start = Callable[..., LocalLambda]


@pytest.fixture
def start_service(tmp_path: Path) -> Iterator[Start]:
    """``start_service(template=..., **LocalConfig fields)``: a running service."""
    started: list[tuple[LocalLambda, Lines]] = []
    seen: set[int] = set()

    def start(template: Path = TEST_TEMPLATE, **options: Any) -> LocalLambda:
        lines = Lines()
        options.setdefault("env_vars", {"Parameters": {"PROBE_RECORD_DIR": str(tmp_path)}})
        options.setdefault("async_retry_delays", (0.2, 0.4))
        service = LocalLambda(LocalConfig(template=template, port=0, log=lines, **options))
        service.lines = lines  # type: ignore[attr-defined]
        started.append((service, lines))
        return service.start()

    yield start
    for service, _ in started:
        seen.update(environment_pids(service))
        service.close()
    leaked = [pid for pid in seen if alive(pid)]
    assert not leaked, f"runtime processes left running: {leaked}"


@pytest.fixture
def service(start_service: Start) -> LocalLambda:
    """The test template's functions, schedules off."""
    return start_service(schedules=False)


@pytest.fixture
def client(service: LocalLambda) -> Any:
    return client_for(service.url)


def records(folder: Path) -> list[dict[str, Any]]:
    """The probe's records of its attempts (see functions/probe/app.py)."""
    found = []
    for path in sorted(folder.glob("*.json")):
        try:
            found.append(json.loads(path.read_text()))
        except ValueError:
            continue  # being written right now
    return found
