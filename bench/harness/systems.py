"""The queues under test: how each one gets its schema, its jobs, and its workers.

Every system drains the same number of no-op jobs from its own fresh database. Jobs
are enqueued through each system's own batch API before the clock starts; PgQueuer
and procrastinate have no tenants, so the tenant number only travels in the payload.
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, LiteralString, Protocol

from psycopg import sql

from harness.pg import as_url, connect

BATCH = 10
ENQUEUE_CHUNK = 1000


_WORDS = ("order", "customer", "invoice", "line", "amount", "currency", "EUR", "USD",
          "shipped", "pending", "address", "street", "city", "postcode", "note", "gift")


def payload(n: int, tenant: int, size: int) -> dict[str, Any]:
    """Job n's payload: its number and tenant, padded to about ``size`` bytes of JSON
    with words drawn the same way in every run: text that compresses like prose does,
    as most real payloads (PostgreSQL compresses large values before storing them)."""
    document: dict[str, Any] = {"tenant": tenant, "n": n}
    if size > 0:
        rng = random.Random(n)
        words: list[str] = []
        length = 40
        while length < size:
            word = rng.choice(_WORDS)
            words.append(word)
            length += len(word) + 1
        document["pad"] = " ".join(words)
    return document


def tenant_ids(tenants: int) -> list[uuid.UUID]:
    """Stable tenant ids, so runs are comparable."""
    return [uuid.uuid5(uuid.NAMESPACE_URL, f"leaseq-bench-tenant-{i}") for i in range(tenants)]


@dataclass(frozen=True)
class Work:
    """What each job's handler does instead of nothing: an ``async def`` handler that
    waits ``handler_ms`` (a network call's wait), ``slots`` of them at once per worker
    process (leaseq's ``concurrency``, PgQueuer's ``concurrency_limit``)."""

    handler_ms: float
    slots: int

    def args(self) -> list[str]:
        return [f"{self.handler_ms:g}", str(self.slots)]


#: The systems whose workers can run a waiting handler concurrently.
WAITING_SYSTEMS = ("leaseq", "pgqueuer")


class System(Protocol):
    key: str
    label: str
    tables: tuple[str, ...]

    def install(self, dsn: str) -> None: ...
    def enqueue(self, dsn: str, jobs: int, tenants: int, payload_bytes: int) -> None: ...
    def commands(self, dsn: str, concurrency: int,
                 work: Work | None = None) -> list[list[str]]: ...
    def finished(self, dsn: str) -> int: ...


# leaseq ------------------------------------------------------------------------------


# The migrations every leaseq database of one benchmark run gets: read once at the
# start (see pin_migrations), so that SQL files changing during a run cannot make its
# lines incomparable.
_PINNED: list[Any] | None = None


def pin_migrations(upto: int | None = None) -> list[dict[str, Any]]:
    """Read the packaged migrations now (up to version ``upto``); describe them."""
    global _PINNED
    from leaseq.store.migrate import load_migrations

    _PINNED = [m for m in load_migrations() if upto is None or m.version <= upto]
    return [{"version": m.version, "name": m.name, "sha256": m.checksum} for m in _PINNED]


def leaseq_install(dsn: str) -> None:
    from leaseq.store.db import connect as leaseq_connect
    from leaseq.store.migrate import migrate

    conn = leaseq_connect(dsn, application_name="leaseq-bench-migrate")
    try:
        migrate(conn, _PINNED)
    finally:
        conn.close()


def _enqueue_in_chunks(dsn: str, statement: LiteralString, jobs: int, tenants: int,
                       payload_bytes: int, kind: str = "noop") -> None:
    """Run ``statement`` over chunks of jobs given as four arrays (tenant ids, operation
    keys, kinds, payloads), tenants interleaved round robin; smaller chunks for large
    payloads, so that one statement stays a few megabytes."""
    ids = tenant_ids(tenants)
    chunk = ENQUEUE_CHUNK if payload_bytes < 10_000 else 50
    with connect(dsn) as conn:
        for start in range(0, jobs, chunk):
            ns = range(start, min(start + chunk, jobs))
            conn.execute(statement, (
                [ids[n % tenants] for n in ns],
                [f"op-{n}" for n in ns],
                [kind] * len(ns),
                [json.dumps(payload(n, n % tenants, payload_bytes)) for n in ns],
            )).fetchall()


def leaseq_enqueue(dsn: str, jobs: int, tenants: int, payload_bytes: int = 0,
                   kind: str = "noop") -> None:
    """Through leaseq's own batch API, app.enqueue_jobs."""
    _enqueue_in_chunks(
        dsn, "select count(*) from app.enqueue_jobs(%s::uuid[], %s::text[], %s::text[],"
             " %s::jsonb[])", jobs, tenants, payload_bytes, kind)


#: The reference schema as the product received it (a copy the upgrade test applies).
REFERENCE_SCHEMA = (Path(__file__).resolve().parents[2]
                    / "tests" / "migrations" / "fixtures" / "reference-schema.sql")


def reference_install(dsn: str) -> None:
    """The reference schema, applied as written by a superuser (it needs the group
    roles to exist and grants to them), plus the one column bench/ceiling.sql writes
    that it lacks: the events' lease_token (nullable, no index)."""
    with connect(dsn) as conn:
        for role in ("service_role", "authenticated"):
            found = conn.execute("select 1 from pg_roles where rolname = %s", (role,))
            if found.fetchone() is None:
                conn.execute(sql.SQL("create role {} nologin").format(sql.Identifier(role)))
        conn.execute(REFERENCE_SCHEMA.read_text(encoding="utf-8").encode())
        conn.execute("alter table app.job_events add column lease_token uuid")


def reference_enqueue(dsn: str, jobs: int, tenants: int, payload_bytes: int = 0) -> None:
    """Set-based INSERTs: the reference has no enqueue function."""
    _enqueue_in_chunks(
        dsn, "with added as (insert into app.jobs (tenant_id, operation_key, kind, payload)"
             " select * from unnest(%s::uuid[], %s::text[], %s::text[], %s::jsonb[])"
             " returning 1) select count(*) from added",
        jobs, tenants, payload_bytes)


def leaseq_finished(dsn: str) -> int:
    with connect(dsn) as conn:
        row = conn.execute(
            "select count(*) filter (where state = 'succeeded') as done,"
            " (select count(*) from app.job_events where event_type = 'succeeded') as events"
            " from app.jobs"
        ).fetchone()
    assert row is not None
    if row["done"] != row["events"]:
        raise RuntimeError(f"{row['done']} succeeded jobs but {row['events']} succeeded events")
    return int(row["done"])


#: leaseq's tables a job's life writes (app.claimable and app.leases since 0023).
LEASEQ_TABLES: tuple[str, ...] = ("app.jobs", "app.job_events", "app.claimable", "app.leases")


@dataclass
class LeaseqSqlFloor:
    key: str = "leaseq-sql"
    label: str = "leaseq SQL floor (functions called directly)"
    tables: tuple[str, ...] = LEASEQ_TABLES
    worker_module: str = "harness.workers.leaseq_sql"

    def install(self, dsn: str) -> None:
        leaseq_install(dsn)

    def enqueue(self, dsn: str, jobs: int, tenants: int, payload_bytes: int) -> None:
        leaseq_enqueue(dsn, jobs, tenants, payload_bytes)

    def commands(self, dsn: str, concurrency: int,
                 work: Work | None = None) -> list[list[str]]:
        extra = work.args() if work is not None else []
        return [
            ["-m", self.worker_module, dsn, f"bench-worker-{i}", str(BATCH), *extra]
            for i in range(concurrency)
        ]

    def finished(self, dsn: str) -> int:
        return leaseq_finished(dsn)


@dataclass
class LeaseqLibrary(LeaseqSqlFloor):
    """The same schema and jobs, drained by the library's Worker.drain."""

    key: str = "leaseq"
    label: str = "leaseq (library drain, as the worker Lambda)"
    worker_module: str = "harness.workers.leaseq_drain"


# PgQueuer ----------------------------------------------------------------------------


async def _pgqueuer(dsn: str, action: str, jobs: int = 0, tenants: int = 1,
                    payload_bytes: int = 0) -> Any:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    conn = await asyncpg.connect(as_url(dsn))
    try:
        queries = Queries(AsyncpgDriver(conn))
        if action == "install":
            await queries.install()
            return None
        if action == "enqueue":
            for start in range(0, jobs, ENQUEUE_CHUNK):
                ns = range(start, min(start + ENQUEUE_CHUNK, jobs))
                await queries.enqueue(
                    ["noop"] * len(ns),
                    [json.dumps(payload(n, n % tenants, payload_bytes)).encode() for n in ns],
                    [0] * len(ns),
                )
            return None
        if action == "finished":
            left = await conn.fetchval("select count(*) from pgqueuer")
            done = await conn.fetchval(
                "select count(*) from pgqueuer_log where status = 'successful'")
            if left:
                raise RuntimeError(f"{left} PgQueuer jobs left in the queue")
            return int(done)
        raise ValueError(action)
    finally:
        await conn.close()


@dataclass
class PgQueuerSystem:
    key: str = "pgqueuer"
    label: str = "PgQueuer"
    tables: tuple[str, ...] = ("pgqueuer", "pgqueuer_log")

    def install(self, dsn: str) -> None:
        asyncio.run(_pgqueuer(dsn, "install"))

    def enqueue(self, dsn: str, jobs: int, tenants: int, payload_bytes: int) -> None:
        asyncio.run(_pgqueuer(dsn, "enqueue", jobs, tenants, payload_bytes))

    def commands(self, dsn: str, concurrency: int,
                 work: Work | None = None) -> list[list[str]]:
        extra = work.args() if work is not None else []
        return [["-m", "harness.workers.pgqueuer_drain", as_url(dsn), str(BATCH), *extra]
                for _ in range(concurrency)]

    def finished(self, dsn: str) -> int:
        return int(asyncio.run(_pgqueuer(dsn, "finished")))


# procrastinate -----------------------------------------------------------------------


async def _procrastinate(dsn: str, action: str, jobs: int = 0, tenants: int = 1,
                         payload_bytes: int = 0) -> None:
    from harness.workers.procrastinate_app import build_app

    app = build_app(dsn)
    async with app.open_async():
        if action == "install":
            await app.schema_manager.apply_schema_async()
        elif action == "enqueue":
            task = app.tasks["noop"]
            for start in range(0, jobs, ENQUEUE_CHUNK):
                ns = range(start, min(start + ENQUEUE_CHUNK, jobs))
                kwargs = [payload(n, n % tenants, payload_bytes) for n in ns]
                await task.batch_defer_async(*kwargs)
        else:
            raise ValueError(action)


@dataclass
class ProcrastinateSystem:
    key: str = "procrastinate"
    label: str = "procrastinate"
    tables: tuple[str, ...] = ("procrastinate_jobs", "procrastinate_events")
    concurrency_per_process: int = 1

    def install(self, dsn: str) -> None:
        asyncio.run(_procrastinate(dsn, "install"))

    def enqueue(self, dsn: str, jobs: int, tenants: int, payload_bytes: int) -> None:
        asyncio.run(_procrastinate(dsn, "enqueue", jobs, tenants, payload_bytes))

    def commands(self, dsn: str, concurrency: int,
                 work: Work | None = None) -> list[list[str]]:
        return [["-m", "harness.workers.procrastinate_drain", dsn,
                 str(self.concurrency_per_process)] for _ in range(concurrency)]

    def finished(self, dsn: str) -> int:
        with connect(dsn) as conn:
            row = conn.execute(
                "select count(*) filter (where status = 'succeeded') as done,"
                " count(*) filter (where status <> 'succeeded') as left"
                " from procrastinate_jobs"
            ).fetchone()
        assert row is not None
        if row["left"]:
            raise RuntimeError(f"{row['left']} procrastinate jobs not succeeded")
        return int(row["done"])


SYSTEMS: dict[str, System] = {
    "leaseq": LeaseqLibrary(),
    "leaseq-sql": LeaseqSqlFloor(),
    "pgqueuer": PgQueuerSystem(),
    "procrastinate": ProcrastinateSystem(),
}
