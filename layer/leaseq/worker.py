"""drain(): claim a batch, run it, record it, until the queue is empty or time is short.

One pass per call (the scheduler is the loop). Each batch costs one statement: the
fair claim of the next batch across tenants travels with the finish that records the
previous batch's outcomes and their audit rows. Outcomes are fenced by lease token, so
a worker that lost its lease cannot overwrite what another worker did; that case is
counted, logged and survived.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ValidationError

from leaseq.client import QueueClient
from leaseq.deadline import Deadline, lease_for
from leaseq.errors import InvalidRequestError
from leaseq.interrupt import TimeLimit, timeouts
from leaseq.job_context import JobContext, job_log_fields, running
from leaseq.jobs import ClaimedJob, JobOutcome, JobState
from leaseq.registry import Registration, Registry
from leaseq.retry import MAX_RETRY_DELAY, RetryPolicy
from leaseq.signals import DiscardJob, JobTimeout, RetryJob
from leaseq.storable import MAX_DOCUMENT_BYTES, json_size, storage_problem

logger = logging.getLogger("leaseq.worker")

#: Seconds kept free after a job's budget to record its outcome before the lease ends.
FINISH_RESERVE = 1.0
#: The SQL contract's result size bound (sql/0003).
MAX_RESULT_BYTES = MAX_DOCUMENT_BYTES


@dataclass(frozen=True)
class WorkerConfig:
    owner: str
    batch_size: int = 10
    lease_margin: float = 5.0
    job_timeout: float = 30.0
    max_lease: float | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if not 1 <= self.batch_size <= 100:
            raise ValueError("batch_size must be between 1 and 100")
        if self.lease_margin < 0 or self.job_timeout <= 0:
            raise ValueError("lease_margin must be >= 0 and job_timeout > 0")


_RecordOutcome = Literal["succeeded", "retry", "dead", "exhausted", "released"]


@dataclass(frozen=True)
class JobRecord:
    """One job's run, as reported to observers (logs, metrics)."""

    job: ClaimedJob
    outcome: _RecordOutcome
    state: JobState | None
    duration: float
    queue_lag: float
    error: dict[str, Any] | None = None

    @property
    def lease_lost(self) -> bool:
        return self.state is None


@dataclass
class DrainReport:
    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    dead: int = 0
    lost_leases: int = 0
    released: int = 0
    batches: int = 0
    time_left: float = 0.0
    stopped: Literal["queue_empty", "deadline", "not_started"] = "not_started"

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


#: One job's outcome with its run time and queue lag, waiting to be recorded.
_Ran = tuple[JobOutcome, float, float]


def _error(code: str, message: str, **extra: Any) -> dict[str, Any]:
    document: dict[str, Any] = _storable({"code": code, "message": message, **extra})
    return document


def _storable(value: Any) -> Any:
    """A JSON value PostgreSQL's jsonb accepts: no U+0000, no NaN, only JSON types.

    Error documents are built from whatever a handler raised; one unstorable message
    must not make the statement that records a whole batch fail.
    """
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, bool | int) or value is None:
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else str(value)
    if isinstance(value, dict):
        return {_storable(str(key)): _storable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_storable(item) for item in value]
    return _storable(str(value))


