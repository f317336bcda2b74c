"""Concurrency and rate limits on jobs, as named and written in Python (not the SQL
contract's numeric bounds, which are :mod:`leaseq.limits`).

A limit caps the jobs of one subject, named as the command line and the database name it:

* ``kind:K``: every job of kind K;
* ``tenant:T`` (``tenant:*``: each tenant on its own): every job of a tenant;
* ``kind:K/tenant:T`` (``kind:K/tenant:*``: each tenant on its own): kind K within a tenant;
* ``key:L``: every job whose producer named ``limit_key=L``, whatever its kind or tenant.

Each has a concurrency (at most N admitted, so at most N running) and/or a rate (at most
R starts per period, ``"10/s"``, ``"100/m"``, ``"5/10s"``, with a burst of at most B
starting together). The database enforces them when a job is admitted and when it starts
(``sql/functions/admission.sql``); here they are parsed and checked, so a limit that can
never admit (0, negative, a malformed rate) is refused where it was written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from uuid import UUID

from leaseq.base.errors import InvalidRequestError

__all__ = ["MAX_LIMIT", "DeclaredLimit", "LimitName", "Rate", "parse_limit_name", "parse_rate"]

#: The largest concurrency, and the most starts per period, a limit may allow.
MAX_LIMIT = 10_000

_UNITS = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
_RATE = re.compile(r"^\s*(?P<count>-?\d+)\s*/\s*(?P<every>\d+(?:\.\d+)?)?\s*"
                   r"(?P<unit>ms|sec|s|min|m|h|d)\s*$")


def _invalid(message: str) -> InvalidRequestError:
    return InvalidRequestError(message, sqlstate="22023")


@dataclass(frozen=True)
class Rate:
    """At most ``count`` starts in any window of ``period``; at most ``burst`` of them
    at once (all ``count`` when None), the rest spread over the period."""

    count: int
    period: timedelta
    burst: int | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_LIMIT:
            raise _invalid(f"a rate must allow 1 to {MAX_LIMIT} starts per period (got "
                           f"{self.count}): a rate of less than 1 would never start a job")
        if not timedelta(seconds=1) <= self.period <= timedelta(days=1):
            raise _invalid("a rate's period must be between 1 second and 1 day "
                           f"(got {self.period})")
        if self.burst is not None and not 1 <= self.burst <= self.count:
            raise _invalid(f"burst must be between 1 and the rate's count {self.count} "
                           f"(got {self.burst})")

    def __str__(self) -> str:
        seconds = self.period.total_seconds()
        text = f"{self.count}/s" if seconds == 1 else f"{self.count}/{seconds:g}s"
        return text if self.burst is None else f"{text} burst {self.burst}"


def parse_rate(text: str, burst: int | None = None) -> Rate:
    """``"10/s"`` (10 a second), ``"100/m"``, ``"1000/h"``, ``"5/10s"`` (5 per 10
    seconds) as a :class:`Rate`; anything else is refused with what is expected.

    >>> parse_rate("10/s"), str(parse_rate("5/10s", burst=1))
    (Rate(count=10, period=datetime.timedelta(seconds=1), burst=None), '5/10s burst 1')
    """
    found = _RATE.match(text) if isinstance(text, str) else None
    if found is None:
        raise _invalid(f"rate {text!r} is not COUNT/PERIOD, for example '10/s', '100/m', "
                       "'1000/h' or '5/10s'")
    every = float(found["every"] or 1)
    period = timedelta(seconds=every * _UNITS[found["unit"]])
    return Rate(int(found["count"]), period, burst)


@dataclass(frozen=True)
class LimitName:
    """A limit's subject: its scope (kind, tenant, kind_tenant, key) and what it names;
    ``tenant_id`` None with scope tenant or kind_tenant means each tenant on its own."""

    scope: str
    kind: str | None = None
    tenant_id: UUID | None = None
    limit_key: str | None = None

    def __str__(self) -> str:
        tenant = "*" if self.tenant_id is None else str(self.tenant_id)
        if self.scope == "kind":
            return f"kind:{self.kind}"
        if self.scope == "tenant":
            return f"tenant:{tenant}"
        if self.scope == "kind_tenant":
            return f"kind:{self.kind}/tenant:{tenant}"
        return f"key:{self.limit_key}"


def _tenant(text: str, name: str) -> UUID | None:
    if text == "*":
        return None
    try:
        return UUID(text)
    except ValueError:
        raise _invalid(f"limit {name!r}: tenant must be a UUID or * (each tenant)") from None


def parse_limit_name(name: str) -> LimitName:
    """``kind:K``, ``tenant:T`` or ``tenant:*``, ``kind:K/tenant:T`` or
    ``kind:K/tenant:*``, ``key:L`` as a :class:`LimitName`.

    >>> str(parse_limit_name("kind:report/tenant:*")), parse_limit_name("key:acct-42").scope
    ('kind:report/tenant:*', 'key')
    """
    if name.startswith("kind:"):
        rest = name.removeprefix("kind:")
        kind, marker, tenant = rest.rpartition("/tenant:")
        if marker:
            if not kind:
                raise _invalid(f"limit {name!r} names no kind")
            return LimitName("kind_tenant", kind=kind, tenant_id=_tenant(tenant, name))
        if not rest:
            raise _invalid(f"limit {name!r} names no kind")
        return LimitName("kind", kind=rest)
    if name.startswith("tenant:"):
        return LimitName("tenant", tenant_id=_tenant(name.removeprefix("tenant:"), name))
    if name.startswith("key:") and name != "key:":
        return LimitName("key", limit_key=name.removeprefix("key:"))
    raise _invalid(f"limit {name!r} is not kind:KIND, tenant:TENANT|*, "
                   "kind:KIND/tenant:TENANT|* or key:KEY")


def check_concurrency(concurrency: int | None) -> None:
    """Refuse a concurrency that could never admit a job (or is beyond the bound)."""
    if concurrency is not None and (isinstance(concurrency, bool)
                                    or not 1 <= concurrency <= MAX_LIMIT):
        raise _invalid(f"concurrency must be between 1 and {MAX_LIMIT} (got {concurrency}): a "
                       "limit of less than 1 would never admit a job")


@dataclass(frozen=True)
class DeclaredLimit:
    """A kind's limit declared with its handler (``@registry.handler(..., concurrency=2,
    rate="10/s")``): for the kind as a whole, or with ``per_tenant`` for the kind
    within each tenant. ``leaseq limits sync`` writes these; an operator's limit on the
    same subject is in force over it."""

    kind: str
    concurrency: int | None = None
    rate: Rate | None = None
    per_tenant: bool = False

    def __post_init__(self) -> None:
        check_concurrency(self.concurrency)
        if self.concurrency is None and self.rate is None:
            raise _invalid(f"kind {self.kind}: a limit needs a concurrency, a rate, or both")

    @property
    def name(self) -> LimitName:
        """The subject the limit is declared on."""
        return LimitName("kind_tenant" if self.per_tenant else "kind", kind=self.kind)
