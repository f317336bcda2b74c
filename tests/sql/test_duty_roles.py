"""What each duty group may do beyond the bare grants of the privilege matrix: the
tenant-bound producer's tenants, the reaper's retention floor, and bindings that follow
a role, not its name. (The legacy service_role: tests/migrations/test_service_role_removal.py.)

Every check connects as a login of the group it is about; the owner and the
administrator only arrange data and roles.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from tests.conftest import Database
from tests.sql.calls import (
    claim_one,
    enqueue,
    new_tenant,
    raises_sqlstate,
    snapshot,
)
from tests.support import postgres
from tests.support.postgres import Conn


@contextmanager
def _login(db: Database, role: str) -> Iterator[Conn]:
    with db.connect(role) as conn:
        yield conn


@pytest.fixture
def producer(db: Database) -> Iterator[Conn]:
    with _login(db, postgres.PRODUCER) as conn:
        yield conn


@pytest.fixture
def tenant_producer(db: Database) -> Iterator[Conn]:
    with _login(db, postgres.TENANT_PRODUCER) as conn:
        yield conn


@pytest.fixture
def duty_worker(db: Database) -> Iterator[Conn]:
    with _login(db, postgres.DUTY_WORKER) as conn:
        yield conn


@pytest.fixture
def reaper(db: Database) -> Iterator[Conn]:
    with _login(db, postgres.REAPER) as conn:
        yield conn


@pytest.fixture
def operator(db: Database) -> Iterator[Conn]:
    with _login(db, postgres.OPERATOR) as conn:
        yield conn


@contextmanager
def _temporary_role(admin: Conn, *groups: str, login: bool = True,
                    name: str | None = None) -> Iterator[str]:
    """A role of its own for one test (roles are cluster-wide: unique name, dropped after)."""
    role = name or f"leaseq_test_tmp_{uuid.uuid4().hex[:10]}"
    admin.execute(sql.SQL("create role {} {} inherit").format(
        sql.Identifier(role), sql.SQL("login" if login else "nologin")))
    try:
        for group in groups:
            admin.execute(sql.SQL("grant {} to {}").format(
                sql.Identifier(group), sql.Identifier(role)))
        yield role
    finally:
        admin.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(role)))


def _bind_producer(owner: Conn, role: str, tenant: uuid.UUID) -> None:
    owner.execute("insert into app.tenant_producers (role_name, tenant_id) values (%s, %s)",
                  (role, tenant))


def _bind_reader(owner: Conn, role: str, tenant: uuid.UUID) -> None:
    owner.execute("insert into app.tenant_readers (role_name, tenant_id) values (%s, %s)",
                  (role, tenant))


def _enqueue_batch(conn: Conn, tenants: list[uuid.UUID],
                   keys: list[str]) -> list[dict[str, object]]:
    return conn.execute(
        "select ord, job_id, status from app.enqueue_jobs(%s, %s, %s, %s) order by ord",
        (tenants, keys, ["email.send"] * len(keys), [Jsonb({"k": k}) for k in keys]),
    ).fetchall()


# The tenant-bound producer ------------------------------------------------------------------


def test_a_tenant_producer_enqueues_into_the_tenants_it_is_bound_to(
    owner: Conn, tenant_producer: Conn
) -> None:
    a, b = new_tenant(), new_tenant()
    _bind_producer(owner, postgres.TENANT_PRODUCER, a)
    _bind_producer(owner, postgres.TENANT_PRODUCER, b)

    single = enqueue(tenant_producer, a, "one")
    batch = _enqueue_batch(tenant_producer, [a, b], ["two", "three"])

    assert single["tenant_id"] == a
    assert "lease_token" not in single  # the job row holds none (app.leases does)
    assert [r["status"] for r in batch] == ["created", "created"]
    counts = owner.execute(
        "select tenant_id, count(*) as n from app.jobs group by tenant_id").fetchall()
    assert {r["tenant_id"]: r["n"] for r in counts} == {a: 2, b: 1}


def test_a_tenant_producer_is_refused_another_tenant_for_the_whole_call_and_nothing_is_written(
    owner: Conn, tenant_producer: Conn
) -> None:
    mine, other = new_tenant(), new_tenant()
    _bind_producer(owner, postgres.TENANT_PRODUCER, mine)
    before = snapshot(owner)

    with raises_sqlstate("42501", match=f"is not bound to tenant {other}"):
        enqueue(tenant_producer, other, "k")
    # One foreign tenant anywhere in a batch refuses the bound tenant's jobs too.
    with raises_sqlstate("42501", match=f"is not bound to tenant {other}"):
        _enqueue_batch(tenant_producer, [mine, mine, other], ["a", "b", "c"])

    assert snapshot(owner) == before == ([], [])


def test_a_tenant_producer_cannot_probe_another_tenants_keys_or_jobs(
    owner: Conn, producer: Conn, tenant_producer: Conn
) -> None:
    """The refusal comes before any lookup: an existing key, a conflicting one and an
    unknown one all get the same 42501, never 'existing', 23505 or an empty answer."""
    mine, other = new_tenant(), new_tenant()
    _bind_producer(owner, postgres.TENANT_PRODUCER, mine)
    existing = enqueue(producer, other, "secret-key", payload={"n": 1})
    before = snapshot(owner)

    probes = [
        ("select * from app.enqueue_job(%s, 'secret-key', 'email.send', %s)",
         (other, Jsonb({"n": 1}))),
        ("select * from app.enqueue_job(%s, 'secret-key', 'email.send', %s)",
         (other, Jsonb({"n": 2}))),
        ("select * from app.enqueue_job(%s, 'no-such-key', 'email.send', %s)",
         (other, Jsonb({"n": 1}))),
        ("select * from app.get_job_result_by_key(%s, 'secret-key')", (other,)),
        ("select * from app.get_job_result_by_key(%s, 'no-such-key')", (other,)),
        ("select * from app.get_job_result(%s, %s)", (other, existing["id"])),
        ("select * from app.get_job_result(%s, %s)", (other, uuid.uuid4())),
    ]
    for query, params in probes:
        with raises_sqlstate("42501", match=f"is not bound to tenant {other}"):
            tenant_producer.execute(query, params)
    # Its own tenant's id does not open another tenant's job either.
    assert tenant_producer.execute("select * from app.get_job_result(%s, %s)",
                                   (mine, existing["id"])).fetchall() == []
    assert snapshot(owner) == before


def test_a_producer_reads_the_state_and_result_of_its_job_but_no_lease_or_payload(
    owner: Conn, tenant_producer: Conn, worker: Conn
) -> None:
    tenant = new_tenant()
    _bind_producer(owner, postgres.TENANT_PRODUCER, tenant)
    created = enqueue(tenant_producer, tenant, "report-7")
    claimed = claim_one(worker, tenant)
    running = tenant_producer.execute("select * from app.get_job_result(%s, %s)",
                                      (tenant, created["id"])).fetchone()
    worker.execute("select app.complete_job(%s, %s, 'worker-1', %s, %s)",
                   (tenant, created["id"], claimed["lease_token"], Jsonb({"rows": 42})))

    by_id = tenant_producer.execute("select * from app.get_job_result(%s, %s)",
                                    (tenant, created["id"])).fetchone()
    by_key = tenant_producer.execute("select * from app.get_job_result_by_key(%s, %s)",
                                     (tenant, "report-7")).fetchone()

    assert running is not None
    assert running["state"] == "running"
    assert not {"lease_token", "lease_owner", "lease_expires_at", "payload"} & set(running)
    assert by_id is not None
    assert (by_id["state"], by_id["result"], by_id["attempts"]) == ("succeeded", {"rows": 42}, 1)
    assert by_key == by_id
    assert tenant_producer.execute("select * from app.get_job_result(%s, %s)",
                                   (tenant, uuid.uuid4())).fetchall() == []


def test_a_producer_enqueues_into_and_reads_any_tenant(owner: Conn, producer: Conn) -> None:
    a, b = new_tenant(), new_tenant()

    batch = _enqueue_batch(producer, [a, b], ["x", "y"])
    read = producer.execute("select tenant_id, state from app.get_job_result_by_key(%s, 'y')",
                            (b,)).fetchall()

    assert [r["status"] for r in batch] == ["created", "created"]
    assert read == [{"tenant_id": b, "state": "pending"}]


def test_an_unbound_producer_probing_another_tenants_key_gets_no_job_id(
    owner: Conn, producer: Conn, tenant_producer: Conn
) -> None:
    """The conflict answer is not a probe: a producer that may write into every tenant
    learns that the key is taken, never the job's id or state; only a request that
    repeats the job exactly (an idempotent retry) gets it back."""
    theirs = new_tenant()
    _bind_producer(owner, postgres.TENANT_PRODUCER, theirs)
    original = enqueue(tenant_producer, theirs, "invoice-7", payload={"amount": 10})
    before = snapshot(owner)

    probe = producer.execute(
        "select ord, job_id, status, state, error from app.enqueue_jobs(%s, %s, %s, %s)",
        ([theirs], ["invoice-7"], ["email.send"], [Jsonb({"guess": True})])).fetchall()
    with raises_sqlstate("23505", match="already names a job with a different kind or payload"):
        enqueue(producer, theirs, "invoice-7", kind="other.kind")
    with pytest.raises(psycopg.Error) as refused:
        enqueue(producer, theirs, "invoice-7", payload={"amount": 11})

    assert probe == [{"ord": 1, "job_id": None, "status": "conflict", "state": None,
                      "error": None}]
    assert str(original["id"]) not in str(refused.value)
    assert "email.send" not in str(refused.value)
    assert snapshot(owner) == before
    # The producer's own retry, identical, is idempotent: the same job, not a new one.
    again = enqueue(tenant_producer, theirs, "invoice-7", payload={"amount": 10})
    replay = tenant_producer.execute(
        "select job_id, status from app.enqueue_jobs(%s, %s, %s, %s)",
        ([theirs], ["invoice-7"], ["email.send"], [Jsonb({"amount": 10})])).fetchone()
    assert again["id"] == original["id"]
    assert replay == {"job_id": original["id"], "status": "existing"}
    assert snapshot(owner) == before


def test_the_login_not_the_role_it_sets_decides_which_tenants_a_producer_may_use(
    db: Database, owner: Conn, admin: Conn
) -> None:
    """Inside the SECURITY DEFINER functions current_user is the owner, so the caller is
    identified by session_user. SET ROLE changes current_user only: it neither narrows
    a producer (its login may act as leaseq_producer) nor lends a bound login another
    role's tenants."""
    login_tenant, role_tenant, unbound = new_tenant(), new_tenant(), new_tenant()
    with _temporary_role(admin, "leaseq_tenant_producer", login=False) as alias:
        _bind_producer(owner, alias, role_tenant)
        _bind_producer(owner, postgres.TENANT_PRODUCER, login_tenant)
        for login in (postgres.TENANT_PRODUCER, postgres.PRODUCER):
            admin.execute(sql.SQL("grant {} to {}").format(
                sql.Identifier(alias), sql.Identifier(login)))
        with _login(db, postgres.TENANT_PRODUCER) as bound, \
                _login(db, postgres.PRODUCER) as unrestricted:
            for conn in (bound, unrestricted):
                conn.execute(sql.SQL("set role {}").format(sql.Identifier(alias)))
                assert conn.execute("select current_user as u").fetchone() == {"u": alias}

            with raises_sqlstate("42501", match=f"role {postgres.TENANT_PRODUCER} is not bound"):
                enqueue(bound, role_tenant, "via-alias")
            enqueue(bound, login_tenant, "own-binding")
            enqueue(unrestricted, unbound, "still-a-producer")

    rows = owner.execute("select tenant_id, operation_key from app.jobs").fetchall()
    assert sorted((r["tenant_id"], r["operation_key"]) for r in rows) == sorted(
        [(login_tenant, "own-binding"), (unbound, "still-a-producer")])


