"""The reaper's and the fair claimer's queries stay index-backed on a large table.

The jobs are written directly, so the tenants' turns are then built by
app.repair_tenant_turns, as the reaper would.

The functions are plpgsql SECURITY DEFINER, so EXPLAIN of the call shows only a
Function Scan; auto_explain logs the plan of every statement inside them instead
(``log_nested_statements``), returned to the calling connection as notices. Each function is
called several times, so both plpgsql's custom plans and its cached generic plan are
checked. auto_explain ships with the Debian and RDS builds of PostgreSQL but not with
the embedded server; there these tests skip.

Run as a module it prints the captured plans as Markdown (docs/sql-plans.md).
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, LiteralString

import psycopg
import pytest
from leaseq.store.db import connect
from leaseq.store.migrate import migrate

from tests.conftest import Database
from tests.support import postgres
from tests.support.postgres import Cluster, Conn

TENANTS = 100
JOBS = 100_000
LATER_TENANTS = 5_000  # tenants whose one job is due next month: a claim never reads them
CALLS = 7  # plpgsql switches to a generic plan after five custom ones

# 100 tenants x 1,000 jobs. Per tenant: 90% succeeded, 5% pending (one in seven of
# them not due for an hour), 3% running (half of those with an expired lease), 2% dead;
# one job in three of every state is of the kind SLOW, the others of 'plan.check'.
_POPULATE = """
insert into app.jobs (tenant_id, operation_key, kind, payload, state, attempts, available_at,
                      lease_owner, created_at, updated_at, completed_at)
select s.tenant, 'op-' || g,
       case when (g / %(tenants)s) %% 3 = 0 then 'plan.slow' else 'plan.check' end,
       jsonb_build_object('g', g), s.state,
       case when s.state = 'pending' then 0 else 1 end,
       clock_timestamp() - interval '1 hour'
         + case when g %% 7 = 0 then interval '2 hours' else interval '0' end,
       case when s.state = 'running' then 'worker-' || (g %% 8) end,
       clock_timestamp() - interval '1 day', clock_timestamp(),
       case when s.state in ('succeeded', 'dead') then clock_timestamp() end
from generate_series(0, %(jobs)s - 1) as g
cross join lateral (
  select ('00000000-0000-4000-8000-' || lpad(to_hex(g %% %(tenants)s), 12, '0'))::uuid
           as tenant,
         case when (g / %(tenants)s) %% 100 < 90 then 'succeeded'
              when (g / %(tenants)s) %% 100 < 95 then 'pending'
              when (g / %(tenants)s) %% 100 < 98 then 'running'
              else 'dead' end::app.job_state as state
) as s
"""


# The running jobs' leases (app.leases): half of them expired.
_POPULATE_LEASES = """
insert into app.leases (job_id, tenant_id, lease_owner, lease_token, expires_at, claimed_at)
select j.id, j.tenant_id, j.lease_owner, gen_random_uuid(),
       clock_timestamp() + case when mod(substr(j.operation_key, 4)::bigint, 2) = 0
                                then interval '-1 minute' else interval '10 minutes' end,
       clock_timestamp()
from app.jobs j
where j.state = 'running'
"""


# The finished jobs' final events, as their outcomes wrote them: retention and the
# finished lists find succeeded jobs by theirs (job_events_succeeded_idx).
_POPULATE_FINAL_EVENTS = """
insert into app.job_events (tenant_id, job_id, event_type, actor, details, created_at)
select j.tenant_id, j.id, j.state::text, 'worker-0', '{}'::jsonb, j.completed_at
from app.jobs j
where j.state in ('succeeded', 'dead')
"""


_POPULATE_LATER = """
insert into app.jobs (tenant_id, operation_key, kind, payload, available_at, created_at,
                      updated_at)
select ('10000000-0000-4000-8000-' || lpad(to_hex(g), 12, '0'))::uuid, 'later', 'plan.check',
       '{}'::jsonb, clock_timestamp() + interval '30 days', clock_timestamp(), clock_timestamp()
