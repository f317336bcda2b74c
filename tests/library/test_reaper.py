"""reap_once(): expired leases of every tenant go back to the queue, within bounds."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from leaseq import JobOutcome, QueueClient, connect, reap_once
from leaseq.base.errors import InvalidRequestError, PermissionDeniedError

from tests.conftest import Database
from tests.library.support import enqueue, event_types, job, states
from tests.support import postgres
from tests.support.fakes import FakeDeadline
from tests.support.postgres import Conn


def abandon(client: QueueClient, admin: Conn, tenants: int, per_tenant: int,
            max_attempts: int | None = None) -> list[uuid.UUID]:
    """Claim jobs and let their leases run out, as a crashed worker would."""
    for _ in range(tenants):
        enqueue(client, uuid.uuid4(), per_tenant, max_attempts=max_attempts)
    claimed: list[uuid.UUID] = []
    while batch := client.claim_ready_jobs("crashed-worker", 100, timedelta(seconds=30)):
        claimed.extend(j.id for j in batch)
    admin.execute("update app.leases set expires_at = clock_timestamp() - interval '1 second'")
    return claimed


def test_a_pass_releases_expired_leases_of_every_tenant(
        client: QueueClient, admin: Conn, owner: Conn) -> None:
    ids = abandon(client, admin, tenants=3, per_tenant=4)

    report = reap_once(client, FakeDeadline(60))

    assert (report.released, report.calls, report.complete) == (12, 1, True)
    assert report.time_left == 60
    assert states(owner) == {"retry_wait": 12}
    row = job(owner, ids[0])
    assert row["last_error"]["code"] == "LEASE_EXPIRED"
    assert event_types(owner, ids[0]) == ["created", "claimed", "lease_expired"]


def test_a_lease_that_has_not_expired_is_left_alone(
        client: QueueClient, owner: Conn) -> None:
    enqueue(client, uuid.uuid4(), 2)
    client.claim_ready_jobs("live-worker", 10, timedelta(seconds=30))

    report = reap_once(client, FakeDeadline(60))

    assert (report.released, report.complete) == (0, True)
    assert states(owner) == {"running": 2}


def test_a_job_whose_last_attempt_expired_is_dead(
        client: QueueClient, admin: Conn, owner: Conn) -> None:
    (job_id,) = abandon(client, admin, tenants=1, per_tenant=1, max_attempts=1)

    assert reap_once(client, FakeDeadline(60)).released == 1
    assert job(owner, job_id)["state"] == "dead"


def test_a_pass_is_bounded_by_count(client: QueueClient, admin: Conn, owner: Conn) -> None:
    abandon(client, admin, tenants=2, per_tenant=25)

    report = reap_once(client, FakeDeadline(60), limit=10, max_calls=3)

    assert (report.released, report.calls, report.complete) == (30, 3, False)
    assert states(owner) == {"retry_wait": 30, "running": 20}
    assert reap_once(client, FakeDeadline(60), limit=10).released == 20


class SlowClient(QueueClient):
    """Each release call takes 4 s of the invocation's time."""

    def __init__(self, client: QueueClient, deadline: FakeDeadline) -> None:
        super().__init__(lambda: client.connection)
        self.deadline = deadline
        self.calls = 0

    def release_all_expired_jobs(self, limit: int = 1000) -> int:
        self.calls += 1
        self.deadline.spend(4)
        return super().release_all_expired_jobs(limit)


def test_a_pass_is_bounded_by_time(client: QueueClient, admin: Conn, owner: Conn) -> None:
    abandon(client, admin, tenants=1, per_tenant=30)
    deadline = FakeDeadline(10)
    slow = SlowClient(client, deadline)

    report = reap_once(slow, deadline, limit=10, margin=2)

    # 10 s left: a call (to 6), a call (to 2), then no time beyond the 2 s margin.
    assert (slow.calls, report.released, report.complete) == (2, 20, False)
    assert report.time_left == 2
    assert states(owner) == {"retry_wait": 20, "running": 10}


def test_no_call_at_all_without_time_beyond_the_margin(client: QueueClient) -> None:
    report = reap_once(client, FakeDeadline(1.5), margin=2)
    assert (report.calls, report.released, report.complete) == (0, 0, False)


@pytest.mark.parametrize("limit", [0, 10_001])
def test_a_limit_outside_the_sql_bounds_is_refused(client: QueueClient, limit: int) -> None:
    with pytest.raises(ValueError, match="between 1 and 10000"):
        reap_once(client, FakeDeadline(60), limit=limit)


