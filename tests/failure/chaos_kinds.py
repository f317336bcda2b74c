"""The job kinds of the chaos drain, their share of the backlog and the fates allowed.

Shared by the test (which enqueues and checks fates) and by the worker processes
(which register the handlers), so both sides agree on one table.
"""

from __future__ import annotations

from dataclasses import dataclass

#: (final state, reason of the dead event, last_error code) of one finished job.
Fate = tuple[str, str | None, str | None]

SUCCEEDED: Fate = ("succeeded", None, None)


@dataclass(frozen=True)
class ChaosKind:
    name: str
    weight: int
    fates: frozenset[Fate]
    max_attempts: int = 20


def _dead(reason: str, code: str) -> Fate:
    return ("dead", reason, code)


KINDS: tuple[ChaosKind, ...] = (
    # Succeeds at once (after a millisecond or two of "work", where kills land).
    ChaosKind("chaos.ok", 880, frozenset({SUCCEEDED})),
    # Raises on its first attempts, then succeeds.
    ChaosKind("chaos.flaky", 40, frozenset({SUCCEEDED})),
    # Sleeps past its time budget on the first attempt (interrupted: JobTimeout).
    ChaosKind("chaos.overrun", 10, frozenset({SUCCEEDED})),
    # Hangs forever on the first attempt (interrupted: JobTimeout).
    ChaosKind("chaos.hang", 5, frozenset({SUCCEEDED})),
    # Records its side effect, then its process dies by SIGKILL before the outcome
    # is recorded: a guaranteed double execution.
    ChaosKind("chaos.crash", 5, frozenset({SUCCEEDED})),
    # Asks to be discarded: dead at once.
    ChaosKind("chaos.poison", 15, frozenset({_dead("discarded", "DISCARDED")})),
    # Always raises: dead once its 3 attempts are spent, by its handler's last failure
    # or, when chaos ended its last attempt, by lease expiry.
    ChaosKind("chaos.doomed", 15, frozenset({
        _dead("max_attempts", "HANDLER_ERROR"),
        _dead("lease_expired_at_max_attempts", "LEASE_EXPIRED"),
    }), max_attempts=3),
    # No handler is registered for it.
    ChaosKind("chaos.unregistered", 10, frozenset({_dead("discarded", "UNKNOWN_KIND")})),
    # Its payload does not fit the kind's model.
    ChaosKind("chaos.typed", 15, frozenset({_dead("discarded", "INVALID_PAYLOAD")})),
)

BY_NAME = {kind.name: kind for kind in KINDS}

#: Budget of the kinds that overrun or hang, and of every other kind.
SHORT_TIMEOUT = 0.3
JOB_TIMEOUT = 0.5
