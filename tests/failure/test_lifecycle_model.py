"""Model-based test of the job lifecycle against the real database.

Hypothesis drives random sequences of enqueue, claim (per tenant and fair), renew,
complete, fail, discard, batched finish, give back, reaper release, redrive, cancel,
cancel requests on running jobs (each way a running job ends then ends it cancelled)
and clock moves; after every step the database must equal a plain-Python model of
the state machine, row by row and event count by event count.

The clock: timestamps are moved into the past by the administrator (``advance``)
instead of waiting. Every duration is a multiple of 500 s, so the few real seconds
an example takes can never move a lease or a retry across "now".
"""

from __future__ import annotations

import dataclasses
import itertools
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from leaseq import ClaimedJob, EnqueueRequest, JobOutcome, QueueClient, connect
from psycopg.types.json import Jsonb

from tests.conftest import Database
from tests.support.postgres import Conn

TENANTS = (uuid.UUID(int=1), uuid.UUID(int=2))
OWNERS = ("w1", "w2")
KEYS = ("a", "b", "c", "d", "e", "f")
KINDS = ("k1", "k2")
PAYLOADS: tuple[dict[str, Any], ...] = ({}, {"x": 1})
LEASES = (1500, 3500)
RETRY_DELAYS = (0, 2500)
STEP = 1000
FINISHED = ("succeeded", "dead", "cancelled")


@dataclass
class ModelJob:
    id: uuid.UUID
    tenant: uuid.UUID
    key: str
    kind: str
    payload: dict[str, Any]
    max_attempts: int
    created: int
    #: (virtual seconds, order of the statement that set it)
    available: tuple[int, int]
    state: str = "pending"
    attempts: int = 0
    owner: str | None = None
    token: uuid.UUID | None = None
    lease_end: int | None = None
    completed: int | None = None
    #: give-backs since the job was created or last redriven
    given_back: int = 0
    #: an operator asked to cancel it while it ran (kept once it ends cancelled)
    cancel_requested: bool = False
    events: Counter[str] = field(default_factory=Counter)

    def holds(self, owner: str, token: uuid.UUID, now: int) -> bool:
        """The fence every worker write passes through."""
        return (self.state == "running" and self.owner == owner and self.token == token
                and self.lease_end is not None and self.lease_end > now)

    def drop_lease(self) -> None:
        self.owner = self.token = self.lease_end = None


