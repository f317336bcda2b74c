"""leaseq queues list, pause and resume: named queues as an operator sees and steers them
(app.queue_overview, app.pause_queue, app.resume_queue; each pause and resume audited with
the operator's identity)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta
from typing import Any

from leaseq.base.queues import QueueOverview
from leaseq.store.duties import OperatorClient
from rich.console import Console

from leaseq_cli.commands._shared import actor, client_for
from leaseq_cli.render import Ui, age, plain, table, when


def queue_rows(views: list[QueueOverview]) -> list[dict[str, Any]]:
    """The queues as ``--json`` and the status view print them."""
    now = datetime.now(UTC)
    return [view.as_dict(now) for view in views]


def queue_table(rows: list[dict[str, Any]], title: str | None = None) -> Any:
    """The per-queue table: depth, oldest ready, running, dead, pool, pause."""
    shown = table("queue", "ready", "scheduled", "running", "retrying", "dead",
                  "oldest ready", "workers", "state", title=title)
    for row in rows:
        state = ("[yellow]paused[/] by " + plain(row["paused_by"] or "?")
                 + (f" ({plain(row['pause_reason'])})" if row["pause_reason"] else "")
                 if row["paused"] else "[green]running[/]")
        dead = f"[bold red]{row['dead']}[/]" if row["dead"] else "[dim]0[/]"
        shown.add_row(plain(row["queue"]), str(row["ready"]), str(row["scheduled"]),
                      str(row["running"]), str(row["retrying"]), dead,
                      age(None if row["oldest_ready_age_seconds"] is None
                          else timedelta(seconds=row["oldest_ready_age_seconds"])),
                      f"{row['live_workers']}/{row['max_workers']}"
                      + (f" (+{row['reserved_workers']} starting)"
                         if row["reserved_workers"] else ""),
                      state)
    return shown


def cmd_queues_list(args: argparse.Namespace, ui: Ui) -> int:
    with client_for(args, ui, OperatorClient) as client:
        rows = queue_rows(client.queue_overview(args.queue))
        history = client.queue_history(args.queue, args.history) if args.queue else []

    def render(out: Console) -> None:
        if not rows:
            out.print("no queues yet: every job goes to the queue 'default'")
            return
        out.print(queue_table(rows))
        if history:
            events = table("when", "event", "actor", "login", "reason",
                           title=f"pauses and resumes of {plain(args.queue)}")
            for event in history:
                events.add_row(when(event["created_at"]), event["event_type"],
                               plain(event["actor"]), plain(event["login"]),
                               plain(event["reason"] or ""))
            out.print(events)

    ui.emit({"queues": rows, **({"history": history} if args.queue else {})}, render)
    return 0


def _change(args: argparse.Namespace, ui: Ui, pause: bool) -> int:
    who = actor(args)
    with client_for(args, ui, OperatorClient) as client:
        state = (client.pause_queue(args.queue, who, args.reason) if pause
                 else client.resume_queue(args.queue, who))
    document = {"queue": state.queue, "paused": state.paused,
                "paused_at": None if state.paused_at is None else state.paused_at.isoformat(),
                "paused_by": state.paused_by, "pause_reason": state.pause_reason,
                "actor": who}

    def render(out: Console) -> None:
        if pause:
            out.print(f"paused queue {plain(state.queue)} since {when(state.paused_at)} "
                      f"(audit actor {plain(state.paused_by or who)}): its jobs are not "
                      "claimed and its workers are not started until "
                      f"leaseq queues resume {plain(state.queue)}; running jobs finish")
        else:
            out.print(f"resumed queue {plain(state.queue)} (audit actor {plain(who)}): its "
                      "jobs are claimed from its next tick or wake")

    ui.emit(document, render)
    return 0


def cmd_queues_pause(args: argparse.Namespace, ui: Ui) -> int:
    return _change(args, ui, True)


def cmd_queues_resume(args: argparse.Namespace, ui: Ui) -> int:
    return _change(args, ui, False)
