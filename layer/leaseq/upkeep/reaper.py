"""reap_once(): end the sessions past their caps, give every tenant's expired leases
back to the queue, enqueue the schedules' due slots, check a page of tenants' turns, then
apply the retention period to finished jobs.

The sessions come first and cost one call (app.end_stalled_sessions, see
:mod:`leaseq.base.sessions`): a reader or a runtime login that lifted its own timeout and
sits in a transaction would otherwise keep every migration and vacuum waiting.

Each call of app.release_all_expired_jobs and app.prune_retained_jobs is bounded
(``limit`` rows, oldest first), and the pass repeats one only while whole pages come
back and time remains, so one reaper invocation can never run past its own deadline.
Releasing comes first: a job waiting for its lease to be released is late work, a
finished job past its retention is only space.

The schedules' tick (app.tick_schedules, see :mod:`leaseq.base.schedules`) comes after the
releases: each call ticks up to ``limit`` due schedules (at most 1000), the pass repeats
while whole pages come back and time remains, and a schedule another pass holds is
skipped (its slots are that pass's). The slots are the database's, so a late or repeated
pass enqueues what is due then and nothing twice.

The prune (the paged loop of :mod:`leaseq.upkeep.retention`, shared with an operator's prune)
calls the reaper's own function, not the operator's app.prune_jobs: it refuses a
retention below the floor the schema owner sets (``app.settings.min_retention``), so a
reaper login (leaseq_reaper) cannot delete recent history even with a wrong setting.
After the tick, held jobs are admitted wherever a limit has a free slot
(app.admit_held_jobs: the statement that frees a slot admits the next held job itself;
this pass catches a race between a hold and a free, a held job whose due time came, a
limit raised or removed), and each limit's state is read for the metrics.
The audit trail's days (app.roll_event_days) are made before the prune: today's and the
next days' partitions of app.job_events, so no event falls into the DEFAULT partition,
and the past days closed, so the prune may drop them whole once they are older than the
retention (sql/functions/events.sql).
The turn check (app.repair_tenant_turns) is the fair claim's safety net: a tenant with
claimable work but no due turn would never be served, which only a defect or a hand
edit of app.jobs can cause; each pass checks up to ``turn_pages`` pages of ``limit``
tenants, continuing where the previous pass stopped, so every tenant is checked within
ceil(tenants with claimable jobs / (turn_pages x limit)) passes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from leaseq.base.deadline import Deadline
from leaseq.base.limits import MAX_PAGE, MAX_RETENTION, Bounds
from leaseq.store.duties import ReaperCalls
from leaseq.upkeep.retention import prune_in_pages

logger = logging.getLogger("leaseq.reaper")

#: Rows per call of each paged function (LEASEQ_REAPER_LIMIT): a page of expired leases,
#: of tenants' turns, of finished jobs to delete.
REAPER_LIMIT = Bounds(1000, 1, MAX_PAGE)
#: Days a finished job is kept (LEASEQ_RETENTION_DAYS; 0 keeps it for ever).
RETENTION_DAYS = Bounds(14.0, 0, MAX_RETENTION.days)


@dataclass
class ReapReport:
    """What one reaper pass did: the sessions past their caps it ended (or could not:
    ``sessions_refused``, ``sessions_unseen``), the expired leases it released (``released``, in
    ``calls`` calls; ``complete`` once a call came back short, so none were left), the
    schedules it ticked and their slots (enqueued as new jobs, already enqueued, enqueued
    later than the grace, skipped: ``slots_missed`` is the last two), the tenants' turns
    it checked and repaired, the finished jobs and events it deleted, the audit trail's
    days it made ahead and closed, and the seconds left when it ended. The reaper
    function logs it and turns it into metrics."""

    released: int = 0
    calls: int = 0
    complete: bool = False
    pruned_jobs: int = 0
    pruned_events: int = 0
    event_days_added: int = 0
    event_days_closed: int = 0
    turns_checked: int = 0
    turns_repaired: int = 0
    sessions_ended: int = 0
    sessions_refused: int = 0
    sessions_unseen: int = 0
    schedules_ticked: int = 0
    slots_enqueued: int = 0
    slots_existing: int = 0
    slots_late: int = 0
    slots_skipped: int = 0
    held_admitted: int = 0
    limits: list[LimitState] = field(default_factory=list)
    time_left: float = 0.0

    @property
    def slots_missed(self) -> int:
        """Due slots not enqueued within the schedules' grace: late or skipped."""
        return self.slots_late + self.slots_skipped

    @property
    def jobs_held(self) -> int:
        """Jobs the limits hold back, over the limits read (:attr:`limits`)."""
        return sum(state.blocked for state in self.limits)

    def as_dict(self) -> dict[str, Any]:
        """The report as a log line's or a trace annotation's fields (the limits' states
        as their total of held jobs: the metrics carry each one)."""
        fields = dict(self.__dict__)
        del fields["limits"]
        fields["jobs_held"] = self.jobs_held
        return fields


