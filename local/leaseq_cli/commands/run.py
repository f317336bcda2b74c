"""leaseq drain, reap and demo: the Lambda handlers invoked in this process."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from contextlib import closing
from typing import TextIO

from leaseq import LeaseqError, QueueClient
from leaseq.store.duties import OperatorClient, ProducerClient, WorkerClient
from rich.console import Console

from leaseq_cli import demo, invoke
from leaseq_cli.commands._shared import actor, handlers_env, local_home, target_for
from leaseq_cli.drain import DrainTotals, FinishedCounter, as_report, describe_stop, drain
from leaseq_cli.failures import CliError
from leaseq_cli.render import Ui, table

# drain and reap -------------------------------------------------------------------------


def _render_drain(out: Console, totals: DrainTotals) -> None:
    shown = table("invocations", "claimed", "succeeded", "retries", "dead", "given back",
                  "leases lost", "seconds")
    shown.add_row(str(totals.invocations), str(totals.claimed), f"[green]{totals.succeeded}[/]",
                  f"[yellow]{totals.retried}[/]",
                  f"[red]{totals.dead}[/]" if totals.dead else "0", str(totals.given_back),
                  str(totals.lost_leases), f"{totals.elapsed:.1f}")
    out.print(shown)
    out.print(describe_stop(totals))


def cmd_drain(args: argparse.Namespace, ui: Ui) -> int:
    target = target_for(args, ui)
    home = local_home()
    with invoke.open_log(home, ui.verbose) as log, \
            invoke.environment(handlers_env(args, target)):
        invoke.reset_runtime()
        try:
            worker = invoke.Invoker("worker", log=log)
            reaper = invoke.Invoker("reaper", log=log) if args.reap else None
            with closing(OperatorClient(QueueClient(target.connect_worker))) as client, \
                    closing(FinishedCounter(target.connect_worker)) as counter:
                client.check()
                totals = drain(ui, client, worker, budget=args.budget,
                               max_invocations=args.invocations, wait=args.wait,
                               reaper=reaper, count_finished=counter)
        finally:
            invoke.reset_runtime()
    ui.emit(totals.as_dict(), lambda out: _render_drain(out, totals))
    return 0


def cmd_reap(args: argparse.Namespace, ui: Ui) -> int:
    target = target_for(args, ui)
    with invoke.open_log(local_home(), ui.verbose) as log, \
            invoke.environment(handlers_env(args, target)):
        invoke.reset_runtime()
        try:
            answer = invoke.Invoker("reaper", log=log)(args.budget)
        finally:
            invoke.reset_runtime()
    report = as_report(answer)
    released = int(report.get("released", 0) or 0)
    ui.emit(report, lambda out: out.print(
        f"released {released} expired lease{'s' if released != 1 else ''}"))
    return 0

# demo -----------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace, ui: Ui) -> int:
    if args.fan_out:
        return _demo_fan_out(args, ui)
    if args.queues:
        return _demo_queues(args, ui)
    target = target_for(args, ui)
    home = local_home()
    run_id = demo.new_run_id()
    # The demo plays every duty over one connection: each step is handed its duty's face.
    with closing(QueueClient(target.connect_worker)) as client:
        operator = OperatorClient(client)
        job_ids = demo.enqueue_demo(ProducerClient(client), run_id)
        ui.note(f"enqueued {len(job_ids)} jobs for {len(demo.TENANTS)} tenants "
                f"({target.description})")
        crashed = demo.crash_a_worker(WorkerClient(client))
        if crashed is not None:
            ui.note(f"a worker claimed job {crashed} and crashed: its lease expires in "
                    f"{demo.CRASHED_LEASE.total_seconds():g} s and the reaper takes it back")
        env = {**demo.DEMO_WORKER_ENV, **handlers_env(args, target),
               "LEASEQ_HANDLERS": demo.DEMO_HANDLERS}
        with invoke.open_log(home, ui.verbose) as log, invoke.environment(env):
            invoke.reset_runtime()
            try:
                with closing(FinishedCounter(target.connect_worker)) as counter:
                    totals = drain(ui, operator, invoke.Invoker("worker", log=log),
                                   budget=args.budget, wait=15.0,
                                   reaper=invoke.Invoker("reaper", log=log),
                                   count_finished=counter)
            finally:
                invoke.reset_runtime()
        summary = demo.summarise(operator, run_id, job_ids, crashed)

    document = {
        "run_id": run_id,
        "tenants": [dict(t.__dict__) for t in summary.tenants],
        "dead": summary.dead,
        "lease_recovered_job": summary.recovered_job,
        "drain": totals.as_dict(),
    }
    ui.emit(document, lambda out: _render_demo(out, summary, totals))
    if summary.unfinished:
        raise CliError(f"{summary.unfinished} demo jobs did not finish: "
                            f"{describe_stop(totals)}")
    return 0


def _render_demo(out: Console, summary: demo.DemoSummary, totals: DrainTotals) -> None:
    shown = table("tenant", "jobs", "succeeded", "retried", "dead", title=(
        f"demo {summary.run_id}: {totals.invocations} worker and "
        f"{totals.reaper_invocations} reaper invocations in {totals.elapsed:.1f} s"))
    for row in summary.tenants:
        shown.add_row(f"{row.tenant} [dim]{row.tenant_id}[/]", str(row.jobs),
                      f"[green]{row.succeeded}[/]", f"[yellow]{row.retried}[/]",
                      f"[bold red]{row.dead}[/]" if row.dead else "0")
    out.print(shown)
    out.print("[dim]retried = succeeded after more than one attempt[/]")
    for dead in summary.dead:
        error = dead["error"] if isinstance(dead["error"], dict) else {}
        out.print()
        out.print(f"[bold red]dead[/]: {dead['kind']} job of {dead['tenant']} "
                  f"after {dead['attempts']} attempt(s): {error.get('code', '')} "
                  f"{error.get('message', '')}".rstrip())
        out.print(f"  inspect it:  leaseq jobs show {dead['id']}", markup=False)
        out.print(f"  retry it:    leaseq dead retry {dead['id']}", markup=False)
    if summary.recovered_job is not None:
        out.print()
        out.print(f"lease recovered by the reaper: leaseq jobs show {summary.recovered_job}",
                  markup=False)
    out.print()
    out.print("next: leaseq status · leaseq dead list · leaseq db stop", markup=False)


# demo --fan-out ------------------------------------------------------------------------

#: The most the fan-out demo waits for its backlog, and then for the workers to stop.
FANOUT_WAIT_SECONDS = 180.0
FANOUT_IDLE_WAIT_SECONDS = 30.0


class _ServiceLog:
    """The local service's lines: kept for the summary, and written to lambda.log (or
    to stderr with --verbose)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, function: str, line: str) -> None:
        with self._lock:
            self.lines.append(f"[{function}] {line}")
            self.stream.write(f"[{function}] {line}\n")
            self.stream.flush()


