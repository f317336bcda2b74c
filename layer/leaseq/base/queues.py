"""Named queues as the library reads them: a queue's pause state and its overview.

A job belongs to one queue (``EnqueueRequest.queue``, its kind's route, or
:data:`leaseq.limits.DEFAULT_QUEUE`); each queue is drained by its own workers, with a
worker pool of its own, and can be paused and resumed by an operator
(sql/functions/queues.sql). These are the rows of those calls, typed, so the command
line, the dashboard and the metrics read the same fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["QueueOverview", "QueueState"]


@dataclass(frozen=True)
class QueueState:
    """A queue's pause: since when, by whom and why (all None while it runs)."""

    queue: str
    paused_at: datetime | None
    paused_by: str | None
    pause_reason: str | None

    @property
    def paused(self) -> bool:
        """True while the queue's jobs are left unclaimed."""
        return self.paused_at is not None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> QueueState:
        """From a row of app.pause_queue or app.resume_queue."""
        return cls(row["queue"], row["paused_at"], row["paused_by"], row["pause_reason"])


@dataclass(frozen=True)
class QueueOverview:
    """One queue's depth and state (app.queue_overview): jobs ready now, scheduled for
    later, running, retrying (retry_wait) and dead; the oldest ready job's time; the
    pool's live and reserved places and its limit; and the pause."""

    queue: str
    ready: int
    scheduled: int
    running: int
    retrying: int
    dead: int
    oldest_ready_at: datetime | None
    live_workers: int
    reserved_workers: int
    max_workers: int
    state: QueueState

    @property
    def paused(self) -> bool:
        """True while the queue is paused."""
        return self.state.paused

    def oldest_ready_age(self, now: datetime) -> float | None:
        """Seconds the oldest ready job has waited at ``now``; None with none ready."""
        if self.oldest_ready_at is None:
            return None
        return max(0.0, (now - self.oldest_ready_at).total_seconds())

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> QueueOverview:
        """From a row of app.queue_overview."""
        return cls(
            queue=row["queue"], ready=int(row["ready"]), scheduled=int(row["scheduled"]),
            running=int(row["running"]), retrying=int(row["retrying"]),
            dead=int(row["dead"]), oldest_ready_at=row["oldest_ready_at"],
            live_workers=int(row["live_workers"]),
            reserved_workers=int(row["reserved_workers"]),
            max_workers=int(row["max_workers"]),
            state=QueueState(row["queue"], row["paused_at"], row["paused_by"],
                             row["pause_reason"]),
        )

    def as_dict(self, now: datetime) -> dict[str, Any]:
        """The overview as JSON-ready values (``leaseq status --json``, the dashboard)."""
        age = self.oldest_ready_age(now)
        return {
            "queue": self.queue, "paused": self.paused, "ready": self.ready,
            "scheduled": self.scheduled, "running": self.running,
            "retrying": self.retrying, "dead": self.dead,
            "oldest_ready_age_seconds": None if age is None else round(age, 3),
            "live_workers": self.live_workers, "reserved_workers": self.reserved_workers,
            "max_workers": self.max_workers,
            "paused_at": None if self.state.paused_at is None
            else self.state.paused_at.isoformat(),
            "paused_by": self.state.paused_by, "pause_reason": self.state.pause_reason,
        }
