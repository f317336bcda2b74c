"""``python3 bench/run.py --self-check``: do the meters measure what they claim?

Known work, known answers, on the target server, in a scratch database: the relay
counts one round trip per autocommit statement and three for BEGIN / statement /
COMMIT; the WAL attribution charges rows inserted into a table to that table and not
to other databases; the server CPU meter sees a backend burning CPU. Not a timing test:
nothing here depends on how fast the machine is.
"""

from __future__ import annotations

import psycopg

from harness import meters
from harness.pg import Server, connect, run_database
from harness.wire import RoundTripRelay


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
    return 0 if all(results) else 1
