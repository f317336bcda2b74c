"""What a job handler raises to steer its job. These are instructions, not errors:
they are not ``LeaseqError``s and never escape the worker."""

from __future__ import annotations

from datetime import timedelta


class RetryJob(Exception):
    """Retry this job, after ``delay`` (seconds or timedelta) or the kind's backoff.

    For a failure that passes (a rate limit, a service that is down); the attempt
    counts, and once the job's attempts are used up it is dead (reason max_attempts).
    ``reason`` is the job's last_error message.

    >>> def charge(payload: dict, ctx: JobContext) -> None:
    ...     raise RetryJob("the payment service is rate limiting", delay=30)
    >>> RetryJob("rate limited", delay=30).delay
    datetime.timedelta(seconds=30)
    """

    def __init__(self, reason: str = "retry requested", *,
                 delay: float | timedelta | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.delay = timedelta(seconds=delay) if isinstance(delay, int | float) else delay


class DiscardJob(Exception):
    """Retrying cannot help: mark the job dead now, with ``reason`` (an input that will
    never work, a customer who no longer exists). An operator can redrive it later.

    >>> DiscardJob("no card on file").reason
    'no card on file'
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class JobTimeout(BaseException):
    """Raised inside a handler whose time budget is spent.

    A BaseException, so a handler's broad ``except Exception`` cannot swallow it. A
    handler may catch it to clean up, then must let it go (re-raise it); the job is
    retried with code JOB_TIMEOUT.

    >>> issubclass(JobTimeout, Exception)
    False
    """
