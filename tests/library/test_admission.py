"""Limits as Python names them (leaseq.base.admission), declared with handlers, set through the
client, and the reaper's admission pass with its per-limit report."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from leaseq import (
    ConfigurationError,
    InvalidRequestError,
    JobContext,
    QueueClient,
    Registry,
    Worker,
    WorkerConfig,
    parse_limit_name,
    parse_rate,
    reap_once,
)
from leaseq.base.admission import LimitName, Rate

from tests.library.support import enqueue
from tests.support.fakes import FakeDeadline
from tests.support.postgres import Conn


@pytest.mark.parametrize(("text", "count", "seconds"), [
    ("10/s", 10, 1), ("100/m", 100, 60), ("1000/h", 1000, 3600), ("5/10s", 5, 10),
    (" 3 / 2min ", 3, 120), ("1/d", 1, 86400)])
def test_a_rate_is_count_per_period(text: str, count: int, seconds: int) -> None:
    rate = parse_rate(text)
    assert (rate.count, rate.period) == (count, timedelta(seconds=seconds))


@pytest.mark.parametrize(("text", "words"), [
    ("0/s", "would never start a job"), ("-1/s", "would never start a job"),
    ("10", "is not COUNT/PERIOD"), ("10/fortnight", "is not COUNT/PERIOD"),
    ("5/500ms", "between 1 second and 1 day"), ("10001/s", "1 to 10000")])
def test_a_rate_that_could_never_start_a_job_or_is_malformed_is_refused(
        text: str, words: str) -> None:
    with pytest.raises(InvalidRequestError, match=words):
        parse_rate(text)


def test_a_burst_is_between_one_and_the_rates_count() -> None:
    assert Rate(10, timedelta(seconds=1), 1).burst == 1
    with pytest.raises(InvalidRequestError, match="burst must be between 1 and"):
        parse_rate("10/s", burst=11)


def test_limit_names_round_trip_and_a_wrong_one_says_what_is_expected() -> None:
    tenant = uuid.uuid4()
    for name in ("kind:report", "tenant:*", f"tenant:{tenant}", "kind:a:b/tenant:*",
                 f"kind:report/tenant:{tenant}", "key:partner-42"):
        assert str(parse_limit_name(name)) == name
    assert parse_limit_name("kind:a:b/tenant:*") == LimitName("kind_tenant", kind="a:b")
    for wrong in ("report", "kind:", "tenant:acme", "key:"):
        with pytest.raises(InvalidRequestError):
            parse_limit_name(wrong)


def test_a_handler_declares_its_kinds_limit_and_a_limit_that_could_never_admit_is_refused(
) -> None:
    registry = Registry()

    @registry.handler("call_partner", rate="10/s", burst=2)
    def call_partner(payload: dict[str, object], ctx: object) -> None: ...

    [declared] = registry.limits
    assert (declared.kind, declared.rate, declared.concurrency) == (
        "call_partner", Rate(10, timedelta(seconds=1), 2), None)
    for options in ({"concurrency": 0}, {"concurrency": -1}, {"rate": "0/s"},
                    {"rate": "often"}, {"burst": 2}, {"per_tenant": True}):
        with pytest.raises(ConfigurationError, match="kind 'k'"):
            registry.handler("k", **options)  # type: ignore[arg-type]


def test_the_client_sets_lists_and_removes_limits(client: QueueClient) -> None:
    name = client.set_limit("ops", parse_limit_name("kind:echo"), concurrency=2,
                            rate=parse_rate("5/s"))
    assert name == "kind:echo"
    [row] = client.list_limits()
    assert (row["concurrency"], row["rate_count"], row["in_force"]) == (2, 5, True)
    with pytest.raises(InvalidRequestError, match="would never admit"):
        client.set_limit("ops", parse_limit_name("kind:echo"), concurrency=0)
    assert client.remove_limit(parse_limit_name("kind:echo")) is True
    assert client.remove_limit(parse_limit_name("kind:echo")) is False


def test_the_reaper_admits_held_jobs_a_free_slot_waits_for_and_reports_each_limit(
        client: QueueClient, owner: Conn) -> None:
    client.set_limit("ops", parse_limit_name("kind:echo"), concurrency=1)
    tenant = uuid.uuid4()
    enqueue(client, tenant, 3)
    # Room that no freeing statement announced (here the owner raised the limit by hand).
    owner.execute("update app.limits set concurrency = 2")
    report = reap_once(client, FakeDeadline(60))
    assert report.held_admitted == 1
    [state] = report.limits
    assert (state.name, state.instances, state.admitted, state.running, state.blocked) == (
        "kind:echo", 1, 2, 0, 1)
    assert state.oldest_blocked_age >= 0
    assert report.as_dict()["jobs_held"] == 1
    assert "limits" not in report.as_dict()


def test_a_limit_for_every_tenant_is_reported_once_over_its_instances(
        client: QueueClient) -> None:
    client.set_limit("ops", parse_limit_name("kind:echo/tenant:*"), concurrency=1)
    for _ in range(3):
        enqueue(client, uuid.uuid4(), 2)
    report = reap_once(client, FakeDeadline(60))
    [state] = report.limits
    assert (state.name, state.instances, state.admitted, state.blocked) == (
        "kind:echo/tenant:*", 3, 3, 3)


def test_a_worker_with_ten_slots_runs_at_most_the_kinds_limit_and_every_other_kind_beside_it(
        client: QueueClient, owner: Conn) -> None:
    registry = Registry()
    lock = threading.Lock()
    flight: Counter[str] = Counter()
    most: Counter[str] = Counter()

    async def run(kind: str) -> None:
        with lock:
            flight[kind] += 1
            most[kind] = max(most[kind], flight[kind])
        try:
            await asyncio.sleep(0.02)
        finally:
            with lock:
                flight[kind] -= 1

    @registry.handler("report", concurrency=2)
    async def report(payload: Any, ctx: JobContext) -> None:
        await run("report")

    @registry.handler("echo")
    async def echo(payload: Any, ctx: JobContext) -> None:
        await run("echo")

    client.sync_limits(registry.limits)
    for _ in range(3):
        enqueue(client, uuid.uuid4(), 10, kind="report", prefix="r")
        enqueue(client, uuid.uuid4(), 10, kind="echo", prefix="e")
    worker = Worker(client, registry, WorkerConfig(owner="limited-1", concurrency=10,
                                                   batch_size=10, poll_idle=0))
    drained = worker.drain(FakeDeadline(60))
    assert drained.succeeded == 60
    assert most["report"] == 2
    assert most["echo"] > 2
    assert owner.execute("select count(*) as n from app.held_jobs").fetchone() == {"n": 0}
