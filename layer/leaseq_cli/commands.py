"""What each ``leaseq`` subcommand does. Parsing lives in main.py, output in render.py."""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any, TextIO

from leaseq.client import enqueue_jobs
from leaseq.jobs import EnqueueRequest
from leaseq.migrate import migrate
from pydantic import ValidationError
from rich.console import Console

from leaseq_cli import demo, embedded, invoke
from leaseq_cli.drain import DrainTotals, FinishedCounter, describe_stop, drain
from leaseq_cli.failures import CliError, ConflictError, NotFoundError, UsageError
from leaseq_cli.operator import Operator, Selection
from leaseq_cli.render import Ui, age, compact, styled_state, table, when
from leaseq_cli.target import Target, configured_url, resolve

STATES = ("pending", "running", "retry_wait", "succeeded", "dead", "cancelled")
ENQUEUE_CHUNK = 1000


# Shared plumbing ----------------------------------------------------------------------


def _home() -> Path:
    return embedded.leaseq_home()


def _target(args: argparse.Namespace, ui: Ui) -> Target:
    home = _home()
    was_running = embedded.state(home).running if configured_url(args.database_url) is None \
        else True
    target = resolve(args.database_url, home=home)
    if target.embedded is not None and not was_running:
        ui.note(f"[dim]started the embedded PostgreSQL in {home / 'pgdata'} "
                "(stop it with: leaseq db stop)[/]")
    return target


@contextmanager
def _operator(args: argparse.Namespace, ui: Ui) -> Iterator[Operator]:
    target = _target(args, ui)
    with target.connect_worker() as conn:
        yield Operator(conn)


def _actor(args: argparse.Namespace) -> str:
    if getattr(args, "actor", None):
        return str(args.actor)
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"leaseq-cli:{user}"[:200]


def _handlers_env(args: argparse.Namespace, target: Target) -> dict[str, str | None]:
    handlers = getattr(args, "handlers", None) or os.environ.get("LEASEQ_HANDLERS") \
        or demo.DEMO_HANDLERS
    # Like `python -m`, let a handlers module in the current directory be found.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    env: dict[str, str | None] = {"DATABASE_URL": target.worker_dsn,
                                  "LEASEQ_HANDLERS": handlers}
    if getattr(args, "job_timeout", None):
        env["LEASEQ_JOB_TIMEOUT_SECONDS"] = f"{args.job_timeout:g}"
    return env


# migrate --------------------------------------------------------------------------------


def cmd_migrate(args: argparse.Namespace, ui: Ui) -> int:
    if configured_url(args.database_url) is None:
        db = embedded.start(_home())
        assert db.migrations is not None
        report = db.migrations
        where = f"embedded PostgreSQL in {db.home / 'pgdata'}"
    else:
        target = resolve(args.database_url, apply_migrations=False)
        with target.connect_owner("leaseq-cli-migrate") as conn:
            report = migrate(conn)
        where = target.description

    def render(out: Console) -> None:
        if report.applied:
            applied = ", ".join(f"{v:04d}" for v in report.applied)
            out.print(f"[green]applied[/] {applied}; schema version {report.current_version} "
                      f"({where})")
        else:
            out.print(f"schema is up to date at version {report.current_version} ({where})")

    ui.emit({"applied": list(report.applied), "version": report.current_version,
             "database": where}, render)
    return 0


# enqueue --------------------------------------------------------------------------------


def _requests_from_file(stream: TextIO, name: str,
                        default_tenant: uuid.UUID | None) -> list[EnqueueRequest]:
    requests: list[EnqueueRequest] = []
    for number, line in enumerate(stream, start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{name} line {number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{where} is not valid JSON ({exc.msg} at column {exc.colno}); "
                             "each line must be one JSON object") from None
        if not isinstance(item, dict):
            raise UsageError(f"{where} must be a JSON object with tenant_id, operation_key, "
                             "kind and payload")
        if "tenant_id" not in item and default_tenant is not None:
            item["tenant_id"] = str(default_tenant)
        if "payload" in item and not isinstance(item["payload"], dict):
            raise UsageError(f"{where}: payload must be a JSON object, such as "
                             """{"to": "ada@example.com"}""")
        try:
            requests.append(EnqueueRequest.model_validate(item))
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'line'}: {e['msg']}"
                                 for e in exc.errors())
            raise UsageError(f"{where}: {problems}") from None
    if not requests:
        raise UsageError(f"{name} holds no jobs; write one JSON object per line")
    return requests


