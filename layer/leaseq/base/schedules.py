"""Periodic jobs: schedules, checked in Python before they reach the database.

A schedule is a row of ``app.schedules`` (sql/functions/schedules.sql) that the reaper's
tick turns into one ordinary job per slot, keyed ``schedule:<id>:<slot>``, so racing or
repeated ticks never make a second job for a slot. The slots are computed in the database
from its own clock; this module only states a schedule (:class:`Schedule`) and refuses,
before anything is sent, what the database would refuse: a malformed expression, one finer
than a minute, one that can never fire, an unknown time zone. The database checks all of
it again: it is the only door that counts.

``SHARED_TENANT`` (the nil UUID) is where shared work goes: a schedule of work for every
tenant, or for none in particular, enqueues into it; a schedule of one tenant's work names
that tenant.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator

from leaseq.base.storable import character_problem, is_blank

#: The tenant of shared work (scheduled work of no tenant in particular).
SHARED_TENANT = UUID(int=0)

#: The cron macros and the expressions they stand for.
MACROS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_FIELDS: tuple[tuple[str, int, int, tuple[str, ...]], ...] = (
    ("minute", 0, 59, ()), ("hour", 0, 23, ()), ("day-of-month", 1, 31, ()),
    ("month", 1, 12, _MONTHS), ("day-of-week", 0, 7, _WEEKDAYS),
)
_PART = re.compile(r"^(\*|([0-9]{1,4}|[a-z]{3})(-([0-9]{1,4}|[a-z]{3}))?)(/([0-9]{1,4}))?$")
_EVERY = re.compile(r"^@every\s+((?:[0-9]{1,9}[dhms])+)$")
_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _field_values(expression: str, text: str, field: str, low: int, high: int,
                  names: tuple[str, ...]) -> set[int]:
    values: set[int] = set()
    for part in text.split(","):
        match = _PART.match(part)
        if match is None:
            raise ValueError(f"schedule expression {expression!r}: the {field} field {text!r} is "
                             "not a number, a range a-b, a step */n or a list of these")
        bounds: list[int | None] = []
        for value in (match.group(2), match.group(4)):
            if value is None or value.isdigit():
                bounds.append(None if value is None else int(value))
            elif value in names:
                bounds.append(names.index(value) + low)
            else:
                extra = f" or {names[0]}-{names[-1]}" if names else ""
                raise ValueError(f"schedule expression {expression!r}: {value!r} is not a value "
                                 f"of the {field} field (use {low} to {high}{extra})")
        step = int(match.group(6)) if match.group(6) else 1
        if match.group(1) == "*":
            first, last = low, high
        else:
            assert bounds[0] is not None
            first = bounds[0]
            last = bounds[1] if bounds[1] is not None else (high if match.group(6) else first)
        if not (low <= first <= high and low <= last <= high):
            raise ValueError(f"schedule expression {expression!r}: the {field} field {text!r} "
                             f"is out of range: use {low} to {high}")
        if first > last:
            raise ValueError(f"schedule expression {expression!r}: the {field} field's range "
                             f"{part!r} runs backwards: write the lower value first")
        if step < 1:
            raise ValueError(f"schedule expression {expression!r}: the {field} field's step "
                             f"must be at least 1 (got {step})")
        values.update(range(first, last + 1, step))
    return values


def expression_problem(expression: str) -> str | None:
    """What is wrong with a schedule expression (the database's message), or None.

    >>> expression_problem("*/5 * * * *") is None
    True
    >>> expression_problem("0 0 30 2 *")
    "schedule expression '0 0 30 2 *' can never fire: none of its months has any of its days of the month"
    """  # noqa: E501
    text = expression.strip().lower()
    if not text:
        return ("schedule expression is required: a five-field cron expression such as "
                "'*/5 * * * *', or '@every 10m'")
    if len(expression) > 200:
        return "schedule expression must have at most 200 characters"
    if text.startswith("@every"):
        match = _EVERY.match(text)
        if match is None:
            return (f"schedule expression {expression!r}: an interval is @every followed by "
                    "numbers with units d, h, m or s, such as @every 10m or @every 1h30m")
        seconds = sum(int(n) * _UNITS[u] for n, u in re.findall(r"([0-9]+)([dhms])",
                                                                 match.group(1)))
        if seconds < 60:
            return (f"schedule expression {expression!r}: schedules finer than a minute are not "
                    "supported (the reaper ticks once a minute); use @every 1m or more, or a "
                    "job that loops")
        if seconds > 366 * 86400:
            return f"schedule expression {expression!r}: an interval must be at most 366 days"
        return None
    text = MACROS.get(text, text)
    if text.startswith("@"):
        return (f"schedule expression {expression!r}: unknown macro; use @yearly, @annually, "
                "@monthly, @weekly, @daily, @midnight, @hourly or @every <interval>")
    fields = text.split()
    if len(fields) != 5:
        return (f"schedule expression {expression!r} has {len(fields)} fields; cron expressions "
                "have five: minute hour day-of-month month day-of-week (no seconds, no year)")
    try:
        sets = [_field_values(expression, f, *spec) for f, spec in zip(fields, _FIELDS,
                                                                          strict=True)]
    except ValueError as exc:
        return str(exc)
    days, months = sets[2], sets[3]
    if fields[4].startswith("*") and not any(
            d <= _MONTH_DAYS[m - 1] for m in months for d in days):
        return (f"schedule expression {expression!r} can never fire: none of its months has "
                "any of its days of the month")
    return None


_ZONE_NAME = re.compile(r"^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*$")


def time_zone_problem(time_zone: str) -> str | None:
    """What is wrong with a time zone name (not an IANA name), or None. Only the zone's
    own file is read (no listing of every zone: a handlers module declares schedules
    at a worker's cold start); the database checks the name against its own list."""
    problem = (f"time zone {time_zone!r} is not an IANA time zone name this database knows; "
               "use a name such as UTC or Europe/Berlin")
    if not time_zone or len(time_zone) > 64 or _ZONE_NAME.match(time_zone) is None:
        return problem
    try:
        ZoneInfo(time_zone)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return problem
    return None


class Schedule(BaseModel):
    """One schedule: its jobs' tenant, kind, payload and max_attempts, its expression and
    time zone, and ``fill_limit``, how many missed slots to enqueue after an outage or a
    pause (0 skips them). ``name`` is unique within the tenant."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tenant_id: UUID = SHARED_TENANT
    name: str = Field(min_length=1, max_length=128)
    kind: str = Field(min_length=1, max_length=128)
    expression: str = Field(min_length=1, max_length=200)
    time_zone: str = "UTC"
    payload: dict[str, Any] = Field(default_factory=dict)
    fill_limit: int = Field(default=0, ge=0, le=1000)
    max_attempts: int = Field(default=6, ge=1, le=20)

    @field_validator("name", "kind")
    @classmethod
    def _plain_text(cls, value: str) -> str:
        if is_blank(value):
            raise ValueError("must be a non-blank text")
        problem = character_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("expression")
    @classmethod
    def _expression(cls, value: str) -> str:
        problem = expression_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("time_zone")
    @classmethod
    def _time_zone(cls, value: str) -> str:
        problem = time_zone_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


@dataclass(frozen=True)
class TickedSchedule:
    """What one tick did for one schedule: slots enqueued as new jobs, slots whose key
    already named their job (``existing``), slots enqueued later than the grace
    (``late``), slots never to be enqueued (``skipped``), the last slot enqueued and its
    job, and the schedule's next slot."""

    schedule_id: UUID
    tenant_id: UUID
    name: str
    enqueued: int
    existing: int
    late: int
    skipped: int
    last_slot: datetime | None
    last_job_id: UUID | None
    next_slot: datetime

    @property
    def missed(self) -> int:
        """Slots not enqueued within the grace: late ones and skipped ones."""
        return self.late + self.skipped