def _demo_fan_out(args: argparse.Namespace, ui: Ui) -> int:
    """A backlog through the enqueue function on the local Lambda service: its wake
    starts one worker, whose full claims start more, up to --max-workers."""
    import boto3
    from botocore.config import Config

    from leaseq_cli.commands import lambda_service

    template = lambda_service.template_path()
    target = target_for(args, ui)
    home = local_home()
    home.mkdir(parents=True, exist_ok=True)
    run_id, tenant = demo.new_run_id(), uuid.uuid4()
    summary = demo.FanOutSummary(run_id, tenant, args.jobs, args.max_workers)
    worker_env = {**demo.DEMO_WORKER_ENV,
                  "LEASEQ_FANOUT_IDLE_SECONDS": f"{demo.FANOUT_IDLE_SECONDS:g}"}
    log_file = None if ui.verbose else (home / "lambda.log").open("a", encoding="utf-8")
    log = _ServiceLog(log_file or sys.stderr)
    try:
        service = lambda_service.local_lambda(
            template, target, demo.DEMO_HANDLERS, log=log, max_workers=args.max_workers,
            env_vars={"WorkerFunction": worker_env}, schedules=False)
        with service, closing(OperatorClient(QueueClient(target.connect_worker))) as client:
            ui.note(f"local Lambda service on {service.url} ({target.description}); "
                    f"function logs: {'stderr' if ui.verbose else home / 'lambda.log'}")
            ui.note(f"enqueueing {args.jobs} jobs through the enqueue function; at most "
                    f"{args.max_workers} worker invocations at once, no schedule")
            from leaseq_lambda_local.overrides import PLACEHOLDER_CREDENTIALS

            lam = boto3.client(
                "lambda", endpoint_url=service.url, region_name="us-east-1",
                aws_access_key_id=PLACEHOLDER_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                aws_secret_access_key=PLACEHOLDER_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                config=Config(retries={"total_max_attempts": 1}))
            started = time.monotonic()
            items = demo.fan_out_items(run_id, tenant, args.jobs)
            for first in range(0, len(items), 1000):
                answer = lam.invoke(FunctionName="EnqueueFunction",
                                    Payload=json.dumps({"jobs": items[first:first + 1000]}))
                body = json.loads(answer["Payload"].read())
                if "FunctionError" in answer or body.get("rejected"):
                    raise CliError(f"the enqueue function refused the demo's jobs: {body}")
            _watch_fan_out(ui, summary, client, started)
            deadline = time.monotonic() + FANOUT_IDLE_WAIT_SECONDS
            while not service.service.idle() and time.monotonic() < deadline:
                time.sleep(0.2)
            stats = service.service.stats()["functions"]["WorkerFunction"]
    finally:
        if log_file is not None:
            log_file.close()
    summary.cold_starts = int(stats["cold_starts"])
    for line in demo.worker_summaries(log.lines):
        if line["message"] == "drain finished":
            trigger = str(line.get("trigger"))
            summary.invocations[trigger] = summary.invocations.get(trigger, 0) + 1
        else:
            summary.refused += 1
    ui.emit(summary.as_dict(), lambda out: _render_fan_out(out, summary))
    if summary.unfinished:
        raise CliError(f"{summary.unfinished} demo jobs did not finish within "
                       f"{FANOUT_WAIT_SECONDS:g} s")
    return 0