def _read_requests(args: argparse.Namespace) -> list[EnqueueRequest]:
    if args.file is not None:
        if args.kind or args.payload is not None or args.key:
            raise UsageError("give either --file or --kind/--payload/--key, not both")
        if args.file == "-":
            return _requests_from_file(sys.stdin, "stdin", args.tenant)
        path = Path(args.file)
        try:
            with path.open(encoding="utf-8") as stream:
                return _requests_from_file(stream, str(path), args.tenant)
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    if args.tenant is None or not args.kind:
        raise UsageError("say what to enqueue: --tenant UUID --kind KIND [--payload JSON], "
                         "or --file JOBS.jsonl")
    return [EnqueueRequest(
        tenant_id=args.tenant, operation_key=args.key or f"cli-{uuid.uuid4()}", kind=args.kind,
        payload=args.payload or {}, max_attempts=args.max_attempts,
        correlation_id=args.correlation_id)]


def cmd_enqueue(args: argparse.Namespace, ui: Ui) -> int:
    requests = _read_requests(args)
    with _operator(args, ui) as operator:
        results = []
        for start in range(0, len(requests), ENQUEUE_CHUNK):
            chunk = requests[start:start + ENQUEUE_CHUNK]
            for result in enqueue_jobs(operator.conn, chunk):
                results.append((start + result.index, result))
    counts = {s: sum(1 for _, r in results if r.status == s)
              for s in ("created", "existing", "conflict")}
    rows: list[dict[str, Any]] = [
        {"index": i, "job_id": r.job_id, "status": r.status, "state": r.state.value,
         "tenant_id": requests[i].tenant_id, "operation_key": requests[i].operation_key,
         "kind": requests[i].kind} for i, r in results]

    def render(out: Console) -> None:
        if len(rows) <= 20:
            shown = table("job id", "tenant", "kind", "operation key", "status")
            for row in rows:
                status = row["status"]
                style = {"created": "green", "existing": "dim", "conflict": "bold red"}[status]
                shown.add_row(str(row["job_id"]), str(row["tenant_id"]), row["kind"],
                              row["operation_key"], f"[{style}]{status}[/]")
            out.print(shown)
        out.print(f"{counts['created']} created, {counts['existing']} already existed, "
                  f"{counts['conflict']} conflicts")

    ui.emit({"counts": counts, "jobs": rows}, render)
    if counts["conflict"]:
        first = next(r for r in rows if r["status"] == "conflict")
        raise ConflictError(
            f"{counts['conflict']} operation keys already name a job with another kind or "
            f"payload (first: {first['operation_key']!r}, job {first['job_id']}); use new keys "
            "for new jobs")
    return 0


# drain and reap -------------------------------------------------------------------------


def _render_drain(out: Console, totals: DrainTotals) -> None:
    shown = table("invocations", "claimed", "succeeded", "retries", "dead", "given back",
                  "leases lost", "seconds")
    shown.add_row(str(totals.invocations), str(totals.claimed), f"[green]{totals.succeeded}[/]",
                  f"[yellow]{totals.retried}[/]",
                  f"[red]{totals.dead}[/]" if totals.dead else "0", str(totals.released),
                  str(totals.lost_leases), f"{totals.elapsed:.1f}")
    out.print(shown)
    out.print(describe_stop(totals))


def cmd_drain(args: argparse.Namespace, ui: Ui) -> int:
    target = _target(args, ui)
    home = _home()
    with invoke.open_log(home, ui.verbose) as log, \
            invoke.environment(_handlers_env(args, target)):
        invoke.reset_runtime()
        try:
            worker = invoke.Invoker("worker", log=log)
            reaper = invoke.Invoker("reaper", log=log) if args.reap else None
            with target.connect_worker() as conn, \
                    closing(FinishedCounter(target.connect_worker)) as counter:
                totals = drain(ui, Operator(conn), worker, budget=args.budget,
                               max_invocations=args.invocations, wait=args.wait,
                               reaper=reaper, count_finished=counter)
        finally:
            invoke.reset_runtime()
    ui.emit(totals.as_dict(), lambda out: _render_drain(out, totals))
    return 0


def cmd_reap(args: argparse.Namespace, ui: Ui) -> int:
    target = _target(args, ui)
    with invoke.open_log(_home(), ui.verbose) as log, \
            invoke.environment(_handlers_env(args, target)):
        invoke.reset_runtime()
        try:
            answer = invoke.Invoker("reaper", log=log)(args.budget)
        finally:
            invoke.reset_runtime()
    from leaseq_cli.drain import _as_report

    report = _as_report(answer)
    released = int(report.get("released", 0) or 0)
    ui.emit(report, lambda out: out.print(
        f"released {released} expired lease{'s' if released != 1 else ''}"))
    return 0


# status ---------------------------------------------------------------------------------


