"""The worker pool's limits, written at deploy time as the schema owner.

The pool's maximum, how long a reserved place or a wake's ticket waits for its invocation
(the start hold) and each login's wake debounce are the owner's: they live in the one row of
``app.settings``, which no runtime login may write, and the pool functions cap every caller
by them (sql/README.md, "The worker pool"). A stolen worker or producer login therefore
cannot widen them, however it calls the functions. The template passes them in the resource
property ``WorkerPool`` (``MaxWorkers`` and ``WakeDebounceSeconds`` from its parameters, the
start hold above the worker's maximum event age), and the handler writes them on the owner's
connection right after migrating, before any new function runs.

Every value is checked before anything connects, with the database's own ranges
(``leaseq.drain.config.OWNER_POOL_BOUNDS``). A request without the property comes from a template
that predates it (CloudFormation rolling an update back): the database keeps the limits it
has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from leaseq import PoolLimits, set_worker_pool_limits
from leaseq.base.errors import ConfigurationError
from leaseq.base.limits import Bounds
from leaseq.drain.config import OWNER_POOL_BOUNDS

#: The custom resource property holding the limits (a map, by key below).
PROPERTY: Final = "WorkerPool"
MAX_WORKERS: Final = "MaxWorkers"
START_HOLD: Final = "StartHoldSeconds"
WAKE_DEBOUNCE: Final = "WakeDebounceSeconds"
KEYS: Final = (MAX_WORKERS, START_HOLD, WAKE_DEBOUNCE)


def _number(limits: Mapping[str, Any], key: str, bounds: Bounds, *, whole: bool) -> float:
    if key not in limits:
        raise ConfigurationError(f"the resource property {PROPERTY}.{key} is missing")
    text = str(limits[key]).strip()
    try:
        value = int(text) if whole else float(text)
    except ValueError:
        value = None
    if value is None or not bounds.allows(value):  # NaN is within no bounds
        kind = "a whole number" if whole else "a number of seconds"
        raise ConfigurationError(
            f"the resource property {PROPERTY}.{key} must be {kind} {bounds.describe()}, "
            f"not {limits[key]!r}")
    return value


def requested_pool_limits(properties: Mapping[str, Any]) -> PoolLimits | None:
    """The limits the request asks for, checked; None when it carries none."""
    limits = properties.get(PROPERTY)
    if limits is None:
        return None
    if not isinstance(limits, Mapping):
        raise ConfigurationError(f"the resource property {PROPERTY} must be a map of "
                                 f"{', '.join(KEYS)}, not {limits!r}")
    return PoolLimits(
        max_workers=int(_number(limits, MAX_WORKERS, OWNER_POOL_BOUNDS["max_workers"],
                                whole=True)),
        start_hold=_number(limits, START_HOLD, OWNER_POOL_BOUNDS["start_hold"], whole=False),
        wake_debounce=_number(limits, WAKE_DEBOUNCE, OWNER_POOL_BOUNDS["wake_debounce"],
                              whole=False),
    )


def write_pool_limits(conn: Any, limits: PoolLimits) -> PoolLimits:
    """Write ``limits`` to ``app.settings`` on the owner's connection; the limits now in
    force, as the database read them back."""
    return set_worker_pool_limits(conn, max_workers=limits.max_workers,
                                  start_hold=limits.start_hold,
                                  wake_debounce=limits.wake_debounce)


def describe(limits: PoolLimits) -> str:
    """One line for the log and the resource's ``WorkerPoolLimits`` attribute."""
    return (f"MaxWorkers {limits.max_workers}, StartHoldSeconds {limits.start_hold:g}, "
            f"WakeDebounceSeconds {limits.wake_debounce:g}")
