"""``bench/run.py pinned``: claims while another session pins the MVCC horizon.

A long REPEATABLE READ transaction (a report, a backup's ``pg_dump``, a forgotten
``BEGIN`` in a console) keeps its snapshot's xmin: no row deleted or updated after it
began can be pruned or vacuumed, in any table of its database, until it ends. A queue
whose claim walks over its own dead rows then slows down as they pile up.

For each system (leaseq, PgQueuer) and each mode (not pinned, then pinned), in a fresh
database: a producer enqueues ``--rate`` jobs a second (a batch every 100 ms, through
the system's own batch enqueue); ``--consumers`` sessions claim batches of 10 and finish
them (leaseq: ``QueueClient.claim_ready_jobs`` + ``finish_jobs``; PgQueuer:
``Queries.dequeue`` + ``log_jobs``, the statements its QueueManager runs), each sleeping
10 ms after a claim that found nothing; a session VACUUMs the system's tables every
``--vacuum-every`` seconds, as autovacuum would; all for ``--seconds``. When pinned, one
more session opens a REPEATABLE READ transaction, reads the job table (which takes the
snapshot) and holds it until the end. Reported: the latency of every claim that
returned jobs (median, p99) and of every claim, the jobs that flowed, and the dead
tuples and total size of each table at the end (pg_stat_user_tables, once the sessions
have ended).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from psycopg import sql

from harness import meters, source, tablestats
from harness.pg import Conn, Server, as_url, connect, run_database
from harness.systems import SYSTEMS, leaseq_install, payload, pin_migrations, tenant_ids

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
BENCH_DIR = Path(__file__).resolve().parent.parent
TICK = 0.1
BATCH = 10
IDLE_SLEEP = 0.01
TABLES = {"leaseq": ["app.jobs", "app.job_events", "app.claimable", "app.leases",
                     "app.tenant_turns"],
          "pgqueuer": ["public.pgqueuer", "public.pgqueuer_log"]}
HOLD_QUERY = {"leaseq": "select count(*) from app.jobs",
              "pgqueuer": "select count(*) from pgqueuer"}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python3 bench/run.py pinned",
        description="Jobs flow at a set rate while another session holds a REPEATABLE "
                    "READ transaction open (the MVCC horizon pinned); claim latency and "
                    "dead tuples, pinned vs not, for leaseq and PgQueuer in one run.")
    p.add_argument("--dsn", default=DEFAULT_DSN, help="superuser DSN (default: %(default)s)")
    p.add_argument("--seconds", type=float, default=180.0,
                   help="how long jobs flow in each mode, and how long the transaction is "
                        "held when pinned (default %(default)s)")
    p.add_argument("--quick", action="store_true",
                   help="a look, not a measurement: 20 seconds per mode")
    p.add_argument("--rate", type=int, default=500,
                   help="jobs enqueued a second, a batch every 100 ms (default %(default)s)")
    p.add_argument("--consumers", type=int, default=2,
                   help="sessions claiming and finishing at once, so the flow keeps up "
                        "on a busy machine (default %(default)s)")
    p.add_argument("--vacuum-every", type=float, default=10.0, metavar="SECONDS",
                   help="VACUUM the system's tables this often during the flow, as "
                        "autovacuum would on a server where it is on (0: never; "
                        "default %(default)s)")
    p.add_argument("--tenants", type=int, default=10, help="leaseq tenants (%(default)s)")
    p.add_argument("--systems", default="leaseq,pgqueuer",
                   help="comma-separated subset of %(default)s")
    p.add_argument("--nice", type=int, default=-10,
                   help="scheduling priority of this process and its server sessions "
                        "(needs root; 0 leaves priorities alone; default %(default)s)")
    p.add_argument("--explain", action="store_true",
                   help="leaseq: at the end of each mode, before the pin is let go, run "
                        "three claims of 50 fresh jobs under auto_explain and report the "
                        "scans that read the most buffers (where a claim's time goes)")
    p.add_argument("--keep-databases", action="store_true")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON results file (default bench/results/pinned-<time>.json)")
    args = p.parse_args(argv)
    if args.quick:
        args.seconds = 20.0
    if args.seconds <= 0 or args.rate <= 0 or args.consumers < 1 or args.vacuum_every < 0:
        p.error("--seconds, --rate and --consumers must be positive, --vacuum-every not "
                "negative")
    unknown = set(args.systems.split(",")) - set(TABLES)
    if unknown:
        p.error(f"unknown systems {sorted(unknown)}; choose from {sorted(TABLES)}")
    return args


class Flow:
    """What one mode's run saw: claim latencies, jobs produced and finished."""

    def __init__(self) -> None:
        self.claims_ms: list[float] = []
        self.empty_claims_ms: list[float] = []
        self.produced = 0
        self.finished = 0
        self.late_ticks = 0

    def summary(self, seconds: float) -> dict[str, Any]:
        def stats(values: list[float]) -> dict[str, float | int | None]:
            if len(values) < 2:
                return {"count": len(values), "median_ms": None, "p99_ms": None}
            cuts = statistics.quantiles(values, n=100)
            return {"count": len(values), "median_ms": statistics.median(values),
                    "p95_ms": cuts[94], "p99_ms": cuts[98], "max_ms": max(values)}

        return {"seconds": seconds, "produced": self.produced, "finished": self.finished,
                "jobs_per_s": self.finished / seconds, "late_ticks": self.late_ticks,
                "claims": stats(self.claims_ms),
                "all_claims": stats(self.claims_ms + self.empty_claims_ms)}


