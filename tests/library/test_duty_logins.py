"""The library's producer, worker and reaper paths each work with the login of their own
duty group only, and a tenant-bound producer's refusal arrives as PermissionDeniedError."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from leaseq import QueueClient, Registry, Worker, WorkerConfig, connect, reap_once
from leaseq.base.errors import PermissionDeniedError

from tests.conftest import Database
from tests.library.support import requests, states
from tests.support import postgres
from tests.support.fakes import FakeDeadline
from tests.support.postgres import Conn


@pytest.fixture
def logins(db: Database) -> Iterator[dict[str, QueueClient]]:
    clients = {
        role: QueueClient(lambda role=role: connect(db.dsn(role)))
        for role in (postgres.PRODUCER, postgres.TENANT_PRODUCER, postgres.DUTY_WORKER,
                     postgres.REAPER)
    }
    yield clients
    for client in clients.values():
        client.close()


def test_a_producer_a_worker_and_a_reaper_each_need_only_their_own_group(
        logins: dict[str, QueueClient], owner: Conn, admin: Conn) -> None:
    producer, worker, reaper = (logins[postgres.PRODUCER], logins[postgres.DUTY_WORKER],
                                logins[postgres.REAPER])
    tenant = uuid.uuid4()
    results = producer.enqueue_jobs(requests(tenant, 3))
    registry = Registry()
    registry.register("echo", lambda payload, ctx: {"echo": payload["i"]})

    report = Worker(worker, registry, WorkerConfig(owner="duty-worker")).drain(FakeDeadline(60))
    admin.execute("update app.jobs set completed_at = completed_at - interval '20 days'")
    reaped = reap_once(reaper, FakeDeadline(60), retention=timedelta(days=14))

    assert report.succeeded == 3
    assert (reaped.complete, reaped.pruned_jobs) == (True, 3)
    assert states(owner) == {}
    assert producer.get_job_result(tenant, results[0].job_id) is None


def test_a_producer_reads_its_jobs_result_by_id_or_by_operation_key(
        logins: dict[str, QueueClient], owner: Conn) -> None:
    producer, worker = logins[postgres.PRODUCER], logins[postgres.DUTY_WORKER]
    tenant = uuid.uuid4()
    (created,) = producer.enqueue_jobs(requests(tenant, 1, prefix="invoice"))
    registry = Registry()
    registry.register("echo", lambda payload, ctx: {"total": 12})
    Worker(worker, registry, WorkerConfig(owner="duty-worker")).drain(FakeDeadline(60))

    by_id = producer.get_job_result(tenant, created.job_id)
    by_key = producer.get_job_result_by_key(tenant, "invoice-0")

    assert by_id is not None
    assert (by_id["state"], by_id["result"], by_id["attempts"]) == ("succeeded", {"total": 12}, 1)
    assert "lease_token" not in by_id
    assert by_key == by_id
    assert producer.get_job_result_by_key(tenant, "no-such-key") is None


def test_a_tenant_bound_producer_is_refused_an_unbound_tenant_with_the_binding_hint(
        logins: dict[str, QueueClient], owner: Conn) -> None:
    bound = logins[postgres.TENANT_PRODUCER]
    mine, other = uuid.uuid4(), uuid.uuid4()
    owner.execute("insert into app.tenant_producers (role_name, tenant_id) values (%s, %s)",
                  (postgres.TENANT_PRODUCER, mine))

    assert [r.status for r in bound.enqueue_jobs(requests(mine, 2))] == ["created", "created"]
    with pytest.raises(PermissionDeniedError, match=r"app\.tenant_producers") as refused:
        bound.enqueue_jobs(requests(other, 1))
    assert refused.value.sqlstate == "42501"
    with pytest.raises(PermissionDeniedError, match=f"not bound to tenant {other}"):
        bound.get_job_result_by_key(other, "op-0")
    assert states(owner) == {"pending": 2}
