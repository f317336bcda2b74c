"""Drain the queue locally: the worker handler invoked again and again, as its schedule
would invoke it in AWS, until nothing is left to do.

Between invocations the loop looks at the queue (app.queue_status): it stops when no
job is pending or waiting for a retry, or when the next one is due later than the
operator is willing to wait; otherwise it sleeps until the next job is due. With
``reap`` the reaper handler runs before every worker invocation, as its own schedule
would, and jobs still running (a lease that has yet to expire) count as work left.

With a kind filter (``--kind`` / ``--exclude-kind``, or LEASEQ_KINDS / LEASEQ_EXCLUDE_KINDS
in the environment) only jobs of the kinds the worker claims count (app.queue_depth per
kind, which does not say when the next one is due: the loop then waits up to ``wait``);
jobs of the other kinds are counted apart, as left to their own worker. The same holds
for named queues: the worker drains its own queue (``--queue``, LEASEQ_QUEUE; "default"),
and while other queues hold jobs only its queue's jobs count (app.queue_overview), the
others' as left to their own workers.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from leaseq.base.queues import QueueOverview
from leaseq.drain.config import FINISH_RESERVE, WorkerConfig, needed_for
from leaseq.settings import WorkerSettings
from leaseq.store.client import QueueClient
from leaseq.store.db import Connection
from leaseq.store.duties import OperatorClient
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from leaseq_cli.failures import UsageError
from leaseq_cli.render import Ui

Stop = Literal["queue_empty", "invocation_limit", "scheduled_later", "idle_too_long"]

#: Seconds before a progress bar appears: short drains print only their summary.
PROGRESS_AFTER = 2.0


@dataclass
class DrainTotals:
    invocations: int = 0
    reaper_invocations: int = 0
    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    dead: int = 0
    given_back: int = 0
    lost_leases: int = 0
    leases_recovered: int = 0
    elapsed: float = 0.0
    stopped: Stop = "queue_empty"
    left: dict[str, int] = field(default_factory=dict)
    next_due_in: float | None = None
    #: With a kind filter: jobs pending or waiting for a retry of the kinds it leaves.
    left_to_others: int = 0

    def add_worker(self, report: dict[str, Any]) -> None:
        self.invocations += 1
        for name in ("claimed", "succeeded", "retried", "dead", "given_back", "lost_leases"):
            setattr(self, name, getattr(self, name) + int(report.get(name, 0) or 0))

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class FinishedCounter:
    """Counts finished jobs on a connection of its own (opened on first use), for the
    progress thread."""

    def __init__(self, connect: Callable[[], Connection]) -> None:
        self._client = OperatorClient(QueueClient(connect))

    def __call__(self) -> int:
        rows = self._client.queue_status()
        return sum(int(row["jobs"]) for row in rows if row["state"] in FINISHED)

    def close(self) -> None:
        self._client.close()


@dataclass(frozen=True)
class Backlog:
    """What the queue holds right now, from app.queue_status."""

    by_state: dict[str, int]
    ready: int
    next_due_in: float | None
    #: With a kind filter: pending and retry_wait jobs of the kinds the worker leaves.
    others: int = 0

    @classmethod
    def read(cls, client: OperatorClient, claims: WorkerConfig | None = None) -> Backlog:
        """The whole queue, or with ``claims`` (a worker's kind filter) the jobs of the
        kinds it claims."""
        if claims is not None and (claims.kinds or claims.exclude_kinds):
            return cls._of_kinds(client, claims)
        if claims is not None and claims.queue is not None:
            views = client.queue_overview()
            if any(v.queue != claims.queue and v.ready + v.scheduled + v.running
                   for v in views):
                return cls._of_queue(views, claims.queue)
        by_state: dict[str, int] = {}
        ready = 0
        due: list[float] = []
        for row in client.queue_status():
            by_state[row["state"]] = by_state.get(row["state"], 0) + int(row["jobs"])
            ready += int(row["ready_jobs"])
            if row["next_ready_in"] is not None:
                due.append(max(0.0, row["next_ready_in"].total_seconds()))
        return cls(by_state, ready, min(due) if due else None)

    @classmethod
    def _of_kinds(cls, client: OperatorClient, claims: WorkerConfig) -> Backlog:
        by_state = {"pending": 0, "retry_wait": 0, "running": 0}
        ready = others = 0
        for row in client.queue_depth_by_kind():
            if not claims.claims(row["kind"]):
                others += int(row["pending"]) + int(row["retry_wait"])
                continue
            for state in by_state:
                by_state[state] += int(row[state])
            ready += int(row["ready"])
        return cls(by_state, ready, None, others)

    @classmethod
    def _of_queue(cls, views: list[QueueOverview], queue: str) -> Backlog:
        by_state = {"pending": 0, "retry_wait": 0, "running": 0}
        ready = others = 0
        for view in views:
            if view.queue != queue:
                others += view.ready + view.scheduled
                continue
            by_state["retry_wait"] += view.retrying
            by_state["pending"] += view.ready + view.scheduled - view.retrying
            by_state["running"] += view.running
            ready += view.ready
        return cls(by_state, ready, None, others)

    def waiting(self, *, include_running: bool) -> int:
        states = ("pending", "retry_wait", "running") if include_running else (
            "pending", "retry_wait")
        return sum(self.by_state.get(s, 0) for s in states)


def worker_settings() -> WorkerSettings:
    """The worker's settings as the handler will read them (the drain's environment)."""
    return WorkerSettings.model_validate(
        {k: v for k, v in os.environ.items() if k.startswith("LEASEQ_") and v})


def kind_filter() -> WorkerConfig | None:
    """The worker's kind filter and queue (the queue is always set: the worker drains
    one)."""
    settings = worker_settings()
    return WorkerConfig(owner="leaseq-drain", kinds=settings.kinds,
                        exclude_kinds=settings.exclude_kinds, queue=settings.queue)


def check_budget(budget: float) -> None:
    """Refuse an invocation budget too short to start a single job, before invoking."""
    settings = worker_settings()
    needed = needed_for(settings.job_timeout_seconds, settings.lease_margin_seconds)
    if budget < needed:
        raise UsageError(
            f"a {budget:g} s invocation is too short to start a job: the worker needs the job "
            "timeout plus the lease margin plus 1 s "
            f"({settings.job_timeout_seconds:g} + {settings.lease_margin_seconds:g} + "
            f"{FINISH_RESERVE:g} = {needed:g} s); raise --budget or lower --job-timeout")


def as_report(value: Any) -> dict[str, Any]:
    """The handler's answer as a dict of counters, whatever its exact shape."""
    if isinstance(value, dict):
        nested = value.get("report") or value.get("drain")
        return nested if isinstance(nested, dict) else value
    as_dict = getattr(value, "as_dict", None)
    return as_dict() if callable(as_dict) else {}