# Retention ------------------------------------------------------------------------------


def finish_some(client: QueueClient, admin: Conn, *, old: int, recent: int,
                waiting: int) -> list[uuid.UUID]:
    """``old`` jobs finished 20 days ago (half succeeded, half dead), ``recent`` finished
    now, ``waiting`` still pending; returns the ids of the old ones."""
    tenant = uuid.uuid4()
    enqueue(client, tenant, old + recent, prefix="done")
    claimed = client.claim_ready_jobs("w", old + recent, timedelta(seconds=30))
    client.finish_jobs("w", [
        JobOutcome(j, "succeeded" if n % 2 == 0 else "dead",
                   None if n % 2 == 0 else {"code": "DISCARDED", "message": "no"})
        for n, j in enumerate(claimed)])
    enqueue(client, tenant, waiting, prefix="waiting")
    old_ids = [j.id for j in claimed[:old]]
    admin.execute("update app.jobs set completed_at = completed_at - interval '20 days'"
                  " where id = any (%s)", (old_ids,))
    return old_ids


def test_with_a_retention_a_pass_deletes_jobs_finished_before_it_with_their_events(
        client: QueueClient, admin: Conn, owner: Conn) -> None:
    old_ids = finish_some(client, admin, old=5, recent=3, waiting=2)

    report = reap_once(client, FakeDeadline(60), limit=2, retention=timedelta(days=14))

    # Three pages of at most two: 2 + 2 + 1 old jobs, three events each.
    assert (report.pruned_jobs, report.pruned_events) == (5, 15)
    assert states(owner) == {"succeeded": 1, "dead": 2, "pending": 2}
    left = owner.execute(
        "select (select count(*) from app.jobs where id = any (%(ids)s)) as jobs,"
        " (select count(*) from app.job_events where job_id = any (%(ids)s)) as events",
        {"ids": old_ids}).fetchone()
    assert left == {"jobs": 0, "events": 0}


def test_a_pass_makes_the_event_days_ahead_and_closes_a_past_day(
        client: QueueClient, owner: Conn) -> None:
    """The reaper's roll: the days ahead exist before their events are written, and a
    past day is closed so that retention may drop it."""
    owner.execute("delete from app.event_days where day > (clock_timestamp() at time zone"
                  " 'UTC')::date + 1 and dropped_at is null")
    owner.execute("do $$ declare r record; begin for r in select c.relname from pg_class c"
                  " join pg_inherits i on i.inhrelid = c.oid where i.inhparent ="
                  " 'app.job_events'::regclass and c.relname <> 'job_events_default'"
                  " and to_date(right(c.relname, 8), 'YYYYMMDD') > (clock_timestamp()"
                  " at time zone 'UTC')::date + 1 loop execute format('drop table"
                  " app_events.%I', r.relname); end loop; end $$")
    owner.execute("select app.add_event_day((clock_timestamp() at time zone 'UTC')::date"
                  " - 60)")
    owner.execute("update app.event_days set closed_at = null where day ="
                  " (clock_timestamp() at time zone 'UTC')::date - 60")

    report = reap_once(client, FakeDeadline(60))

    assert (report.event_days_added, report.event_days_closed) == (2, 1)
    assert report.as_dict()["event_days_added"] == 2
    assert reap_once(client, FakeDeadline(60)).event_days_added == 0


def test_without_a_retention_finished_jobs_are_kept(
        client: QueueClient, admin: Conn, owner: Conn) -> None:
    finish_some(client, admin, old=3, recent=0, waiting=0)

    report = reap_once(client, FakeDeadline(60))

    assert (report.pruned_jobs, report.pruned_events) == (0, 0)
    assert states(owner) == {"succeeded": 2, "dead": 1}


def test_expired_leases_are_released_before_anything_is_pruned(
        client: QueueClient, admin: Conn, owner: Conn) -> None:
    finish_some(client, admin, old=4, recent=0, waiting=0)
    abandon(client, admin, tenants=1, per_tenant=5)

    report = reap_once(client, FakeDeadline(60), limit=2, max_calls=2,
                       retention=timedelta(days=1))

    # Two calls could not release all five: the pass stops there and prunes nothing.
    assert (report.released, report.complete, report.pruned_jobs) == (4, False, 0)
    report = reap_once(client, FakeDeadline(60), limit=10, retention=timedelta(days=1))
    assert (report.released, report.complete, report.pruned_jobs) == (1, True, 4)


