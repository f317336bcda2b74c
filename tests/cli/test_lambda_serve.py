"""``leaseq lambda serve`` as a terminal runs it: on the embedded PostgreSQL, printing the
endpoint to export, serving boto3, and stopping every environment on Ctrl-C."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import urllib.request
from pathlib import Path
from typing import IO, Any

import boto3
from botocore.config import Config

from tests.cli.conftest import LEASEQ, REPO, clean_environment

EXPORT = "export AWS_ENDPOINT_URL_LAMBDA="


def _lines(stream: IO[str], into: queue.Queue[str]) -> None:
    for line in stream:
        into.put(line)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_lambda_serve_runs_the_functions_on_the_embedded_database_and_stops_on_ctrl_c(
    embedded_home: Path,
) -> None:
    process = subprocess.Popen(
        [str(LEASEQ), "lambda", "serve", "--port", "0", "--no-schedules", "--max-workers", "3"],
        env=clean_environment(LEASEQ_HOME=str(embedded_home)), cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    printed: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_lines, args=(process.stdout, printed), daemon=True).start()
    try:
        seen: list[str] = []
        while not any(line.startswith(EXPORT) for line in seen):
            seen.append(printed.get(timeout=90))
        url = next(line for line in seen if line.startswith(EXPORT))[len(EXPORT):].strip()
        client = boto3.client("lambda", endpoint_url=url, region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing",
                              config=Config(retries={"total_max_attempts": 1}))
        answer = client.invoke(FunctionName="ReaperFunction",
                               Payload=(REPO / "events" / "reaper_schedule.json").read_bytes())
        report: dict[str, Any] = json.loads(answer["Payload"].read())
        with urllib.request.urlopen(f"{url}/local/stats", timeout=10) as response:  # noqa: S310
            stats = json.load(response)
        pids = [e["pid"] for f in stats["functions"].values() for e in f["environments"]]

        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    rest = []
    while not printed.empty():
        rest.append(printed.get())

    assert url.startswith("http://127.0.0.1:")
    assert any("embedded PostgreSQL" in line for line in seen)
    # --max-workers turns the pool on: the worker and the enqueue function get its
    # settings, the worker a reservation of one more for the tick.
    assert any(line.startswith("  WorkerFunction:") and "reserved 4," in line for line in seen)
    assert sum("from --env-vars: LEASEQ_MAX_WORKERS, LEASEQ_WORKER_FUNCTION" in line
               for line in seen) == 2
    assert "FunctionError" not in answer, report
    assert (report["task"], report["status"]) == ("reaper", "ok")
    assert code == 0, process.stderr.read() if process.stderr else ""
    assert "stopped\n" in rest
    assert pids
    assert not [pid for pid in pids if _alive(pid)]
    assert (embedded_home / "lambda.log").read_text().count("START RequestId") >= 1
