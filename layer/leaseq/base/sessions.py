"""Sessions past their caps: what the reaper's sweep (app.end_stalled_sessions) reports.

Every user may SET statement_timeout and idle_in_transaction_session_timeout, also to 0,
and PostgreSQL cannot forbid it; a reader or a runtime login that lifts its cap could
hold a lock on the queue's tables (every migration gives up behind it) and a snapshot
(vacuum keeps every dead row) for as long as it likes. The reaper ends such sessions
once they pass the caps their logins were given; see sql/README.md, "Sessions past
their caps".
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

#: The sweep's outcomes: ended; refused (the schema owner may not end sessions: it
#: needs pg_signal_backend); unseen (it may not read their state: pg_read_all_stats).
Outcome = Literal["ended", "refused", "unseen"]


@dataclass(frozen=True)
class StalledSession:
    """A session the sweep acted on: a reader or a runtime login idle in a transaction,
    or running one statement, past its cap. ``state`` and ``stalled_for`` are None for
    an ``unseen`` session, whose state the owner may not read."""

    pid: int
    login: str
    state: str | None
    stalled_for: timedelta | None
    outcome: Outcome