@pytest.mark.parametrize("days", [-1, 3651])
def test_a_retention_outside_the_sql_bounds_is_refused(
        client: QueueClient, days: int) -> None:
    with pytest.raises(ValueError, match="retention must be between 0 and 3650 days"):
        reap_once(client, FakeDeadline(60), retention=timedelta(days=days))


def test_a_reaper_login_applies_its_retention_but_never_prunes_below_the_owners_floor(
        db: Database, client: QueueClient, admin: Conn, owner: Conn) -> None:
    """The reaper's own login (leaseq_reaper) cannot call the operator's prune at all;
    its prune_retained_jobs refuses an age below app.settings.min_retention (1 day)."""
    finish_some(client, admin, old=2, recent=2, waiting=0)
    reaper = QueueClient(lambda: connect(db.dsn(postgres.REAPER)))
    try:
        with pytest.raises(InvalidRequestError, match=r"app\.settings\.min_retention"):
            reap_once(reaper, FakeDeadline(60), retention=timedelta(hours=12))
        assert states(owner) == {"succeeded": 2, "dead": 2}
        with pytest.raises(PermissionDeniedError, match="leaseq_operator"):
            reaper.prune_jobs(timedelta(0))

        report = reap_once(reaper, FakeDeadline(60), retention=timedelta(days=14))
    finally:
        reaper.close()
    assert (report.pruned_jobs, report.pruned_events) == (2, 6)
    assert states(owner) == {"succeeded": 1, "dead": 1}


def test_a_pass_gives_a_tenant_whose_turn_was_lost_its_turn_back(
        client: QueueClient, owner: Conn) -> None:
    tenants = [uuid.uuid4() for _ in range(5)]
    for tenant in tenants:
        enqueue(client, tenant, 1)
    owner.execute("delete from app.tenant_turns where tenant_id = %s", (tenants[0],))  # a defect
    assert {j.tenant_id for j in client.claim_ready_jobs("w", 10, timedelta(seconds=30))} == set(
        tenants[1:])

    report = reap_once(client, FakeDeadline(60), limit=2, turn_pages=10)

    assert (report.turns_checked, report.turns_repaired) == (1, 1)  # only one still waits
    (found,) = client.claim_ready_jobs("w", 10, timedelta(seconds=30))
    assert found.tenant_id == tenants[0]


def test_a_pass_checks_at_most_turn_pages_pages_of_tenants(
        client: QueueClient, owner: Conn) -> None:
    for _ in range(7):
        enqueue(client, uuid.uuid4(), 1)
    owner.execute("delete from app.tenant_turns")

    first = reap_once(client, FakeDeadline(60), limit=2, turn_pages=2)
    second = reap_once(client, FakeDeadline(60), limit=2, turn_pages=2)

    assert (first.turns_checked, first.turns_repaired) == (4, 4)
    assert (second.turns_checked, second.turns_repaired) == (3, 3)  # the rest, then it wraps
    assert len(client.claim_ready_jobs("w", 10, timedelta(seconds=30))) == 7


def test_a_pass_first_ends_a_reader_session_that_lifted_its_idle_cap(
        db: Database, admin: Conn, caplog: pytest.LogCaptureFixture) -> None:
    """A reader login capped at 1 s by its role sits in a transaction with the cap
    lifted; the reaper's pass ends it, counts it and says which login it was."""
    import time

    import psycopg
    from psycopg import sql

    role = f"leaseq_test_idle_{uuid.uuid4().hex[:8]}"
    admin.execute(sql.SQL("create role {} login in role authenticated").format(
        sql.Identifier(role)))
    admin.execute(sql.SQL("alter role {} in database {} set"
                          " idle_in_transaction_session_timeout = '1s'").format(
        sql.Identifier(role), sql.Identifier(db.name)))
    reaper = QueueClient(lambda: connect(db.dsn(postgres.REAPER)))
    try:
        with db.connect(role) as reader:
            reader.execute("begin")
            reader.execute("select count(*) from app.jobs")
            reader.execute("set idle_in_transaction_session_timeout = 0")
            time.sleep(1.3)

            report = reap_once(reaper, FakeDeadline(60))

            with pytest.raises(psycopg.OperationalError):
                reader.execute("select 1")
        assert (report.sessions_ended, report.sessions_refused, report.sessions_unseen) == (
            1, 0, 0)
        (line,) = [r for r in caplog.records if r.getMessage() == "ended a session past its cap"]
        assert (line.login, line.state) == (role, "idle in transaction")  # type: ignore[attr-defined]
    finally:
        reaper.close()
        admin.execute(sql.SQL("drop role {}").format(sql.Identifier(role)))
