#!/usr/bin/env python3
"""What the worker writes to its log per job at each ``LogLevel``, and what it costs.

``python3 bench/log_volume.py [--dsn SUPERUSER_DSN] [--jobs 2000] [--levels INFO,WARNING]``
(in the project's environment: ``source scripts/bootstrap`` first).

For each level, in a fresh database of its own migrated with this checkout's ``sql/``,
``--jobs`` jobs of one tenant (payload ``{"n": <number>}``, the elastic benchmark's
``sleep`` kind with no wait) are drained by one invocation of the real worker function
(``functions/worker/app.py``) in a new process with ``POWERTOOLS_LOG_LEVEL`` set, as a new
execution environment at that ``LogLevel`` would be. Its stdout is what Lambda would send
to CloudWatch Logs; the script counts its log lines and EMF metric documents, their bytes
per job, and the worker process's CPU time per job (``time.process_time`` around the
invocation). Lambda's own platform lines are not included.

CloudWatch Logs bills ingestion per GB, so bytes per job is the cost that grows with the
queue; the CPU figure is why a busy worker drains faster at ``WARNING``
(docs/benchmarks.md, "Elastic drain").
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness.pg import Server, run_database

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


def child(dsn: str, jobs: int, out: Path) -> None:
    """One execution environment: migrate, enqueue, one worker invocation, stdout to out."""
    from leaseq import EnqueueRequest, QueueClient, connect
    from leaseq.store.migrate import migrate
    from leaseq_cli.lambda_context import LocalLambdaContext

    owner = connect(dsn)
    owner.autocommit = True
    migrate(owner)
    owner.close()
    client = QueueClient(lambda: connect(dsn))
    tenant = uuid.uuid4()
    requests = [EnqueueRequest(tenant_id=tenant, operation_key=f"k-{n}", kind="sleep",
                               payload={"n": n}) for n in range(jobs)]
    for start in range(0, jobs, 1000):
        client.enqueue_jobs(requests[start:start + 1000])
    client.close()

    spec = importlib.util.spec_from_file_location("worker_app", ROOT / "functions/worker/app.py")
    assert spec is not None
    assert spec.loader is not None
    app = importlib.util.module_from_spec(spec)
    with out.open("w", encoding="utf-8") as stream:
        saved, sys.stdout = sys.stdout, stream
        try:
            spec.loader.exec_module(app)
            cpu = time.process_time()
            answer = app.lambda_handler({}, LocalLambdaContext(budget_seconds=300))
            cpu = time.process_time() - cpu
        finally:
            sys.stdout = saved
    print(json.dumps({"succeeded": answer.get("succeeded"), "cpu_s": cpu}))


def measure(server: Server, level: str, jobs: int, workdir: Path) -> dict[str, Any]:
    out = workdir / f"{level}.log"
    with server.database(run_database(f"leaseq_bench_log_volume_{level.lower()}")) as dsn:
        env = {**os.environ, "DATABASE_URL": dsn,
               "LEASEQ_HANDLERS": "elastic_handlers", "LEASEQ_BENCH_HANDLER_MS": "0",
               "LEASEQ_WORKER_CONCURRENCY": "50", "LEASEQ_POLL_IDLE_SECONDS": "0",
               "POWERTOOLS_SERVICE_NAME": "leaseq", "POWERTOOLS_METRICS_NAMESPACE": "Leaseq",
               "POWERTOOLS_LOG_LEVEL": level, "POWERTOOLS_TRACE_DISABLED": "true",
               "PYTHONPATH": os.pathsep.join([str(BENCH), os.environ.get("PYTHONPATH", "")])}
        env.pop("AWS_LAMBDA_LOG_LEVEL", None)
        done = subprocess.run([sys.executable, __file__, "--child", env["DATABASE_URL"],
                               str(jobs), str(out)], env=env, check=True,
                              capture_output=True, text=True)
        result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["succeeded"] != jobs:
        raise SystemExit(f"{level}: {result['succeeded']} of {jobs} jobs succeeded")
    lines = out.read_text(encoding="utf-8").splitlines()
    documents = [json.loads(line) for line in lines if line.startswith("{")]
    metric = [len(line) + 1 for line, d in zip(lines, documents, strict=True) if "_aws" in d]
    logged = [len(line) + 1 for line, d in zip(lines, documents, strict=True) if "_aws" not in d]
    return {"level": level, "jobs": jobs,
            "log_lines_per_job": len(logged) / jobs, "log_bytes_per_job": sum(logged) / jobs,
            "metric_documents_per_job": len(metric) / jobs,
            "metric_bytes_per_job": sum(metric) / jobs,
            "bytes_per_job": (sum(logged) + sum(metric)) / jobs,
            "cpu_ms_per_job": result["cpu_s"] * 1000 / jobs,
            "messages": Counter(d.get("message") for d in documents if "_aws" not in d)}


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="superuser DSN of the server; "
                        "each level gets a database of its own there, dropped after")
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--levels", default="INFO,WARNING")
    parser.add_argument("--repeat", type=int, default=3, help="runs per level (median)")
    args = parser.parse_args()
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"leaseq-logvol-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    print("| LogLevel | log lines / job | log bytes / job | metric documents / job "
          "| metric bytes / job | bytes / job | worker CPU ms / job (median of "
          f"{args.repeat}) |\n|---|--:|--:|--:|--:|--:|--:|")
    for level in args.levels.split(","):
        runs = [measure(Server(args.dsn), level, args.jobs, workdir)
                for _ in range(args.repeat)]
        cpu = sorted(r["cpu_ms_per_job"] for r in runs)[len(runs) // 2]
        r = runs[0]
        print(f"| {level} | {r['log_lines_per_job']:.2f} | {r['log_bytes_per_job']:.0f} "
              f"| {r['metric_documents_per_job']:.2f} | {r['metric_bytes_per_job']:.0f} "
              f"| {r['bytes_per_job']:.0f} | {cpu:.3f} |")
        print(f"  lines: {dict(r['messages'].most_common(5))}", file=sys.stderr)


if __name__ == "__main__":
    main()
