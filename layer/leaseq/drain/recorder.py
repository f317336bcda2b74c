"""Recording outcomes: every finished job's outcome reaches the database within a bounded
time, in as few statements as possible.

An outcome waits here until the first of:

* the worker's next claim, which carries it (``app.finish_and_claim_jobs``: one round
  trip records the finished jobs and claims the next ones);
* its due time: ``record_interval`` seconds after the job finished (1 s by default), or
  earlier when its lease would end first. A thread of the recorder's own writes every
  outcome that is due, whatever the worker is doing (a sync handler running for
  minutes, an event loop waiting for slow jobs), with ``app.finish_jobs``.

So a worker killed at any instant leaves unrecorded only the jobs still running and the
jobs that finished less than ``record_interval`` (plus one statement's time) before the
kill: only those run again. See docs/reliability.md, "What a hard kill repeats".

Recording is one step: the statement, then the report's counts and the observer's
record of each job. Outcomes are fenced by lease token: a job whose lease was lost comes
back without a state, and is counted and logged, never retried here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, NamedTuple
from uuid import UUID

from leaseq.base.errors import InvalidRequestError, LeaseqError
from leaseq.base.jobs import ClaimedJob, JobOutcome, JobState
from leaseq.drain.outcomes import error_document
from leaseq.drain.report import DrainReport
from leaseq.kinds.job_context import job_log_fields
from leaseq.store.duties import WorkerCalls

logger = logging.getLogger("leaseq.worker")

#: What became of a job, as observers see it: the outcome sent for it, or what happened
#: instead (given back unstarted; its lease lost before an outcome could be sent).
RecordedOutcome = Literal["succeeded", "retry", "dead", "exhausted", "given_back",
                          "lease_lost"]


@dataclass(frozen=True)
class JobRecord:
    """One job's run, as reported to observers (logs, metrics)."""

    job: ClaimedJob
    outcome: RecordedOutcome
    state: JobState | None
    duration: float
    queue_lag: float
    error: dict[str, Any] | None = None

    @property
    def lease_lost(self) -> bool:
        """Whether the outcome was refused because the lease was no longer this
        worker's (another worker may have run the job since)."""
        return self.state is None


class JobRun(NamedTuple):
    """A finished job waiting to be recorded: its outcome, run time and queue lag (a
    named tuple: one is built per job)."""

    outcome: JobOutcome
    duration: float
    queue_lag: float


