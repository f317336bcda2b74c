"""app.release_jobs: claimed jobs given back unstarted go behind the ready work, and a
job given back ten times (a kind no invocation has time for) is made dead instead of
being handed round for ever."""

from __future__ import annotations

from typing import Any

from tests.sql.calls import (
    WORKER_NAME,
    claim,
    claim_one,
    enqueue_many,
    event_types,
    events,
    expire_lease,
    job,
    new_tenant,
)
from tests.support.postgres import Conn


def give_back(conn: Conn, jobs: list[dict[str, Any]], owner: str = WORKER_NAME) -> set[Any]:
    rows = conn.execute(
        "select job_id from app.release_jobs(%s, %s::uuid[], %s::uuid[], %s::uuid[])",
        (owner, [j["tenant_id"] for j in jobs], [j["id"] for j in jobs],
         [j["lease_token"] for j in jobs])).fetchall()
    return {row["job_id"] for row in rows}


def test_a_job_given_back_goes_behind_the_work_ready_now_with_its_attempt_undone(
        worker: Conn, admin: Conn) -> None:
    tenant = new_tenant()
    first, second, third = enqueue_many(worker, tenant, 3)
    # The first job is the oldest by a minute: without the move it would come back first.
    admin.execute("update app.jobs set available_at = available_at - interval '1 minute'"
                  " where id = %s", (first,))
    taken = claim_one(worker, tenant)
    assert taken["id"] == first

    assert give_back(worker, [taken]) == {first}

    row = job(admin, first)
    assert (row["state"], row["attempts"], row["lease_token"]) == ("pending", 0, None)
    assert row["available_at"] > taken["available_at"]
    order = [j["id"] for j in claim(worker, tenant, limit=3)]
    assert order[-1] == first  # the other two (tied, so in id order) come first
    assert set(order[:2]) == {second, third}
    assert event_types(admin, first) == ["created", "claimed", "released", "claimed"]


def test_the_tenth_give_back_makes_the_job_dead_naming_the_setting_to_change(
        worker: Conn, admin: Conn) -> None:
    tenant = new_tenant()
    (job_id,) = enqueue_many(worker, tenant, 1)
    for _ in range(9):
        assert give_back(worker, [claim_one(worker, tenant)]) == {job_id}
    assert job(admin, job_id)["state"] == "pending"

    last = claim_one(worker, tenant)
    assert give_back(worker, [last]) == {job_id}

    row = job(admin, job_id)
    assert (row["state"], row["attempts"], row["lease_token"]) == ("dead", 1, None)
    assert row["completed_at"] is not None
    error = row["last_error"]
    assert (error["code"], error["kind"], error["givenBack"]) == (
        "GIVEN_BACK_TOO_OFTEN", "email.send", 10)
    assert "WorkerTimeoutSeconds" in error["message"]
    assert "lower the kind's timeout" in error["message"]
    dead = events(admin, job_id)[-1]
    assert (dead["event_type"], dead["lease_token"]) == ("dead", last["lease_token"])
    assert dead["details"]["reason"] == "given_back_too_often"
    # Claims minus give-backs equal attempts: the audit's rule still holds.
    types = event_types(admin, job_id)
    assert types.count("claimed") - types.count("released") == row["attempts"]


def test_a_redrive_starts_the_give_back_count_again(worker: Conn, admin: Conn) -> None:
    tenant = new_tenant()
    (job_id,) = enqueue_many(worker, tenant, 1)
    for _ in range(10):
        give_back(worker, [claim_one(worker, tenant)])
    assert job(admin, job_id)["state"] == "dead"
    worker.execute("select * from app.redrive_jobs('operator', null, %s::uuid[])", ([job_id],))

    for _ in range(9):
        give_back(worker, [claim_one(worker, tenant)])

    assert job(admin, job_id)["state"] == "pending"


def test_an_expired_or_foreign_lease_is_not_given_back(worker: Conn, admin: Conn) -> None:
    tenant = new_tenant()
    enqueue_many(worker, tenant, 2)
    mine, expired = claim(worker, tenant, limit=2)
    expire_lease(admin, expired["id"])

    assert give_back(worker, [mine], owner="someone-else") == set()
    assert give_back(worker, [mine, expired]) == {mine["id"]}
    assert job(admin, expired["id"])["state"] == "running"  # the reaper's to release
