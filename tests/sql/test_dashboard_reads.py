"""The dashboard's reads: queue depth, activity, paged lists, a job and its timeline.

Each read is called in both forms: the operator's (SECURITY DEFINER, leaseq_operator, every
tenant) and the reader's (SECURITY INVOKER, row-level security picks the tenant).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from tests.conftest import Database
from tests.sql.calls import claim_one, enqueue, expire_lease, new_tenant, raises_sqlstate
from tests.support import postgres
from tests.support.postgres import Conn

LIST = "select * from app.list_jobs(%s, %s, %s, %s, %s, %s, %s, %s)"
READER_LIST = "select * from app.reader_list_jobs(%s, %s, %s, %s, %s, %s, %s, %s)"


def _fail(conn: Conn, tenant: uuid.UUID, *, message: str, retry: bool) -> uuid.UUID:
    job = claim_one(conn, tenant)
    if retry:
        conn.execute("select app.fail_job(%s, %s, 'worker-1', %s, %s, '1 hour')",
                     (tenant, job["id"], job["lease_token"], Jsonb({"message": message})))
    else:
        conn.execute("select app.discard_job(%s, %s, 'worker-1', %s, %s)",
                     (tenant, job["id"], job["lease_token"], Jsonb({"message": message})))
    return uuid.UUID(str(job["id"]))


def _succeed(conn: Conn, tenant: uuid.UUID) -> uuid.UUID:
    job = claim_one(conn, tenant)
    conn.execute("select app.complete_job(%s, %s, 'worker-1', %s, %s)",
                 (tenant, job["id"], job["lease_token"], Jsonb({"ok": True})))
    return uuid.UUID(str(job["id"]))


@pytest.fixture
def bound_reader(db: Database, owner: Conn) -> Iterator[tuple[Conn, uuid.UUID]]:
    """A reader bound to one tenant, with app.tenant_id set for its session."""
    tenant = new_tenant()
    owner.execute("insert into app.tenant_readers (role_name, tenant_id) values (%s, %s)",
                  (postgres.READER, tenant))
    with db.connect(postgres.READER) as conn:
        conn.execute("select set_config('app.tenant_id', %s, false)", (str(tenant),))
        yield conn, tenant


def test_queue_depth_counts_unfinished_and_dead_jobs_per_tenant_kind_and_in_total(
    worker: Conn, owner: Conn
) -> None:
    busy, quiet = new_tenant(), new_tenant()
    for i in range(3):
        enqueue(worker, busy, f"p{i}", kind="email.send")
    enqueue(worker, busy, "later", kind="email.send",
            available_at=None)
    owner.execute("update app.jobs set available_at = now() + interval '1 hour'"
                  " where operation_key = 'later'")
    enqueue(worker, quiet, "r1", kind="report.build")
    running = claim_one(worker, quiet)
    expire_lease(owner, running["id"])
    enqueue(worker, quiet, "d1", kind="report.build")
    _fail(worker, quiet, message="boom", retry=False)
    enqueue(worker, quiet, "s1", kind="report.build")
    _succeed(worker, quiet)

    rows = worker.execute("select * from app.queue_depth(null, null, 20)").fetchall()
    by = {(r["dimension"], r["tenant_id"], r["kind"]): r for r in rows}

    total = by[("total", None, None)]
    assert (total["pending"], total["ready"], total["running"], total["expired"],
            total["retry_wait"], total["dead"]) == (4, 3, 1, 1, 0, 1)
    assert by[("tenant", busy, None)]["pending"] == 4
    assert by[("tenant", quiet, None)]["dead"] == 1
    assert by[("kind", None, "report.build")]["running"] == 1
    assert by[("kind", None, "email.send")]["ready"] == 3
    # The tenant whose oldest ready job has waited longest comes first.
    tenants = [r["tenant_id"] for r in rows if r["dimension"] == "tenant"]
    assert tenants == [busy, quiet]


def test_queue_depth_limits_the_tenants_listed_but_not_the_totals(worker: Conn) -> None:
    for i in range(5):
        enqueue(worker, new_tenant(), f"k{i}")
    rows = worker.execute("select * from app.queue_depth(null, null, 2)").fetchall()
    assert sum(r["dimension"] == "tenant" for r in rows) == 2
    total = next(r for r in rows if r["dimension"] == "total")
    assert total["pending"] == 5


def test_a_reader_sees_only_its_own_tenant_in_every_dashboard_read(
    worker: Conn, bound_reader: tuple[Conn, uuid.UUID]
) -> None:
    reader, mine = bound_reader
    other = new_tenant()
    own_job = enqueue(worker, mine, "mine")["id"]
    other_job = enqueue(worker, other, "theirs")["id"]
    enqueue(worker, other, "theirs-2")

    depth = reader.execute("select * from app.reader_queue_depth()").fetchall()
    assert {r["tenant_id"] for r in depth if r["dimension"] == "tenant"} == {mine}
    assert next(r for r in depth if r["dimension"] == "total")["pending"] == 1
    # Asking for another tenant does not widen what row-level security lets through.
    asked = reader.execute("select * from app.reader_queue_depth(%s)", (other,)).fetchall()
    assert [r["pending"] for r in asked if r["dimension"] == "total"] in ([], [0])

    listed = reader.execute(READER_LIST, ("pending", other, None, None, None, None, None, 50))
    assert listed.fetchall() == []
    listed = reader.execute(READER_LIST, ("pending", None, None, None, None, None, None, 50))
    assert [r["id"] for r in listed.fetchall()] == [own_job]

    assert reader.execute("select * from app.reader_get_job(%s)", (other_job,)).fetchall() == []
    assert reader.execute("select * from app.reader_get_job(%s)", (own_job,)).fetchone()
    assert reader.execute("select * from app.reader_job_timeline(%s)",
                          (other_job,)).fetchall() == []
    timeline = reader.execute("select * from app.reader_job_timeline(%s)", (own_job,))
    assert [e["event_type"] for e in timeline.fetchall()] == ["created"]


def test_a_reader_bound_to_no_tenant_sees_nothing(db: Database, worker: Conn) -> None:
    job = enqueue(worker, new_tenant(), "a")["id"]
    with db.connect(postgres.OTHER_READER) as reader:
        reader.execute("select set_config('app.tenant_id', %s, false)", (str(new_tenant()),))
        rows = reader.execute(READER_LIST, ("pending", None, None, None, None, None, None, 50))
        assert rows.fetchall() == []
        assert reader.execute("select * from app.reader_get_job(%s)", (job,)).fetchall() == []


def _page_through(conn: Conn, state: str, **filters: Any) -> list[list[dict[str, Any]]]:
    pages: list[list[dict[str, Any]]] = []
    after_at = after_id = None
    while True:
        rows = conn.execute(LIST, (state, filters.get("tenant"), filters.get("kind"),
                                   filters.get("since"), filters.get("until"),
                                   after_at, after_id, filters.get("limit", 3))).fetchall()
        if not rows:
            return pages
        pages.append(rows)
        after_at, after_id = rows[-1]["sort_at"], rows[-1]["id"]


def test_list_jobs_pages_by_keyset_through_every_job_once_in_order(
    worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    ids = [enqueue(worker, tenant, f"j{i}")["id"] for i in range(8)]
    # Two jobs share an available_at: the id breaks the tie, so none is lost or repeated.
    owner.execute("update app.jobs set available_at = now() - (interval '1 minute' * ("
                  "  select count(*) from app.jobs k"
                  "  where k.operation_key > app.jobs.operation_key))")
    owner.execute("update app.jobs set available_at = (select available_at from app.jobs"
                  " where operation_key = 'j3') where operation_key = 'j4'")

    pages = _page_through(worker, "pending")
    seen = [r["id"] for page in pages for r in page]

    assert sorted(seen) == sorted(ids)
    assert len(seen) == len(set(seen))
    keys = [(r["sort_at"], r["id"]) for page in pages for r in page]
    assert keys == sorted(keys)
    assert [len(p) for p in pages] == [3, 3, 2]


def test_list_jobs_dead_newest_first_with_last_error_and_filters(worker: Conn) -> None:
    tenant, other = new_tenant(), new_tenant()
    for i in range(4):
        enqueue(worker, tenant, f"d{i}", kind="a" if i % 2 else "b")
        _fail(worker, tenant, message=f"error {i}", retry=False)
    enqueue(worker, other, "x", kind="a")
    _fail(worker, other, message="elsewhere", retry=False)

    pages = _page_through(worker, "dead", tenant=tenant, limit=10)
    rows = pages[0]
    assert [r["error_summary"] for r in rows] == ["error 3", "error 2", "error 1", "error 0"]
    only_a = _page_through(worker, "dead", tenant=tenant, kind="a", limit=10)[0]
    assert {r["kind"] for r in only_a} == {"a"}
    assert len(only_a) == 2
    everyone = _page_through(worker, "dead", limit=2)
    assert sum(len(p) for p in everyone) == 5


def test_list_jobs_running_shows_owner_and_expiry_never_the_token(worker: Conn) -> None:
    tenant = new_tenant()
    enqueue(worker, tenant, "r")
    claimed = claim_one(worker, tenant)
    (row,) = worker.execute(LIST, ("running", None, None, None, None, None, None, 10)).fetchall()
    assert row["lease_owner"] == "worker-1"
    assert row["lease_expires_at"] == claimed["lease_expires_at"] == row["sort_at"]
    assert "lease_token" not in row
    assert str(claimed["lease_token"]) not in repr(row)


def test_list_jobs_time_range_applies_to_the_lists_own_clock(worker: Conn, owner: Conn) -> None:
    tenant = new_tenant()
    old = enqueue(worker, tenant, "old")["id"]
    new = enqueue(worker, tenant, "new")["id"]
    owner.execute("update app.jobs set available_at = now() - interval '2 hours' where id = %s",
                  (old,))
    since = owner.execute("select now() - interval '1 hour' as t").fetchone()
    assert since is not None
    after = _page_through(worker, "pending", since=since["t"], limit=10)
    before = _page_through(worker, "pending", until=since["t"], limit=10)
    assert [r["id"] for r in after[0]] == [new]
    assert [r["id"] for r in before[0]] == [old]


def test_job_activity_buckets_outcomes_and_enqueue_to_start_latency(
    worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    enqueue(worker, tenant, "ok")
    ok = _succeed(worker, tenant)
    enqueue(worker, tenant, "bad")
    bad = _fail(worker, tenant, message="x", retry=False)
    # The successful job waited 90 seconds between enqueue and its first claim.
    owner.execute("update app.job_events set created_at = created_at - interval '90 seconds'"
                  " where job_id = %s and event_type = 'created'", (ok,))
    owner.execute("update app.job_events set details = jsonb_set(details, '{availableAt}',"
                  " to_jsonb(created_at)) where job_id = %s and event_type = 'created'", (ok,))
    owner.execute("update app.jobs set created_at = created_at - interval '90 seconds'"
                  " where id = %s", (ok,))
    owner.execute("update app.jobs set completed_at = now() - interval '3 hours' where id = %s",
                  (bad,))

    rows = worker.execute("select * from app.job_activity(%s, null, '6 hours', 6, 50)",
                          (tenant,)).fetchall()

    assert len(rows) == 6
    assert [r["succeeded"] for r in rows] == [0, 0, 0, 0, 0, 1]
    assert sum(r["dead"] for r in rows) == 1
    assert rows[2]["dead"] == 1
    last = rows[-1]
    assert last["samples"] == 1
    assert timedelta(seconds=89) < last["latency_max"] < timedelta(seconds=100)
    assert rows[0]["bucket_end"] == rows[1]["bucket_start"]


@pytest.mark.parametrize(("query", "params", "message"), [
    (LIST, ("pending", None, None, None, None, None, None, 0), "p_limit must be between 1"),
    (LIST, (None, None, None, None, None, None, None, 10), "p_state is required"),
    (LIST, ("dead", None, "  ", None, None, None, None, 10), "p_kind must be"),
    (LIST, ("dead", None, None, None, None, "2026-01-01", None, 10), "go together"),
    (LIST, ("dead", None, None, "2026-02-01", "2026-01-01", None, None, 10), "p_from"),
    ("select * from app.job_activity(null, null, '1 second', 10, 10)", (), "p_window"),
    ("select * from app.job_activity(null, null, '1 hour', 0, 10)", (), "p_buckets"),
    ("select * from app.queue_depth(null, null, 0)", (), "p_limit"),
    ("select * from app.reader_get_job(null)", (), "p_job_id is required"),
])
def test_dashboard_reads_refuse_bad_arguments_with_22023(
    worker: Conn, owner: Conn, query: str, params: tuple[Any, ...], message: str
) -> None:
    conn = owner if "reader_" in query else worker
    with raises_sqlstate("22023", match=message):
        conn.execute(query, params)


def test_hostile_kinds_and_errors_come_back_byte_for_byte(worker: Conn) -> None:
    tenant = new_tenant()
    kind = "<script>alert('k')</script>\"é✓"
    enqueue(worker, tenant, "h", kind=kind, payload={"html": "<img src=x onerror=alert(1)>"})
    _fail(worker, tenant, message="</td><script>alert(\"e\")</script> ünïcødé", retry=True)
    (row,) = worker.execute(LIST, ("retry_wait", None, kind, None, None, None, None, 5))
    assert row["kind"] == kind
    assert row["error_summary"] == "</td><script>alert(\"e\")</script> ünïcødé"


def test_job_activity_counts_agree_between_the_index_only_and_the_filtered_paths(
    worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    for i in range(5):
        enqueue(worker, tenant, f"s{i}")
        _succeed(worker, tenant)
    for i in range(2):
        enqueue(worker, tenant, f"d{i}")
        _fail(worker, tenant, message="x", retry=False)
    enqueue(worker, tenant, "c")
    worker.execute("select * from app.cancel_jobs('op', %s, null, null, 1, null)", (tenant,))
    owner.execute("update app.jobs set completed_at = now() - interval '90 minutes'"
                  " where operation_key in ('s0', 'd0')")

    query = "select * from app.job_activity(%s, null, '3 hours', 3, 0)"
    unfiltered = worker.execute(query, (None,)).fetchall()
    filtered = worker.execute(query, (tenant,)).fetchall()

    counts = [(r["succeeded"], r["dead"], r["cancelled"]) for r in unfiltered]
    assert counts == [(0, 0, 0), (1, 1, 0), (4, 1, 1)]
    assert counts == [(r["succeeded"], r["dead"], r["cancelled"]) for r in filtered]


def test_job_activity_of_one_kind_counts_every_tenants_jobs_of_that_kind_only(
    worker: Conn,
) -> None:
    first, second = new_tenant(), new_tenant()
    for tenant, key, kind in ((first, "a", "report.build"), (first, "b", "report.build"),
                              (first, "c", "email.send"), (second, "d", "report.build")):
        enqueue(worker, tenant, key, kind=kind)
        _succeed(worker, tenant)
    enqueue(worker, first, "e", kind="report.build")
    _fail(worker, first, message="x", retry=False)
    enqueue(worker, second, "f", kind="report.build")
    worker.execute("select * from app.cancel_jobs('op', %s, null, null, 1, null)", (second,))

    query = "select * from app.job_activity(%s, %s, '1 hour', 2, 0)"
    every = worker.execute(query, (None, "report.build")).fetchall()
    per_tenant = [worker.execute(query, (t, "report.build")).fetchall() for t in (first, second)]

    counts = [(r["succeeded"], r["dead"], r["cancelled"]) for r in every]
    assert counts == [(0, 0, 0), (3, 1, 1)]
    assert counts == [tuple(a[k] + b[k] for k in ("succeeded", "dead", "cancelled"))
                      for a, b in zip(*per_tenant, strict=True)]