# Bindings follow the role, not its name ---------------------------------------------------------


def test_a_role_recreated_under_a_dropped_producers_name_is_bound_to_nothing(
    db: Database, owner: Conn, admin: Conn
) -> None:
    tenant = new_tenant()
    name = f"leaseq_test_tmp_{uuid.uuid4().hex[:10]}"
    with _temporary_role(admin, "leaseq_tenant_producer", name=name):
        _bind_producer(owner, name, tenant)
        with _login(db, name) as first:
            enqueue(first, tenant, "first-life")
    with _temporary_role(admin, "leaseq_tenant_producer", name=name), \
            _login(db, name) as again, raises_sqlstate("42501", match="is not bound to tenant"):
        enqueue(again, tenant, "second-life")
    # The dropped role's binding names its OID, which no role has any more.
    stale = owner.execute(
        "select count(*) as n from app.tenant_producers b"
        " where not exists (select 1 from pg_roles r where r.oid = b.role_name)").fetchone()
    assert stale == {"n": 1}


def test_a_role_recreated_under_a_dropped_readers_name_sees_no_tenant(
    db: Database, owner: Conn, admin: Conn, worker: Conn
) -> None:
    tenant = new_tenant()
    enqueue(worker, tenant, "a")
    name = f"leaseq_test_tmp_{uuid.uuid4().hex[:10]}"

    def visible(conn: Conn) -> int:
        conn.execute("select set_config('app.tenant_id', %s, false)", (str(tenant),))
        row = conn.execute("select count(*) as n from app.jobs").fetchone()
        assert row is not None
        bindings = conn.execute("select count(*) as n from app.tenant_readers").fetchone()
        assert bindings is not None
        return int(row["n"]) + 10 * int(bindings["n"])

    with _temporary_role(admin, "authenticated", name=name):
        _bind_reader(owner, name, tenant)
        with _login(db, name) as first:
            assert visible(first) == 11  # one job, one binding of its own
    with _temporary_role(admin, "authenticated", name=name), _login(db, name) as again:
        assert visible(again) == 0


