"""Caps a session cannot lift: app.end_stalled_sessions, the reaper's sweep.

Any user may SET idle_in_transaction_session_timeout or statement_timeout to 0. These
tests do it as a tenant reader and as a runtime login, in a transaction that holds a
lock on app.jobs, and show that the reaper's call ends the session once it is past the
cap its login was given, and leaves every session within its cap (or without one)
alone. Each test makes logins of its own, with caps of a second or two set on the role
for this database, as an owner or administrator sets them with ALTER ROLE.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.conftest import Database
from tests.support import postgres
from tests.support.postgres import Conn


@contextmanager
def capped_login(db: Database, admin: Conn, group: str, **caps: str) -> Iterator[str]:
    """A login of ``group`` whose role settings in this database are ``caps``."""
    role = f"leaseq_test_capped_{uuid.uuid4().hex[:8]}"
    admin.execute(sql.SQL("create role {} login inherit").format(sql.Identifier(role)))
    try:
        admin.execute(sql.SQL("grant {} to {}").format(sql.Identifier(group),
                                                       sql.Identifier(role)))
        for name, value in caps.items():
            admin.execute(sql.SQL("alter role {} in database {} set {} = {}").format(
                sql.Identifier(role), sql.Identifier(db.name), sql.Identifier(name),
                sql.Literal(value)))
        yield role
    finally:
        admin.execute("select pg_terminate_backend(pid) from pg_stat_activity"
                      " where usename = %s", (role,))
        admin.execute(sql.SQL("drop owned by {}").format(sql.Identifier(role)))
        admin.execute(sql.SQL("drop role {}").format(sql.Identifier(role)))


@pytest.fixture
def reaper(db: Database) -> Iterator[Conn]:
    with db.connect(postgres.REAPER) as conn:
        yield conn


def sweep(reaper: Conn) -> list[dict[str, Any]]:
    return reaper.execute("select * from app.end_stalled_sessions()").fetchall()


def hold_jobs_lock(conn: Conn, read: str = "select count(*) from app.jobs") -> None:
    """What the attack needs: a transaction that has read app.jobs (so holds its lock,
    and its snapshot), then the session's idle cap lifted, then nothing more."""
    conn.execute("begin isolation level repeatable read")
    conn.execute(read)
    conn.execute("set idle_in_transaction_session_timeout = 0")


def is_gone(conn: Conn) -> bool:
    try:
        conn.execute("select 1")
    except psycopg.OperationalError:
        return True
    return False


def test_a_reader_that_lifts_its_idle_cap_inside_a_transaction_is_ended_by_the_reaper(
        db: Database, admin: Conn, owner: Conn, reaper: Conn) -> None:
    with capped_login(db, admin, "authenticated",
                      idle_in_transaction_session_timeout="1s") as role:
        owner.execute("insert into app.tenant_readers (role_name, tenant_id) values (%s, %s)",
                      (role, uuid.uuid4()))
        with db.connect(role) as reader:
            hold_jobs_lock(reader)
            assert reader.execute("show idle_in_transaction_session_timeout").fetchone() == {
                "idle_in_transaction_session_timeout": "0"}
            time.sleep(1.5)

            (ended,) = sweep(reaper)

            assert (ended["login"], ended["state"], ended["outcome"]) == (
                role, "idle in transaction", "ended")
            assert ended["stalled_for"] > timedelta(seconds=1)
            assert is_gone(reader)


def test_a_session_within_its_cap_and_a_session_not_in_a_transaction_are_left_alone(
        db: Database, admin: Conn, reaper: Conn) -> None:
    with capped_login(db, admin, "authenticated",
                      idle_in_transaction_session_timeout="30s") as role, \
            db.connect(role) as within, db.connect(role) as idle:
        hold_jobs_lock(within)
        idle.execute("set idle_in_transaction_session_timeout = 0")
        time.sleep(0.2)

        assert sweep(reaper) == []
        assert not is_gone(within)
        assert not is_gone(idle)


def test_a_runtime_login_whose_statement_outruns_its_lifted_statement_timeout_is_ended(
        db: Database, admin: Conn, reaper: Conn) -> None:
    with capped_login(db, admin, "leaseq_worker", statement_timeout="1s") as role, \
            db.connect(role) as worker:
        worker.execute("set statement_timeout = 0")
        failed: list[BaseException] = []

        def sleep_holding_the_lock() -> None:
            try:
                worker.execute("select pg_sleep(30)")
            except psycopg.Error as exc:
                failed.append(exc)

        thread = threading.Thread(target=sleep_holding_the_lock)
        thread.start()
        time.sleep(1.5)

        (ended,) = sweep(reaper)
        thread.join(timeout=10)

        assert (ended["login"], ended["state"], ended["outcome"]) == (role, "active", "ended")
        assert not thread.is_alive()
        assert len(failed) == 1
        assert isinstance(failed[0], psycopg.OperationalError)