class Recorder:
    """Holds a drain's finished outcomes and records them (see the module docstring).

    Safe to use from several threads: the drain's own, the recorder's thread, and the
    event loop's database thread. The :class:`~leaseq.QueueClient` serialises their
    statements on its one connection.
    """

    def __init__(self, client: WorkerCalls, owner: str, report: DrainReport,
                 on_job: Callable[[JobRecord], None] | None, interval: float,
                 clock: Callable[[], float] = time.monotonic, *,
                 kinds: Sequence[str] | None = None,
                 exclude_kinds: Sequence[str] | None = None,
                 queue: str | None = None) -> None:
        self._client = client
        self._owner = owner
        #: Every claim's kind filter (WorkerConfig.kinds, exclude_kinds) and its queue.
        self._kinds: dict[str, Any] = {"kinds": kinds, "exclude_kinds": exclude_kinds,
                                       "queue": queue}
        self._report = report
        self._on_job = on_job
        self._interval = interval
        self._clock = clock
        self._pending: list[JobRun] = []
        self._due: float | None = None  # earliest due time among _pending
        self._pending_lock = threading.Lock()
        self._tally_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: Exception | None = None

    # Waiting outcomes ---------------------------------------------------------------

    def add(self, run: JobRun, due: float | None = None) -> None:
        """Hold ``run`` until it is recorded: at the latest ``record_interval`` from now,
        or by ``due`` (a clock time, when its lease ends sooner)."""
        with self._pending_lock:
            if not self._pending:
                # The oldest waiting outcome is due first: one clock reading per batch.
                self._due = self._clock() + self._interval
            self._pending.append(run)
            if due is None or self._due is None or due >= self._due:
                return
            self._due = due
        self._wake.set()  # a lease ends sooner than the recorder thread would look again

    @property
    def waiting(self) -> int:
        """Outcomes not recorded yet."""
        return len(self._pending)

    def _take(self) -> list[JobRun]:
        with self._pending_lock:
            runs, self._pending, self._due = self._pending, [], None
        return runs

    def _put_back(self, runs: list[JobRun]) -> None:
        with self._pending_lock:
            self._pending[:0] = runs
            self._due = self._clock()

    # Recording ----------------------------------------------------------------------

    def record(self) -> None:
        """Record every waiting outcome now, in one statement."""
        runs = self._take()
        if not runs:
            return
        try:
            recorded, states = self._write([r.outcome for r in runs])
        except LeaseqError:
            self._put_back(runs)
            raise
        self._tally(runs, recorded, states)

    def record_and_claim(self, limit: int, lease: timedelta) -> list[ClaimedJob]:
        """Claim up to ``limit`` jobs, carrying every waiting outcome in the same
        statement (a plain claim when none waits)."""
        runs = self._take()
        if not runs:
            return self._client.claim_ready_jobs(self._owner, limit, lease, **self._kinds)
        outcomes = [r.outcome for r in runs]
        try:
            states, jobs = self._client.finish_and_claim_jobs(
                self._owner, outcomes, limit, lease, **self._kinds)
        except InvalidRequestError as exc:
            logger.error("outcomes refused with the next claim; recording them apart",
                         extra={"error": exc.message, "outcomes": len(runs)})
            try:
                recorded, states = self._write(outcomes)
            except LeaseqError:
                self._put_back(runs)
                raise
            self._tally(runs, recorded, states)
            return self._client.claim_ready_jobs(self._owner, limit, lease, **self._kinds)
        except LeaseqError:
            self._put_back(runs)
            raise
        self._tally(runs, outcomes, states)
        return jobs

    def _write(self, outcomes: list[JobOutcome]
               ) -> tuple[list[JobOutcome], dict[UUID, JobState]]:
        """One statement for the batch; if it is refused, one by one.

        The worker sanitises what it sends, so a refusal means a bug; even then one
        job's unstorable outcome must not cost the others theirs. A refused single
        outcome is replaced by a minimal error that always fits.
        """
        owner = self._owner
        try:
            return outcomes, self._client.finish_jobs(owner, outcomes)
        except InvalidRequestError as exc:
            logger.error("outcomes refused as a batch; recording them one by one",
                         extra={"error": exc.message, "outcomes": len(outcomes)})
        recorded: list[JobOutcome] = []
        states: dict[UUID, JobState] = {}
        for outcome in outcomes:
            try:
                states.update(self._client.finish_jobs(owner, [outcome]))
            except InvalidRequestError as exc:
                logger.error("outcome refused; recording a minimal error instead",
                             extra={**job_log_fields(outcome.job), "error": exc.message})
                outcome = JobOutcome(
                    outcome.job, "retry" if outcome.outcome == "retry" else "dead",
                    error_document("OUTCOME_NOT_STORABLE", exc.message,
                                   intended=outcome.outcome),
                    retry_delay=timedelta(0) if outcome.outcome == "retry" else None)
                states.update(self._client.finish_jobs(owner, [outcome]))
            recorded.append(outcome)
        return recorded, states

    def _tally(self, runs: list[JobRun], recorded: list[JobOutcome],
               states: dict[UUID, JobState]) -> None:
        report = self._report
        with self._tally_lock:
            for run, outcome in zip(runs, recorded, strict=True):
                state = states.get(outcome.job.id)
                if state is None:
                    report.lost_leases += 1
                    logger.warning("lease lost before the outcome was recorded; another "
                                   "worker or the reaper owns the job now",
                                   extra=job_log_fields(outcome.job))
                elif state is JobState.SUCCEEDED:
                    report.succeeded += 1
                elif state is JobState.DEAD:
                    report.dead += 1
                elif state is JobState.CANCELLED:
                    report.cancelled += 1
                else:
                    report.retried += 1
                if self._on_job is not None:
                    error = outcome.detail if outcome.outcome != "succeeded" else None
                    self._tell(JobRecord(outcome.job, outcome.outcome, state, run.duration,
                                         run.queue_lag, error))

    def report_job(self, job: ClaimedJob, outcome: RecordedOutcome,
                   state: JobState | None) -> None:
        """Tell the observer about a job that had no outcome to record (given back, or
        its lease lost before it ran); counting it is the caller's."""
        if self._on_job is None:  # no record built per job for nobody
            return
        with self._tally_lock:
            self._tell(JobRecord(job, outcome, state, 0.0, 0.0))

    def count(self, **deltas: int) -> None:
        """Add to the drain's report from any thread."""
        with self._tally_lock:
            for name, delta in deltas.items():
                setattr(self._report, name, getattr(self._report, name) + delta)

    def _tell(self, record: JobRecord) -> None:
        assert self._on_job is not None
        try:
            self._on_job(record)
        except Exception:
            logger.exception("job observer failed; continuing")

    # The thread that records what is due -------------------------------------------

    def start(self) -> None:
        """Start recording due outcomes in the background (until :meth:`stop`)."""
        self._thread = threading.Thread(target=self._run, name="leaseq-recorder",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the background thread (after the statement it may be sending)."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def raise_failure(self) -> None:
        """Raise the error that stopped the background thread, if any: the drain must
        end as it would have had its own statement failed."""
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure

    def _run(self) -> None:
        while not self._stopping.is_set():
            due = self._due
            now = self._clock()
            if due is not None and due <= now:
                try:
                    self.record()
                except Exception as exc:  # raised in the drain's thread by raise_failure
                    self._failure = exc
                    return
                continue
            wait = self._interval / 2
            if due is not None:
                wait = min(wait, due - now)
            self._wake.wait(wait)
            self._wake.clear()