def _paced(until: float, tick: Callable[[], None], flow: Flow) -> None:
    """Call ``tick`` every TICK seconds until ``until`` (a late tick is counted, not
    repeated: the rate is then below the target, and the result says so)."""
    next_at = time.monotonic()
    while next_at < until:
        tick()
        next_at += TICK
        delay = next_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            flow.late_ticks += 1
            next_at = time.monotonic()


class _Vacuumer:
    """VACUUMs ``tables`` every ``every`` seconds on its own session, as autovacuum
    would (on this benchmark's server it may be off); pinned, it can remove nothing
    newer than the held snapshot, which is the point of the comparison."""

    def __init__(self, dsn: str, tables: list[str], every: float) -> None:
        self._dsn, self._tables, self._every = dsn, tables, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-vacuum")
        self.count = 0
        self.seconds = 0.0
        self.error: BaseException | None = None

    def start(self) -> None:
        if self._every > 0:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        try:
            with connect(self._dsn) as conn:
                while not self._stop.wait(self._every):
                    t0 = time.perf_counter()
                    for table in self._tables:
                        conn.execute(sql.SQL("vacuum {}").format(
                            sql.Identifier(*table.split("."))))
                    self.seconds += time.perf_counter() - t0
                    self.count += 1
        except BaseException as exc:
            self.error = exc


def _renice_session(conn: Conn, nice: int) -> None:
    if nice:
        row = conn.execute("select pg_backend_pid() as pid").fetchone()
        if row is not None:
            meters.renice(int(row["pid"]), nice)


# leaseq ------------------------------------------------------------------------------


