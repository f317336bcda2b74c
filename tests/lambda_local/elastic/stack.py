"""The elastic drain's stack on the local Lambda service, and what the tests watch.

* :func:`start_elastic` runs this folder's template (the real worker, enqueue and reaper
  functions, the pool on) on the test database, with the handlers of ``handlers.py``;
* :class:`PoolWatch` samples the pool table and the worker's connections while a test
  runs, so the maximum is checked throughout and not only at the end;
* :func:`drainers_at_once` reads, from the audit log, how many invocations claimed or
  finished jobs at overlapping times: fan-out seen from the database;
* :func:`lines` reads the functions' JSON log lines.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from leaseq_lambda_local import LocalLambda
from psycopg.rows import dict_row

from tests.conftest import Database
from tests.failure.audit import (
    Audit,
    audit_queue,
    create_side_effects_table,
    drop_side_effects_table,
    unfinished_jobs,
)
from tests.lambda_local.conftest import REPO, Start, client_for, payload
from tests.support.postgres import OWNER, WORKER

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "template.yaml"
HANDLERS = "tests.lambda_local.elastic.handlers"
WORKER_FUNCTION = "WorkerFunction"
#: The worker's connections (the runtime names them after the function).
WORKER_APPLICATION = f"leaseq {WORKER_FUNCTION}"


@pytest.fixture
def side_effects(db: Database) -> Iterator[None]:
    """The handlers' side-effect table, empty, for the length of a test."""
    with db.connect(None) as admin:
        create_side_effects_table(admin, WORKER)
    yield
    with db.connect(None) as admin:
        drop_side_effects_table(admin)


def start_elastic(start_service: Start, db: Database, *,
                  parameters: Mapping[str, str] | None = None,
                  env: Mapping[str, Mapping[str, str]] | None = None,
                  **options: Any) -> LocalLambda:
    """The elastic template on the test database (schedules off unless asked)."""
    env_vars: dict[str, dict[str, str]] = {
        "Parameters": {"ELASTIC_EFFECTS_DSN": db.worker_dsn}}
    for function, variables in (env or {}).items():
        env_vars.setdefault(function, {}).update(variables)
    options.setdefault("schedules", False)
    return start_service(template=TEMPLATE, database_url=db.worker_dsn,
                         owner_database_url=db.owner_dsn, handlers=HANDLERS,
                         python_path=(REPO,), env_vars=env_vars,
                         parameter_overrides=dict(parameters or {}), **options)


def jobs(count: int, kind: str = "elastic.work", **payload: Any) -> list[dict[str, Any]]:
    """Enqueue-function items: ``count`` jobs of ``kind`` over a few tenants."""
    tenants = [str(uuid.uuid4()) for _ in range(4)]
    run = uuid.uuid4().hex[:8]
    return [{"tenant_id": tenants[n % len(tenants)], "operation_key": f"{kind}-{run}-{n}",
             "kind": kind, "payload": {"n": n, **payload}, "max_attempts": 10}
            for n in range(count)]


def enqueue(service: LocalLambda, items: list[dict[str, Any]]) -> dict[str, Any]:
    """Through the enqueue function, as a producer would (one synchronous invoke)."""
    answer = client_for(service.url).invoke(FunctionName="EnqueueFunction",
                                            Payload=json.dumps({"jobs": items}))
    body: dict[str, Any] = payload(answer)
    assert "FunctionError" not in answer, body
    assert body["rejected"] == 0, body
    return body


def wait_until_drained(db: Database, service: LocalLambda, timeout: float = 120.0) -> float:
    """Wait until no job is unfinished; the seconds it took."""
    started = time.monotonic()
    with db.connect(OWNER) as conn:
        while unfinished_jobs(conn):
            if time.monotonic() - started > timeout:
                tail = service.lines.tail(15)  # type: ignore[attr-defined]
                raise AssertionError(f"{unfinished_jobs(conn)} jobs unfinished after "
                                     f"{timeout:g} s; the functions said:\n{tail}")
            time.sleep(0.1)
    return time.monotonic() - started