from generate_series(1, %(tenants)s) as g
"""


SLOW = "plan.slow"
#: A claim's kind filter (p_kinds, p_exclude_kinds): the slow worker's and the main one's.
FILTERS = {"kinds": ([SLOW], None), "exclude": (None, [SLOW])}


def tenant_uuid(n: int) -> uuid.UUID:
    return uuid.UUID(f"00000000-0000-4000-8000-{n:012x}")


@dataclass(frozen=True)
class Plan:
    query: str
    root: dict[str, Any]
    text: str


def _nodes(node: dict[str, Any], *, follow_init_plans: bool = True) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        if not follow_init_plans and child.get("Parent Relationship") in ("InitPlan", "SubPlan"):
            continue
        yield from _nodes(child, follow_init_plans=follow_init_plans)


def seq_scans_of_jobs(plans: list[Plan]) -> list[str]:
    return [
        p.query for p in plans for n in _nodes(p.root)
        if n["Node Type"] == "Seq Scan"
        and n.get("Relation Name") in ("jobs", "job_events", "claimable", "tenant_turns",
                                       "kind_turns")
    ]


def turn_rows_read(plans: list[Plan], table: str = "tenant_turns") -> int:
    """The most index entries any one scan of ``table`` returned (per loop)."""
    return max((n["Actual Rows"] + n.get("Rows Removed by Filter", 0)
                for p in plans for n in _nodes(p.root)
                if n.get("Relation Name") == table and "Scan" in n["Node Type"]),
               default=0)


def sorts(plans: list[Plan]) -> list[str]:
    return [
        p.query for p in plans for n in _nodes(p.root)
        if n["Node Type"] in ("Sort", "Incremental Sort")
    ]


def large_sorts_of_jobs(plans: list[Plan], max_rows: int) -> list[str]:
    """Sorts that read app.jobs or app.claimable below them (not in a CTE or sub-plan
    beside them) and sorted more than ``max_rows`` rows: a batch's worth is fine, the
    backlog is not."""
    found = []
    for p in plans:
        for node in _nodes(p.root):
            if node["Node Type"] not in ("Sort", "Incremental Sort"):
                continue
            below = list(_nodes(node, follow_init_plans=False))
            reads_jobs = any(n.get("Relation Name") in ("jobs", "claimable") for n in below)
            # A top-N sort under a LIMIT emits few rows; what it read is its input's.
            sorted_rows = max(n["Actual Rows"] for n in below[1:2] or [node])
            if reads_jobs and sorted_rows > max_rows:
                found.append(p.query)
    return found


def indexes_used(plans: list[Plan]) -> set[str]:
    """The indexes of scans that ran: an arm a one-time filter skipped (Actual Loops 0)
    is in the plan but read nothing, so it proves no index is used."""
    return {n["Index Name"] for p in plans for n in _nodes(p.root)
            if "Index Name" in n and n.get("Actual Loops", 1) > 0}


class PlanCapture:
    """auto_explain on one superuser connection; every nested statement's plan as a notice."""

    def __init__(self, conn: Conn, fmt: str = "json") -> None:
        self.conn = conn
        self.fmt = fmt
        self._messages: list[str] = []
        conn.execute("load 'auto_explain'")
        for setting, value in (
            ("auto_explain.log_min_duration", "0"),
            ("auto_explain.log_nested_statements", "on"),
            ("auto_explain.log_level", "notice"),
            ("auto_explain.log_format", fmt),
            ("auto_explain.log_analyze", "on"),
            ("auto_explain.log_timing", "off"),
            ("auto_explain.log_buffers", "off"),
        ):
            conn.execute("select set_config(%s, %s, false)", (setting, value))
        conn.add_notice_handler(self._on_notice)

    def _on_notice(self, diag: psycopg.errors.Diagnostic) -> None:
        message = diag.message_primary or ""
        if "plan:" in message:
            self._messages.append(message)

    def run(
        self, query: LiteralString, params: tuple[Any, ...] = ()
    ) -> tuple[list[dict[str, Any]], list[Plan]]:
        self._messages.clear()
        rows = self.conn.execute(query, params).fetchall()
        plans = [self._parse(m) for m in self._messages]
        return rows, plans

    def _parse(self, message: str) -> Plan:
        body = message.split("plan:", 1)[1].strip()
        if self.fmt != "json":
            # "Query Text: ..." runs on over the statement's own (indented) lines; the
            # plan starts at the first line after it that is not indented.
            lines = body.splitlines()
            start = next(
                (i for i, line in enumerate(lines) if i > 0 and line and not line[0].isspace()),
                len(lines),
            )
            query = "\n".join(lines[:start]).removeprefix("Query Text: ")
            return Plan(query, {"Node Type": "?"}, "\n".join(lines[start:]))
        data = json.loads(body)
        return Plan(data["Query Text"], data["Plan"], body)