def test_a_login_without_a_cap_of_its_own_is_not_given_one(
        db: Database, admin: Conn, reaper: Conn) -> None:
    """An application's producer login may keep its transactions open: the sweep
    enforces caps the owner set, and sets none. (A reader always has the 60 s cap.)"""
    with capped_login(db, admin, "leaseq_producer") as role, db.connect(role) as producer:
        hold_jobs_lock(producer, "select * from app.get_job_result(gen_random_uuid(),"
                                 " gen_random_uuid())")
        time.sleep(1.2)

        assert sweep(reaper) == []
        assert not is_gone(producer)


def test_the_owner_and_administrators_are_never_ended(
        db: Database, admin: Conn, reaper: Conn) -> None:
    """The owner holds the groups it created (with ADMIN OPTION from PostgreSQL 16), an
    administrator may too: their sessions are theirs to manage, whatever their caps."""
    cap = "alter role {} in database {} {} idle_in_transaction_session_timeout"
    admin.execute(sql.SQL(cap + " = '1s'").format(
        sql.Identifier(postgres.OWNER), sql.Identifier(db.name), sql.SQL("set")))
    try:
        with db.connect(postgres.OWNER) as busy, \
                capped_login(db, admin, "authenticated",
                             idle_in_transaction_session_timeout="1s") as administrator:
            admin.execute(sql.SQL("alter role {} createrole").format(
                sql.Identifier(administrator)))
            with db.connect(administrator) as also_busy:
                hold_jobs_lock(busy)
                hold_jobs_lock(also_busy)
                time.sleep(1.2)

                assert sweep(reaper) == []
                assert not is_gone(busy)
                assert not is_gone(also_busy)
    finally:
        admin.execute(sql.SQL(cap).format(
            sql.Identifier(postgres.OWNER), sql.Identifier(db.name), sql.SQL("reset")))


@pytest.mark.parametrize(("grant", "outcome"), [
    ("pg_signal_backend", "refused"), ("pg_read_all_stats", "unseen")])
def test_without_its_grants_the_owner_reports_each_session_it_cannot_end_or_see(
        db: Database, admin: Conn, reaper: Conn, grant: str, outcome: str) -> None:
    with capped_login(db, admin, "authenticated",
                      idle_in_transaction_session_timeout="1s") as role, \
            db.connect(role) as reader:
        hold_jobs_lock(reader)
        time.sleep(1.2)
        admin.execute(sql.SQL("revoke {} from {}").format(sql.Identifier(grant),
                                                         sql.Identifier(postgres.OWNER)))
        try:
            rows = sweep(reaper)
        finally:
            admin.execute(sql.SQL("grant {} to {}").format(sql.Identifier(grant),
                                                          sql.Identifier(postgres.OWNER)))

        assert [(r["login"], r["outcome"]) for r in rows] == [(role, outcome)]
        assert not is_gone(reader)


@pytest.mark.parametrize(("setting", "expected"), [
    ("15s", timedelta(seconds=15)), ("1500", timedelta(seconds=1.5)),
    ("2min", timedelta(minutes=2)), ("250ms", timedelta(milliseconds=250)),
    ("1h", timedelta(hours=1)), ("0", None)])
def test_a_roles_duration_setting_is_read_as_postgresql_reads_it(
        db: Database, admin: Conn, owner: Conn, setting: str, expected: timedelta | None
) -> None:
    with capped_login(db, admin, "leaseq_worker", statement_timeout=setting) as role:
        row = owner.execute("select app.role_duration_setting(%s::regrole, 'statement_timeout')"
                            " as cap", (role,)).fetchone()
    assert row == {"cap": expected}


def test_a_setting_for_this_database_comes_before_the_one_for_every_database(
        db: Database, admin: Conn, owner: Conn) -> None:
    with capped_login(db, admin, "leaseq_worker", statement_timeout="3s") as role:
        admin.execute(sql.SQL("alter role {} set statement_timeout = '9s'").format(
            sql.Identifier(role)))
        both = owner.execute("select app.role_duration_setting(%s::regrole,"
                             " 'statement_timeout') as cap", (role,)).fetchone()
        admin.execute(sql.SQL("alter role {} in database {} reset statement_timeout").format(
            sql.Identifier(role), sql.Identifier(db.name)))
        everywhere = owner.execute("select app.role_duration_setting(%s::regrole,"
                                   " 'statement_timeout') as cap", (role,)).fetchone()
    assert (both, everywhere) == ({"cap": timedelta(seconds=3)}, {"cap": timedelta(seconds=9)})