def wait_until_idle(service: LocalLambda, timeout: float = 60.0) -> None:
    """Wait until no invocation runs or waits (the started workers stopped polling)."""
    deadline = time.monotonic() + timeout
    while not service.service.idle():
        assert time.monotonic() < deadline, "the local service never became idle"
        time.sleep(0.1)


def audit(db: Database) -> Audit:
    """The failure suite's audit of every job, event and side effect."""
    with db.connect(None) as admin:  # the side effects are the handlers' own table
        return audit_queue(admin)


def assert_exactly_once(report: Audit) -> None:
    """Nothing lost, nothing completed twice, every success backed by an execution."""
    assert report.violations == [], report.violations[:10]
    assert report.double_completions == 0
    assert report.unbacked_successes == 0
    assert report.states["succeeded"] == report.jobs, report.lines()


def lines(service: LocalLambda, function: str = WORKER_FUNCTION) -> list[dict[str, Any]]:
    """The JSON log lines ``function`` wrote."""
    found = []
    prefix = f"[{function}] "
    for line in list(service.lines.lines):  # type: ignore[attr-defined]
        if line.startswith(prefix + "{"):
            try:
                found.append(json.loads(line[len(prefix):]))
            except ValueError:
                continue
    return found


def messages(service: LocalLambda, text: str,
             function: str = WORKER_FUNCTION) -> list[dict[str, Any]]:
    return [line for line in lines(service, function) if line.get("message") == text]


def drainers_at_once(db: Database) -> int:
    """The most invocations whose claims and outcomes overlap in time, from the audit
    log: each owner drains from its first claim to its last event."""
    with db.connect(OWNER) as conn:
        spans = conn.execute(
            "select actor, min(created_at) as first, max(created_at) as last"
            " from app.job_events where event_type <> 'created'"
            " and actor not in ('watchdog', 'reaper') and actor like %s group by actor",
            (f"{WORKER_FUNCTION}:%",)).fetchall()
    moments = sorted([(row["first"], 1) for row in spans] + [(row["last"], -1) for row in spans],
                     key=lambda moment: (moment[0], -moment[1]))
    running = most = 0
    for _, step in moments:
        running += step
        most = max(most, running)
    return most


@dataclass
class PoolWatch:
    """The most places, places but a tick's extra one (``regular``: never more than the
    maximum), live places and worker connections seen while it ran."""

    places: int = 0
    regular: int = 0
    live: int = 0
    connections: int = 0
    samples: int = 0
    reservations: set[uuid.UUID] = field(default_factory=set)


@contextmanager
def watch_pool(db: Database, application: str = WORKER_APPLICATION,
               every: float = 0.01) -> Iterator[PoolWatch]:
    """Sample the pool and ``application``'s connections as a superuser, every ``every``
    seconds, until the block ends."""
    seen = PoolWatch()
    stop = threading.Event()

    def sample() -> None:
        with psycopg.connect(db.admin_dsn, autocommit=True, row_factory=dict_row) as conn:
            while not stop.is_set():
                pool = conn.execute(
                    "select count(*) as places, count(*) filter (where not extra) as regular,"
                    " count(owner) as live,"
                    " coalesce(array_agg(id) filter (where owner is null), '{}') as reserved"
                    " from app.worker_pool where expires_at > clock_timestamp()").fetchone()
                backends = conn.execute(
                    "select count(*) as n from pg_stat_activity"
                    " where datname = current_database() and application_name = %s",
                    (application,)).fetchone()
                assert pool is not None
                assert backends is not None
                seen.places = max(seen.places, int(pool["places"]))
                seen.regular = max(seen.regular, int(pool["regular"]))
                seen.live = max(seen.live, int(pool["live"]))
                seen.connections = max(seen.connections, int(backends["n"]))
                seen.reservations.update(pool["reserved"])
                seen.samples += 1
                stop.wait(every)

    thread = threading.Thread(target=sample, name="pool-watch", daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(timeout=10)