def test_a_binding_names_an_existing_role(owner: Conn) -> None:
    with raises_sqlstate("42704"):
        owner.execute("insert into app.tenant_producers (role_name, tenant_id)"
                      " values ('leaseq_test_no_such_role', gen_random_uuid())")


# The reaper's retention floor --------------------------------------------------------------


def _finished_jobs(worker: Conn, admin: Conn, tenant: uuid.UUID, ages: dict[str, timedelta]
                   ) -> None:
    """Jobs that succeeded the given time ago (moved into the past as the administrator)."""
    for key, age in ages.items():
        job = enqueue(worker, tenant, key)
        lease = claim_one(worker, tenant)
        worker.execute("select app.complete_job(%s, %s, 'worker-1', %s, null)",
                       (tenant, job["id"], lease["lease_token"]))
        admin.execute("update app.jobs set completed_at = clock_timestamp() - %s where id = %s",
                      (age, job["id"]))


def _keys(owner: Conn) -> set[str]:
    return {r["operation_key"] for r in owner.execute("select operation_key from app.jobs")}


def test_the_reaper_prunes_finished_jobs_older_than_its_retention(
    worker: Conn, admin: Conn, owner: Conn, reaper: Conn
) -> None:
    _finished_jobs(worker, admin, new_tenant(),
                   {"old": timedelta(days=15), "recent": timedelta(days=3)})

    row = reaper.execute("select * from app.prune_retained_jobs('14 days', 100)").fetchone()

    assert row == {"jobs_deleted": 1, "events_deleted": 3}
    assert _keys(owner) == {"recent"}