FINISHED = ("succeeded", "dead", "cancelled")


class _Progress:
    """A progress bar that appears once a drain has lasted a few seconds.

    One invocation may run for its whole budget, so the bar is driven by a thread that
    counts finished jobs on a connection of its own (``count_finished``), not by the
    invocations' reports, which arrive only when each invocation ends.
    """

    def __init__(self, ui: Ui, total: int, count_finished: Callable[[], int] | None) -> None:
        self.ui = ui
        self.total = max(total, 1)
        self.count_finished = count_finished
        self.started = time.monotonic()
        self.totals = DrainTotals()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> _Progress:
        if self.ui.interactive and self.count_finished is not None:
            self._thread = threading.Thread(target=self._run, name="leaseq-progress",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        assert self.count_finished is not None
        if self._stop.wait(PROGRESS_AFTER):
            return
        try:
            baseline = self.count_finished()
        except Exception:
            return  # a bar is a nicety: never let it fail the drain
        done_before = self.totals.succeeded + self.totals.dead
        bar = Progress(TextColumn("draining"), BarColumn(), MofNCompleteColumn(),
                       TextColumn("{task.description}"), TimeElapsedColumn(),
                       console=self.ui.err, transient=True)
        task = bar.add_task("", total=self.total, completed=min(done_before, self.total))
        with bar:
            while not self._stop.wait(0.25):
                try:
                    done = done_before + self.count_finished() - baseline
                except Exception:
                    return
                bar.update(task, completed=min(done, self.total),
                           description=f"invocation {self.totals.invocations + 1}")


def drain(
    ui: Ui,
    client: OperatorClient,
    worker: Callable[[float], Any],
    *,
    budget: float,
    max_invocations: int | None = None,
    wait: float = 10.0,
    reaper: Callable[[float], Any] | None = None,
    reaper_budget: float = 10.0,
    count_finished: Callable[[], int] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> DrainTotals:
    """Invoke ``worker`` (and ``reaper``) until the queue is drained; see the module doc.

    ``count_finished`` (finished jobs in the queue, read on its own connection) drives
    the progress bar on a terminal.
    """
    check_budget(budget)
    claims = kind_filter()
    started = time.monotonic()
    backlog = Backlog.read(client, claims)
    progress = _Progress(ui, backlog.waiting(include_running=True), count_finished)
    totals = progress.totals
    idle_since: float | None = None
    with progress:
        while True:
            if max_invocations is not None and totals.invocations >= max_invocations:
                totals.stopped = "invocation_limit"
                break
            if reaper is not None:
                reaped = as_report(reaper(reaper_budget))
                totals.reaper_invocations += 1
                totals.leases_recovered += int(reaped.get("released", 0) or 0)
            report = as_report(worker(budget))
            totals.add_worker(report)
            if int(report.get("claimed", 0) or 0) > 0:
                idle_since = None
                continue
            backlog = Backlog.read(client, claims)
            if backlog.ready > 0:
                # Claimed by someone else in the meantime, or given back: look again shortly.
                sleep(0.1)
                continue
            if backlog.waiting(include_running=reaper is not None) == 0:
                totals.stopped = "queue_empty"
                break
            now = time.monotonic()
            idle_since = now if idle_since is None else idle_since
            due = backlog.next_due_in
            if due is not None and due > wait:
                totals.stopped = "scheduled_later"
                break
            if now - idle_since > wait:
                totals.stopped = "idle_too_long"
                break
            sleep(min(due if due is not None else 0.5, 1.0) + 0.05)
    totals.elapsed = time.monotonic() - started
    final = Backlog.read(client, claims)
    totals.left = {s: n for s, n in final.by_state.items()
                   if s in ("pending", "retry_wait", "running") and n}
    totals.next_due_in = final.next_due_in
    totals.left_to_others = final.others
    return totals


def describe_stop(totals: DrainTotals) -> str:
    others = (f"; {totals.left_to_others} of the kinds this drain leaves wait for their own "
              "worker") if totals.left_to_others else ""
    if totals.stopped == "queue_empty":
        if others:
            return "no job of the kinds this drain claims is pending or waiting for a retry" + (
                others)
        return "the queue is drained: no job is pending or waiting for a retry"
    left = ", ".join(f"{n} {s}" for s, n in sorted(totals.left.items())) or "nothing"
    if totals.stopped == "invocation_limit":
        return f"stopped after {totals.invocations} invocations; left: {left}{others}"
    due = timedelta(seconds=totals.next_due_in or 0)
    if totals.stopped == "scheduled_later":
        return (f"left: {left}; the next job is due in {due}, later than --wait: "
                f"run leaseq drain again then{others}")
    return f"nothing became ready within --wait; left: {left}{others}"
