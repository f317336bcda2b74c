"""The operator's calls of QueueClient: redrive and cancel call after bounded call until
the selection is done, and the paged prune of leaseq.upkeep.retention stops where it should."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from leaseq import QueueClient
from leaseq.base.jobs import Selection
from leaseq.store import client as client_module
from leaseq.upkeep.retention import prune_in_pages
from psycopg.types.json import Jsonb

from tests.sql.calls import claim, enqueue_many, event_types, job, new_tenant
from tests.support.postgres import Conn


def _dead_jobs(worker: Conn, tenant: uuid.UUID, count: int) -> list[uuid.UUID]:
    """``count`` jobs that died at once: discarded on their first attempt."""
    enqueue_many(worker, tenant, count)
    leases = claim(worker, tenant, limit=count)
    for lease in leases:
        worker.execute("select app.discard_job(%s, %s, %s, %s, %s)", (
            tenant, lease["id"], lease["lease_owner"], lease["lease_token"],
            Jsonb({"code": "DISCARDED", "message": "bad input"})))
    return [lease["id"] for lease in leases]


@pytest.fixture
def small_batches(monkeypatch: pytest.MonkeyPatch) -> int:
    """Three jobs per call instead of the SQL bound, so a handful of jobs takes several."""
    monkeypatch.setattr(client_module, "MAX_OPERATOR_BATCH", 3)
    return 3


def test_a_redrive_of_more_ids_than_one_call_takes_redrives_each_once(
    client: QueueClient, worker: Conn, owner: Conn, small_batches: int,
) -> None:
    ids = _dead_jobs(worker, new_tenant(), 7)

    done = client.redrive_jobs("ops:alice", Selection(tuple(ids)), reason="fixed")

    assert sorted(row["job_id"] for row in done) == sorted(ids)
    for job_id in ids:
        assert job(owner, job_id)["state"] == "pending"
        assert event_types(owner, job_id).count("redriven") == 1


def test_a_filtered_redrive_stops_at_its_limit_across_calls(
    client: QueueClient, worker: Conn, owner: Conn, small_batches: int,
) -> None:
    tenant = new_tenant()
    ids = _dead_jobs(worker, tenant, 7)
    _dead_jobs(worker, new_tenant(), 2)  # another tenant's, never selected

    done = client.redrive_jobs("ops:alice", Selection(tenant_id=tenant), limit=5)

    assert len(done) == 5
    assert {row["tenant_id"] for row in done} == {tenant}
    assert sorted(job(owner, i)["state"] for i in ids) == ["dead"] * 2 + ["pending"] * 5


def test_a_cancel_of_every_pending_job_of_a_tenant_takes_as_many_calls_as_it_needs(
    client: QueueClient, worker: Conn, owner: Conn, small_batches: int,
) -> None:
    tenant = new_tenant()
    ids = enqueue_many(worker, tenant, 7)

    done = client.cancel_jobs("ops:alice", Selection(tenant_id=tenant, kind="email.send"))

    assert sorted(row["job_id"] for row in done) == sorted(ids)
    assert {job(owner, i)["state"] for i in ids} == {"cancelled"}


def test_the_paged_prune_deletes_page_after_page_until_one_comes_back_short(
    client: QueueClient, worker: Conn, admin: Conn,
) -> None:
    ids = _dead_jobs(worker, new_tenant(), 5)
    admin.execute("update app.jobs set completed_at = clock_timestamp() - interval '10 days'"
                  " where id = any(%s)", (ids,))

    first = prune_in_pages(client.prune_jobs, timedelta(days=1), limit=2, max_pages=1)
    rest = prune_in_pages(client.prune_jobs, timedelta(days=1), limit=2)

    assert (first.jobs_deleted, first.batches) == (2, 1)
    assert first.events_deleted == 2 * 3  # created, claimed, dead
    assert (rest.jobs_deleted, rest.batches) == (3, 2)  # pages of 2 and 1


def test_the_paged_prune_asks_before_every_page_whether_to_go_on(
    client: QueueClient, worker: Conn, admin: Conn,
) -> None:
    ids = _dead_jobs(worker, new_tenant(), 4)
    admin.execute("update app.jobs set completed_at = clock_timestamp() - interval '10 days'"
                  " where id = any(%s)", (ids,))
    answers = iter([True, False])

    report = prune_in_pages(client.prune_jobs, timedelta(days=1), limit=1,
                            keep_going=lambda: next(answers))

    assert (report.jobs_deleted, report.batches) == (1, 1)