@pytest.fixture(scope="module")
def big_queue(cluster: Cluster, migrated_database: Database) -> Iterator[Database]:
    """A migrated database holding 100,000 analysed jobs of 100 tenants."""
    with cluster.connect() as admin:
        try:
            admin.execute("load 'auto_explain'")
        except psycopg.errors.UndefinedFile:
            pytest.skip(
                "auto_explain is not shipped with this server (the embedded build lacks "
                "it); run with LEASEQ_TEST_DSN against a Debian or RDS PostgreSQL"
            )
    database = build_big_queue(cluster)
    try:
        yield database
    finally:
        postgres.drop_database(cluster, database.name)


def build_big_queue(cluster: Cluster) -> Database:
    name = f"leaseq_plans_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    postgres.create_database(cluster, name)
    database = Database(cluster, name)
    with connect(database.owner_dsn) as conn:
        migrate(conn)
        conn.execute(_POPULATE, {"jobs": JOBS, "tenants": TENANTS})
        conn.execute(_POPULATE_LEASES)
        conn.execute(_POPULATE_FINAL_EVENTS)
        conn.execute(_POPULATE_LATER, {"tenants": LATER_TENANTS})
        conn.execute("select * from app.repair_tenant_turns(10000)")
        conn.execute("analyze app.jobs, app.claimable, app.leases, app.tenant_turns,"
                     " app.kind_turns, app.job_events")
    return database


@pytest.fixture
def capture(big_queue: Database) -> Iterator[PlanCapture]:
    """A superuser connection with auto_explain; whatever the test changes is rolled back."""
    with big_queue.connect(None) as conn, conn.transaction(force_rollback=True):
        yield PlanCapture(conn)


def test_big_queue_has_the_intended_shape(capture: PlanCapture) -> None:
    rows, _ = capture.run(
        "select state, count(*) as n, count(distinct tenant_id) as tenants from app.jobs"
        " group by state order by state"
    )
    assert rows == [
        {"state": "pending", "n": 5_000 + LATER_TENANTS, "tenants": 100 + LATER_TENANTS},
        {"state": "running", "n": 3_000, "tenants": 100},
        {"state": "succeeded", "n": 90_000, "tenants": 100},
        {"state": "dead", "n": 2_000, "tenants": 100},
    ]
    rows, _ = capture.run(
        "select kind, count(distinct tenant_id) as tenants from app.jobs"
        " where state = 'pending' and tenant_id < '10000000-0000-0000-0000-000000000000'"
        " group by kind order by kind")
    assert rows == [{"kind": "plan.check", "tenants": 100}, {"kind": SLOW, "tenants": 100}]


def test_ready_tenants_reads_the_due_turns_and_probes_the_claimable_index_per_tenant(
    capture: PlanCapture,
) -> None:
    plans: list[Plan] = []
    for _ in range(CALLS):
        rows, captured = capture.run("select * from app.ready_tenants(100)")
        assert [r["tenant_id"] for r in rows] == [tenant_uuid(n) for n in range(TENANTS)]
        plans += captured

    assert plans, "auto_explain captured nothing"
    assert seq_scans_of_jobs(plans) == []
    # The one sort orders the due tenants (one row each), never jobs.
    assert large_sorts_of_jobs(plans, max_rows=TENANTS) == []
    assert {"tenant_turns_due_idx", "claimable_order_idx"} <= indexes_used(plans)


def test_oldest_ready_at_is_the_first_entry_of_the_ready_index(capture: PlanCapture) -> None:
    plans: list[Plan] = []
    for _ in range(CALLS):
        rows, captured = capture.run("select app.oldest_ready_at() as at")
        assert rows[0]["at"] is not None
        plans += captured

    assert seq_scans_of_jobs(plans) == []
    assert sorts(plans) == []
    assert indexes_used(plans) == {"claimable_ready_idx"}