@dataclass(frozen=True)
class LimitState:
    """One limit as the reaper read it (app.limit_status), over its instances in use (a
    limit for every tenant has one per tenant): its name (kind:K, tenant:T or tenant:*,
    kind:K/tenant:T or kind:K/tenant:*, key:L), how many instances, the jobs admitted
    through them and running, the jobs they hold back and the oldest one's wait in
    seconds (0 when none)."""

    name: str
    instances: int
    admitted: int
    running: int
    blocked: int
    oldest_blocked_age: float


def reap_once(client: ReaperCalls, deadline: Deadline, *, limit: int = REAPER_LIMIT.default,
              max_calls: int = 100, margin: float = 2.0,
              retention: timedelta | None = None, turn_pages: int = 10,
              schedule_pages: int = 10) -> ReapReport:
    """Release expired leases of every tenant until none are left or time is short;
    then tick up to ``schedule_pages`` pages of due schedules; then check up to
    ``turn_pages`` pages of tenants' turns; then make the audit trail's days ahead and
    close the past ones; then, with a ``retention``, delete jobs that finished longer ago
    than that (and drop the days of events before it)."""
    if not REAPER_LIMIT.allows(limit):
        raise ValueError(f"limit must be between 1 and {MAX_PAGE} (got {limit!r})")
    if turn_pages < 0 or schedule_pages < 0:
        raise ValueError("turn_pages and schedule_pages must not be negative")
    if retention is not None and not timedelta(0) <= retention <= MAX_RETENTION:
        raise ValueError(f"retention must be between 0 and {MAX_RETENTION.days} days "
                         f"(got {retention})")
    report = ReapReport()
    if deadline.remaining() > margin:
        _end_stalled_sessions(client, report)
    while report.calls < max_calls and deadline.remaining() > margin:
        released = client.release_all_expired_jobs(limit)
        report.calls += 1
        report.released += released
        if released < limit:
            report.complete = True
            break
    _tick_schedules(client, deadline, report, min(limit, 1000), schedule_pages, margin)
    if deadline.remaining() > margin:
        _admit_held(client, report, min(limit, MAX_PAGE))
    _repair_turns(client, deadline, report, limit, turn_pages, margin)
    if deadline.remaining() > margin:
        report.event_days_added, report.event_days_closed = client.roll_event_days()
    if report.complete and retention is not None:
        _prune(client, deadline, report, retention, limit, max_calls, margin)
    report.time_left = deadline.remaining()
    if report.released:
        logger.info("released expired leases", extra={"released": report.released})
    if report.turns_repaired:
        logger.info("gave tenants with claimable jobs their missing turns", extra={
            "tenants": report.turns_repaired, "checked": report.turns_checked})
    if report.slots_missed:
        logger.warning("schedules' due slots were not enqueued within the grace", extra={
            "late": report.slots_late, "skipped": report.slots_skipped})
    if report.pruned_jobs:
        logger.info("deleted jobs past their retention", extra={
            "jobs": report.pruned_jobs, "events": report.pruned_events})
    return report


