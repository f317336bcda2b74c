"""leaseq status, jobs show and dead list: read-only views of the queue."""

from __future__ import annotations

import argparse
from typing import Any

from leaseq.base.decoding import UndecodableJson
from leaseq.store.duties import OperatorClient
from rich.console import Console

from leaseq_cli.commands._shared import STATES, client_for
from leaseq_cli.commands.operate import checked_kind
from leaseq_cli.commands.queues import queue_rows, queue_table
from leaseq_cli.failures import NotFoundError
from leaseq_cli.render import Ui, age, compact, plain, styled_state, table, when

# status ---------------------------------------------------------------------------------


def _status_document(rows: list[dict[str, Any]]) -> dict[str, Any]:
    tenants: dict[str, dict[str, Any]] = {}
    for row in rows:
        entry = tenants.setdefault(str(row["tenant_id"]), {
            "tenant_id": row["tenant_id"], "states": dict.fromkeys(STATES, 0), "ready": 0,
            "oldest_ready_age": None, "next_ready_in": None, "cancel_requested": 0})
        entry["states"][row["state"]] = int(row["jobs"])
        entry["ready"] += int(row["ready_jobs"])
        entry["cancel_requested"] += int(row.get("cancel_requested") or 0)
        for key in ("oldest_ready_age", "next_ready_in"):
            value = row[key]
            if value is not None:
                current = entry[key]
                better = max if key == "oldest_ready_age" else min
                entry[key] = value if current is None else better(current, value)
    totals = dict.fromkeys(STATES, 0)
    for entry in tenants.values():
        for state, count in entry["states"].items():
            totals[state] += count
    return {"tenants": list(tenants.values()), "totals": totals,
            "ready": sum(e["ready"] for e in tenants.values()),
            "cancel_requested": sum(e["cancel_requested"] for e in tenants.values())}


#: How the command line words each reason app.waiting_jobs and app.job_wait_reasons
#: give (sql/README.md, "Waiting jobs"); a reason not listed is shown as it is.
WAIT_REASONS = {
    "scheduled": "not yet due",
    "retry_wait": "retry waiting",
    "behind_priority": "behind higher-priority work",
    "queued": "queued behind older work",
    "ready": "ready, next in its tenant",
    "held_by_limit": "held by a limit",
    "cancel_requested": "cancel requested",
}