class LifecycleMachine(RuleBasedStateMachine):
    database: ClassVar[Database]

    def __init__(self) -> None:
        super().__init__()
        self.admin: Conn = self.database.connect(None)
        self.admin.execute("truncate app.jobs, app.job_events, app.claimable, app.leases,"
                           " app.tenant_turns")
        self.worker = connect(self.database.worker_dsn)
        self.client = QueueClient(lambda: self.worker)
        self.jobs: dict[uuid.UUID, ModelJob] = {}
        self.handles: dict[uuid.UUID, ClaimedJob] = {}
        self.now = 0
        self.seq = itertools.count()

    def teardown(self) -> None:
        self.worker.close()
        self.admin.close()

    # Model bookkeeping -------------------------------------------------------------

    def _ready(self, tenant: uuid.UUID | None = None) -> list[ModelJob]:
        ready = [j for j in self.jobs.values()
                 if j.state in ("pending", "retry_wait") and j.available[0] <= self.now
                 and (tenant is None or j.tenant == tenant)]
        return sorted(ready, key=lambda j: (j.available, j.created, j.id.int))

    def _claimed(self, job: ModelJob, claimed: ClaimedJob, lease: int) -> None:
        job.state = "running"
        job.attempts += 1
        job.owner, job.token, job.lease_end = claimed.lease_owner, claimed.lease_token, (
            self.now + lease)
        job.events["claimed"] += 1
        assert claimed.attempts == job.attempts
        self.handles[claimed.lease_token] = claimed

    def _cancelled(self, job: ModelJob, at: int) -> str:
        """A running job with a cancel request ends cancelled, whatever ended it."""
        job.drop_lease()
        job.state, job.completed = "cancelled", at
        job.events["cancelled"] += 1
        return job.state

    def _finish(self, job: ModelJob, outcome: str, delay: int, at: int) -> str:
        if job.cancel_requested:
            return self._cancelled(job, at)
        job.drop_lease()
        if outcome == "succeeded":
            job.state = "succeeded"
        elif outcome == "dead" or job.attempts >= job.max_attempts:
            job.state = "dead"
        else:
            job.state = "retry_wait"
            job.available = (self.now + delay, at)
        job.completed = None if job.state == "retry_wait" else at
        job.events["retry_scheduled" if job.state == "retry_wait" else job.state] += 1
        return job.state

    # Rules -------------------------------------------------------------------------

    @initialize()
    def start(self) -> None:
        assert self.admin.execute("select count(*) as n from app.jobs").fetchone() == {"n": 0}

    @rule(items=st.lists(st.tuples(st.sampled_from(TENANTS), st.sampled_from(KEYS),
                                   st.sampled_from(KINDS), st.sampled_from(PAYLOADS),
                                   st.integers(1, 2)), min_size=1, max_size=4))
    def enqueue(self, items: list[tuple[uuid.UUID, str, str, dict[str, Any], int]]) -> None:
        results = self.client.enqueue_jobs([
            EnqueueRequest(tenant_id=t, operation_key=k, kind=kind, payload=p, max_attempts=m)
            for t, k, kind, p, m in items])
        at = next(self.seq)
        for (tenant, key, kind, payload, max_attempts), result in zip(items, results, strict=True):
            known = next((j for j in self.jobs.values() if (j.tenant, j.key) == (tenant, key)),
                         None)
            if known is None:
                assert result.status == "created"
                self.jobs[result.job_id] = ModelJob(
                    result.job_id, tenant, key, kind, payload, max_attempts, at, (self.now, at),
                    events=Counter(created=1))
                continue
            if (known.kind, known.payload) == (kind, payload):
                assert (result.status, result.job_id) == ("existing", known.id)
                assert result.state == known.state
            else:
                # A conflict names no job: its id would answer a probe of the key.
                assert (result.status, result.job_id, result.state) == ("conflict", None, None)

    @rule(tenant=st.sampled_from(TENANTS), owner=st.sampled_from(OWNERS),
          limit=st.integers(1, 3), lease=st.sampled_from(LEASES))
    def claim(self, tenant: uuid.UUID, owner: str, limit: int, lease: int) -> None:
        expected = self._ready(tenant)[:limit]
        got = self.client.claim_jobs(tenant, owner, limit, timedelta(seconds=lease))
        assert [j.id for j in got] == [j.id for j in expected]
        for claimed in got:
            self._claimed(self.jobs[claimed.id], claimed, lease)

    @rule(owner=st.sampled_from(OWNERS), limit=st.integers(1, 3), lease=st.sampled_from(LEASES))
    def claim_fairly(self, owner: str, limit: int, lease: int) -> None:
        ready = self._ready()
        got = self.client.claim_ready_jobs(owner, limit, timedelta(seconds=lease))
        assert len(got) == min(limit, len(ready))
        ids = {j.id for j in got}
        assert len(ids) == len(got)
        ready_tenants = {j.tenant for j in ready}
        for tenant in ready_tenants:
            in_order = [j.id for j in ready if j.tenant == tenant]
            taken = [i for i in in_order if i in ids]
            assert taken == in_order[:len(taken)], "a tenant's jobs were taken out of order"
            if len(ready_tenants) <= limit:
                assert taken, "a tenant with ready work got nothing from a fair claim"
        for claimed in got:
            self._claimed(self.jobs[claimed.id], claimed, lease)

    @rule(owner=st.sampled_from(OWNERS), limit=st.integers(1, 3),
          outcome=st.sampled_from(["succeeded", "retry", "dead"]),
          delay=st.sampled_from(RETRY_DELAYS))
    def work(self, owner: str, limit: int, outcome: str, delay: int) -> None:
        """What a worker does: a fair claim, then every claimed job's outcome in one batch."""
        before = set(self.handles)
        self.claim_fairly(owner, limit, LEASES[0])
        claimed = [job for token, job in self.handles.items() if token not in before]
        if claimed:
            outcomes = [JobOutcome(job, outcome, {"work": True}, timedelta(seconds=delay))  # type: ignore[arg-type]
                        for job in claimed]
            states = self.client.finish_jobs(owner, outcomes)
            at = next(self.seq)
            assert {k: str(v) for k, v in states.items()} == {
                job.id: self._finish(self.jobs[job.id], outcome, delay, at) for job in claimed}

    # Claims are picked by index, never from a Bundle: which jobs a claim returns
    # can depend on ties between random ids, and Hypothesis needs every draw to have
    # the same shape when it replays an example.

    def _pick(self, pick: int, live: bool) -> ClaimedJob | None:
        """A live claim (its job still runs under it) or any claim ever made."""
        if live:
            running = sorted((j for j in self.jobs.values() if j.token is not None),
                             key=lambda j: (j.created, j.tenant.int, j.key))
            choices = [self.handles[j.token] for j in running if j.token is not None]
        else:
            choices = list(self.handles.values())
        return choices[pick % len(choices)] if choices else None

    def _picks(self, picks: list[int], live: bool) -> list[ClaimedJob]:
        chosen: dict[uuid.UUID, ClaimedJob] = {}
        for pick in picks:
            job = self._pick(pick, live)
            if job is not None:
                chosen.setdefault(job.id, job)
        return list(chosen.values())

    @rule(pick=st.integers(0, 99), live=st.booleans(), lease=st.sampled_from(LEASES),
          intruder=st.booleans())
    def renew(self, pick: int, live: bool, lease: int, intruder: bool) -> None:
        job = self._pick(pick, live)
        if job is None:
            return
        if intruder:
            job = dataclasses.replace(job, lease_owner="intruder")
        model = self.jobs[job.id]
        expected = model.holds(job.lease_owner, job.lease_token, self.now)
        if lease == LEASES[0]:  # the earlier contract's answer
            assert self.client.renew_job_lease(job, timedelta(seconds=lease)) is expected
        else:  # the worker's: the renewal and, when it holds, the cancel request
            renewal = self.client.renew_job_lease_status(job, timedelta(seconds=lease))
            assert (renewal.renewed, renewal.cancel_requested) == (
                expected, expected and model.cancel_requested)
        if expected:
            model.lease_end = self.now + lease

    @rule(pick=st.integers(0, 99), live=st.booleans(),
          outcome=st.sampled_from(["succeeded", "retry", "dead"]),
          delay=st.sampled_from(RETRY_DELAYS))
    def finish_one(self, pick: int, live: bool, outcome: str, delay: int) -> None:
        """app.complete_job, app.fail_job or app.discard_job, under the picked claim."""
        job = self._pick(pick, live)
        if job is None:
            return
        model = self.jobs[job.id]
        fenced_in = model.holds(job.lease_owner, job.lease_token, self.now)
        fence = (job.tenant_id, job.id, job.lease_owner, job.lease_token)
        if outcome == "succeeded":
            row = self.worker.execute("select app.complete_job(%s, %s, %s, %s, %s) as done",
                                      (*fence, Jsonb({"ok": True}))).fetchone()
            assert row == {"done": fenced_in}
        elif outcome == "retry":
            row = self.worker.execute(
                "select app.fail_job(%s, %s, %s, %s, %s, %s)::text as state",
                (*fence, Jsonb({"e": 1}), timedelta(seconds=delay))).fetchone()
        else:
            row = self.worker.execute(
                "select app.discard_job(%s, %s, %s, %s, %s)::text as state",
                (*fence, Jsonb({"e": 2}))).fetchone()
        if fenced_in:
            state = self._finish(model, outcome, delay, next(self.seq))
            assert outcome == "succeeded" or row == {"state": state}
        else:
            assert outcome == "succeeded" or row == {"state": None}

    @rule(picks=st.lists(st.tuples(st.integers(0, 99),
                                   st.sampled_from(["succeeded", "retry", "dead"]),
                                   st.sampled_from(RETRY_DELAYS)), min_size=1, max_size=3),
          live=st.booleans(), owner=st.sampled_from(OWNERS))
    def finish_batch(self, picks: list[tuple[int, str, int]], live: bool, owner: str) -> None:
        """app.finish_jobs with one outcome per distinct job, as the worker records them."""
        jobs = self._picks([p for p, _, _ in picks], live)
        if not jobs:
            return
        outcomes = [JobOutcome(job, outcome, {"batch": True}, timedelta(seconds=delay))  # type: ignore[arg-type]
                    for job, (_, outcome, delay) in zip(jobs, picks, strict=False)]
        states = self.client.finish_jobs(owner, outcomes)
        at = next(self.seq)
        expected = {}
        for item in outcomes:
            model = self.jobs[item.job.id]
            if model.holds(owner, item.job.lease_token, self.now):
                delay = int(item.retry_delay.total_seconds()) if item.retry_delay else 0
                expected[item.job.id] = self._finish(model, item.outcome, delay, at)
        assert {k: str(v) for k, v in states.items()} == expected

    @rule(picks=st.lists(st.integers(0, 99), min_size=1, max_size=3), live=st.booleans(),
          owner=st.sampled_from(OWNERS))
    def give_back(self, picks: list[int], live: bool, owner: str) -> None:
        """app.release_jobs: claimed jobs handed back unstarted."""
        jobs = self._picks(picks, live)
        if not jobs:
            return
        given = self.client.release_jobs(owner, jobs)
        at = next(self.seq)
        expected = set()
        for job in jobs:
            model = self.jobs[job.id]
            if model.holds(owner, job.lease_token, self.now):
                expected.add(job.id)
                if model.cancel_requested:  # never handed round again
                    self._cancelled(model, at)
                    continue
                model.drop_lease()
                if model.given_back >= 9:  # the tenth give-back: dead, the attempt counted
                    model.state, model.completed = "dead", at
                    model.events["dead"] += 1
                    continue
                model.state = "pending" if model.attempts <= 1 else "retry_wait"
                model.attempts -= 1
                model.available = (self.now, at)  # behind the work ready now
                model.given_back += 1
                model.events["released"] += 1
        assert given == expected

    @rule(seconds=st.sampled_from([STEP, 2 * STEP]), then_reap=st.booleans())
    def advance(self, seconds: int, then_reap: bool) -> None:
        self.admin.execute("update app.jobs set available_at = available_at - %(d)s",
                           {"d": timedelta(seconds=seconds)})
        self.admin.execute("update app.leases set expires_at = expires_at - %(d)s",
                           {"d": timedelta(seconds=seconds)})
        # The tenants' turns are times too (a job due later gives a turn due then).
        self.admin.execute("update app.tenant_turns set turn_at = turn_at - %(d)s",
                           {"d": timedelta(seconds=seconds)})
        self.now += seconds
        if then_reap:
            self.release_expired(None)

    @rule(tenant=st.none() | st.sampled_from(TENANTS))
    def release_expired(self, tenant: uuid.UUID | None) -> None:
        if tenant is None:
            released = self.client.release_all_expired_jobs()
        else:
            released = self.client.release_expired_jobs(tenant)
        at = next(self.seq)
        expired = [j for j in self.jobs.values()
                   if j.state == "running" and j.lease_end is not None
                   and j.lease_end <= self.now and (tenant is None or j.tenant == tenant)]
        assert released == len(expired)
        for job in expired:
            if job.cancel_requested:
                self._cancelled(job, at)
                continue
            job.drop_lease()
            if job.attempts >= job.max_attempts:
                job.state, job.completed = "dead", at
                job.events["dead"] += 1
            else:
                job.state, job.available = "retry_wait", (self.now, at)
                job.events["lease_expired"] += 1

    @rule(data=st.data(), limit=st.integers(1, 2))
    def redrive(self, data: st.DataObject, limit: int) -> None:
        tenant, ids, kind = self._filters(data)
        rows = self.worker.execute(
            "select job_id from app.redrive_jobs('operator', %s, %s, %s, %s)",
            (tenant, ids, kind, limit)).fetchall()
        at = next(self.seq)
        dead = sorted((j for j in self._matching(tenant, ids, kind) if j.state == "dead"),
                      key=lambda j: (j.completed or 0, j.id.int))[:limit]
        assert {r["job_id"] for r in rows} == {j.id for j in dead}
        for job in dead:
            job.state, job.attempts, job.completed = "pending", 0, None
            job.available = (self.now, at)
            job.given_back = 0
            job.events["redriven"] += 1

    @rule(data=st.data(), limit=st.integers(1, 3))
    def cancel(self, data: st.DataObject, limit: int) -> None:
        tenant, ids, kind = self._filters(data)
        rows = self.worker.execute(
            "select job_id from app.cancel_jobs('operator', %s, %s, %s, %s)",
            (tenant, ids, kind, limit)).fetchall()
        at = next(self.seq)
        waiting = sorted((j for j in self._matching(tenant, ids, kind)
                          if j.state in ("pending", "retry_wait")),
                         key=lambda j: (j.available, j.id.int))[:limit]
        assert {r["job_id"] for r in rows} == {j.id for j in waiting}
        for job in waiting:
            job.state, job.completed = "cancelled", at
            job.events["cancelled"] += 1

    @rule(picks=st.lists(st.integers(0, 99), min_size=1, max_size=3))
    def request_cancel(self, picks: list[int]) -> None:
        """app.request_job_cancel of named jobs: waiting ones cancelled at once, running
        ones given a request (once), finished ones left alone."""
        known = sorted(self.jobs.values(), key=lambda j: (j.created, j.tenant.int, j.key))
        if not known:
            return
        ids = list(dict.fromkeys(known[p % len(known)].id for p in picks))
        rows = self.worker.execute(
            "select job_id, state::text as state from app.request_job_cancel('operator', %s)",
            (ids,)).fetchall()
        at = next(self.seq)
        expected = {}
        for job_id in ids:
            job = self.jobs[job_id]
            if job.state in ("pending", "retry_wait"):
                job.state, job.completed = "cancelled", at
                job.events["cancelled"] += 1
                expected[job_id] = "cancelled"
            elif job.state == "running":
                if not job.cancel_requested:
                    job.cancel_requested = True
                    job.events["cancel_requested"] += 1
                expected[job_id] = "running"
        assert {r["job_id"]: r["state"] for r in rows} == expected

    def _filters(self, data: st.DataObject) -> tuple[uuid.UUID | None, list[uuid.UUID] | None,
                                                     str | None]:
        by = data.draw(st.sampled_from(["nothing", "tenant", "ids", "kind", "tenant and kind"]),
                       label="filter by")
        tenant = data.draw(st.sampled_from(TENANTS), label="tenant")
        kind = data.draw(st.sampled_from(KINDS), label="kind")
        picks = data.draw(st.lists(st.integers(0, 99), min_size=1, max_size=3), label="picks")
        known = sorted(self.jobs.values(), key=lambda j: (j.created, j.tenant.int, j.key))
        ids = list(dict.fromkeys(known[p % len(known)].id for p in picks)) if known else None
        return (tenant if "tenant" in by else None, ids if by == "ids" else None,
                kind if "kind" in by else None)

    def _matching(self, tenant: uuid.UUID | None, ids: list[uuid.UUID] | None,
                  kind: str | None) -> list[ModelJob]:
        return [j for j in self.jobs.values()
                if (tenant is None or j.tenant == tenant) and (ids is None or j.id in ids)
                and (kind is None or j.kind == kind)]

    # What must hold after every step ----------------------------------------------

    @invariant()
    def database_equals_model(self) -> None:
        rows = self.admin.execute(
            "select j.id, j.state::text as state, j.attempts, j.max_attempts, j.lease_owner,"
            " l.lease_token, l.expires_at is not null as leased, l.expires_at > now() as live,"
            " j.available_at <= now() as ready, j.cancel_requested_at is not null as cancelling,"
            " j.completed_at is not null as completed,"
            " (select count(*) from app.claimable c where c.job_id = j.id) as entries"
            " from app.jobs j left join app.leases l on l.job_id = j.id").fetchall()
        assert {r["id"] for r in rows} == set(self.jobs)
        for row in rows:
            job = self.jobs[row["id"]]
            leased = job.state == "running"
            assert (row["lease_owner"] is None) == (row["lease_token"] is None) == (
                not row["leased"]) == (not leased), f"lease shape broken: {row}"
            assert row == {
                "id": job.id, "state": job.state, "attempts": job.attempts,
                "max_attempts": job.max_attempts, "lease_owner": job.owner,
                "lease_token": job.token, "leased": leased,
                "live": None if job.lease_end is None else job.lease_end > self.now,
                "ready": row["ready"] if leased or job.state in FINISHED
                else job.available[0] <= self.now,
                "completed": job.state in FINISHED,
                "cancelling": job.cancel_requested,
                # Exactly one claimable entry while the job waits, none otherwise.
                "entries": 1 if job.state in ("pending", "retry_wait") else 0,
            }

    @invariant()
    def events_equal_model(self) -> None:
        counted: dict[uuid.UUID, Counter[str]] = {job_id: Counter() for job_id in self.jobs}
        for row in self.admin.execute(
            "select job_id, event_type, count(*) as n from app.job_events group by 1, 2"
        ).fetchall():
            counted[row["job_id"]][row["event_type"]] = row["n"]
        for job_id, job in self.jobs.items():
            assert counted[job_id] == job.events, f"events of {job.state} job {job_id}"


def _settings(soak: bool) -> settings:
    return settings(
        max_examples=1000 if soak else 80,
        stateful_step_count=100 if soak else 50,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


def test_job_lifecycle_matches_the_model_after_every_step(
    db: Database, request: pytest.FixtureRequest
) -> None:
    LifecycleMachine.database = db
    run_state_machine_as_test(LifecycleMachine,
                              settings=_settings(bool(request.config.getoption("--soak"))))
