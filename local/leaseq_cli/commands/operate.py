"""leaseq dead retry, cancel and prune: changes an operator makes, each audited."""

from __future__ import annotations

import argparse
from typing import Any

from leaseq.base.jobs import Selection
from leaseq.base.storable import blank_problem
from leaseq.store.client import MAX_OPERATOR_BATCH
from leaseq.store.duties import OperatorClient
from leaseq.upkeep.retention import prune_in_pages
from rich.console import Console

from leaseq_cli.commands._shared import actor, client_for
from leaseq_cli.failures import ConflictError, NotFoundError, UsageError
from leaseq_cli.render import Ui, plain, when

# dead retry / cancel --------------------------------------------------------


def checked_kind(kind: str | None) -> str | None:
    """A ``--kind`` filter, refused when it shows nothing (white space, zero-width
    characters): no job can have such a kind, so the filter would only match nothing."""
    if kind is None:
        return None
    problem = blank_problem(kind)
    if problem is not None:
        raise UsageError(f"--kind {problem}; give a kind as the handlers register it, or "
                         "leave --kind out to select every kind")
    return kind


def _selection(args: argparse.Namespace, verb: str, what: str) -> Selection:
    selection = Selection(tuple(args.job_ids or ()), args.tenant, checked_kind(args.kind))
    if selection.job_ids and (args.tenant or args.kind or args.all):
        raise UsageError("give job ids or filters (--tenant/--kind/--all), not both")
    if selection.everything and not args.all:
        raise UsageError(f"say which {what} to {verb}: job ids, --tenant and/or --kind, "
                         "or --all")
    return selection


def _act(args: argparse.Namespace, ui: Ui, *, verb: str, past: str, what: str,
         allowed: tuple[str, ...]) -> int:
    selection = _selection(args, verb, what)
    with client_for(args, ui, OperatorClient) as client:
        for job_id in selection.job_ids:
            if client.get_job(job_id) is None:
                raise NotFoundError(f"no job has id {job_id}; nothing was {past}")
        action = client.redrive_jobs if verb == "retry" else client.cancel_jobs
        done = action(actor(args), selection, reason=args.reason, limit=args.limit)
        done_ids = {row["job_id"] for row in done}
        skipped = []
        for job_id in selection.job_ids:
            if job_id not in done_ids:
                job = client.get_job(job_id)
                skipped.append((job_id, str(job["state"]) if job else "gone"))

    def render(out: Console) -> None:
        out.print(f"{past} {len(done)} job{'s' if len(done) != 1 else ''}"
                  + (f" (audit actor {actor(args)})" if done else ""))
        for row in done[:20]:
            out.print(f"  {row['job_id']}  {plain(row['kind'])}  tenant {row['tenant_id']}")
        if len(done) > 20:
            out.print(f"  ... and {len(done) - 20} more")

    ui.emit({past: done, "skipped": [{"job_id": j, "state": s} for j, s in skipped]}, render)
    if skipped:
        job_id, state = skipped[0]
        raise ConflictError(
            f"job {job_id} is {state}, so it was not {past}: only "
            f"{' or '.join(allowed)} jobs can be {past}"
            + (f" ({len(skipped) - 1} more skipped)" if len(skipped) > 1 else ""))
    return 0


def cmd_dead_retry(args: argparse.Namespace, ui: Ui) -> int:
    return _act(args, ui, verb="retry", past="redriven", what="dead jobs", allowed=("dead",))


def cmd_cancel(args: argparse.Namespace, ui: Ui) -> int:
    """Named jobs are cancelled whatever they are doing (a running one by a request its
    worker learns at its next renewal or outcome); filters reach waiting jobs only."""
    if not args.job_ids:
        return _act(args, ui, verb="cancel", past="cancelled", what="pending jobs",
                    allowed=("pending", "retry_wait"))
    selection = _selection(args, "cancel", "jobs")
    ids = list(selection.job_ids)[:args.limit] if args.limit else list(selection.job_ids)
    who = actor(args)
    with client_for(args, ui, OperatorClient) as client:
        for job_id in ids:
            if client.get_job(job_id) is None:
                raise NotFoundError(f"no job has id {job_id}; nothing was cancelled")
        rows: list[dict[str, Any]] = []
        for start in range(0, len(ids), MAX_OPERATOR_BATCH):
            rows += client.request_job_cancel(who, ids[start:start + MAX_OPERATOR_BATCH],
                                              reason=args.reason)
        acted = {row["job_id"] for row in rows}
        skipped = []
        for job_id in ids:
            if job_id not in acted:
                job = client.get_job(job_id)
                skipped.append((job_id, str(job["state"]) if job else "gone"))
    cancelled = [row for row in rows if row["state"] == "cancelled"]
    requested = [row for row in rows if row["state"] == "running"]

    def render(out: Console) -> None:
        out.print(f"cancelled {len(cancelled)} job{'s' if len(cancelled) != 1 else ''}"
                  + (f" (audit actor {who})" if rows else ""))
        for row in cancelled[:20]:
            out.print(f"  {row['job_id']}  {plain(row['kind'])}  tenant {row['tenant_id']}")
        if requested:
            out.print(f"cancel requested for {len(requested)} running "
                      f"job{'s' if len(requested) != 1 else ''}: each ends cancelled at its "
                      "worker's next lease renewal or outcome, or when its lease expires")
        for row in requested[:20]:
            out.print(f"  {row['job_id']}  {plain(row['kind'])}  tenant {row['tenant_id']}"
                      f"  requested by {plain(row['cancel_requested_by'])} at "
                      f"{when(row['cancel_requested_at'])}")

    ui.emit({"cancelled": cancelled, "cancel_requested": requested,
             "skipped": [{"job_id": j, "state": s} for j, s in skipped]}, render)
    if skipped:
        job_id, state = skipped[0]
        raise ConflictError(
            f"job {job_id} is {state}, so it was not cancelled: only pending, retry_wait "
            "or running jobs can be cancelled"
            + (f" ({len(skipped) - 1} more skipped)" if len(skipped) > 1 else ""))
    return 0

# prune ----------------------------------------------------------------------------------


def cmd_prune(args: argparse.Namespace, ui: Ui) -> int:
    with client_for(args, ui, OperatorClient) as client:
        report = prune_in_pages(client.prune_jobs, args.older_than, limit=args.batch,
                                max_pages=args.max_batches)
    ui.emit(dict(report.__dict__), lambda out: out.print(
        f"deleted {report.jobs_deleted} finished jobs older than {args.older_than} and "
        f"{report.events_deleted} events, in {report.batches} batches"))
    return 0