def _add_waiting(document: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    by_tenant = {str(e["tenant_id"]): e for e in document["tenants"]}
    for entry in document["tenants"]:
        entry["waiting"] = {}
    for row in rows:
        entry = by_tenant.get(str(row["tenant_id"]))
        if entry is not None:
            entry["waiting"][row["reason"]] = {"jobs": int(row["jobs"]),
                                               "next_at": row["next_at"]}


def cmd_status(args: argparse.Namespace, ui: Ui) -> int:
    with client_for(args, ui, OperatorClient) as client:
        document = _status_document(client.queue_status(args.tenant))
        _add_waiting(document, client.waiting_jobs(args.tenant))
        # Named queues are every tenant's: shown without --tenant only.
        document["queues"] = [] if args.tenant else queue_rows(client.queue_overview())
        document["limits"] = client.limit_status()

    def render(out: Console) -> None:
        paused = [q["queue"] for q in document["queues"] if q["paused"]]
        if not document["tenants"]:
            out.print("the queue is empty" + (" for this tenant" if args.tenant else ""))
            if paused:
                out.print(f"[yellow]paused queues[/]: {', '.join(map(plain, paused))}")
            return
        if len(document["queues"]) > 1 or paused:
            out.print(queue_table(document["queues"], title="queues"))
        shown = table("tenant", *STATES, "ready", "oldest ready")
        for entry in document["tenants"]:
            counts = [_count(state, entry["states"][state]) for state in STATES]
            if entry["cancel_requested"]:  # running jobs whose worker has yet to stop
                counts[STATES.index("running")] += (
                    f" [magenta]({entry['cancel_requested']} cancel requested)[/]")
            shown.add_row(str(entry["tenant_id"]), *counts, str(entry["ready"]),
                          age(entry["oldest_ready_age"]))
        if len(document["tenants"]) > 1:
            shown.add_section()
            shown.add_row("[bold]all tenants[/]",
                          *[_count(s, document["totals"][s]) for s in STATES],
                          str(document["ready"]), "")
        out.print(shown)
        waits = table("tenant", "why waiting", "jobs", "due", title="waiting jobs")
        for entry in document["tenants"]:
            for reason, wait in entry["waiting"].items():
                waits.add_row(str(entry["tenant_id"]), WAIT_REASONS.get(reason, plain(reason)),
                              str(wait["jobs"]), when(wait["next_at"]))
        if waits.row_count:
            out.print(waits)
        if document["limits"]:
            limits = table("limit", "admitted", "running", "held", "oldest held",
                           title="limits (leaseq limits list)")
            for row in document["limits"]:
                limits.add_row(plain(row["bucket"]), str(row["admitted"]), str(row["running"]),
                               str(row["blocked"]), when(row["oldest_blocked_at"])
                               if row["oldest_blocked_at"] else "")
            out.print(limits)
        if document["totals"]["dead"]:
            out.print(f"[red]{document['totals']['dead']} dead[/]: see them with "
                      "leaseq dead list")
        if document["cancel_requested"]:
            out.print(f"[magenta]{document['cancel_requested']} running with a cancel "
                      "requested[/]: each ends cancelled at its worker's next renewal or "
                      "outcome, or when its lease expires")

    ui.emit(document, render)
    return 0


def _count(state: str, count: int) -> str:
    if not count:
        return "[dim]0[/]"
    return f"[bold red]{count}[/]" if state == "dead" else str(count)

# jobs show ------------------------------------------------------------------------------


def cmd_jobs_show(args: argparse.Namespace, ui: Ui) -> int:
    with client_for(args, ui, OperatorClient) as client:
        job = client.get_job(args.job_id)
        if job is None:
            raise NotFoundError(f"no job has id {args.job_id}; find ids with leaseq dead list, "
                                "or in the output of leaseq enqueue")
        events = client.job_timeline(args.job_id, args.limit)
        (wait,) = client.job_wait_reasons([args.job_id]) or ({},)

    def render(out: Console) -> None:
        facts = table("", "", title=f"job {job['id']}")
        facts.show_header = False
        for label, value in (
            ("tenant", str(job["tenant_id"])),
            ("kind", plain(job["kind"])),
            ("operation key", plain(job["operation_key"])),
            ("state", styled_state(str(job["state"]))),
            ("attempts", f"{job['attempts']} of {job['max_attempts']}"),
            ("created", when(job["created_at"])),
            ("available at", when(wait.get("available_at") or job["available_at"])),
            ("limit key", plain(job.get("limit_key") or "-")),
            ("priority", f"{wait.get('priority', '-')} (1 least urgent .. 9 most)"),
            ("waiting", _wait_text(wait)),
            ("completed", when(job["completed_at"])),
            ("lease", f"{plain(job['lease_owner'])} until {when(job['lease_expires_at'])}"
             if job["lease_owner"] else "-"),
            *_cancel_request(job),
            ("correlation id", plain(job["correlation_id"] or "-")),
            ("payload", compact(job["payload"], 400)),
            ("result", compact(job["result"], 400) or "-"),
            ("last error", compact(job["last_error"], 400) or "-"),
        ):
            facts.add_row(f"[bold]{label}[/]", value)
        out.print(facts)
        out.print()
        timeline = table("#", "time", "event", "actor", "details", title="timeline")
        for event in events:
            timeline.add_row(str(event["sequence"]), when(event["created_at"]),
                             _event_style(event["event_type"]), plain(event["actor"]),
                             compact(event["details"], 300))
        out.print(timeline)

    ui.emit({"job": job, "wait": wait or None, "events": events}, render)
    return 0


def _cancel_request(job: dict[str, Any]) -> list[tuple[str, str]]:
    """The "cancel requested" line of a job an operator cancelled while it ran (by whom,
    when); none for a job without a request."""
    if job.get("cancel_requested_at") is None:
        return []
    label = "cancel requested" if str(job["state"]) == "running" else "cancelled while running"
    return [(label, f"[magenta]by {plain(job['cancel_requested_by'])} at "
                    f"{when(job['cancel_requested_at'])}[/]")]


def _wait_text(wait: dict[str, Any]) -> str:
    """Why the job is not running, in words (app.job_wait_reasons)."""
    reason = wait.get("reason")
    if reason is None:
        return "-"
    words = WAIT_REASONS.get(reason, plain(reason))
    if reason == "held_by_limit" and wait.get("held_by"):
        return f"[yellow]held by limit {plain(wait['held_by'])}[/]: admitted when it has room"
    if wait.get("until") is not None:
        return f"{words}, until {when(wait['until'])}"
    if reason in ("behind_priority", "queued"):
        return (f"{words}: {wait['jobs_ahead']} ahead in its tenant, "
                f"{wait['higher_priority_ahead']} of higher priority")
    return words


def _event_style(event: str) -> str:
    style = {"succeeded": "green", "dead": "bold red", "retry_scheduled": "yellow",
             "lease_expired": "yellow", "cancelled": "magenta", "redriven": "cyan",
             "claimed": "blue", "cancel_requested": "magenta"}.get(event)
    return f"[{style}]{event}[/]" if style else event


# dead list --------------------------------------------------------------------------------


def _error_summary(error: Any) -> str:
    """``CODE message`` of a job's last_error, whatever shape it has."""
    if isinstance(error, UndecodableJson):
        return error.describe()
    if not isinstance(error, dict):
        return ""
    return " ".join(str(x) for x in (error.get("code"), error.get("message")) if x)


def cmd_dead_list(args: argparse.Namespace, ui: Ui) -> int:
    kind = checked_kind(args.kind)
    with client_for(args, ui, OperatorClient) as client:
        rows = client.dead_jobs(args.tenant, kind, args.limit)

    def render(out: Console) -> None:
        if not rows:
            out.print("no dead jobs")
            return
        shown = table("job id", "tenant", "kind", "attempts", "reason", "error", "died")
        for row in rows:
            shown.add_row(str(row["id"]), str(row["tenant_id"]), plain(row["kind"]),
                          f"{row['attempts']}/{row['max_attempts']}",
                          plain(row["reason"] or "-"),
                          plain(_error_summary(row["last_error"])[:120]),
                          when(row["completed_at"]))
        out.print(shown)
        out.print("retry one with: leaseq dead retry JOB_ID   (or --tenant/--kind/--all)")

    ui.emit({"jobs": rows}, render)
    return 0