def _json_result(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return value


class Worker:
    def __init__(
        self,
        client: QueueClient,
        registry: Registry,
        config: WorkerConfig,
        *,
        on_job: Callable[[JobRecord], None] | None = None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        rand: Callable[[], float] = random.random,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.client = client
        self.registry = registry
        self.config = config
        self._on_job = on_job
        self._now = now
        self._rand = rand
        self._timer = timer

    # The pass -------------------------------------------------------------------------

    def drain(self, deadline: Deadline) -> DrainReport:
        """Claim, run and record batches until the queue is empty or time is short.

        The outcomes of a batch travel with the claim of the next one (one statement,
        one commit per batch); the last batch's outcomes are recorded on their own.
        """
        report = DrainReport()
        carried: list[_Ran] = []
        with timeouts() as limit:
            self._drain(deadline, report, carried, limit)
        report.time_left = deadline.remaining()
        return report

    def _drain(self, deadline: Deadline, report: DrainReport, carried: list[_Ran],
               limit: TimeLimit) -> None:
        cfg = self.config
        try:
            while True:
                remaining = deadline.remaining()
                lease = lease_for(remaining, margin=cfg.lease_margin, cap=cfg.max_lease)
                if (lease is None
                        or remaining < cfg.job_timeout + cfg.lease_margin + FINISH_RESERVE):
                    report.stopped = "deadline"
                    break
                lease_ends_at = remaining - lease.total_seconds()
                if carried:
                    jobs = self._record_and_claim(carried, lease, report)
                    carried.clear()
                else:
                    jobs = self.client.claim_ready_jobs(cfg.owner, cfg.batch_size, lease)
                if not jobs:
                    report.stopped = "queue_empty"
                    break
                report.batches += 1
                report.claimed += len(jobs)
                finished_in_time, ran = self._run_batch(
                    jobs, deadline, lease_ends_at, report, limit)
                carried.extend(ran)
                if not finished_in_time:
                    # A job could not be started in the time left: claiming again would
                    # only take it and give it back, over and over.
                    report.stopped = "deadline"
                    break
        finally:
            self._record(carried, report)

    def _run_batch(self, jobs: list[ClaimedJob], deadline: Deadline, lease_ends_at: float,
                   report: DrainReport, limit: TimeLimit) -> tuple[bool, list[_Ran]]:
        """Run a claimed batch; return whether it all ran, and the outcomes to record.

        Times are in "remaining seconds" units, which shrink as time passes: a lease
        that ends at 12.0 ends when the deadline has 12 s left. Without a lease cap all
        leases end at the margin, so the whole batch is recorded by one statement, the
        one that claims the next batch; with a cap, outcomes are recorded early when a
        lease would end first. When jobs had to be given back because time ran short,
        everything is recorded here and (False, []) comes back.
        """
        pending: list[_Ran] = []
        pending_lease_end = 0.0  # the latest lease end among ``pending``
        unstarted: list[ClaimedJob] = []
        margin = self.config.lease_margin
        for position, job in enumerate(jobs):
            registration = self.registry.get(job.kind)
            budget = self._budget(registration)
            now = deadline.remaining()
            if now - margin - FINISH_RESERVE < budget:
                unstarted = jobs[position:]
                break
            recorded_by = now - budget - FINISH_RESERVE
            if pending and pending_lease_end > recorded_by:
                self._record(pending, report)
                pending, pending_lease_end = [], 0.0
            lease_end = lease_ends_at
            if lease_end > recorded_by:
                renewed = self._renew(job, deadline)
                if renewed is None:
                    report.lost_leases += 1
                    self._observe(job, "retry", None)
                    continue
                lease_end = renewed
            lag = max(0.0, (self._now() - job.available_at).total_seconds())
            started = self._timer()
            with running(job):
                outcome = self._run_one(job, registration, budget, deadline, limit)
            pending.append((outcome, self._timer() - started, lag))
            pending_lease_end = max(pending_lease_end, lease_end)
        if not unstarted:
            return True, pending
        self._record(pending, report)
        given_back = self.client.release_jobs(self.config.owner, unstarted)
        report.released += len(given_back)
        report.lost_leases += len(unstarted) - len(given_back)
        logger.info("gave back jobs that could not start in the time left", extra={
            "given_back": len(given_back), "time_left": round(deadline.remaining(), 3)})
        for job in unstarted:
            self._observe(job, "released", JobState.PENDING if job.id in given_back else None)
        return False, []

    def _budget(self, registration: Registration | None) -> float:
        if registration is not None and registration.timeout is not None:
            return registration.timeout
        return self.config.job_timeout

    def _policy(self, registration: Registration | None) -> RetryPolicy:
        if registration is not None and registration.retry is not None:
            return registration.retry
        return self.config.retry

    # One job ----------------------------------------------------------------------------

    def _run_one(self, job: ClaimedJob, registration: Registration | None, budget: float,
                 deadline: Deadline, limit: TimeLimit) -> JobOutcome:
        """Run one job's handler (in the job's logging context) and judge its outcome."""
        if job.payload_error is not None:
            # Retrying cannot help: every claim would read the same stored text.
            logger.error("payload cannot be decoded", extra=job_log_fields(job))
            undecodable = job.payload_error
            return JobOutcome(job, "dead", _error(
                "UNDECODABLE_PAYLOAD",
                f"the stored payload cannot be decoded as JSON by Python: "
                f"{undecodable.reason}. Enqueue a corrected job under a new operation "
                "key; retrying this one would fail the same way",
                prefix=undecodable.prefix, length=len(undecodable.text)))
        if registration is None:
            logger.error("no handler registered for this kind", extra=job_log_fields(job))
            return JobOutcome(job, "dead", _error(
                "UNKNOWN_KIND", f"no handler is registered for kind {job.kind!r}",
                kind=job.kind))
        try:
            payload: Any = job.payload
            if registration.payload_model is not None:
                payload = registration.payload_model.model_validate(job.payload)
        except ValidationError as exc:
            logger.error("payload does not match the kind's model", extra=job_log_fields(job))
            return JobOutcome(job, "dead", _error(
                "INVALID_PAYLOAD", f"payload does not match {exc.title}",
                errors=json.loads(exc.json(include_url=False, include_input=False))))

        started = deadline.remaining()
        context = JobContext(
            job,
            _remaining=lambda: max(0.0, budget - (started - deadline.remaining())),
            _renew=lambda: self._renew(job, deadline) is not None,
        )
        policy = self._policy(registration)
        debug = logger.isEnabledFor(logging.DEBUG)
        if debug:
            logger.debug("job started", extra=job_log_fields(job))
        try:
            result = limit.call(lambda: registration.handler(payload, context), budget)
        except JobTimeout:
            logger.warning("job overran its time budget and was interrupted",
                           extra=job_log_fields(job))
            return self._retry(job, policy, None, _error(
                "JOB_TIMEOUT", f"the handler ran longer than its budget of {budget:g} s"))
        except RetryJob as exc:
            logger.info("handler asked for a retry", extra=job_log_fields(job))
            return self._retry(job, policy, exc.delay, _error("RETRY_REQUESTED", exc.reason))
        except DiscardJob as exc:
            logger.warning("handler discarded the job", extra=job_log_fields(job))
            return JobOutcome(job, "dead", _error("DISCARDED", exc.reason))
        except Exception as exc:
            logger.warning("handler failed", extra={**job_log_fields(job), "error": repr(exc)},
                           exc_info=True)
            return self._retry(job, policy, None, _error(
                "HANDLER_ERROR", str(exc) or type(exc).__name__, type=type(exc).__qualname__))
        if debug:
            logger.debug("job handler returned", extra=job_log_fields(job))
        return self._success(job, result)

    def _success(self, job: ClaimedJob, result: Any) -> JobOutcome:
        if result is None:  # most handlers return nothing: nothing to check
            return JobOutcome(job, "succeeded")
        try:
            value = _json_result(result)
            problem = storage_problem(value)
            size = json_size(value) if problem is None else 0
        except (TypeError, ValueError, RecursionError) as exc:
            return JobOutcome(job, "dead", _error(
                "RESULT_NOT_JSON", "the handler returned a value that is not strict JSON: "
                f"{str(exc) or type(exc).__name__}"))
        if problem is not None:
            return JobOutcome(job, "dead", _error(
                "RESULT_NOT_JSON", f"the handler's result cannot be stored: {problem}"))
        if size > MAX_RESULT_BYTES:
            return JobOutcome(job, "dead", _error(
                "RESULT_TOO_LARGE",
                f"the handler's result is {size} bytes; at most {MAX_RESULT_BYTES} are stored"))
        return JobOutcome(job, "succeeded", value)

    def _retry(self, job: ClaimedJob, policy: RetryPolicy, delay: timedelta | None,
               error: dict[str, Any]) -> JobOutcome:
        if not policy.allows_another(job.attempts, job.max_attempts):
            # Attempts used up, by the job's own limit or the kind's stricter one: the
            # queue records it dead with reason max_attempts, which operators tell
            # apart from a discard.
            return JobOutcome(job, "exhausted", {**error, "final": True})
        chosen = delay if delay is not None else policy.delay(job.attempts, rand=self._rand)
        chosen = min(max(chosen, timedelta(0)), MAX_RETRY_DELAY)  # the SQL contract's bounds
        return JobOutcome(job, "retry", error, retry_delay=chosen)

    def _renew(self, job: ClaimedJob, deadline: Deadline) -> float | None:
        """Extend ``job``'s lease as far as allowed; the new end, or None if lost."""
        remaining = deadline.remaining()
        lease = lease_for(remaining, margin=self.config.lease_margin, cap=self.config.max_lease)
        if lease is None or not self.client.renew_job_lease(job, lease):
            return None
        return remaining - lease.total_seconds()

    # Recording --------------------------------------------------------------------------

    def _record(self, outcomes: list[_Ran], report: DrainReport) -> None:
        if not outcomes:
            return
        recorded, states = self._finish([o for o, _, _ in outcomes])
        self._account(outcomes, recorded, states, report)

    def _record_and_claim(self, outcomes: list[_Ran], lease: timedelta,
                          report: DrainReport) -> list[ClaimedJob]:
        try:
            states, jobs = self.client.finish_and_claim_jobs(
                self.config.owner, [o for o, _, _ in outcomes], self.config.batch_size, lease)
        except InvalidRequestError as exc:
            logger.error("outcomes refused with the next claim; recording them apart",
                         extra={"error": exc.message, "outcomes": len(outcomes)})
            self._record(outcomes, report)
            return self.client.claim_ready_jobs(self.config.owner, self.config.batch_size, lease)
        self._account(outcomes, [o for o, _, _ in outcomes], states, report)
        return jobs

    def _account(self, ran: list[_Ran], recorded: list[JobOutcome],
                 states: dict[UUID, JobState], report: DrainReport) -> None:
        for outcome, (_, duration, lag) in zip(recorded, ran, strict=True):
            state = states.get(outcome.job.id)
            if state is None:
                report.lost_leases += 1
                logger.warning("lease lost before the outcome was recorded; another worker "
                               "or the reaper owns the job now", extra=job_log_fields(outcome.job))
            elif state is JobState.SUCCEEDED:
                report.succeeded += 1
            elif state is JobState.DEAD:
                report.dead += 1
            else:
                report.retried += 1
            error = outcome.detail if outcome.outcome != "succeeded" else None
            self._observe(outcome.job, outcome.outcome, state, duration, lag, error)

    def _finish(self, outcomes: list[JobOutcome]
                ) -> tuple[list[JobOutcome], dict[UUID, JobState]]:
        """Record a batch in one statement; if the statement is refused, one by one.

        The worker sanitises what it sends, so a refusal means a bug; even then one
        job's unstorable outcome must not cost the others theirs. A refused single
        outcome is replaced by a minimal error that always fits.
        """
        owner = self.config.owner
        try:
            return outcomes, self.client.finish_jobs(owner, outcomes)
        except InvalidRequestError as exc:
            logger.error("outcomes refused as a batch; recording them one by one",
                         extra={"error": exc.message, "outcomes": len(outcomes)})
        recorded: list[JobOutcome] = []
        states: dict[UUID, JobState] = {}
        for outcome in outcomes:
            try:
                states.update(self.client.finish_jobs(owner, [outcome]))
            except InvalidRequestError as exc:
                logger.error("outcome refused; recording a minimal error instead",
                             extra={**job_log_fields(outcome.job), "error": exc.message})
                outcome = JobOutcome(
                    outcome.job, "retry" if outcome.outcome == "retry" else "dead",
                    _error("OUTCOME_NOT_STORABLE", exc.message, intended=outcome.outcome),
                    retry_delay=timedelta(0) if outcome.outcome == "retry" else None)
                states.update(self.client.finish_jobs(owner, [outcome]))
            recorded.append(outcome)
        return recorded, states

    def _observe(self, job: ClaimedJob, outcome: _RecordOutcome, state: JobState | None,
                 duration: float = 0.0, lag: float = 0.0,
                 error: dict[str, Any] | None = None) -> None:
        if self._on_job is None:  # no record built per job for nobody
            return
        try:
            self._on_job(JobRecord(job, outcome, state, duration, lag, error))
        except Exception:
            logger.exception("job observer failed; continuing")