def test_repair_walks_the_claimable_index_one_probe_per_tenant(capture: PlanCapture) -> None:
    plans: list[Plan] = []
    left = TENANTS + LATER_TENANTS
    for _ in range(CALLS):
        rows, captured = capture.run("select * from app.repair_tenant_turns(1000)")
        assert rows == [{"tenants_checked": min(left, 1000), "turns_repaired": 0}]
        left = left - 1000 if left > 1000 else TENANTS + LATER_TENANTS  # wraps at the end
        plans += captured

    assert seq_scans_of_jobs(plans) == []
    assert large_sorts_of_jobs(plans, max_rows=1000) == []  # at most the page itself
    assert "claimable_queue_idx" in indexes_used(plans)  # (queue, tenant) pairs


def test_the_fair_claim_reads_only_due_turns_with_many_tenants_due_later(
    capture: PlanCapture,
) -> None:
    """The 5,000 tenants whose only job is due next month add nothing a claim reads."""
    plans: list[Plan] = []
    for _ in range(CALLS):
        rows, captured = capture.run("select id from app.claim_ready_jobs('plan-check', 10)")
        assert len(rows) == 10
        plans += captured

    assert seq_scans_of_jobs(plans) == []
    assert "tenant_turns_due_idx" in indexes_used(plans)
    assert turn_rows_read(plans) <= TENANTS  # the due turns, not the 5,000 later ones


def test_release_all_expired_jobs_scans_the_leases_and_reads_each_job_by_its_key(
    capture: PlanCapture,
) -> None:
    """app.leases holds the running jobs only: the reaper scans it (an index on the
    expiry would make every renewal a non-HOT update) and sorts at most those."""
    released: list[int] = []
    plans: list[Plan] = []
    for _ in range(CALLS):
        rows, captured = capture.run("select app.release_all_expired_jobs(1000) as n")
        released.append(rows[0]["n"])
        plans += captured

    assert released == [1000, 500] + [0] * (CALLS - 2)
    assert seq_scans_of_jobs(plans) == []
    # The expired leases (with their jobs) are sorted, at most the running jobs; and
    # the woken tenants (app.wake_tenants writes turns in tenant order).
    assert large_sorts_of_jobs(plans, max_rows=3_000) == []
    assert "jobs_pkey" in indexes_used(plans)


def test_claims_read_jobs_through_the_claimable_index_and_sort_only_a_batch(
    capture: PlanCapture,
) -> None:
    plans: list[Plan] = []
    for n in range(CALLS):
        rows, captured = capture.run(
            "select id from app.claim_jobs(%s, 'plan-check', 10)", (tenant_uuid(n),)
        )
        assert len(rows) == 10
        plans += captured
        rows, captured = capture.run("select id from app.claim_ready_jobs('plan-check', 10)")
        assert len(rows) == 10
        plans += captured

    assert seq_scans_of_jobs(plans) == []
    assert large_sorts_of_jobs(plans, max_rows=2 * 10) == []
    assert {"claimable_order_idx", "tenant_turns_due_idx"} <= indexes_used(plans)
    assert "claimable_ready_idx" not in indexes_used(plans)  # all tenants' ready jobs


def test_a_claim_reads_its_jobs_limits_by_primary_key_even_without_statistics(
    capture: PlanCapture,
) -> None:
    """The claim's limits hook (app.start_limited_jobs) probes the jobs it claims by their
    key, whatever the statistics say: written as EXISTS over `id = any (ids)`, a table
    without statistics (new, or growing faster than autovacuum analyses it) got a scan of
    every job on every claim, the planner expecting to meet a limited job early."""
    capture.conn.execute("delete from pg_statistic where starelid = 'app.jobs'::regclass")
    plans: list[Plan] = []
    for _ in range(CALLS):
        rows, captured = capture.run("select id from app.claim_ready_jobs('plan-check', 10)")
        assert len(rows) == 10
        plans += [p for p in captured if "limit_buckets" in p.query]

    assert plans, "auto_explain captured no limits probe"
    assert seq_scans_of_jobs(plans) == []
    assert indexes_used(plans) == {"jobs_pkey"}


