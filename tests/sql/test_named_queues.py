"""Named queues (sql/functions/queues.sql, the claims' and the pool's p_queue): a job
belongs to one queue, a queue's claims and pool see only its jobs and places, a paused
queue's jobs stay unclaimed while its running jobs finish, and every pause and resume is
audited with the operator's identity and login.

Each call runs as the role that makes it in production: producers enqueue, a worker
login claims and joins, an operator login pauses, the owner routes kinds.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from tests.sql.calls import new_tenant, raises_sqlstate
from tests.support import postgres
from tests.support.postgres import Conn

LEASE = timedelta(seconds=30)
LONG = timedelta(minutes=5)
HOLD = timedelta(seconds=90)


def enqueue(conn: Conn, tenant: uuid.UUID, keys: list[str], queues: list[str | None],
            kind: str = "email.send") -> list[dict[str, Any]]:
    return conn.execute(
        "select * from app.enqueue_jobs(%s, %s, %s, %s, p_queues => %s) order by ord",
        ([tenant] * len(keys), keys, [kind] * len(keys), [Jsonb({"k": k}) for k in keys],
         queues)).fetchall()


def claim(conn: Conn, queue: str | None, limit: int = 10) -> list[dict[str, Any]]:
    return conn.execute("select * from app.claim_ready_jobs(%s, %s, %s, p_queue => %s)",
                        ("worker-1", limit, LEASE, queue)).fetchall()


def overview(conn: Conn) -> dict[str, dict[str, Any]]:
    return {row["queue"]: row
            for row in conn.execute("select * from app.queue_overview()").fetchall()}


def test_a_job_goes_to_the_queue_its_producer_names_and_else_to_default(
        producer: Conn, owner: Conn) -> None:
    tenant = new_tenant()
    rows = enqueue(producer, tenant, ["a", "b"], ["reports", None])
    assert [r["queue"] for r in rows] == ["reports", "default"]
    stored = owner.execute("select operation_key, queue from app.jobs order by operation_key")
    assert [(r["operation_key"], r["queue"]) for r in stored] == [("a", "reports"),
                                                                  ("b", "default")]
    event = owner.execute("select details from app.job_events where event_type = 'created'"
                          " order by created_at limit 1").fetchone()
    assert event is not None
    assert event["details"]["queue"] in ("reports", "default")


@pytest.mark.parametrize("name", ["Reports", "", "1st", "a" * 41, "with space", "ünï"])
def test_a_queue_name_no_queue_can_have_is_refused_per_item_with_22023(
        producer: Conn, duty_worker: Conn, name: str) -> None:
    tenant = new_tenant()
    rows = enqueue(producer, tenant, ["bad", "good"], [name, "reports"])
    assert rows[0]["status"] == "rejected"
    assert "queue must be a queue name" in rows[0]["error"]
    assert rows[1]["status"] == "created"
    with raises_sqlstate("22023", "queue name"):
        producer.execute("select * from app.enqueue_job(%s, 'one', 'k', '{}', p_queue => %s)",
                         (tenant, name))
    with raises_sqlstate("22023", "queue name"):
        claim(duty_worker, name)


def test_a_queues_claim_takes_only_its_jobs_and_a_claim_without_one_takes_every_queue(
        producer: Conn, duty_worker: Conn) -> None:
    tenant = new_tenant()
    enqueue(producer, tenant, ["r1", "r2", "d1"], ["reports", "reports", None])
    got = claim(duty_worker, "reports")
    assert sorted(j["operation_key"] for j in got) == ["r1", "r2"]
    assert claim(duty_worker, "reports") == []
    assert [j["operation_key"] for j in claim(duty_worker, None)] == ["d1"]


def test_due_tenants_with_work_in_other_queues_never_take_a_queues_claim(
        producer: Conn, duty_worker: Conn) -> None:
    # 40 tenants with older ready work in 'bulk' are due before the one tenant whose
    # job is in 'urgent': a claim of 'urgent' of one job still finds it at once.
    for n in range(40):
        enqueue(producer, new_tenant(), [f"bulk-{n}"], ["bulk"])
    tenant = new_tenant()
    enqueue(producer, tenant, ["urgent-1"], ["urgent"])
    (job,) = claim(duty_worker, "urgent", limit=1)
    assert job["operation_key"] == "urgent-1"
    assert job["tenant_id"] == tenant


def test_a_paused_queue_is_not_claimed_its_running_jobs_finish_and_resume_claims_again(
        producer: Conn, duty_worker: Conn, operator: Conn, owner: Conn) -> None:
    tenant = new_tenant()
    enqueue(producer, tenant, ["r1", "r2", "d1"], ["reports", "reports", None])
    (running,) = claim(duty_worker, "reports", limit=1)
    paused = operator.execute("select * from app.pause_queue('reports', 'ada', 'incident')"
                              ).fetchone()
    assert paused is not None
    assert paused["paused_by"] == "ada"
    assert claim(duty_worker, "reports") == []
    assert [j["operation_key"] for j in claim(duty_worker, None)] == ["d1"]
    finished = duty_worker.execute(
        "select * from app.complete_job(%s, %s, %s, %s, '{}')",
        (tenant, running["id"], "worker-1", running["lease_token"])).fetchone()
    assert finished is not None
    state = owner.execute("select state::text from app.jobs where id = %s",
                          (running["id"],)).fetchone()
    assert state == {"state": "succeeded"}
    resumed = operator.execute("select * from app.resume_queue('reports', 'ada')").fetchone()
    assert resumed is not None
    assert resumed["paused_at"] is None
    left = {"r1", "r2"} - {running["operation_key"]}
    assert [j["operation_key"] for j in claim(duty_worker, "reports")] == sorted(left)


def test_every_pause_and_resume_is_audited_once_with_the_actor_and_the_login(
        operator: Conn) -> None:
    operator.execute("select * from app.pause_queue('reports', 'ada', 'incident 42')")
    operator.execute("select * from app.pause_queue('reports', 'bob', 'again')")
    operator.execute("select * from app.resume_queue('reports', 'carol')")
    operator.execute("select * from app.resume_queue('reports', 'dave')")
    events = operator.execute("select * from app.queue_history('reports')").fetchall()
    assert [(e["event_type"], e["actor"], e["reason"]) for e in events] == [
        ("resumed", "carol", None), ("paused", "ada", "incident 42")]
    assert {e["login"] for e in events} == {postgres.OPERATOR}


def test_pause_refuses_a_blank_actor_and_a_bad_queue_name(operator: Conn) -> None:
    with raises_sqlstate("22023", "p_actor"):
        operator.execute("select * from app.pause_queue('reports', ' ')")
    with raises_sqlstate("22023", "queue name"):
        operator.execute("select * from app.pause_queue('Reports', 'ada')")


def test_producers_and_workers_may_not_pause_a_queue(producer: Conn,
                                                     duty_worker: Conn) -> None:
    for conn in (producer, duty_worker):
        with raises_sqlstate("42501"):
            conn.execute("select * from app.pause_queue('reports', 'me')")


def test_each_queue_has_a_pool_of_its_own_and_one_full_pool_never_holds_another_back(
        owner: Conn, duty_worker: Conn) -> None:
    owner.execute("select * from app.set_worker_pool_limits(2)")
    joined = [duty_worker.execute(
        "select app.join_worker_pool(%s, 'schedule', null, 10, %s, 'reports') as ok",
        (f"r-{n}", LONG)).fetchone() for n in range(2)]
    assert all(j and j["ok"] for j in joined)
    assert duty_worker.execute("select count(*) as n from app.reserve_worker_places("
                               "5, 10, %s, 'reports')", (HOLD,)).fetchone() == {"n": 0}
    places = duty_worker.execute("select count(*) as n from app.reserve_worker_places("
                                 "5, 10, %s, 'default')", (HOLD,)).fetchone()
    assert places == {"n": 2}
    sizes = {q: duty_worker.execute("select * from app.worker_pool_size(%s)", (q,)).fetchone()
             for q in ("reports", "default")}
    assert sizes == {"reports": {"live": 2, "reserved": 0},
                     "default": {"live": 0, "reserved": 2}}


def test_a_paused_queues_pool_takes_no_join_reserves_nothing_and_wakes_nothing(
        operator: Conn, duty_worker: Conn, producer: Conn) -> None:
    operator.execute("select * from app.pause_queue('reports', 'ada')")
    assert duty_worker.execute(
        "select app.join_worker_pool('r-1', 'schedule', null, 10, %s, 'reports') as ok",
        (LONG,)).fetchone() == {"ok": False}
    assert duty_worker.execute("select count(*) as n from app.reserve_worker_places("
                               "3, 10, %s, 'reports')", (HOLD,)).fetchone() == {"n": 0}
    assert producer.execute("select app.wake_worker_place('reports') as t").fetchone() == {
        "t": None}
    woke = producer.execute("select app.wake_worker_place('default') as t").fetchone()
    assert woke is not None
    assert woke["t"] is not None


def test_a_wake_is_per_queue_so_a_busy_queue_never_keeps_another_from_waking(
        duty_worker: Conn, producer: Conn) -> None:
    duty_worker.execute(
        "select app.join_worker_pool('d-1', 'schedule', null, 10, %s, 'default')", (LONG,))
    assert producer.execute("select app.wake_worker_place('default') as t").fetchone() == {
        "t": None}
    woke = producer.execute("select app.wake_worker_place('reports') as t").fetchone()
    assert woke is not None
    assert woke["t"] is not None


def test_the_overview_counts_each_queues_jobs_pool_and_pause(
        producer: Conn, duty_worker: Conn, operator: Conn) -> None:
    tenant = new_tenant()
    enqueue(producer, tenant, ["r1", "r2", "r3", "d1"], ["reports"] * 3 + [None])
    (later,) = producer.execute(
        "select * from app.enqueue_jobs(%s, %s, %s, %s, %s, p_queues => %s)",
        ([tenant], ["later"], ["k"], [Jsonb({})], [datetime.now(UTC) + timedelta(days=30)],
         ["reports"])).fetchall()
    assert later["status"] == "created", later
    claim(duty_worker, "reports", limit=1)
    operator.execute("select * from app.pause_queue('reports', 'ada', 'why')")
    views = overview(operator)
    reports = views["reports"]
    assert (reports["ready"], reports["scheduled"], reports["running"], reports["dead"]) == (
        2, 1, 1, 0)
    assert reports["oldest_ready_at"] is not None
    assert reports["paused_by"] == "ada"
    assert views["default"]["ready"] == 1
    assert views["default"]["paused_at"] is None


def test_routing_a_kind_sends_its_new_jobs_and_moves_its_waiting_ones(
        producer: Conn, owner: Conn, duty_worker: Conn) -> None:
    tenant = new_tenant()
    enqueue(producer, tenant, ["before"], [None], kind="report.build")
    moved = owner.execute("select app.route_kinds('slow', array['report.build']) as n"
                          ).fetchone()
    assert moved == {"n": 1}
    (after,) = enqueue(producer, tenant, ["after"], [None], kind="report.build")
    (named,) = enqueue(producer, tenant, ["named"], ["default"], kind="report.build")
    assert (after["queue"], named["queue"]) == ("slow", "default")
    assert sorted(j["operation_key"] for j in claim(duty_worker, "slow")) == ["after", "before"]
    with raises_sqlstate("42501"):
        duty_worker.execute("select app.route_kinds('slow', array['x'])")