@pytest.mark.parametrize("older_than", ["0 seconds", "23 hours 59 minutes", None])
def test_the_reaper_cannot_prune_younger_than_the_owners_floor(
    worker: Conn, admin: Conn, owner: Conn, reaper: Conn, older_than: str | None
) -> None:
    _finished_jobs(worker, admin, new_tenant(), {"hour": timedelta(hours=1)})
    before = snapshot(owner)

    with raises_sqlstate("22023", match="p_older_than must be between 1 day "
                                        "(app.settings.min_retention) and 3650 days"):
        reaper.execute("select * from app.prune_retained_jobs(%s::interval, 100)",
                       (older_than,))
    with raises_sqlstate("42501", match="permission denied for function prune_jobs"):
        reaper.execute("select * from app.prune_jobs('0 seconds', 100)")
    with raises_sqlstate("42501", match="permission denied"):
        reaper.execute("update app.settings set min_retention = '0 seconds'")

    assert snapshot(owner) == before


def test_the_owner_sets_the_floor_and_an_operator_is_not_bound_by_it(
    worker: Conn, admin: Conn, owner: Conn, reaper: Conn, operator: Conn
) -> None:
    _finished_jobs(worker, admin, new_tenant(),
                   {"week": timedelta(days=7), "hour": timedelta(hours=1)})
    owner.execute("update app.settings set min_retention = '10 days'")
    try:
        with raises_sqlstate("22023", match="between 10 days (app.settings.min_retention)"):
            reaper.execute("select * from app.prune_retained_jobs('5 days', 100)")
        assert _keys(owner) == {"week", "hour"}
        pruned = operator.execute("select * from app.prune_jobs('0 seconds', 100)").fetchone()
    finally:
        owner.execute("update app.settings set min_retention = default")
    assert pruned == {"jobs_deleted": 2, "events_deleted": 6}


def test_without_its_settings_row_the_reaper_prunes_nothing(
    worker: Conn, admin: Conn, owner: Conn, reaper: Conn
) -> None:
    _finished_jobs(worker, admin, new_tenant(), {"old": timedelta(days=30)})
    owner.execute("delete from app.settings")
    try:
        with raises_sqlstate("55000", match="app.settings has no row"):
            reaper.execute("select * from app.prune_retained_jobs('14 days', 100)")
    finally:
        owner.execute("insert into app.settings default values")
    assert _keys(owner) == {"old"}
