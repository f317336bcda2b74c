"""Contract of cancelling a running job: app.request_job_cancel records the request,
app.renew_job_lease_status tells the worker, and every way a running job ends
(outcome, give-back, reaper) ends it 'cancelled', fenced by the lease token.

The request is made by each login allowed to (operator, dashboard) and refused to the
others (worker, producer, reaper, tenant reader), each connecting as itself.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from tests.conftest import Database
from tests.sql.calls import (
    WORKER_NAME,
    claim,
    claim_one,
    enqueue,
    event_types,
    events,
    expire_lease,
    job,
    new_tenant,
    raises_sqlstate,
    snapshot,
)
from tests.support import postgres
from tests.support.postgres import Conn

ACTOR = "leaseq-cli:ada"


@pytest.fixture
def dashboard(db: Database) -> Iterator[Conn]:
    with db.connect(postgres.DASHBOARD) as conn:
        yield conn


def _request(conn: Conn, job_ids: list[uuid.UUID], actor: str = ACTOR,
             reason: str | None = None) -> list[dict[str, Any]]:
    return conn.execute("select * from app.request_job_cancel(%s, %s, %s)",
                        (actor, job_ids, reason)).fetchall()


def _renew(conn: Conn, lease: dict[str, Any], token: uuid.UUID | None = None
           ) -> dict[str, Any]:
    row = conn.execute(
        "select * from app.renew_job_lease_status(%s, %s, %s, %s, '30 seconds')",
        (lease["tenant_id"], lease["id"], lease["lease_owner"],
         token or lease["lease_token"])).fetchone()
    assert row is not None
    return row


def _finish(conn: Conn, lease: dict[str, Any], outcome: str, detail: Any = None,
            token: uuid.UUID | None = None) -> list[dict[str, Any]]:
    return conn.execute(
        "select job_id, state::text as state from app.finish_jobs(%s, %s, %s, %s, %s, %s, %s)",
        (lease["lease_owner"], [lease["tenant_id"]], [lease["id"]],
         [token or lease["lease_token"]], [outcome],
         [Jsonb(detail) if detail is not None else None],
         [timedelta(seconds=5) if outcome == "retry" else None])).fetchall()


def _running(worker: Conn, key: str = "a", **kw: Any) -> dict[str, Any]:
    tenant = new_tenant()
    enqueue(worker, tenant, key, **kw)
    return claim_one(worker, tenant)


def test_a_running_job_gets_a_cancel_request_naming_the_operator_and_its_login(
    worker: Conn, owner: Conn, operator: Conn
) -> None:
    lease = _running(worker)

    (row,) = _request(operator, [lease["id"]], reason="customer asked")

    assert (row["job_id"], row["state"], row["cancel_requested_by"]) == (
        lease["id"], "running", ACTOR)
    stored = job(owner, lease["id"])
    assert stored["state"] == "running"  # still its worker's until it records something
    assert stored["lease_token"] == lease["lease_token"]
    assert (stored["cancel_requested_at"], stored["cancel_requested_by"]) == (
        row["cancel_requested_at"], ACTOR)
    requested = events(owner, lease["id"])[-1]
    assert requested["event_type"] == "cancel_requested"
    assert requested["actor"] == ACTOR
    assert requested["details"] == {"attempt": 1, "leaseOwner": WORKER_NAME,
                                    "reason": "customer asked",
                                    "login": postgres.OPERATOR}


def test_pending_and_retry_wait_jobs_are_cancelled_at_once(
    worker: Conn, owner: Conn, operator: Conn
) -> None:
    tenant = new_tenant()
    pending = enqueue(worker, tenant, "p")["id"]
    lease = _running(worker, "r")
    _finish(worker, lease, "retry", {"message": "again"})
    waiting = lease["id"]

    rows = _request(operator, [pending, waiting])

    assert {(r["job_id"], r["state"]) for r in rows} == {(pending, "cancelled"),
                                                        (waiting, "cancelled")}
    for job_id, previous in ((pending, "pending"), (waiting, "retry_wait")):
        stored = job(owner, job_id)
        assert stored["state"] == "cancelled"
        assert stored["completed_at"] is not None
        assert stored["cancel_requested_at"] is None
        cancelled = events(owner, job_id)[-1]
        assert (cancelled["event_type"], cancelled["actor"]) == ("cancelled", ACTOR)
        assert cancelled["details"]["previousState"] == previous
        assert cancelled["details"]["login"] == postgres.OPERATOR


def test_finished_and_unknown_jobs_give_no_row_and_change_nothing(
    worker: Conn, owner: Conn, operator: Conn
) -> None:
    lease = _running(worker)
    _finish(worker, lease, "succeeded", {"ok": True})
    before = snapshot(owner)

    assert _request(operator, [lease["id"], uuid.uuid4()]) == []
    assert snapshot(owner) == before


def test_a_second_request_keeps_the_first_and_writes_no_event(
    worker: Conn, owner: Conn, operator: Conn, dashboard: Conn
) -> None:
    lease = _running(worker)
    (first,) = _request(operator, [lease["id"]])

    (again,) = _request(dashboard, [lease["id"]], actor="dashboard:someone-else")

    assert (again["cancel_requested_at"], again["cancel_requested_by"]) == (
        first["cancel_requested_at"], ACTOR)
    assert event_types(owner, lease["id"]).count("cancel_requested") == 1


def test_the_renewal_answers_whether_a_cancel_was_requested_and_keeps_the_lease(
    worker: Conn, owner: Conn, operator: Conn
) -> None:
    lease = _running(worker)
    assert _renew(worker, lease) == {"renewed": True, "cancel_requested": False}

    _request(operator, [lease["id"]])
    expires = job(owner, lease["id"])["lease_expires_at"]
    time.sleep(0.01)

    assert _renew(worker, lease) == {"renewed": True, "cancel_requested": True}
    assert job(owner, lease["id"])["lease_expires_at"] > expires
    # The earlier contract keeps answering the renewal alone.
    (old,) = worker.execute(
        "select app.renew_job_lease(%s, %s, %s, %s) as ok",
        (lease["tenant_id"], lease["id"], WORKER_NAME, lease["lease_token"])).fetchall()
    assert old["ok"] is True


def test_a_renewal_with_a_stale_token_is_refused_and_tells_nothing(
    worker: Conn, operator: Conn
) -> None:
    lease = _running(worker)
    _request(operator, [lease["id"]])

    assert _renew(worker, lease, token=uuid.uuid4()) == {"renewed": False,
                                                          "cancel_requested": None}


@pytest.mark.parametrize(("outcome", "detail"), [
    ("succeeded", {"sent": 3}),
    ("retry", {"message": "temporary"}),
    ("dead", {"message": "discarded"}),
    ("exhausted", {"message": "no more"}),
])
def test_any_outcome_after_a_request_ends_the_job_cancelled_never_retried(
    worker: Conn, owner: Conn, operator: Conn, outcome: str, detail: dict[str, Any]
) -> None:
    lease = _running(worker)
    _request(operator, [lease["id"]])

    assert _finish(worker, lease, outcome, detail) == [
        {"job_id": lease["id"], "state": "cancelled"}]

    stored = job(owner, lease["id"])
    assert stored["state"] == "cancelled"
    assert stored["completed_at"] is not None
    assert (stored["lease_owner"], stored["lease_token"]) == (None, None)
    if outcome == "succeeded":
        assert stored["result"] == detail  # the work was done: its result is kept
    else:
        assert stored["last_error"]["message"] == detail["message"]
    assert event_types(owner, lease["id"])[-2:] == ["cancel_requested", "cancelled"]
    cancelled = events(owner, lease["id"])[-1]
    assert cancelled["actor"] == ACTOR
    assert cancelled["lease_token"] == lease["lease_token"]
    assert cancelled["details"]["outcome"] == outcome
    assert cancelled["details"]["leaseOwner"] == WORKER_NAME
    assert claim(worker, lease["tenant_id"]) == []  # never claimable again


def test_an_outcome_with_a_stale_token_is_refused_after_a_request(
    worker: Conn, owner: Conn, operator: Conn
) -> None:
    lease = _running(worker)
    _request(operator, [lease["id"]])

    assert _finish(worker, lease, "succeeded", {"ok": True}, token=uuid.uuid4()) == []

    stored = job(owner, lease["id"])
    assert stored["state"] == "running"
    assert stored["cancel_requested_by"] == ACTOR
    assert event_types(owner, lease["id"])[-1] == "cancel_requested"


def test_a_job_given_back_after_a_request_ends_cancelled(
    worker: Conn, owner: Conn, operator: Conn
) -> None:
    lease = _running(worker)
    _request(operator, [lease["id"]])

    given_back = worker.execute(
        "select job_id from app.release_jobs(%s, %s, %s, %s)",
        (WORKER_NAME, [lease["tenant_id"]], [lease["id"]], [lease["lease_token"]])).fetchall()

    assert given_back == [{"job_id": lease["id"]}]
    assert job(owner, lease["id"])["state"] == "cancelled"
    cancelled = events(owner, lease["id"])[-1]
    assert (cancelled["event_type"], cancelled["actor"]) == ("cancelled", ACTOR)
    assert cancelled["details"]["outcome"] == "not_started"
    assert claim(worker, lease["tenant_id"]) == []


def test_an_expired_lease_with_a_request_ends_cancelled_at_reaping_not_retried(
    worker: Conn, owner: Conn, operator: Conn
) -> None:
    lease = _running(worker)
    _request(operator, [lease["id"]])
    expire_lease(owner, lease["id"])

    (released,) = worker.execute("select app.release_all_expired_jobs(100) as n").fetchall()

    assert released["n"] == 1
    stored = job(owner, lease["id"])
    assert stored["state"] == "cancelled"
    assert stored["completed_at"] is not None
    assert stored["last_error"]["retryable"] is False
    cancelled = events(owner, lease["id"])[-1]
    assert (cancelled["event_type"], cancelled["actor"]) == ("cancelled", ACTOR)
    assert cancelled["details"]["reason"] == "lease_expired_after_cancel_request"
    assert claim(worker, lease["tenant_id"]) == []
    # The worker that lost the lease cannot record over it.
    assert _finish(worker, lease, "succeeded", {"late": True}) == []


def test_a_cancel_waiting_for_the_reaper_cancels_the_job_the_reaper_put_back(
    db: Database, worker: Conn, owner: Conn, operator: Conn, admin: Conn
) -> None:
    lease = _running(worker)
    expire_lease(owner, lease["id"])
    result: dict[str, Any] = {}
    with db.connect(postgres.REAPER) as reaper:
        with reaper.transaction():
            reaper.execute("select app.release_all_expired_jobs(100)")
            # The reaper holds the row: the cancel waits for it, then sees retry_wait.
            thread = threading.Thread(target=lambda: result.update(
                rows=_request(operator, [lease["id"]])))
            thread.start()
            _wait_until_blocked(admin, postgres.OPERATOR)
        thread.join(10)

    assert [(r["job_id"], r["state"]) for r in result["rows"]] == [(lease["id"], "cancelled")]
    assert job(owner, lease["id"])["state"] == "cancelled"
    assert event_types(owner, lease["id"])[-2:] == ["lease_expired", "cancelled"]


def test_a_request_made_before_the_reaper_runs_ends_the_job_cancelled(
    db: Database, worker: Conn, owner: Conn, operator: Conn
) -> None:
    lease = _running(worker)
    expire_lease(owner, lease["id"])
    with operator.transaction():
        _request(operator, [lease["id"]])
        # The reaper skips the row the cancel holds: nothing is retried meanwhile.
        with db.connect(postgres.REAPER) as reaper:
            assert reaper.execute(
                "select app.release_all_expired_jobs(100) as n").fetchone() == {"n": 0}
    with db.connect(postgres.REAPER) as reaper:
        assert reaper.execute(
            "select app.release_all_expired_jobs(100) as n").fetchone() == {"n": 1}

    assert job(owner, lease["id"])["state"] == "cancelled"
    assert event_types(owner, lease["id"])[-2:] == ["cancel_requested", "cancelled"]


def test_an_outcome_committed_while_the_cancel_waits_wins_and_the_cancel_gives_no_row(
    worker: Conn, owner: Conn, operator: Conn, admin: Conn
) -> None:
    lease = _running(worker)
    result: dict[str, Any] = {}
    with worker.transaction():
        _finish(worker, lease, "succeeded", {"ok": True})
        thread = threading.Thread(target=lambda: result.update(
            rows=_request(operator, [lease["id"]])))
        thread.start()
        _wait_until_blocked(admin, postgres.OPERATOR)
    thread.join(10)

    assert result["rows"] == []
    assert job(owner, lease["id"])["state"] == "succeeded"


def _wait_until_blocked(admin: Conn, login: str) -> None:
    """Until a session of ``login`` waits for a row another holds (the race's second
    party: the cancel tries its locks again every 10 ms, sleeping in between)."""
    for _ in range(200):
        row = admin.execute(
            "select count(*) as n from pg_stat_activity"
            " where usename = %s and (wait_event_type = 'Lock' or wait_event = 'PgSleep')",
            (login,)).fetchone()
        if row is not None and row["n"]:
            return
        time.sleep(0.02)
    raise AssertionError(f"no session of {login} waited for a lock")


@pytest.mark.parametrize("login", [postgres.DUTY_WORKER, postgres.PRODUCER,
                                   postgres.TENANT_PRODUCER, postgres.REAPER,
                                   postgres.READER, postgres.OUTSIDER])
def test_only_operators_and_the_dashboard_may_request_a_cancel(
    db: Database, worker: Conn, owner: Conn, login: str
) -> None:
    lease = _running(worker)
    before = snapshot(owner)
    with db.connect(login) as conn, raises_sqlstate("42501"):
        _request(conn, [lease["id"]])
    assert snapshot(owner) == before


def test_the_dashboard_may_request_a_cancel_under_its_viewer_s_name(
    worker: Conn, owner: Conn, dashboard: Conn
) -> None:
    lease = _running(worker)
    viewer = "dashboard:arn:aws:sts::123456789012:assumed-role/OnCall/ada"

    (row,) = _request(dashboard, [lease["id"]], actor=viewer)

    assert row["cancel_requested_by"] == viewer
    requested = events(owner, lease["id"])[-1]
    assert (requested["actor"], requested["details"]["login"]) == (viewer, postgres.DASHBOARD)


@pytest.mark.parametrize("login", [postgres.DASHBOARD, postgres.OPERATOR, postgres.READER])
def test_only_workers_may_renew_and_read_the_request(
    db: Database, worker: Conn, login: str
) -> None:
    lease = _running(worker)
    with db.connect(login) as conn, raises_sqlstate("42501"):
        _renew(conn, lease)


@pytest.mark.parametrize(("actor", "ids", "reason", "message"), [
    (ACTOR, None, None, "p_job_ids is required"),
    (ACTOR, [], None, "number of job ids"),
    (ACTOR, [None], None, "must not contain NULL"),
    ("  ", [uuid.uuid4()], None, "p_actor"),
    (None, [uuid.uuid4()], None, "p_actor"),
    (ACTOR, [uuid.uuid4()], "x" * 501, "p_reason"),
])
def test_bad_input_is_refused_and_changes_nothing(
    worker: Conn, owner: Conn, operator: Conn, actor: Any, ids: Any, reason: Any, message: str
) -> None:
    _running(worker)
    before = snapshot(owner)
    with raises_sqlstate("22023", message):
        operator.execute("select * from app.request_job_cancel(%s, %s::uuid[], %s)",
                         (actor, ids, reason))
    assert snapshot(owner) == before


def test_job_reads_and_status_show_the_request(
    db: Database, worker: Conn, owner: Conn, operator: Conn
) -> None:
    lease = _running(worker)
    (row,) = _request(operator, [lease["id"]])

    got = operator.execute("select * from app.get_job(%s)", (lease["id"],)).fetchone()
    assert got is not None
    assert (got["cancel_requested_at"], got["cancel_requested_by"]) == (
        row["cancel_requested_at"], ACTOR)
    status = operator.execute("select * from app.queue_status(%s)",
                              (lease["tenant_id"],)).fetchall()
    assert [(s["state"], s["cancel_requested"]) for s in status] == [("running", 1)]

    owner.execute("insert into app.tenant_readers (role_name, tenant_id) values (%s, %s)",
                  (postgres.READER, lease["tenant_id"]))
    with db.connect(postgres.READER) as reader:
        reader.execute("select set_config('app.tenant_id', %s, false)",
                       (str(lease["tenant_id"]),))
        seen = reader.execute("select * from app.reader_get_job(%s)",
                              (lease["id"],)).fetchone()
    assert seen is not None
    assert seen["cancel_requested_by"] == ACTOR
    assert "lease_token" not in seen


def test_a_cancel_holds_no_job_while_it_waits_so_a_batch_finish_never_deadlocks_with_it(
    worker: Conn, owner: Conn, operator: Conn, admin: Conn
) -> None:
    tenant = new_tenant()
    enqueue(worker, tenant, "a")
    enqueue(worker, tenant, "b")
    first, second = claim(worker, tenant, limit=2)
    result: dict[str, Any] = {}
    with worker.transaction():
        _finish(worker, second, "succeeded", {"n": 2})  # the worker holds the second job
        thread = threading.Thread(target=lambda: result.update(
            rows=_request(operator, [first["id"], second["id"]])))
        thread.start()
        _wait_until_blocked(admin, postgres.OPERATOR)
        # The first job is free to the worker: the waiting cancel took no lock.
        started = time.monotonic()
        _finish(worker, first, "succeeded", {"n": 1})
        assert time.monotonic() - started < 1
    thread.join(10)

    assert result["rows"] == []  # both finished before the cancel could act
    assert {job(owner, j["id"])["state"] for j in (first, second)} == {"succeeded"}


def test_a_cancel_that_cannot_lock_its_jobs_for_5_seconds_is_refused_and_changes_nothing(
    db: Database, worker: Conn, owner: Conn, operator: Conn
) -> None:
    lease = _running(worker)
    before = snapshot(owner)
    with db.connect(postgres.OWNER) as holder, holder.transaction():
        holder.execute("select 1 from app.jobs where id = %s for update", (lease["id"],))
        with raises_sqlstate("55P03", "stayed locked for 5 seconds"):
            _request(operator, [lease["id"]])
    assert snapshot(owner) == before
