"""``python3 bench/run.py --self-check``: do the meters measure what they claim?

Known work, known answers, on the target server, in a scratch database: the relay
counts one round trip per autocommit statement and three for BEGIN / statement /
COMMIT; the WAL attribution charges rows inserted into a table to that table and not
to other databases; the server CPU meter sees a backend burning CPU. For the elastic
benchmark: job records survive the round trip through their files, the concurrency
sweep and the percentiles give the answers worked out by hand, the arrivals are a
Poisson process of the asked rate, and the connection sampler counts named connections
to its database and leaves the benchmark's own out. Not a timing test: nothing here
depends on how fast the machine is.
"""

from __future__ import annotations

import itertools
import statistics
import tempfile
import time
from pathlib import Path

import psycopg

from harness import meters, records
from harness.elastic_stack import ConnectionSampler
from harness.pg import Server, connect, run_database
from harness.wire import RoundTripRelay
from harness.workers.elastic_producer import arrivals


def _check(name: str, ok: bool, detail: str) -> bool:
    print(f"  {'ok  ' if ok else 'FAIL'} {name}: {detail}")
    return ok


def run(server: Server) -> int:
    results = []
    with server.database(run_database("leaseq_bench_selfcheck")) as dsn:
        with RoundTripRelay(dsn) as relay, psycopg.connect(
            relay.dsn_for(dsn), autocommit=True
        ) as conn:
            before = relay.round_trips
            for _ in range(5):
                conn.execute("select 1").fetchall()
            single = relay.round_trips - before
            # psycopg's first transaction block on a connection asks one more question.
            with conn.transaction():
                conn.execute("select 1").fetchall()
            before = relay.round_trips
            with conn.transaction():
                conn.execute("select 1").fetchall()
            tx = relay.round_trips - before
        results.append(_check("relay, 5 autocommit statements", single == 5, f"{single} trips"))
        results.append(_check("relay, BEGIN + statement + COMMIT", tx == 3, f"{tx} trips"))

        walinspect = meters.enable_walinspect(dsn)
        with connect(dsn) as conn:
            conn.execute("create table probe (id bigint primary key, pad text)")
            start = meters.wal_mark(conn)
            conn.execute("insert into probe"
                         " select g, repeat('x', 100) from generate_series(1, 5000) g")
            end = meters.wal_mark(conn)
            wal = meters.wal_between(conn, start, end)
            if walinspect:
                breakdown = meters.wal_breakdown(conn, start, end)
                heap = breakdown["by_relation"].get("probe", 0)
                index = breakdown["by_relation"].get("probe_pkey", 0)
                results.append(_check(
                    "WAL of 5,000 inserted rows is charged to their table and index",
                    heap > 5000 * 100 and index > 0 and breakdown["own_bytes"] <= wal.lsn_bytes,
                    f"table {heap} B, index {index} B, own {breakdown['own_bytes']} B, "
                    f"LSN distance {wal.lsn_bytes} B"))
            else:
                results.append(_check("pg_walinspect", False, "extension not available"))

            pm = meters.postmaster_pid(conn)
            if meters.ServerCpuMeter.available(pm):
                assert pm is not None
                meter = meters.ServerCpuMeter(pm, run_database("leaseq_bench_selfcheck"))
                meter.start()
                conn.execute("select count(*) from generate_series(1, 3000000)").fetchall()
                cpu = meter.stop()
                results.append(_check("server CPU meter sees a busy backend",
                                      cpu.attributed_s > 0.05, f"{cpu.attributed_s:.2f} s"))
            else:
                results.append(_check("server CPU meter", False, "server not on this machine"))
        results.extend(_elastic_checks(server, dsn))
    return 0 if all(results) else 1


def _elastic_checks(server: Server, dsn: str) -> list[bool]:
    results = []
    with tempfile.TemporaryDirectory() as directory:
        writer = records.RecordWriter(directory)
        writer.write(1, 10.0, 10.5, 10.6)
        writer.write(2, 10.0, 10.55, 10.7)
        read = records.read_records(Path(directory))
    results.append(_check("records survive their file", [r.n for r in read] == [1, 2]
                          and abs(read[1].started - 10.55) < 1e-6, f"{read}"))
    # Three jobs: [0, 2), [1, 3), [2, 4): two at once from 1 s on; the third starts at the
    # instant the first ends, so three never run at once.
    jobs = [records.Record(i, 0.0, float(i), float(i + 2), 1) for i in range(3)]
    full, peak, peak_at = records.concurrency_reached(jobs, 2)
    never, _, _ = records.concurrency_reached(jobs, 3)
    results.append(_check("concurrency sweep", full == 1.0 and peak == 2 and peak_at == 1.0
                          and never is None, f"2 at once from {full}, peak {peak} at "
                          f"{peak_at}, 3 at once: {never}"))
    at = records.concurrency_at(jobs, [0.5, 1.5, 2.5, 3.5, 4.5])
    results.append(_check("concurrency at moments", at == [1, 2, 2, 1, 0], f"{at}"))
    waits = [records.Record(i, 0.0, i / 100, 1.0, 1) for i in range(101)]
    summary = records.latency_summary(waits)
    results.append(_check(
        "latency percentiles of 0.00..1.00 s", abs(summary["p50"] - 0.5) < 1e-9
        and abs(summary["p99"] - 0.99) < 1e-9 and summary["max"] == 1.0,
        f"p50 {summary['p50']:.3f}, p99 {summary['p99']:.3f}, max {summary['max']}"))
    twice = records.duplicates([*jobs, jobs[1]])
    results.append(_check("a job that ran twice is seen", twice == [1], f"{twice}"))
    times = arrivals(200, 60, 13)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    cv = statistics.pstdev(gaps) / statistics.mean(gaps)
    results.append(_check(
        "Poisson arrivals at 200/s for 60 s", 11_400 < len(times) < 12_600 and 0.9 < cv < 1.1
        and times == arrivals(200, 60, 13), f"{len(times)} jobs, gap CV {cv:.2f}, seeded"))

    sampler = ConnectionSampler(server.admin_dsn, run_database("leaseq_bench_selfcheck"),
                                interval=0.05).start()
    with psycopg.connect(dsn, application_name="leaseq WorkerFunction"), \
            psycopg.connect(dsn, application_name="leaseq WorkerFunction"), \
            psycopg.connect(dsn, application_name="leaseq-bench-probe"):
        time.sleep(0.5)
    sampled = sampler.stop()
    results.append(_check(
        "connection sampler: 2 named, the benchmark's own left out",
        sampled["peak"] == 2 and sampled["peak_by_application"].get(
            "leaseq WorkerFunction") == 2, f"{sampled['peak']} {sampled['peak_by_application']}"))
    return results
