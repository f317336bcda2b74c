"""leaseq limits set, list, remove and sync: concurrency and rate limits, as an operator
sets them at run time (the rows of app.limits; see leaseq.base.admission for the names)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from leaseq.base.admission import parse_limit_name, parse_rate
from leaseq.store.duties import OperatorClient
from rich.console import Console

from leaseq_cli.commands._shared import actor, client_for
from leaseq_cli.commands.schedules import _registry
from leaseq_cli.failures import NotFoundError, UsageError
from leaseq_cli.render import Ui, plain, table


def _rate_text(row: dict[str, Any]) -> str:
    if row["rate_count"] is None:
        return ""
    seconds = row["rate_period"].total_seconds()
    text = f"{row['rate_count']}/s" if seconds == 1 else f"{row['rate_count']}/{seconds:g}s"
    if row["burst"] is not None and row["burst"] != row["rate_count"]:
        text += f" burst {row['burst']}"
    return text


def cmd_limits_set(args: argparse.Namespace, ui: Ui) -> int:
    if args.concurrency is None and args.rate is None:
        raise UsageError("say what the limit allows: --concurrency N, --rate R/PERIOD, or both")
    if args.burst is not None and args.rate is None:
        raise UsageError("--burst needs --rate")
    name = parse_limit_name(args.name)
    rate = None if args.rate is None else parse_rate(args.rate, args.burst)
    with client_for(args, ui, OperatorClient) as client:
        written = client.set_limit(actor(args), name, concurrency=args.concurrency, rate=rate)
    document = {"name": written, "concurrency": args.concurrency,
                "rate": None if rate is None else str(rate)}
    allows = ", ".join(x for x in (
        None if args.concurrency is None else f"{args.concurrency} running at once",
        None if rate is None else f"{rate} starts") if x)
    ui.emit(document, lambda out: out.print(f"limit {plain(written)}: {allows}"))
    return 0


def cmd_limits_list(args: argparse.Namespace, ui: Ui) -> int:
    with client_for(args, ui, OperatorClient) as client:
        rows = client.list_limits()
        states = client.limit_status()

    def render(out: Console) -> None:
        if not rows:
            out.print("no limits; set one with leaseq limits set NAME --concurrency N")
        else:
            shown = table("limit", "concurrency", "rate", "source", "in force")
            for row in rows:
                shown.add_row(plain(row["name"]), str(row["concurrency"] or ""),
                              _rate_text(row), row["source"],
                              "yes" if row["in_force"] else "[dim]no: the operator's is[/]")
            out.print(shown)
        if states:
            used = table("instance", "admitted", "running", "held", "oldest held")
            for s in states:
                used.add_row(plain(s["bucket"]), str(s["admitted"]), str(s["running"]),
                             str(s["blocked"]), "" if s["oldest_blocked_at"] is None
                             else str(s["oldest_blocked_at"]))
            out.print(used)

    ui.emit({"limits": rows, "instances": states}, render)
    return 0


def cmd_limits_remove(args: argparse.Namespace, ui: Ui) -> int:
    name = parse_limit_name(args.name)
    with client_for(args, ui, OperatorClient) as client:
        removed = client.remove_limit(name)
    if not removed:
        raise NotFoundError(f"no operator's limit named {args.name!r}; see them with "
                            "leaseq limits list (a code-declared one goes with leaseq limits "
                            "sync)")
    ui.emit({"removed": True, "name": str(name)}, lambda out: out.print(
        f"removed limit {plain(str(name))}; the jobs it held are admitted unless another "
        "limit holds them"))
    return 0


def cmd_limits_sync(args: argparse.Namespace, ui: Ui) -> int:
    handlers = args.handlers or os.environ.get("LEASEQ_HANDLERS")
    if not handlers:
        raise UsageError("say which handlers module declares the limits: --handlers MODULE "
                         "(or $LEASEQ_HANDLERS)")
    limits = _registry(handlers).limits
    with client_for(args, ui, OperatorClient) as client:
        rows = client.sync_limits(limits)

    def render(out: Console) -> None:
        if not rows:
            out.print(f"{handlers} declares no limits, and none declared in code remain")
        for row in rows:
            out.print(f"{row['status']:>9}  {plain(row['name'])}")

    ui.emit({"handlers": handlers, "limits": rows}, render)
    return 0
