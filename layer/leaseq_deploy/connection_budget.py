"""The connection budget, checked at deploy time: what the stack can open against what the
database lets it open.

Each execution of a runtime function holds at most one database connection, and reserved
concurrency caps a function's executions, so the most connections the stack can open is a sum
of template parameters. The most the database accepts is known only to the database
(``max_connections``, less the slots it keeps for superusers and, behind RDS Proxy, the share
``ProxyMaxConnectionsPercent`` lets the proxy open). CloudFormation's Rules cannot add, so the
migrations custom resource, which holds the schema owner's connection anyway, compares the two
before it migrates and fails the deploy, naming the parameters and the numbers, when the sum
does not fit or when the worker's reservation is too small for its pool. Nothing has changed
by then.

What is counted, one connection per execution:

* the worker: ``WorkerReservedConcurrency``, which must be at least ``MaxWorkers + 1`` (the
  pool's invocations plus the schedule's tick, which must be able to start and be turned
  away rather than be throttled);
* the slow worker (only with ``SlowKinds``), the reaper and the enqueue function: their
  reserved concurrency;
* operators: ``OperatorConnections``, the allowance for the command line and the dashboard.
  The dashboard's function is reserved (``DashboardReservedConcurrency``) and each of its
  executions holds its own login's connection plus, with tenant viewers, at most
  ``DashboardReaderConnections`` tenant reader connections: that product must fit within
  ``OperatorConnections``, or the deploy is refused (the rest is the command line's);
* the migrations: the one direct connection this check runs on, kept outside the proxy's share.

A function left unreserved (0) has no bound Lambda enforces: it is counted at the least it
needs (the worker ``MaxWorkers + 1``, the others 1) and named in the summary, since only the
account's concurrency limit bounds it.

The check counts one server connection per client connection, as if every session were pinned
to its connection by the proxy: a deploy that passes never waits on the proxy's pool and never
meets "too many clients". Other applications on a shared server are not seen; leave room for
them with ``OperatorConnections`` or a smaller ``ProxyMaxConnectionsPercent``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

import psycopg
from leaseq.base.errors import ConfigurationError
from leaseq.store.client import queue_connections, set_stack_connections

#: The custom resource property holding the budget's parameters (a map, by parameter name).
PROPERTY: Final = "ConnectionBudget"
#: Keys of that map; the template passes each parameter under its own name.
MAX_WORKERS: Final = "MaxWorkers"
WORKER: Final = "WorkerReservedConcurrency"
SLOW_WORKER: Final = "SlowWorkerReservedConcurrency"
REAPER: Final = "ReaperReservedConcurrency"
ENQUEUE: Final = "EnqueueReservedConcurrency"
OPERATORS: Final = "OperatorConnections"
PROXY_PERCENT: Final = "ProxyMaxConnectionsPercent"
DASHBOARD: Final = "DashboardReservedConcurrency"
DASHBOARD_READERS: Final = "DashboardReaderConnections"
#: Every key the template sends; SLOW_WORKER and PROXY_PERCENT are empty when there is no
#: slow worker, or no proxy; the two dashboard keys are empty without the dashboard (and
#: absent from an earlier template's request), DASHBOARD_READERS 0 without tenant viewers.
KEYS: Final = (MAX_WORKERS, WORKER, SLOW_WORKER, REAPER, ENQUEUE, OPERATORS, PROXY_PERCENT,
               DASHBOARD, DASHBOARD_READERS)
#: The direct connection of the migrations (this check runs on it).
MIGRATIONS_CONNECTIONS: Final = 1

Connection = psycopg.Connection[dict[str, Any]]

#: Any login may read these. ``reserved_connections`` (PostgreSQL 16 and later) and RDS's
#: ``rds.rds_superuser_reserved_connections`` (RDS for PostgreSQL 15 and earlier) hold slots
#: back for privileged roles, as ``superuser_reserved_connections`` does for superusers.
LIMITS_SQL: Final = """
select current_setting('max_connections')::integer as max_connections,
       current_setting('superuser_reserved_connections')::integer as superuser_reserved,
       current_setting('reserved_connections', true) as reserved,
       current_setting('rds.rds_superuser_reserved_connections', true) as rds_reserved
