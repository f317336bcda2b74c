"""The SQL contract's bounds as Python names, and the type of a setting's default and range.

The database refuses a value outside these bounds (SQLSTATE 22023, see sql/README.md).
Python checks the same bounds before anything is sent, so that a setting or a request
that can never work is refused where it was written, naming the setting instead of a
function argument. Each bound has one name here; the modules that check or size a call
(the settings, the worker, the reaper, the enqueue function, the producers' client)
import it rather than repeat the number.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

#: Jobs one claim may take (app.claim_ready_jobs, claim_jobs, finish_and_claim_jobs).
MAX_CLAIM = 100
#: Jobs one app.enqueue_jobs call may carry.
MAX_ENQUEUE = 1000
#: Bytes of JSON text the payloads of one app.enqueue_jobs call may hold together
#: (16 MiB; each payload is also bounded, by leaseq.base.storable.MAX_DOCUMENT_BYTES).
MAX_ENQUEUE_BYTES = 16 * 1024 * 1024
#: Rows one call of the reaper's paged functions may touch (app.release_all_expired_jobs,
#: repair_tenant_turns, prune_jobs, prune_retained_jobs).
MAX_PAGE = 10_000
#: Attempts a job may be given (EnqueueRequest.max_attempts, RetryPolicy.max_attempts).
MAX_ATTEMPTS = 20
#: A job's priority: 1 is the least urgent, 9 the most; 5 when none is given
#: (EnqueueRequest.priority, app.enqueue_jobs). Aging bounds how long a job can be
#: overtaken: see sql/README.md, "Priorities".
MIN_PRIORITY = 1
MAX_PRIORITY = 9
DEFAULT_PRIORITY = 5
#: A queue's name (app.check_queue): 1 .. 40 lowercase ASCII letters, digits, '-' and '_',
#: starting with a letter, since it names Lambda functions, metric dimensions and log
#: fields. A job names no queue: its kind's route, else :data:`DEFAULT_QUEUE`.
QUEUE_NAME_PATTERN = r"^[a-z][a-z0-9_-]{0,39}$"
MAX_QUEUE_NAME = 40
DEFAULT_QUEUE = "default"
#: The shortest and the longest lease a claim or renewal may take.
MIN_LEASE = timedelta(seconds=1)
MAX_LEASE = timedelta(days=1)
#: The longest wait before a retry.
MAX_RETRY_DELAY = timedelta(days=30)
#: The longest retention a prune accepts.
MAX_RETENTION = timedelta(days=3650)


def enqueue_size_problem(sizes: Iterable[tuple[int, int]]) -> str | None:
    """Why an enqueue call is too large, or None: the SQL contract's check and message.

    ``sizes`` are ``(position, bytes)`` of the payloads the call would store, in order,
    positions counted from 1; their sum may not pass :data:`MAX_ENQUEUE_BYTES`. The
    message names the payload that takes it past, as app.enqueue_jobs does:

    >>> enqueue_size_problem([(1, MAX_ENQUEUE_BYTES)]) is None
    True
    >>> enqueue_size_problem([(1, MAX_ENQUEUE_BYTES), (2, 2)]).split(", and ")[1]
    'job 2 brings them to 16777218; split the batch into smaller calls'
    """
    total = 0
    for position, size in sizes:
        total += size
        if total > MAX_ENQUEUE_BYTES:
            return (f"enqueue call too large: its payloads must total at most "
                    f"{MAX_ENQUEUE_BYTES} bytes as JSON text, and job {position} brings them "
                    f"to {total}; split the batch into smaller calls")
    return None


@dataclass(frozen=True)
class Bounds:
    """A setting's default and the closed range it must lie in (``above``: the low end
    itself is excluded, for values that must be positive).

    One value per setting, read by every place that takes the setting (the library's
    arguments, the environment's settings, the template's test), so they cannot drift:

    >>> margin = Bounds(5.0, 0.5, 600)
    >>> margin.allows(0.4), margin.describe()
    (False, 'at least 0.5 and at most 600')
    """

    default: Any
    low: float
    high: float
    above: bool = False

    def allows(self, value: float) -> bool:
        """Whether ``value`` lies in the range."""
        return (value > self.low if self.above else value >= self.low) and value <= self.high

    def describe(self) -> str:
        """The range in words, for an error message."""
        low = f"more than {self.low:.15g}" if self.above else f"at least {self.low:.15g}"
        return f"{low} and at most {self.high:.15g}"

    def field(self) -> dict[str, Any]:
        """Keyword arguments of a pydantic ``Field`` with this default and range."""
        low = {"gt": self.low} if self.above else {"ge": self.low}
        return {"default": self.default, "le": self.high, **low}


def queue_name_problem(name: object) -> str | None:
    """Why ``name`` cannot name a queue, in the database's words (app.check_queue), or
    None: for settings and requests checked before anything is sent."""
    import re

    if not isinstance(name, str) or re.fullmatch(QUEUE_NAME_PATTERN, name) is None:
        shown = repr(name[:60]) if isinstance(name, str) else repr(name)
        return ("must be a queue name: 1 to 40 lowercase letters, digits, '-' or '_', "
                f"starting with a letter (got {shown})")
    return None