@pytest.mark.parametrize("kinds", list(FILTERS.values()), ids=list(FILTERS))
def test_a_filtered_fair_claim_reads_its_kinds_due_turns_and_jobs_and_nothing_else(
    capture: PlanCapture, kinds: tuple[list[str] | None, list[str] | None],
) -> None:
    """The slow worker's claim and the main worker's: the due turns of their kinds only
    (not the 5,000 due next month), and no scan of app.jobs that walks past jobs of the
    other kinds, whose backlog is a third of every tenant's."""
    plans: list[Plan] = []
    for _ in range(CALLS):
        rows, captured = capture.run(
            "select id, kind from app.claim_ready_jobs('plan-check', 10, '30 seconds', %s, %s,"
            " 'default')", kinds)  # a worker names its queue
        assert len(rows) == 10
        assert ({r["kind"] for r in rows} == {SLOW}) is (kinds[0] is not None)
        plans += captured

    assert seq_scans_of_jobs(plans) == []
    assert large_sorts_of_jobs(plans, max_rows=2 * 10) == []
    assert {"kind_turns_due_idx", "claimable_kind_idx"} <= indexes_used(plans)
    assert "claimable_ready_idx" not in indexes_used(plans)
    assert turn_rows_read(plans, "kind_turns") <= TENANTS
    assert turn_rows_read(plans, "tenant_turns") == 0  # the tenants' turns are not read
    assert turn_rows_read(plans, "claimable") <= 2 * 10  # a share, never a backlog


@pytest.mark.parametrize("kinds", list(FILTERS.values()), ids=list(FILTERS))
def test_a_filtered_claim_of_one_tenant_reads_the_kinds_index_only(
    capture: PlanCapture, kinds: tuple[list[str] | None, list[str] | None],
) -> None:
    plans: list[Plan] = []
    for n in range(CALLS):
        rows, captured = capture.run(
            "select id from app.claim_jobs(%s, 'plan-check', 10, '30 seconds', %s, %s)",
            (tenant_uuid(n), *kinds))
        assert len(rows) == 10
        plans += captured

    assert seq_scans_of_jobs(plans) == []
    assert large_sorts_of_jobs(plans, max_rows=2 * 10) == []
    assert "claimable_kind_idx" in indexes_used(plans)
    assert "claimable_order_idx" not in indexes_used(plans)
    assert turn_rows_read(plans, "claimable") <= 10


def test_finish_finds_each_job_by_its_primary_key_not_by_walking_the_running_ones(
    capture: PlanCapture,
) -> None:
    plans: list[Plan] = []
    for _ in range(CALLS):
        claimed, _ = capture.run(
            "select tenant_id, id, lease_token from app.claim_ready_jobs('plan-check', 10)")
        rows, captured = capture.run(
            "select job_id from app.finish_jobs('plan-check', %s, %s, %s, %s, %s, %s)",
            ([r["tenant_id"] for r in claimed], [r["id"] for r in claimed],
             [r["lease_token"] for r in claimed], ["succeeded"] * len(claimed),
             [None] * len(claimed), [None] * len(claimed)))
        assert len(rows) == len(claimed) == 10
        plans += [p for p in captured if "update app.jobs" in p.query]

    assert plans, "auto_explain captured no finish"
    assert seq_scans_of_jobs(plans) == []
    assert indexes_used(plans) == {"jobs_pkey", "leases_pkey"}


def test_prune_finds_finished_jobs_through_their_indexes_never_a_scan_of_the_jobs(
    capture: PlanCapture,
) -> None:
    # Every finished job of the big queue is older than 0 seconds: 90,000 succeeded ones
    # by their events, 2,000 dead ones by jobs_unsuccessful_idx, and a batch takes 100.
    rows, plans = capture.run("select * from app.prune_jobs('0 seconds', 100)")

    assert rows == [{"jobs_deleted": 100, "events_deleted": 100}]  # each job's final event
    # A day's partition still empty (or DEFAULT) may be read whole; a table of the
    # history may not.
    scans = [(n["Relation Name"], n["Actual Rows"] + n.get("Rows Removed by Filter", 0))
             for p in plans for n in _nodes(p.root) if n["Node Type"] == "Seq Scan"]
    assert [(name, read) for name, read in scans
            if name.startswith(("jobs", "job_events")) and read > 20] == []
    used = indexes_used(plans)
    assert "jobs_unsuccessful_idx" in used
    assert any(name.startswith("job_events") and "created_at" in name for name in used), used


