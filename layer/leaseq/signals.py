"""What a job handler raises to steer its job. These are instructions, not errors:
they are not ``LeaseqError``s and never escape the worker."""

from __future__ import annotations

from datetime import timedelta


class RetryJob(Exception):
    """Retry this job, after ``delay`` (seconds or timedelta) or the kind's backoff."""

    def __init__(self, reason: str = "retry requested", *,
                 delay: float | timedelta | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.delay = timedelta(seconds=delay) if isinstance(delay, int | float) else delay


class DiscardJob(Exception):
    """Retrying cannot help: mark the job dead now, with ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class JobTimeout(BaseException):
    """Raised inside a handler whose time budget is spent.

    A BaseException, so a handler's broad ``except Exception`` cannot swallow it.
    """