def _status_document(rows: list[dict[str, Any]]) -> dict[str, Any]:
    tenants: dict[str, dict[str, Any]] = {}
    for row in rows:
        entry = tenants.setdefault(str(row["tenant_id"]), {
            "tenant_id": row["tenant_id"], "states": dict.fromkeys(STATES, 0), "ready": 0,
            "oldest_ready_age": None, "next_ready_in": None})
        entry["states"][row["state"]] = int(row["jobs"])
        entry["ready"] += int(row["ready_jobs"])
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
            "ready": sum(e["ready"] for e in tenants.values())}


def cmd_status(args: argparse.Namespace, ui: Ui) -> int:
    with _operator(args, ui) as operator:
        document = _status_document(operator.queue_status(args.tenant))

    def render(out: Console) -> None:
        if not document["tenants"]:
            out.print("the queue is empty" + (" for this tenant" if args.tenant else ""))
            return
        shown = table("tenant", *STATES, "ready", "oldest ready")
        for entry in document["tenants"]:
            counts = [_count(state, entry["states"][state]) for state in STATES]
            shown.add_row(str(entry["tenant_id"]), *counts, str(entry["ready"]),
                          age(entry["oldest_ready_age"]))
        if len(document["tenants"]) > 1:
            shown.add_section()
            shown.add_row("[bold]all tenants[/]",
                          *[_count(s, document["totals"][s]) for s in STATES],
                          str(document["ready"]), "")
        out.print(shown)
        if document["totals"]["dead"]:
            out.print(f"[red]{document['totals']['dead']} dead[/]: see them with "
                      "leaseq dead list")

    ui.emit(document, render)
    return 0


def _count(state: str, count: int) -> str:
    if not count:
        return "[dim]0[/]"
    return f"[bold red]{count}[/]" if state == "dead" else str(count)


# jobs show ------------------------------------------------------------------------------


def cmd_jobs_show(args: argparse.Namespace, ui: Ui) -> int:
    with _operator(args, ui) as operator:
        job = operator.get_job(args.job_id)
        if job is None:
            raise NotFoundError(f"no job has id {args.job_id}; find ids with leaseq dead list, "
                                "or in the output of leaseq enqueue")
        events = operator.job_timeline(args.job_id, args.limit)

    def render(out: Console) -> None:
        facts = table("", "", title=f"job {job['id']}")
        facts.show_header = False
        for label, value in (
            ("tenant", str(job["tenant_id"])),
            ("kind", job["kind"]),
            ("operation key", job["operation_key"]),
            ("state", styled_state(str(job["state"]))),
            ("attempts", f"{job['attempts']} of {job['max_attempts']}"),
            ("created", when(job["created_at"])),
            ("available at", when(job["available_at"])),
            ("completed", when(job["completed_at"])),
            ("lease", f"{job['lease_owner']} until {when(job['lease_expires_at'])}"
             if job["lease_owner"] else "-"),
            ("correlation id", job["correlation_id"] or "-"),
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
                             _event_style(event["event_type"]), event["actor"],
                             compact(event["details"], 300))
        out.print(timeline)

    ui.emit({"job": job, "events": events}, render)
    return 0


def _event_style(event: str) -> str:
    style = {"succeeded": "green", "dead": "bold red", "retry_scheduled": "yellow",
             "lease_expired": "yellow", "cancelled": "magenta", "redriven": "cyan",
             "claimed": "blue"}.get(event)
    return f"[{style}]{event}[/]" if style else event


# dead list / dead retry / cancel --------------------------------------------------------


def cmd_dead_list(args: argparse.Namespace, ui: Ui) -> int:
    with _operator(args, ui) as operator:
        rows = operator.dead_jobs(args.tenant, args.kind, args.limit)

    def render(out: Console) -> None:
        if not rows:
            out.print("no dead jobs")
            return
        shown = table("job id", "tenant", "kind", "attempts", "reason", "error", "died")
        for row in rows:
            error = row["last_error"] or {}
            message = error.get("message") if isinstance(error, dict) else None
            code = error.get("code") if isinstance(error, dict) else None
            shown.add_row(str(row["id"]), str(row["tenant_id"]), row["kind"],
                          f"{row['attempts']}/{row['max_attempts']}", row["reason"] or "-",
                          " ".join(str(x) for x in (code, message) if x)[:120],
                          when(row["completed_at"]))
        out.print(shown)
        out.print("retry one with: leaseq dead retry JOB_ID   (or --tenant/--kind/--all)")

    ui.emit({"jobs": rows}, render)
    return 0


def _selection(args: argparse.Namespace, verb: str, what: str) -> Selection:
    selection = Selection(tuple(args.job_ids or ()), args.tenant, args.kind)
    if selection.job_ids and (args.tenant or args.kind or args.all):
        raise UsageError("give job ids or filters (--tenant/--kind/--all), not both")
    if selection.everything and not args.all:
        raise UsageError(f"say which {what} to {verb}: job ids, --tenant and/or --kind, "
                         "or --all")
    return selection