def _watch_fan_out(ui: Ui, summary: demo.FanOutSummary, client: OperatorClient,
                   started: float) -> None:
    """Sample the pool and the backlog until every job finished (or the wait ends)."""
    shown = -1.0
    while True:
        elapsed = time.monotonic() - started
        counts = demo.tenant_counts(client, summary.tenant_id)
        finished = sum(counts.get(state, 0) for state in ("succeeded", "dead", "cancelled"))
        try:
            size = client.worker_pool_size()
        except LeaseqError:
            size = None
        sample = demo.FanOutSample(round(elapsed, 2), size.live if size else 0,
                                   size.reserved if size else 0, finished)
        summary.samples.append(sample)
        if elapsed - shown >= 0.5 or finished >= summary.jobs:
            shown = elapsed
            ui.note(f"{elapsed:5.1f} s  workers {'#' * sample.live:<{summary.max_workers}} "
                    f"{sample.live}" + (f" (+{sample.reserved} starting)"
                                        if sample.reserved else "")
                    + f"  done {finished}/{summary.jobs}")
        if finished >= summary.jobs or elapsed > FANOUT_WAIT_SECONDS:
            summary.succeeded = counts.get("succeeded", 0)
            summary.unfinished = summary.jobs - finished
            summary.seconds = elapsed
            return
        time.sleep(0.1)


def _render_fan_out(out: Console, summary: demo.FanOutSummary) -> None:
    shown = table("seconds", "workers", "starting", "done", title=(
        f"fan-out demo {summary.run_id}: {summary.jobs} jobs, MaxWorkers "
        f"{summary.max_workers}"))
    step = -1.0
    for sample in summary.samples:
        if sample.elapsed - step >= 1.0 or sample is summary.samples[-1]:
            step = sample.elapsed
            shown.add_row(f"{sample.elapsed:.1f}", "#" * sample.live + f" {sample.live}",
                          str(sample.reserved), f"{sample.finished}/{summary.jobs}")
    out.print(shown)
    starts = ", ".join(f"{count} by {trigger}" for trigger, count
                       in sorted(summary.invocations.items()))
    out.print(f"drained {summary.succeeded} of {summary.jobs} jobs in {summary.seconds:.1f} s "
              f"with up to {summary.peak_workers} worker invocations at once "
              f"(MaxWorkers {summary.max_workers})")
    out.print(f"worker invocations: {starts or 'none'}"
              + (f"; {summary.refused} refused by a full pool" if summary.refused else "")
              + f"; {summary.cold_starts} cold starts")
    out.print("[dim]the wake started the first worker after the enqueue's commit; each "
              "full claim asked for one more, at most once a second per worker[/]")
    out.print("next: leaseq lambda serve --max-workers 4 · docs/elastic-drain.md",
              markup=False)



def _demo_queues(args: argparse.Namespace, ui: Ui) -> int:
    """Two named queues drained in parallel by their own workers, a third paused."""
    from leaseq_cli import queues_demo

    target = target_for(args, ui)
    # --jobs is the fan-out demo's backlog (400 unless given); here it is per queue.
    per_queue = 120 if args.jobs == 400 else args.jobs
    ui.note(f"{per_queue} jobs in each of {', '.join(queues_demo.KINDS)}; "
            f"{queues_demo.PAUSED} is paused; {' and '.join(queues_demo.DRAINED)} drain in "
            f"parallel, each by its own worker ({target.description})")

    def show(sample: queues_demo.QueueSample) -> None:
        cells = "  ".join(f"{name} ready {ready:>3} running {running}"
                          + (" (paused)" if name == queues_demo.PAUSED else "")
                          for name, (ready, running) in sample.queues.items())
        ui.note(f"{sample.elapsed:6.1f} s  {cells}")

    with closing(QueueClient(target.connect_worker)) as client:
        summary = queues_demo.run(client, target.worker_dsn, per_queue=per_queue,
                                  actor=actor(args), on_sample=show)

    def render(out: Console) -> None:
        for name in queues_demo.KINDS:
            out.print(f"{name}: {summary.finished.get(name, 0)} finished, "
                      f"{summary.waiting.get(name, 0)} waiting")
        out.print(f"drained in {summary.seconds:.1f} s; {queues_demo.PAUSED} stayed paused "
                  f"(by {summary.paused_by}): see it with leaseq queues list "
                  f"{queues_demo.PAUSED}, drain it with leaseq queues resume "
                  f"{queues_demo.PAUSED} && leaseq drain --queue {queues_demo.PAUSED}")

    ui.emit(summary.as_dict(), render)
    return 0 if summary.workers_ok else 1