def _end_stalled_sessions(client: ReaperCalls, report: ReapReport) -> None:
    """End the sessions past their caps first: one of them may be what keeps a
    migration or vacuum waiting. Each ended session is worth a look (a client that
    lifted its own timeout, or a stuck one); a missing grant is said on every pass."""
    for session in client.end_stalled_sessions():
        if session.outcome == "ended":
            report.sessions_ended += 1
            logger.warning("ended a session past its cap", extra={
                "login": session.login, "pid": session.pid, "state": session.state,
                "stalled_seconds": None if session.stalled_for is None
                else round(session.stalled_for.total_seconds(), 1)})
        elif session.outcome == "refused":
            report.sessions_refused += 1
        else:
            report.sessions_unseen += 1
    if report.sessions_refused or report.sessions_unseen:
        logger.warning(
            "sessions past their caps cannot be ended: the schema owner needs "
            "pg_signal_backend (to end them) and pg_read_all_stats (to see their state); "
            "grant both to it as an administrator", extra={
                "refused": report.sessions_refused, "unseen": report.sessions_unseen})


def _tick_schedules(client: ReaperCalls, deadline: Deadline, report: ReapReport, limit: int,
                    pages: int, margin: float) -> None:
    for _ in range(pages):
        if deadline.remaining() <= margin:
            return
        ticked = client.tick_schedules(limit)
        report.schedules_ticked += len(ticked)
        for schedule in ticked:
            report.slots_enqueued += schedule.enqueued
            report.slots_existing += schedule.existing
            report.slots_late += schedule.late
            report.slots_skipped += schedule.skipped
            if schedule.missed:
                logger.warning("a schedule's due slots were not enqueued within the grace",
                               extra={"schedule": schedule.name,
                                      "tenant_id": str(schedule.tenant_id),
                                      "late": schedule.late, "skipped": schedule.skipped})
        if len(ticked) < limit:
            return


def _repair_turns(client: ReaperCalls, deadline: Deadline, report: ReapReport, limit: int,
                  pages: int, margin: float) -> None:
    for _ in range(pages):
        if deadline.remaining() <= margin:
            return
        checked, repaired = client.repair_tenant_turns(limit)
        report.turns_checked += checked
        report.turns_repaired += repaired
        if checked < limit:  # the sweep reached the last tenant; the next pass starts over
            return


#: Limits a pass reports as metrics, those holding the most jobs first: each is a
#: metric of its own (a limit for every tenant is one, its instances summed).
LIMIT_METRICS = 20


def _admit_held(client: ReaperCalls, report: ReapReport, limit: int) -> None:
    """Admit what the limits left held with a slot free (a race between a hold and a
    free, a held job whose due time came, a limit raised or removed), then read each
    limit's state for the metrics."""
    report.held_admitted = client.admit_held_jobs(limit)
    now = datetime.now(UTC)
    by_name: dict[str, list[dict[str, Any]]] = {}
    for row in client.limit_status():
        by_name.setdefault(str(row["name"]), []).append(row)
    states = []
    for name, rows in by_name.items():
        held_at = [r["oldest_blocked_at"] for r in rows if r["oldest_blocked_at"] is not None]
        states.append(LimitState(
            name=name, instances=len(rows), admitted=sum(int(r["admitted"]) for r in rows),
            running=sum(int(r["running"]) for r in rows),
            blocked=sum(int(r["blocked"]) for r in rows),
            oldest_blocked_age=max((now - min(held_at)).total_seconds(), 0.0) if held_at
            else 0.0))
    states.sort(key=lambda s: (-s.blocked, s.name))
    report.limits = states[:LIMIT_METRICS]


def _prune(client: ReaperCalls, deadline: Deadline, report: ReapReport, retention: timedelta,
           limit: int, max_calls: int, margin: float) -> None:
    pruned = prune_in_pages(client.prune_retained_jobs, retention, limit=limit,
                            max_pages=max_calls,
                            keep_going=lambda: deadline.remaining() > margin)
    report.pruned_jobs += pruned.jobs_deleted
    report.pruned_events += pruned.events_deleted
