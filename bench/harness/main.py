"""The benchmark run: every system, every run, then the secondary measurements."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness import machine, meters, report, secondary, source, tablestats
from harness.ceiling import REFERENCE_SCRIPT, SCRIPT, run_ceiling
from harness.drain import DrainResult, measured, run_drain
from harness.pg import Server, analyze, connect, find_pgbench, run_database
from harness.systems import (
    LEASEQ_TABLES,
    SYSTEMS,
    WAITING_SYSTEMS,
    System,
    Work,
    leaseq_enqueue,
    leaseq_finished,
    leaseq_install,
    pin_migrations,
    reference_enqueue,
    reference_install,
)
from harness.wire import RoundTripRelay

BENCH_DIR = Path(__file__).resolve().parent.parent
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


#: The pgbench lines: bench/ceiling.sql on leaseq's schema, and on the reference schema.
CEILINGS = ("ceiling", "ceiling-reference")


@dataclass(frozen=True)
class Cell:
    """One line of the table: a system at a concurrency."""

    key: str
    concurrency: int

    @property
    def name(self) -> str:
        return f"{self.key}@c{self.concurrency}"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python3 bench/run.py",
        description="Drain N no-op jobs with leaseq, PgQueuer and procrastinate, and run "
                    "the set-based SQL ceiling with pgbench, on one PostgreSQL server.")
    p.add_argument("--dsn", default=DEFAULT_DSN,
                   help="superuser DSN of the server (default: %(default)s); the benchmark "
                        "creates and drops its own databases there")
    p.add_argument("--jobs", type=int, default=20_000, help="jobs per drain (%(default)s)")
    p.add_argument("--tenants", type=int, default=10, help="tenants (%(default)s)")
    p.add_argument("--payload-bytes", type=int, default=0, metavar="N",
                   help="pad every job's payload to about N bytes of JSON (default: a few "
                        "bytes); large payloads show what a system reads per job")
    p.add_argument("--runs", type=int, default=3, help="timed runs per line (%(default)s)")
    p.add_argument("--systems",
                   default="leaseq,leaseq-sql,pgqueuer,procrastinate,ceiling,ceiling-reference",
                   help="comma-separated subset of the default: %(default)s")
    p.add_argument("--leaseq-concurrency", default="1,4", help="(default %(default)s)")
    p.add_argument("--peer-concurrency", default="4",
                   help="concurrency of the peers and the ceiling (default %(default)s)")
    p.add_argument("--rt-jobs", type=int, default=5_000,
                   help="jobs in the untimed round-trip pass, through a counting relay "
                        "(default %(default)s; 0 skips it)")
    p.add_argument("--finished", type=int, default=1_000_000,
                   help="finished jobs in the table for the claim-latency test "
                        "(default %(default)s; 0 skips it)")
    p.add_argument("--ready-backlog", type=int, default=100_000,
                   help="ready jobs in the tables beside the finished ones in the "
                        "claim-latency test, leaseq and PgQueuer alike (default "
                        "%(default)s; the empty database holds only the ready jobs the "
                        "samples take)")
    p.add_argument("--rss-jobs", type=int, default=None,
                   help="the smaller drain for the peak-memory comparison (default jobs/10)")
    p.add_argument("--no-secondary", action="store_true",
                   help="skip claim latency, import time and peak memory")
    p.add_argument("--settle", type=float, default=10.0,
                   help="before each timed drain, wait up to this many seconds for the "
                        "machine to be quiet (< 0.3 cores busy); default %(default)s")
    p.add_argument("--quiet-retries", type=int, default=0, metavar="N",
                   help="repeat a drain up to N times while the rest of the machine used "
                        "more than --max-other-load cores during it, and keep the quietest "
                        "attempt (default %(default)s: keep every first attempt)")
    p.add_argument("--max-other-load", type=float, default=0.25, metavar="CORES",
                   help="see --quiet-retries (default %(default)s)")
    p.add_argument("--nice", type=int, default=-10,
                   help="scheduling priority given to the workers and to the server "
                        "backends serving the benchmark's database, so that other load on "
                        "a shared machine disturbs the figures less (needs root; 0 leaves "
                        "priorities alone; default %(default)s)")
    p.add_argument("--sql-upto", type=int, default=None, metavar="VERSION",
                   help="apply leaseq's migrations only up to this version (to compare a "
                        "schema change with what came before it; default: all)")
    p.add_argument("--handler-ms", type=float, default=None, metavar="MS",
                   help="instead of a no-op, every job's handler is an async def that waits "
                        "MS milliseconds (0: awaits nothing), --handler-concurrency of them "
                        "at once per worker process; leaseq and PgQueuer only")
    p.add_argument("--handler-concurrency", type=int, default=50, metavar="N",
                   help="jobs at once per worker process with --handler-ms: leaseq's "
                        "concurrency, PgQueuer's concurrency_limit (default %(default)s)")
    p.add_argument("--keep-databases", action="store_true")
    p.add_argument("--self-check", action="store_true",
                   help="check the meters against known work on the server, then exit")
    p.add_argument("--report", type=Path, default=None, metavar="JSON",
                   help="print the tables of a saved results file and exit")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON results file (default bench/results/<time>.json)")
    return p.parse_args(argv)


def plan(args: argparse.Namespace) -> list[Cell]:
    wanted = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in SYSTEMS and s not in CEILINGS]
    if unknown:
        raise SystemExit(f"unknown systems {unknown}; choose from {[*SYSTEMS, *CEILINGS]}")
    if args.handler_ms is not None and set(wanted) - set(WAITING_SYSTEMS):
        raise SystemExit(f"--handler-ms runs {', '.join(WAITING_SYSTEMS)} only; "
                         f"pass --systems {','.join(WAITING_SYSTEMS)}")
    leaseq_c = [int(c) for c in args.leaseq_concurrency.split(",")]
    peer_c = [int(c) for c in args.peer_concurrency.split(",")]
    cells = []
    for key in wanted:
        for c in (leaseq_c if key.startswith("leaseq") else peer_c):
            cells.append(Cell(key, c))
    return cells


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.server = Server(args.dsn)
        self.pgbench = find_pgbench()
        with connect(args.dsn) as conn:
            pm = meters.postmaster_pid(conn)
        self.postmaster = pm if meters.ServerCpuMeter.available(pm) else None
        self.walinspect = self.server.has_extension("pg_walinspect")

    def _cpu_meter(self, dbname: str) -> meters.ServerCpuMeter | None:
        if self.postmaster is None:
            return None
        return meters.ServerCpuMeter(self.postmaster, dbname, nice=self.args.nice)

    def _measured_enqueue(self, dsn: str, dbname: str, jobs: int, system: System | None,
                          on_reference: bool, walinspect: bool) -> dict[str, Any]:
        """Enqueue ``jobs`` through the system's own batch API, reading the server CPU
        and the WAL it cost (what a producer's writes take from the database)."""
        with connect(dsn) as probe, measured(probe, cpu_meter=self._cpu_meter(dbname),
                                             walinspect=walinspect) as window:
            if system is None:
                enqueue = reference_enqueue if on_reference else leaseq_enqueue
                enqueue(dsn, jobs, self.args.tenants, self.args.payload_bytes)
            else:
                system.enqueue(dsn, jobs, self.args.tenants, self.args.payload_bytes)
            # The enqueue's session has closed; its exit is charged once it is gone.
            tablestats.wait_for_sessions_to_end(probe)
        wal = window.wal
        breakdown = wal.breakdown if wal is not None else {}
        return {
            "jobs": jobs, "seconds": window.seconds,
            "server_cpu_s": window.cpu.attributed_s if window.cpu is not None else None,
            "wal_own_bytes": breakdown.get("own_bytes"),
            "wal_lsn_bytes": wal.lsn_bytes if wal is not None else None,
            "index_entries": tablestats.index_entries(breakdown, jobs)
            if "by_record" in breakdown else None,
        }

    def run_cell(self, cell: Cell, jobs: int, *, relay: RoundTripRelay | None = None,
                 tag: str = "", settle: float = 0.0) -> DrainResult:
        dbname = run_database(
            f"leaseq_bench_{cell.key.replace('-', '_')}_c{cell.concurrency}{tag}")
        is_ceiling = cell.key in CEILINGS
        on_reference = cell.key == "ceiling-reference"
        system = None if is_ceiling else SYSTEMS[cell.key]
        with self.server.database(dbname, keep=self.args.keep_databases) as dsn:
            if on_reference:
                reference_install(dsn)
            elif system is None:
                leaseq_install(dsn)
            else:
                system.install(dsn)
            walinspect = self.walinspect and meters.enable_walinspect(dsn)
            # Restart the checkpoint cycle before the enqueue, so the drain that follows
            # within seconds pays the full-page images a steady queue would (few).
            self.server.checkpoint()
            tables = (["app.jobs", "app.job_events"] if on_reference
                      else list(LEASEQ_TABLES) if system is None else list(system.tables))
            enqueued = self._measured_enqueue(dsn, dbname, jobs, system, on_reference,
                                              walinspect)
            analyze(dsn, tables)
            before = tablestats.snapshot(dsn, tables)
            settled = machine.wait_until_quiet(settle) if settle > 0 else None
            if is_ceiling:
                if self.pgbench is None:
                    raise RuntimeError("pgbench not found (on PATH or /usr/lib/postgresql)")
                result = run_ceiling(
                    self.pgbench, dsn, jobs, cell.concurrency,
                    cpu_meter=self._cpu_meter(dbname), walinspect=walinspect,
                    relay=(lambda: relay.round_trips) if relay else None,
                    relay_dsn=relay.dsn_for(dsn) if relay else None, nice=self.args.nice,
                    script=REFERENCE_SCRIPT if on_reference else SCRIPT)
                after = tablestats.snapshot(dsn, tables)
                finished = result.jobs if on_reference else leaseq_finished(dsn)
            else:
                assert system is not None
                worker_dsn = relay.dsn_for(dsn) if relay else dsn
                work = None if self.args.handler_ms is None else Work(
                    self.args.handler_ms, self.args.handler_concurrency)
                result = run_drain(
                    system.commands(worker_dsn, cell.concurrency, work), dsn,
                    cpu_meter=self._cpu_meter(dbname), walinspect=walinspect,
                    relay_count=(lambda: relay.round_trips) if relay else None,
                    nice=self.args.nice)
                after = tablestats.snapshot(dsn, tables)
                finished = system.finished(dsn)
            result.tables = tablestats.delta(before, after)
            result.enqueue = enqueued
            if finished != jobs:
                raise RuntimeError(f"{cell.name}: {finished} of {jobs} jobs finished")
        if settled is not None:
            result.settle = {"waited_s": settled[0], "load_before": settled[1]}
        return result


def main(argv: list[str]) -> int:
    if argv[:1] == ["cold-start"]:
        from harness import cold_start

        return cold_start.main(argv[1:])
    if argv[:1] == ["retention"]:
        from harness import retention

        return retention.main(argv[1:])
    if argv[:1] == ["claim-latency"]:
        from harness import latency

        return latency.main(argv[1:])
    if argv[:1] == ["pinned"]:
        from harness import pinned

        return pinned.main(argv[1:])
    if argv[:1] == ["elastic"]:
        from harness import elastic

        return elastic.main(argv[1:])
    args = parse_args(argv)
    if args.report is not None:
        saved = json.loads(args.report.read_text(encoding="utf-8"))
        saved["summary"] = report.summarise(saved)
        print(report.render(saved))
        return 0
    if args.self_check:
        from harness import selfcheck

        return selfcheck.run(Server(args.dsn))
    cells = plan(args)
    # A terminated run still stops its workers, drops its databases and its code copy.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    revision = source.revision()
    source.freeze()
    if args.nice:
        # Inherited by every worker, pgbench and import-time interpreter started below.
        meters.renice(os.getpid(), args.nice)
    bench = Bench(args)
    migrations = pin_migrations(args.sql_upto)
    started = time.time()
    facts = bench.server.facts()
    print(f"server: {facts['version']}")
    work = "" if args.handler_ms is None else (
        f" (handler waits {args.handler_ms:g} ms, {args.handler_concurrency} at once)")
    print(f"{args.jobs} jobs{work}, {args.tenants} tenants, batch 10, {args.runs} runs; "
          f"cells: {', '.join(c.name for c in cells)}", flush=True)

    out = args.out or BENCH_DIR / "results" / (
        datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + ".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    setup = {
        "jobs": args.jobs, "tenants": args.tenants, "runs": args.runs, "batch": 10,
        "payload_bytes": args.payload_bytes,
        "handler_ms": args.handler_ms,
        "handler_concurrency": args.handler_concurrency if args.handler_ms is not None else None,
        "cells": [c.name for c in cells], "rt_jobs": args.rt_jobs,
        "server": facts, "pgbench": bench.pgbench is not None,
        "server_cpu_meter": bench.postmaster is not None,
        "pg_walinspect": bench.walinspect,
        "nice": args.nice,
        "quiet_retries": args.quiet_retries,
        "max_other_load": args.max_other_load,
        "leaseq_migrations": migrations,
        "source": revision,
    }
    runs: dict[str, list[dict[str, Any]]] = {c.name: [] for c in cells}

    def save(partial: bool, **extra: Any) -> dict[str, Any]:
        """Write what is known so far, so an interrupted run still leaves its data."""
        results = {
            "started": datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds"),
            "duration_s": time.time() - started,
            "partial": partial,
            "setup": setup,
            "runs": runs,
            **extra,
        }
        out.write_text(json.dumps(results, indent=2, default=str), encoding="utf-8")
        return results

    # Runs are interleaved (every cell once, then again) so that a slow spell on a
    # shared machine spreads over all systems instead of sinking one of them.
    for run in range(args.runs):
        for cell in cells:
            attempts: list[tuple[float, DrainResult]] = []
            for _ in range(1 + max(args.quiet_retries, 0)):
                attempt = bench.run_cell(cell, args.jobs, settle=args.settle)
                load = (attempt.host.other_cpu_s / attempt.seconds
                        if attempt.host and attempt.seconds else 0.0)
                attempts.append((load, attempt))
                print(f"  run {run + 1} {cell.name:<22} {attempt.jobs_per_s:>8.0f} jobs/s"
                      f"  ({attempt.seconds:.2f} s; other load {load:.2f} cores)", flush=True)
                if load <= args.max_other_load:
                    break
            _, result = min(attempts, key=lambda a: a[0])
            entry = result.as_dict()
            # Every attempt's rate and load; the figures above are the quietest one's.
            entry["attempts"] = [{"other_load": load, "jobs_per_s": a.jobs_per_s}
                                 for load, a in attempts]
            runs[cell.name].append(entry)
            save(partial=True)

    round_trips: dict[str, Any] = {}
    if args.rt_jobs:
        with RoundTripRelay(args.dsn) as relay:
            for cell in cells:
                if cell.concurrency != max(c.concurrency for c in cells if c.key == cell.key):
                    continue
                result = bench.run_cell(cell, args.rt_jobs, relay=relay, tag="_rt")
                round_trips[cell.name] = {
                    "jobs": result.jobs, "round_trips": result.round_trips,
                    "per_job": (result.round_trips or 0) / result.jobs,
                }
                print(f"  round trips {cell.name:<16} "
                      f"{round_trips[cell.name]['per_job']:.3f} per job", flush=True)

    extra: dict[str, Any] = {}
    if not args.no_secondary:
        leaseq_c1 = Cell("leaseq", 1)
        if leaseq_c1.name in runs:
            small = args.rss_jobs or max(args.jobs // 10, 100)
            result = bench.run_cell(leaseq_c1, small, tag="_rss")
            extra["peak_rss"] = {
                "small_jobs": small, "small_kib": result.peak_rss_kib[0],
                "large_jobs": args.jobs,
                "large_kib": sorted(r["peak_rss_kib"][0] for r in runs[leaseq_c1.name])[
                    len(runs[leaseq_c1.name]) // 2],
            }
            print(f"  peak RSS {extra['peak_rss']}", flush=True)
        if args.finished:
            extra["claim_latency"] = secondary.claim_latency(
                bench.server, finished=args.finished, tenants=args.tenants,
                ready_backlog=args.ready_backlog, keep=args.keep_databases, nice=args.nice)
            print(f"  claim latency ratio {extra['claim_latency']['ratio']:.2f}", flush=True)
            if "pgqueuer" in args.systems.split(","):
                extra["pgqueuer_claim_latency"] = secondary.pgqueuer_claim_latency(
                    bench.server, finished=args.finished, ready_backlog=args.ready_backlog,
                    keep=args.keep_databases, nice=args.nice)
                print(f"  PgQueuer claim latency ratio "
                      f"{extra['pgqueuer_claim_latency']['ratio']:.2f}", flush=True)
        extra["import_time"] = secondary.import_time()
        print(f"  import time {extra['import_time'].get('median_ms', 'n/a')}", flush=True)

    results = save(partial=False, round_trips=round_trips, **extra)
    results["summary"] = report.summarise(results)
    out.write_text(json.dumps(results, indent=2, default=str), encoding="utf-8")
    print()
    print(report.render(results))
    print(f"\nresults: {out}")
    return 0