def _markdown(cluster: Cluster) -> str:
    """The plans of one call of each function, as docs/sql-plans.md shows them."""
    database = build_big_queue(cluster)
    out: list[str] = []
    try:
        with database.connect(None) as conn:
            version = conn.execute("show server_version").fetchone()
            assert version is not None
            out.append(f"Captured on PostgreSQL {version['server_version']}.\n")
            with conn.transaction(force_rollback=True):
                capture = PlanCapture(conn, fmt="text")
                calls: list[tuple[str, LiteralString, tuple[Any, ...]]] = [
                    ("app.ready_tenants(100)", "select * from app.ready_tenants(100)", ()),
                    ("app.release_all_expired_jobs(1000)",
                     "select app.release_all_expired_jobs(1000)", ()),
                    ("app.claim_jobs(tenant, 'w', 10)",
                     "select id from app.claim_jobs(%s, 'w', 10)", (tenant_uuid(5),)),
                    ("app.claim_ready_jobs('w', 10)",
                     "select id from app.claim_ready_jobs('w', 10)", ()),
                    ("app.claim_ready_jobs('w', 10, '30 seconds', p_kinds => '{plan.slow}')",
                     "select id from app.claim_ready_jobs('w', 10, '30 seconds',"
                     " p_kinds => '{plan.slow}')", ()),
                    ("app.claim_ready_jobs('w', 10, '30 seconds', p_exclude_kinds =>"
                     " '{plan.slow}')",
                     "select id from app.claim_ready_jobs('w', 10, '30 seconds',"
                     " p_exclude_kinds => '{plan.slow}')", ()),
                    ("app.claim_jobs(tenant, 'w', 10, '30 seconds', null, '{plan.slow}')",
                     "select id from app.claim_jobs(%s, 'w', 10, '30 seconds', null,"
                     " '{plan.slow}')", (tenant_uuid(6),)),
                    ("app.oldest_ready_at()", "select app.oldest_ready_at()", ()),
                    ("app.repair_tenant_turns(1000)",
                     "select * from app.repair_tenant_turns(1000)", ()),
                ]
                for title, call, params in calls:
                    _, plans = capture.run(call, params)
                    shown = [
                        p for p in plans
                        if ("app.jobs" in p.query or "app.tenant_turns" in p.query
                            or "app.kind_turns" in p.query or "app.claimable" in p.query
                            or "app.leases" in p.query)
                        and "FOR KEY SHARE" not in p.query
                    ]
                    out.append(f"### {title}\n")
                    seen: set[str] = set()
                    for plan in shown:
                        # A row trigger's statement runs once per row: shown once.
                        if plan.query in seen:
                            continue
                        seen.add(plan.query)
                        out.append("```\n" + plan.text + "\n```\n")
                # The rest of the claim path: a renewal and the outcome of a batch.
                claimed = conn.execute(
                    "select tenant_id, id, lease_owner, lease_token"
                    " from app.claim_ready_jobs('w', 10)").fetchall()
                first = claimed[0]
                for title, call, params in [
                    ("app.renew_job_lease_status(tenant, job, 'w', token)",
                     "select * from app.renew_job_lease_status(%s, %s, 'w', %s)",
                     (first["tenant_id"], first["id"], first["lease_token"])),
                    ("app.finish_jobs('w', ... 10 outcomes 'succeeded')",
                     "select * from app.finish_jobs('w', %s, %s, %s, %s, %s, %s)",
                     ([r["tenant_id"] for r in claimed], [r["id"] for r in claimed],
                      [r["lease_token"] for r in claimed], ["succeeded"] * len(claimed),
                      [None] * len(claimed), [None] * len(claimed))),
                ]:
                    _, plans = capture.run(call, params)
                    out.append(f"### {title}\n")
                    for plan in plans:
                        if "app." in plan.query and "FOR KEY SHARE" not in plan.query:
                            out.append("```\n" + plan.text + "\n```\n")
    finally:
        postgres.drop_database(cluster, database.name)
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(_markdown(Cluster(os.environ["LEASEQ_TEST_DSN"])))
