"""``bench/run.py claim-latency``: only the claim-latency comparison of the full run.

The same measurement the full run makes after its drains (harness.secondary): claim
latency with a long history and a ready backlog against a database with only the ready
jobs, for leaseq and for PgQueuer, the two databases of each sampled in alternation.
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness import meters, report, secondary, source
from harness.pg import Server
from harness.systems import pin_migrations

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
BENCH_DIR = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python3 bench/run.py claim-latency",
        description="Claim latency (batch 10, one worker) with a long history of finished "
                    "jobs and a ready backlog vs only the ready jobs, leaseq and PgQueuer.")
    p.add_argument("--dsn", default=DEFAULT_DSN, help="superuser DSN (default: %(default)s)")
    p.add_argument("--finished", type=int, default=1_000_000,
                   help="finished jobs in the tables (default %(default)s)")
    p.add_argument("--ready-backlog", type=int, default=100_000,
                   help="ready jobs beside them (default %(default)s)")
    p.add_argument("--tenants", type=int, default=10, help="leaseq tenants (%(default)s)")
    p.add_argument("--samples", type=int, default=300,
                   help="timed claims per database, after 30 warm-up ones (%(default)s)")
    p.add_argument("--systems", default="leaseq,pgqueuer",
                   help="comma-separated subset of %(default)s")
    p.add_argument("--nice", type=int, default=-10,
                   help="scheduling priority of this process and its sessions (needs root; "
                        "0 leaves priorities alone; default %(default)s)")
    p.add_argument("--keep-databases", action="store_true")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON results file (default bench/results/claim-latency-<time>.json)")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    revision = source.revision()
    source.freeze()
    if args.nice:
        meters.renice(os.getpid(), args.nice)
    migrations = pin_migrations()
    server = Server(args.dsn)
    systems = args.systems.split(",")
    result: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "setup": {"server": server.facts(), "source": revision,
                  "leaseq_migrations": migrations}}
    if "leaseq" in systems:
        result["claim_latency"] = secondary.claim_latency(
            server, finished=args.finished, tenants=args.tenants,
            ready_backlog=args.ready_backlog, samples=args.samples,
            keep=args.keep_databases, nice=args.nice)
    if "pgqueuer" in systems:
        result["pgqueuer_claim_latency"] = secondary.pgqueuer_claim_latency(
            server, finished=args.finished, ready_backlog=args.ready_backlog,
            samples=args.samples, keep=args.keep_databases, nice=args.nice)
    out = args.out or BENCH_DIR / "results" / (
        "claim-latency-" + datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + ".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
    print("\n".join(report.latency_lines(result)))
    print(f"\nresults: {out}")
    return 0