"""


@dataclass(frozen=True)
class ServerLimits:
    """The server's connection limits, as ``SHOW`` gives them."""

    max_connections: int
    superuser_reserved: int
    #: ``reserved_connections``, or RDS's ``rds.rds_superuser_reserved_connections`` where
    #: the server predates it; 0 where neither exists.
    reserved: int
    reserved_setting: str = "reserved_connections"

    @property
    def ordinary(self) -> int:
        """Slots left for logins without a reserved-slot privilege (every leaseq login)."""
        return self.max_connections - self.superuser_reserved - self.reserved


def read_server_limits(conn: Connection) -> ServerLimits:
    """Read the limits over ``conn`` (any login may)."""
    row = conn.execute(LIMITS_SQL).fetchone()
    assert row is not None
    if row["reserved"] not in (None, ""):
        reserved, setting = int(row["reserved"]), "reserved_connections"
    elif row["rds_reserved"] not in (None, ""):
        reserved, setting = int(row["rds_reserved"]), "rds.rds_superuser_reserved_connections"
    else:
        reserved, setting = 0, "reserved_connections"
    return ServerLimits(int(row["max_connections"]), int(row["superuser_reserved"]), reserved,
                        setting)


@dataclass(frozen=True)
class Reservation:
    """One function's reserved concurrency and what it counts for when it is 0 (unreserved)."""

    parameter: str
    reserved: int
    unreserved_floor: int

    @property
    def counted(self) -> int:
        return self.reserved if self.reserved > 0 else self.unreserved_floor

    def describe(self) -> str:
        if self.reserved > 0:
            return f"{self.parameter} {self.reserved}"
        return f"{self.parameter} 0 (unreserved, counted as {self.unreserved_floor})"


@dataclass(frozen=True)
class DashboardConnections:
    """The dashboard's share of the operators' allowance: its reserved executions, each
    with its own login's connection and at most ``readers`` tenant reader connections."""

    reserved: int
    readers: int

    @property
    def total(self) -> int:
        return self.reserved * (1 + self.readers)

    def describe(self) -> str:
        return (f"{DASHBOARD} {self.reserved} x (1 + {DASHBOARD_READERS} {self.readers}) = "
                f"{self.total} for the dashboard")


@dataclass(frozen=True)
class StackConnections:
    """The connections the stack can open, from the resource's ``ConnectionBudget`` map."""

    max_workers: int
    reservations: tuple[Reservation, ...]
    operators: int
    #: ProxyMaxConnectionsPercent when the functions go through a proxy, else None.
    proxy_percent: int | None
    #: The dashboard's connections (within ``operators``), or None without a dashboard.
    dashboard: DashboardConnections | None = None
    #: The named queues' workers registered by stacks of their own (``queue_workers.py``),
    #: each counted at what its registration recorded.
    queues: tuple[Reservation, ...] = ()

    @property
    def worker(self) -> Reservation:
        return self.reservations[0]

    @property
    def own(self) -> int:
        """Client connections of this stack's runtime functions and operators (not the
        migrations, nor the queues of other stacks)."""
        return sum(r.counted for r in self.reservations) + self.operators

    @property
    def total(self) -> int:
        """What the deployment can open: this stack's and every registered queue's."""
        return self.own + sum(q.counted for q in self.queues)

    @property
    def unreserved(self) -> tuple[str, ...]:
        return tuple(r.parameter for r in self.reservations if r.reserved == 0)

    def describe(self) -> str:
        operators = f"{OPERATORS} {self.operators}"
        if self.dashboard is not None:
            operators += f" (of which {self.dashboard.describe()})"
        parts = [r.describe() for r in self.reservations] + [operators]
        parts += [q.describe() for q in self.queues]
        return " + ".join(parts) + f" = {self.total}"


