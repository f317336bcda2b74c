"""Check a drained queue against its audit log and its handlers' side effects.

Every job's events must read as one sentence of the lifecycle grammar::

    created (claimed close)* claimed terminal

where each ``close`` (retry_scheduled, lease_expired, released) and the terminal
event (succeeded, dead) carries the lease token of the claim it closes. From that
follow the invariants the failure suite promises: one created event, claims minus
give-backs equal attempts, exactly one terminal event, last, agreeing with the row.

Side effects (``public.side_effects``, written by handlers before they return)
tell executions from completions: a job executed twice is allowed (at-least-once);
a job completed twice, or a success recorded under a lease no handler ran under,
never is.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from psycopg import sql

from tests.support.postgres import Conn

CLOSING_EVENTS = {"retry_scheduled", "lease_expired", "released"}
TERMINAL_EVENTS = {"succeeded", "dead"}
UNFINISHED_STATES = ("pending", "running", "retry_wait")

SIDE_EFFECTS_TABLE = """
create table if not exists public.side_effects (
  id bigint generated always as identity primary key,
  job_id uuid not null,
  lease_token uuid not null,
  attempt integer not null,
  kind text not null,
  worker text not null,
  recorded_at timestamptz not null default clock_timestamp()
)
"""


def create_side_effects_table(admin: Conn, worker_role: str) -> None:
    """The table handlers record their side effects in; only the worker may insert."""
    admin.execute(SIDE_EFFECTS_TABLE)
    admin.execute("truncate public.side_effects")
    admin.execute(sql.SQL("grant usage on schema public to {}").format(sql.Identifier(worker_role)))
    admin.execute(sql.SQL("grant insert on public.side_effects to {}").format(
        sql.Identifier(worker_role)))


def drop_side_effects_table(admin: Conn) -> None:
    admin.execute("drop table if exists public.side_effects")


def unfinished_jobs(conn: Conn) -> int:
    row = conn.execute(
        "select count(*) as n from app.jobs where state = any(%s::app.job_state[])",
        (list(UNFINISHED_STATES),),
    ).fetchone()
    assert row is not None
    return int(row["n"])


@dataclass
class Audit:
    jobs: int = 0
    states: Counter[str] = field(default_factory=Counter)
    dead_reasons: Counter[str] = field(default_factory=Counter)
    events: Counter[str] = field(default_factory=Counter)
    claims: int = 0
    executions: int = 0
    jobs_executed_twice: int = 0
    extra_executions: int = 0
    double_completions: int = 0
    unbacked_successes: int = 0
    max_attempts_seen: int = 0
    fates: dict[str, Counter[str]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    def violation(self, job_id: UUID, message: str) -> None:
        self.violations.append(f"job {job_id}: {message}")

    def lines(self) -> list[str]:
        dead = ", ".join(f"{reason} {n}" for reason, n in sorted(self.dead_reasons.items()))
        return [
            f"jobs                       {self.jobs}",
            f"succeeded                  {self.states['succeeded']}",
            f"dead                       {self.states['dead']} ({dead or 'none'})",
            f"left unfinished            {sum(self.states[s] for s in UNFINISHED_STATES)}",
            f"claims (attempts started)  {self.claims}",
            f"leases expired (reaped)    {self.events['lease_expired']}",
            f"given back unstarted       {self.events['released']}",
            f"retries scheduled          {self.events['retry_scheduled']}",
            f"handler side effects       {self.executions}",
            f"jobs executed twice+       {self.jobs_executed_twice}"
            f" ({self.extra_executions} extra executions)",
            f"double completions         {self.double_completions}",
            f"successes without effect   {self.unbacked_successes}",
            f"most attempts of one job   {self.max_attempts_seen}",
            f"event-log violations       {len(self.violations)}",
        ]


def audit_queue(conn: Conn, *, side_effects: bool = True) -> Audit:
    """Read every job, event and side effect, and check them against each other."""
    report = Audit()
    jobs = {row["id"]: row for row in conn.execute(
        "select j.id, j.kind, j.state::text as state, j.attempts, j.max_attempts,"
        " j.last_error, l.lease_token, j.completed_at,"
        " (select count(*) from app.claimable c where c.job_id = j.id) as entries"
        " from app.jobs j left join app.leases l on l.job_id = j.id").fetchall()}
    events: dict[UUID, list[dict[str, Any]]] = defaultdict(list)
    for row in conn.execute(
        "select job_id, event_type, lease_token, details->>'reason' as reason"
        " from app.job_events order by job_id, sequence"
    ).fetchall():
        events[row["job_id"]].append(row)
    effects: dict[UUID, list[UUID]] = defaultdict(list)
    if side_effects:
        for row in conn.execute("select job_id, lease_token from public.side_effects").fetchall():
            effects[row["job_id"]].append(row["lease_token"])
            report.executions += 1

    report.jobs = len(jobs)
    for job_id in events.keys() - jobs.keys():
        report.violation(job_id, "has events but no row")
    for job_id, job in jobs.items():
        report.states[job["state"]] += 1
        waiting = job["state"] in ("pending", "retry_wait")
        if job["entries"] != (1 if waiting else 0):
            report.violation(job_id, f"{job['entries']} claimable entries while {job['state']}")
        if (job["lease_token"] is not None) != (job["state"] == "running"):
            report.violation(job_id, f"a lease row does not match the state {job['state']}")
        report.max_attempts_seen = max(report.max_attempts_seen, job["attempts"])
        report.fates.setdefault(job["kind"], Counter())[job["state"]] += 1
        _check_timeline(report, job, events.get(job_id, []))
        if side_effects:
            _check_effects(report, job, events.get(job_id, []), effects.get(job_id, []))
    return report


def _check_timeline(report: Audit, job: dict[str, Any], timeline: list[dict[str, Any]]) -> None:
    job_id = job["id"]
    types = [e["event_type"] for e in timeline]
    report.events.update(types)
    report.double_completions += max(0, types.count("succeeded") - 1)
    if not timeline or types[0] != "created" or types.count("created") != 1:
        report.violation(job_id, f"must start with exactly one created event, has {types}")
        return
    claims = releases = terminals = 0
    open_token: UUID | None = None
    for event in timeline[1:]:
        kind = event["event_type"]
        if terminals:
            report.violation(job_id, f"{kind} after the terminal event: {types}")
            return
        if kind == "claimed":
            if open_token is not None:
                report.violation(job_id, f"claimed while already held: {types}")
                return
            open_token = event["lease_token"]
            claims += 1
        elif kind in CLOSING_EVENTS or kind in TERMINAL_EVENTS:
            if open_token is None or event["lease_token"] != open_token:
                report.violation(job_id, f"{kind} does not close the open claim: {types}")
                return
            open_token = None
            releases += kind == "released"
            if kind in TERMINAL_EVENTS:
                terminals += 1
                if kind == "dead":
                    report.dead_reasons[event["reason"] or "NULL"] += 1
        else:
            report.violation(job_id, f"unexpected {kind} event: {types}")
            return
    report.claims += claims
    if terminals != 1:
        report.violation(job_id, f"needs exactly one terminal event, has {types}")
    elif types[-1] != job["state"]:
        report.violation(job_id, f"state {job['state']} disagrees with last event {types[-1]}")
    if claims - releases != job["attempts"]:
        report.violation(job_id, f"{claims} claims - {releases} give-backs"
                                 f" != {job['attempts']} attempts")
    if job["state"] in TERMINAL_EVENTS and job["completed_at"] is None:
        report.violation(job_id, "finished without completed_at")
    if job["state"] == "dead" and not job["last_error"]:
        report.violation(job_id, "dead without a last_error")


def _check_effects(report: Audit, job: dict[str, Any], timeline: list[dict[str, Any]],
                   tokens: list[UUID]) -> None:
    if len(tokens) > 1:
        report.jobs_executed_twice += 1
        report.extra_executions += len(tokens) - 1
    if len(set(tokens)) != len(tokens):
        report.violation(job["id"], "one lease ran its handler twice")
    for event in timeline:
        if event["event_type"] == "succeeded" and event["lease_token"] not in tokens:
            report.unbacked_successes += 1
            report.violation(job["id"], "success recorded under a lease no handler completed")