def _leaseq_flow(dsn: str, seconds: float, rate: int, tenants: int, nice: int,
                 consumers: int) -> Flow:
    from leaseq import QueueClient
    from leaseq import connect as leaseq_connect
    from leaseq.base.jobs import JobOutcome

    flow = Flow()
    per_tick = max(1, round(rate * TICK))
    ids = tenant_ids(tenants)
    until = time.monotonic() + seconds
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            with connect(dsn) as conn:
                _renice_session(conn, nice)

                def tick() -> None:
                    ns = range(flow.produced, flow.produced + per_tick)
                    conn.execute(
                        "select count(*) from app.enqueue_jobs(%s::uuid[], %s::text[],"
                        " %s::text[], %s::jsonb[])",
                        ([ids[n % tenants] for n in ns], [f"op-{n}" for n in ns],
                         ["noop"] * per_tick,
                         [json.dumps(payload(n, n % tenants, 0)) for n in ns])).fetchall()
                    flow.produced += per_tick

                _paced(until, tick, flow)
        except BaseException as exc:  # reported by the consumer's thread
            errors.append(exc)

    lock = threading.Lock()

    def consume(n: int) -> None:
        try:
            client = QueueClient(lambda: leaseq_connect(dsn, application_name="bench-pinned"))
            client.check()
            _renice_session(client.connection, nice)
            lease = timedelta(seconds=30)
            owner = f"bench-pinned-{n}"
            try:
                while time.monotonic() < until and not errors:
                    t0 = time.perf_counter()
                    jobs = client.claim_ready_jobs(owner, BATCH, lease)
                    elapsed = (time.perf_counter() - t0) * 1000
                    if jobs:
                        client.finish_jobs(owner, [JobOutcome(j, "succeeded") for j in jobs])
                        with lock:
                            flow.claims_ms.append(elapsed)
                            flow.finished += len(jobs)
                    else:
                        with lock:
                            flow.empty_claims_ms.append(elapsed)
                        time.sleep(IDLE_SLEEP)
            finally:
                client.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=produce, name="bench-producer")] + [
        threading.Thread(target=consume, args=(n,), name=f"bench-consumer-{n}")
        for n in range(consumers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return flow


# PgQueuer ----------------------------------------------------------------------------


async def _pgqueuer_flow_async(dsn: str, seconds: float, rate: int, nice: int,
                               consumers: int) -> Flow:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries
    from pgqueuer.queries import EntrypointExecutionParameter

    flow = Flow()
    per_tick = max(1, round(rate * TICK))
    until = time.monotonic() + seconds
    url = as_url(dsn)
    producer_conn = await asyncpg.connect(url)
    consumer_conns = [await asyncpg.connect(url, server_settings={
        "application_name": "bench-pinned"}) for _ in range(consumers)]
    for conn in (producer_conn, *consumer_conns):
        if nice:
            meters.renice(int(await conn.fetchval("select pg_backend_pid()")), nice)

    async def produce() -> None:
        queries = Queries(AsyncpgDriver(producer_conn))
        next_at = time.monotonic()
        while next_at < until:
            ns = range(flow.produced, flow.produced + per_tick)
            await queries.enqueue(["noop"] * per_tick,
                                  [json.dumps(payload(n, 0, 0)).encode() for n in ns],
                                  [0] * per_tick)
            flow.produced += per_tick
            next_at += TICK
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                flow.late_ticks += 1
                next_at = time.monotonic()

    async def consume(consumer_conn: asyncpg.Connection) -> None:
        queries = Queries(AsyncpgDriver(consumer_conn))
        entrypoints = {"noop": EntrypointExecutionParameter(concurrency_limit=0)}
        manager = uuid.uuid4()
        while time.monotonic() < until:
            t0 = time.perf_counter()
            jobs = await queries.dequeue(
                batch_size=BATCH, entrypoints=entrypoints, queue_manager_id=manager,
                global_concurrency_limit=None, heartbeat_timeout=timedelta(seconds=30))
            elapsed = (time.perf_counter() - t0) * 1000
            if jobs:
                flow.claims_ms.append(elapsed)
                await queries.log_jobs([(job, "successful", None) for job in jobs])
                flow.finished += len(jobs)
            else:
                flow.empty_claims_ms.append(elapsed)
                await asyncio.sleep(IDLE_SLEEP)

    try:
        await asyncio.gather(produce(), *(consume(conn) for conn in consumer_conns))
    finally:
        await producer_conn.close()
        for conn in consumer_conns:
            await conn.close()
    return flow


# The run -----------------------------------------------------------------------------


def _end_state(dsn: str, system: str) -> dict[str, Any]:
    tables = TABLES[system]
    stats = tablestats.snapshot(dsn, tables)
    sizes: dict[str, int] = {}
    with connect(dsn) as conn:
        for t in tables:
            row = conn.execute("select pg_total_relation_size(%s::regclass) as b",
                               (t,)).fetchone()
            sizes[t] = int(row["b"]) if row else 0
    return {t: {**stats.get(t, {}), "total_bytes": sizes[t]}
            for t in tables if t in stats or t in sizes}


EXPLAIN_SETTINGS = (("log_min_duration", "0"), ("log_nested_statements", "on"),
                    ("log_level", "notice"), ("log_format", "json"), ("log_analyze", "on"),
                    ("log_buffers", "on"), ("log_timing", "on"))


def _explain_claims(dsn: str, tenants: int) -> list[dict[str, Any]]:
    """The scans of three leaseq claims (each of a fresh job per tenant and more), the
    most buffers first: which index a claim walked and how much of it, with the dead
    rows the mode left in place. auto_explain sees the statements inside the SQL
    functions, which an EXPLAIN of the call would not."""
    from leaseq.store.queries import CLAIM_READY_JOBS

    ids = tenant_ids(tenants)
    scans: list[dict[str, Any]] = []
    with connect(dsn) as conn:
        conn.execute(
            "select count(*) from app.enqueue_jobs(%s::uuid[], %s::text[], %s::text[],"
            " %s::jsonb[])",
            ([ids[n % tenants] for n in range(50)], [f"explain-{n}" for n in range(50)],
             ["noop"] * 50, [json.dumps(payload(n, n % tenants, 0)) for n in range(50)]))
        conn.execute("load 'auto_explain'")
        for name, value in EXPLAIN_SETTINGS:
            conn.execute("select set_config(%s, %s, false)", (f"auto_explain.{name}", value))
        messages: list[str] = []
        conn.add_notice_handler(lambda d: messages.append(d.message_primary or ""))
        claim = {"owner": "bench-explain", "limit": BATCH, "lease": timedelta(seconds=30),
                 "kinds": None, "exclude_kinds": None, "queue": None}
        for _ in range(3):
            conn.execute(CLAIM_READY_JOBS, claim).fetchall()

    def walk(node: dict[str, Any], query: str) -> None:
        if "Scan" in node["Node Type"] and node.get("Relation Name"):
            scans.append({
                "query": " ".join(query.split())[:80], "node": node["Node Type"],
                "relation": node["Relation Name"], "index": node.get("Index Name"),
                "buffers": node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0),
                "ms": round(node.get("Actual Total Time", 0) * node.get("Actual Loops", 1), 3),
                "rows": node.get("Actual Rows"), "loops": node.get("Actual Loops")})
        for child in node.get("Plans", []):
            walk(child, query)

    for message in messages:
        if "plan:" in message:
            plan = json.loads(message.split("plan:", 1)[1])
            walk(plan["Plan"], plan["Query Text"])
    return sorted(scans, key=lambda s: -s["buffers"])[:8]


def run_mode(server: Server, system: str, pinned: bool, args: argparse.Namespace) -> dict[str, Any]:
    dbname = run_database(f"{system}_bench_pinned_{'on' if pinned else 'off'}")
    with server.database(dbname, keep=args.keep_databases) as dsn:
        if system == "leaseq":
            leaseq_install(dsn)
        else:
            SYSTEMS["pgqueuer"].install(dsn)
        holder: Conn | None = None
        xmin = None
        if pinned:
            holder = connect(dsn)
            holder.execute("begin isolation level repeatable read")
            holder.execute(HOLD_QUERY[system])
            row = holder.execute("select backend_xmin::text as x from pg_stat_activity"
                                 " where pid = pg_backend_pid()").fetchone()
            xmin = row["x"] if row else None
        t0 = time.monotonic()
        try:
            vacuums = _Vacuumer(dsn, TABLES[system], args.vacuum_every)
            vacuums.start()
            try:
                if system == "leaseq":
                    flow = _leaseq_flow(dsn, args.seconds, args.rate, args.tenants, args.nice,
                                        args.consumers)
                else:
                    flow = asyncio.run(_pgqueuer_flow_async(dsn, args.seconds, args.rate,
                                                            args.nice, args.consumers))
            finally:
                vacuums.stop()
            elapsed = time.monotonic() - t0
            explained = (_explain_claims(dsn, args.tenants)
                         if args.explain and system == "leaseq" else None)
        finally:
            if holder is not None:
                holder.execute("rollback")
                holder.close()
        out = {"system": system, "pinned": pinned, "held_xmin": xmin,
               "vacuums": vacuums.count, "vacuum_seconds": vacuums.seconds,
               **flow.summary(elapsed), "tables": _end_state(dsn, system)}
        if explained is not None:
            out["explain"] = explained
    claims = out["claims"]
    print(f"  {system:<9} {'pinned' if pinned else 'not pinned':<11} "
          f"{out['finished']:>7,} jobs ({out['jobs_per_s']:,.0f}/s)  claim p50 "
          f"{claims['median_ms'] or 0:.2f} ms, p99 {claims['p99_ms'] or 0:.2f} ms", flush=True)
    return out


def render(result: dict[str, Any]) -> str:
    setup = result["setup"]
    lines = [f"Pinned MVCC horizon: {setup['rate']} jobs/s for {setup['seconds']:g} s per mode, "
             f"claims of {BATCH} by {setup['consumers']} consumers, VACUUM every "
             f"{setup['vacuum_every']:g} s (0: never); "
             f"{setup['server']['version'].split(' on ')[0]}, server autovacuum "
             f"{setup['server'].get('autovacuum', '?')}", "",
             "| System | horizon | jobs finished | claim p50 ms | claim p99 ms "
             "| p99 ÷ not pinned | all claims p50 / p99 ms | table | dead tuples | MB |",
             "|---|---|--:|--:|--:|--:|--:|---|--:|--:|"]
    base: dict[str, float] = {}
    for r in result["modes"]:
        c, a = r["claims"], r["all_claims"]
        if not r["pinned"] and c["p99_ms"]:
            base[r["system"]] = c["p99_ms"]
        ratio = (c["p99_ms"] / base[r["system"]]
                 if r["pinned"] and c["p99_ms"] and r["system"] in base else None)
        for i, (table, t) in enumerate(r["tables"].items()):
            head = (f"| {r['system']} | {'pinned' if r['pinned'] else 'not pinned'} "
                    f"| {r['finished']:,} | {_ms(c['median_ms'])} | {_ms(c['p99_ms'])} "
                    f"| {'–' if ratio is None else f'{ratio:.2f}×'} "
                    f"| {_ms(a['median_ms'])} / {_ms(a['p99_ms'])} ") if i == 0 else (
                    "| | | | | | | ")
            lines.append(f"{head}| {table} | {t.get('n_dead_tup', 0):,} "
                         f"| {t['total_bytes'] / 1e6:,.1f} |")
    for r in result["modes"]:
        if r.get("explain"):
            lines += ["", f"Scans of three claims at the end, {r['system']} "
                      f"{'pinned' if r['pinned'] else 'not pinned'}, most buffers first:", "",
                      "| relation | index | node | buffers | ms | rows | loops | statement |",
                      "|---|---|---|--:|--:|--:|--:|---|"]
            lines += [f"| {s['relation']} | {s['index'] or '–'} | {s['node']} | {s['buffers']:,}"
                      f" | {s['ms']:.2f} | {s['rows']} | {s['loops']} | `{s['query']}` |"
                      for s in r["explain"]]
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    # A terminated run still ends its sessions and drops its databases.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    revision = source.revision()
    source.freeze()
    if args.nice:
        meters.renice(os.getpid(), args.nice)
    migrations = pin_migrations()
    server = Server(args.dsn)
    setup = {"seconds": args.seconds, "rate": args.rate, "tenants": args.tenants,
             "consumers": args.consumers, "vacuum_every": args.vacuum_every,
             "batch": BATCH, "server": server.facts(), "source": revision,
             "leaseq_migrations": migrations, "nice": args.nice}
    print(f"{args.rate} jobs/s, {args.seconds:g} s per mode; systems {args.systems}",
          flush=True)
    modes = []
    for system in args.systems.split(","):
        for pinned in (False, True):
            modes.append(run_mode(server, system, pinned, args))
    result = {"started": datetime.now(UTC).isoformat(timespec="seconds"), "setup": setup,
              "modes": modes}
    out = args.out or BENCH_DIR / "results" / (
        "pinned-" + datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + ".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
    print()
    print(render(result))
    print(f"\nresults: {out}")
    return 0