def _optional_whole(budget: Mapping[str, Any], key: str, *, low: int = 0,
                    high: int | None = None, optional: bool = True) -> int | None:
    """The whole number under ``key``; None for an empty value where that means "none"."""
    if key not in budget:
        if optional and key in (DASHBOARD, DASHBOARD_READERS):
            return None  # an earlier template, without the dashboard's keys
        raise ConfigurationError(f"the resource property {PROPERTY}.{key} is missing")
    text = str(budget[key]).strip()
    if optional and text == "":
        return None
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < low or (high is not None and value > high):
        within = f"from {low} to {high}" if high is not None else f"of {low} or more"
        empty = " (or empty)" if optional else ""
        raise ConfigurationError(
            f"the resource property {PROPERTY}.{key} must be a whole number {within}{empty}, "
            f"not {budget[key]!r}")
    return value


def _whole(budget: Mapping[str, Any], key: str, *, high: int | None = None) -> int:
    value = _optional_whole(budget, key, high=high, optional=False)
    assert value is not None  # not optional: an empty value was refused
    return value


def stack_connections(properties: Mapping[str, Any]) -> StackConnections | None:
    """The budget's parameters, checked (each value, and the worker's reservation against
    its pool) before anything connects; None when the request carries none.

    A request without them comes from a template that predates the check: CloudFormation
    rolling an update back to it. It is not checked, so the rollback succeeds.
    """
    budget = properties.get(PROPERTY)
    if budget is None:
        return None
    if not isinstance(budget, Mapping):
        raise ConfigurationError(f"the resource property {PROPERTY} must be a map of "
                                 f"{', '.join(KEYS)}, not {budget!r}")
    max_workers = _whole(budget, MAX_WORKERS, high=1000)
    worker = _whole(budget, WORKER)
    slow = _optional_whole(budget, SLOW_WORKER)
    reaper = _whole(budget, REAPER)
    enqueue = _whole(budget, ENQUEUE)
    operators = _whole(budget, OPERATORS)
    proxy_percent = _optional_whole(budget, PROXY_PERCENT, low=1, high=100)
    dashboard_reserved = _optional_whole(budget, DASHBOARD, low=1, high=1000)
    dashboard_readers = _optional_whole(budget, DASHBOARD_READERS, high=20)
    reservations = [Reservation(WORKER, worker, max_workers + 1 if max_workers else 1)]
    if slow is not None:
        reservations.append(Reservation(SLOW_WORKER, slow, 1))
    reservations += [Reservation(REAPER, reaper, 1), Reservation(ENQUEUE, enqueue, 1)]
    dashboard = None if dashboard_reserved is None else DashboardConnections(
        dashboard_reserved, dashboard_readers or 0)
    stack = StackConnections(max_workers, tuple(reservations), operators, proxy_percent,
                             dashboard)
    problem = reservation_problem(stack) or dashboard_problem(stack)
    if problem:
        raise ConfigurationError(problem)
    return stack


def dashboard_problem(stack: StackConnections) -> str | None:
    """Why the dashboard's connections do not fit within the operators' allowance, or
    None."""
    dashboard = stack.dashboard
    if dashboard is None or dashboard.total <= stack.operators:
        return None
    return (
        f"{dashboard.describe()} is more than {OPERATORS} {stack.operators}: each dashboard "
        f"execution holds its login's connection and, with tenant viewers, up to "
        f"{DASHBOARD_READERS} reader connections, all counted within the operators' "
        f"allowance; raise {OPERATORS} to {dashboard.total} or more (plus what the command "
        f"line needs), or lower {DASHBOARD} or {DASHBOARD_READERS}"
    )


