"""leaseq drain, reap and demo: the Lambda handlers invoked in this process."""

from __future__ import annotations

import argparse
from contextlib import closing

from leaseq.client import QueueClient
from rich.console import Console

from leaseq_cli import demo, invoke
from leaseq_cli.commands._shared import handlers_env, local_home, target_for
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
            with closing(QueueClient(target.connect_worker)) as client, \
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
    target = target_for(args, ui)
    home = local_home()
    run_id = demo.new_run_id()
    with closing(QueueClient(target.connect_worker)) as client:
        job_ids = demo.enqueue_demo(client, run_id)
        ui.note(f"enqueued {len(job_ids)} jobs for {len(demo.TENANTS)} tenants "
                f"({target.description})")
        crashed = demo.crash_a_worker(client)
        if crashed is not None:
            ui.note(f"a worker claimed job {crashed} and crashed: its lease expires in "
                    f"{demo.CRASHED_LEASE.total_seconds():g} s and the reaper takes it back")
        env = {**demo.DEMO_WORKER_ENV, **handlers_env(args, target),
               "LEASEQ_HANDLERS": demo.DEMO_HANDLERS}
        with invoke.open_log(home, ui.verbose) as log, invoke.environment(env):
            invoke.reset_runtime()
            try:
                with closing(FinishedCounter(target.connect_worker)) as counter:
                    totals = drain(ui, client, invoke.Invoker("worker", log=log),
                                   budget=args.budget, wait=15.0,
                                   reaper=invoke.Invoker("reaper", log=log),
                                   count_finished=counter)
            finally:
                invoke.reset_runtime()
        summary = demo.summarise(client, run_id, job_ids, crashed)

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
