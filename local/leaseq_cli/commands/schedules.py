"""leaseq schedules add, list, pause, resume, remove and sync: periodic jobs, as an
operator defines them (the rows of app.schedules; the reaper's tick enqueues their slots)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

from leaseq.base.schedules import Schedule
from leaseq.kinds.registry import Registry
from leaseq.store.duties import OperatorClient
from rich.console import Console

from leaseq_cli.commands._shared import client_for
from leaseq_cli.failures import NotFoundError, UsageError
from leaseq_cli.render import Ui, plain, styled_state, table, when


def cmd_schedules_add(args: argparse.Namespace, ui: Ui) -> int:
    schedule = Schedule(tenant_id=args.tenant, name=args.name, kind=args.kind,
                        expression=args.expression, time_zone=args.tz,
                        payload=args.payload or {}, fill_limit=args.fill,
                        max_attempts=args.max_attempts)
    with client_for(args, ui, OperatorClient) as client:
        row = client.put_schedule(schedule)
    document = {**row, **schedule.model_dump()}

    def render(out: Console) -> None:
        out.print(f"{row['status']} schedule {plain(schedule.name)} ({plain(schedule.kind)}, "
                  f"{plain(schedule.expression)} {schedule.time_zone}) in tenant "
                  f"{schedule.tenant_id}; next slot {when(row['next_slot'])}")

    ui.emit(document, render)
    return 0


def cmd_schedules_list(args: argparse.Namespace, ui: Ui) -> int:
    with client_for(args, ui, OperatorClient) as client:
        rows = client.list_schedules(args.tenant, args.next)

    def render(out: Console) -> None:
        if not rows:
            out.print("no schedules" + (" in this tenant" if args.tenant else "")
                      + "; add one with leaseq schedules add")
            return
        shown = table("tenant", "name", "kind", "expression", "next slots", "last slot",
                      "last job", "missed")
        for row in rows:
            next_slots = "[yellow]paused[/]" if row["paused"] else "\n".join(
                when(slot) for slot in row["next_slots"])
            job = "" if row["last_job_id"] is None else (
                f"{row['last_job_id']}\n" + (styled_state(str(row["last_job_state"]))
                                             if row["last_job_state"] else "[dim]pruned[/]"))
            shown.add_row(str(row["tenant_id"]), plain(row["name"]), plain(row["kind"]),
                          f"{plain(row['expression'])}\n[dim]{row['time_zone']}"
                          f"{', fill ' + str(row['fill_limit']) if row['fill_limit'] else ''}"
                          f"{', code' if row['source'] == 'code' else ''}[/]",
                          next_slots, when(row["last_slot"]) if row["last_slot"] else "",
                          job, str(row["slots_missed"]))
        out.print(shown)

    ui.emit({"schedules": rows}, render)
    return 0


def _pause(args: argparse.Namespace, ui: Ui, paused: bool) -> int:
    with client_for(args, ui, OperatorClient) as client:
        if not any(r["name"] == args.name for r in client.list_schedules(args.tenant, 0)):
            raise NotFoundError(f"no schedule named {args.name!r} in tenant {args.tenant}; "
                                "see them with leaseq schedules list")
        row = client.pause_schedule(args.tenant, args.name, paused=paused)
    verb = "paused" if paused else "resumed"
    ui.emit({**row, "name": args.name, "tenant_id": args.tenant}, lambda out: out.print(
        f"{verb} schedule {plain(args.name)}"
        + ("" if paused else f"; next slot {when(row['next_slot'])}")))
    return 0


def cmd_schedules_pause(args: argparse.Namespace, ui: Ui) -> int:
    return _pause(args, ui, True)


def cmd_schedules_resume(args: argparse.Namespace, ui: Ui) -> int:
    return _pause(args, ui, False)


def cmd_schedules_remove(args: argparse.Namespace, ui: Ui) -> int:
    with client_for(args, ui, OperatorClient) as client:
        removed = client.remove_schedule(args.tenant, args.name)
    if not removed:
        raise NotFoundError(f"no schedule named {args.name!r} in tenant {args.tenant}; "
                            "nothing was removed")
    ui.emit({"removed": True, "name": args.name, "tenant_id": args.tenant},
            lambda out: out.print(f"removed schedule {plain(args.name)}; the jobs it made "
                                  "stay"))
    return 0


def _registry(module_name: str) -> Registry:
    # Like `python -m`, let a handlers module in the current directory be found.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import the handlers module {module_name!r}: {exc}") from exc
    registry: Any = getattr(module, "registry", None)
    if not isinstance(registry, Registry):
        raise UsageError(f"the handlers module {module_name!r} has no `registry` "
                         "(a leaseq.Registry)")
    return registry


def cmd_schedules_sync(args: argparse.Namespace, ui: Ui) -> int:
    handlers = args.handlers or os.environ.get("LEASEQ_HANDLERS")
    if not handlers:
        raise UsageError("say which handlers module declares the schedules: --handlers "
                         "MODULE (or $LEASEQ_HANDLERS)")
    schedules = _registry(handlers).schedules
    with client_for(args, ui, OperatorClient) as client:
        rows = client.sync_schedules(schedules)

    def render(out: Console) -> None:
        if not rows:
            out.print(f"{handlers} declares no schedules, and none declared in code remain")
            return
        for row in rows:
            out.print(f"{row['status']:>9}  {plain(row['name'])}  tenant {row['tenant_id']}")

    ui.emit({"handlers": handlers, "schedules": rows}, render)
    return 0