def reservation_problem(stack: StackConnections) -> str | None:
    """Why the worker's reservation cannot hold its pool and the tick, or None."""
    reserved, needed = stack.worker.reserved, stack.max_workers + 1
    if stack.max_workers == 0 or reserved == 0 or reserved >= needed:
        return None
    lower = (f"lower {MAX_WORKERS} to {reserved - 1}" if reserved > 1
             else f"set {MAX_WORKERS} to 0 (no pool: the schedule alone drains)")
    return (
        f"{WORKER} {reserved} is less than {MAX_WORKERS} {stack.max_workers} + 1: the pool "
        f"runs up to {stack.max_workers} worker invocations and the schedule's tick needs one "
        f"execution more, to be turned away rather than throttled; set {WORKER} to {needed} "
        f"or more (0 leaves the worker unreserved), or {lower}"
    )


@dataclass(frozen=True)
class Budget:
    """The most client connections the stack may open, and how that number came about."""

    limit: int
    explanation: str
    through_proxy: bool


def budget(limits: ServerLimits, proxy_percent: int | None) -> Budget:
    """The stack's share of the server: behind a proxy, the proxy's pool; else the server's
    ordinary slots. Either way one ordinary slot is kept for the migrations' direct
    connection."""
    held = (f"max_connections {limits.max_connections} - superuser_reserved_connections "
            f"{limits.superuser_reserved}")
    if limits.reserved:
        held += f" - {limits.reserved_setting} {limits.reserved}"
    direct = limits.ordinary - MIGRATIONS_CONNECTIONS
    direct_text = f"{held} - {MIGRATIONS_CONNECTIONS} for the migrations = {direct}"
    if proxy_percent is None:
        return Budget(direct, f"the database allows {direct_text}", through_proxy=False)
    pool = limits.max_connections * proxy_percent // 100
    explanation = (f"the proxy may open {PROXY_PERCENT} {proxy_percent}% of max_connections "
                   f"{limits.max_connections} = {pool}")
    if direct < pool:
        explanation += f", of which the database allows {direct_text}"
    return Budget(min(pool, direct), explanation, through_proxy=True)


def check(stack: StackConnections, limits: ServerLimits) -> str:
    """A one-line summary when the stack fits; a ConfigurationError naming the numbers when
    it does not."""
    share = budget(limits, stack.proxy_percent)
    route = " through the proxy" if share.through_proxy else ""
    if stack.total > share.limit:
        remedies = [
            f"lower {MAX_WORKERS} with {WORKER} (at least {MAX_WORKERS} + 1)",
            f"lower the other reservations or {OPERATORS}",
        ]
        if share.through_proxy:
            remedies.append(f"raise {PROXY_PERCENT}")
        remedies.append("give the database more connections (a larger DbInstanceClass: RDS "
                        "sets max_connections from the instance's memory)")
        raise ConfigurationError(
            f"the stack can open {stack.total} database connections{route} but "
            f"{share.explanation}: {stack.describe()}; {', '.join(remedies[:-1])}, or "
            f"{remedies[-1]}")
    summary = f"{stack.total} of {share.limit} connections{route} ({stack.describe()}; " \
              f"{share.explanation})"
    if stack.unreserved:
        summary += (f"; unreserved, so bounded only by the account's concurrency: "
                    f"{', '.join(stack.unreserved)}")
    return summary


def registered_queues(conn: Connection) -> tuple[Reservation, ...]:
    """The queues' workers other stacks registered (``app.queue_workers``, through
    ``app.queue_connections``), as reservations; none before the schema has the registry
    (this check runs before migrating)."""
    state = queue_connections(conn)
    queues = []
    for entry in (state["queues"] if state else None) or ():
        name, connections = str(entry).rsplit(" ", 1)
        queues.append(Reservation(f"queue {name}", int(connections), int(connections)))
    return tuple(queues)


def check_connection_budget(conn: Connection, stack: StackConnections) -> str:
    """Read the server's limits and the registered queues over ``conn`` and check the
    stack, with those queues, against them."""
    return check(replace(stack, queues=registered_queues(conn)), read_server_limits(conn))


def record_stack_connections(conn: Connection, stack: StackConnections) -> None:
    """After migrating: keep this stack's own connections and proxy share in the schema
    (``app.connection_budget``), for the queues' registrations to add to."""
    set_stack_connections(conn, stack.own, stack.proxy_percent)