def _act(args: argparse.Namespace, ui: Ui, *, verb: str, past: str, what: str,
         allowed: tuple[str, ...]) -> int:
    selection = _selection(args, verb, what)
    with _operator(args, ui) as operator:
        for job_id in selection.job_ids:
            if operator.get_job(job_id) is None:
                raise NotFoundError(f"no job has id {job_id}; nothing was {past}")
        action = operator.redrive_jobs if verb == "retry" else operator.cancel_jobs
        done = action(_actor(args), selection, reason=args.reason, limit=args.limit)
        done_ids = {row["job_id"] for row in done}
        skipped = []
        for job_id in selection.job_ids:
            if job_id not in done_ids:
                job = operator.get_job(job_id)
                skipped.append((job_id, str(job["state"]) if job else "gone"))

    def render(out: Console) -> None:
        out.print(f"{past} {len(done)} job{'s' if len(done) != 1 else ''}"
                  + (f" (audit actor {_actor(args)})" if done else ""))
        for row in done[:20]:
            out.print(f"  {row['job_id']}  {row['kind']}  tenant {row['tenant_id']}")
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
    return _act(args, ui, verb="cancel", past="cancelled", what="pending jobs",
                allowed=("pending", "retry_wait"))


# prune ----------------------------------------------------------------------------------


def cmd_prune(args: argparse.Namespace, ui: Ui) -> int:
    with _operator(args, ui) as operator:
        report = operator.prune_jobs(args.older_than, batch=args.batch,
                                     max_batches=args.max_batches)
    ui.emit(dict(report.__dict__), lambda out: out.print(
        f"deleted {report.jobs_deleted} finished jobs older than {args.older_than} and "
        f"{report.events_deleted} events, in {report.batches} batches"))
    return 0


# db -------------------------------------------------------------------------------------


def cmd_db_start(args: argparse.Namespace, ui: Ui) -> int:
    db = embedded.start(_home())
    return _db_status(ui, embedded.state(db.home), started=True)


def cmd_db_stop(args: argparse.Namespace, ui: Ui) -> int:
    home = _home()
    before = embedded.state(home)
    after = embedded.stop(home)

    def render(out: Console) -> None:
        if before.running:
            out.print(f"stopped the embedded PostgreSQL (pid {before.pid}); its data stays in "
                      f"{home / 'pgdata'}")
        else:
            out.print(f"the embedded PostgreSQL in {home / 'pgdata'} is not running")

    ui.emit({"was_running": before.running, **after.as_dict()}, render)
    return 0


def cmd_db_status(args: argparse.Namespace, ui: Ui) -> int:
    return _db_status(ui, embedded.state(_home()))


def _db_status(ui: Ui, current: embedded.ServerState, *, started: bool = False) -> int:
    override = configured_url(None)
    document = {**current.as_dict(), "database_url_set": override is not None}

    def render(out: Console) -> None:
        facts = table("", "", title="embedded PostgreSQL")
        facts.show_header = False
        facts.add_row("[bold]state[/]", "[green]running[/]" if current.running else (
            "stopped" if current.initialised else "not created yet"))
        facts.add_row("[bold]data[/]", str(current.home / "pgdata"))
        if current.running:
            facts.add_row("[bold]pid[/]", str(current.pid))
            facts.add_row("[bold]socket[/]", f"{current.socket_dir} (port {current.port})")
            facts.add_row("[bold]roles[/]", f"{embedded.OWNER_ROLE} (schema owner), "
                          f"{embedded.WORKER_ROLE} (service_role); passwords in "
                          f"{current.home / 'credentials.json'}")
        out.print(facts)
        if override is not None:
            out.print("[yellow]DATABASE_URL is set, so other commands use that database "
                      "instead[/]")

    ui.emit(document, render)
    return 0


def cmd_db_url(args: argparse.Namespace, ui: Ui) -> int:
    db = embedded.start(_home())
    dsn = db.owner_dsn if args.role == "owner" else db.worker_dsn
    ui.emit({"role": args.role, "url": dsn}, lambda out: out.print(dsn, markup=False))
    return 0


# demo -----------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace, ui: Ui) -> int:
    target = _target(args, ui)
    home = _home()
    run_id = demo.new_run_id()
    with target.connect_worker() as conn:
        operator = Operator(conn)
        job_ids = demo.enqueue_demo(operator, run_id)
        ui.note(f"enqueued {len(job_ids)} jobs for {len(demo.TENANTS)} tenants "
                f"({target.description})")
        crashed = demo.crash_a_worker(operator)
        if crashed is not None:
            ui.note(f"a worker claimed job {crashed} and crashed: its lease expires in "
                    f"{demo.CRASHED_LEASE.total_seconds():g} s and the reaper takes it back")
        env = {**demo.DEMO_WORKER_ENV, **_handlers_env(args, target),
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
