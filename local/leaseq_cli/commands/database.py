"""leaseq migrate and leaseq db: the schema and the embedded server."""

from __future__ import annotations

import argparse

from leaseq.store.migrate import migrate
from rich.console import Console
from rich.text import Text

from leaseq_cli import embedded
from leaseq_cli.commands._shared import local_home
from leaseq_cli.failures import UsageError
from leaseq_cli.render import Ui, table
from leaseq_cli.target import configured_url, resolve

# migrate --------------------------------------------------------------------------------


def cmd_migrate(args: argparse.Namespace, ui: Ui) -> int:
    if getattr(args, "stack", None):
        raise UsageError(
            "--stack logs in as the operators' login, never as the schema owner: a deployed "
            "stack applies its migrations itself at deploy time (sam deploy)")
    if configured_url(args.database_url) is None:
        db = embedded.start(local_home())
        assert db.migrations is not None
        report = db.migrations
        where = f"embedded PostgreSQL in {db.home / 'pgdata'}"
    else:
        target = resolve(args.database_url, apply_migrations=False)
        with target.connect_owner("leaseq-cli-migrate") as conn:
            report = migrate(conn)
        where = target.description

    def render(out: Console) -> None:
        # The same line as python -m leaseq migrate, with "applied" in green.
        line = Text(report.describe(where))
        if report.applied:
            line.stylize("green", 0, len("applied"))
        out.print(line)

    ui.emit(report.as_document(where), render)
    return 0

# db -------------------------------------------------------------------------------------


def cmd_db_start(args: argparse.Namespace, ui: Ui) -> int:
    db = embedded.start(local_home())
    return _db_status(ui, embedded.state(db.home))


def cmd_db_stop(args: argparse.Namespace, ui: Ui) -> int:
    home = local_home()
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
    return _db_status(ui, embedded.state(local_home()))


def _db_status(ui: Ui, current: embedded.ServerState) -> int:
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
                          f"{embedded.WORKER_ROLE} ({', '.join(embedded.WORKER_GROUPS)}), "
                          f"{embedded.SUPERUSER} (superuser); "
                          f"passwords in {current.home / 'credentials.json'}")
            facts.add_row("[bold]access[/]", "its OS user only: private socket directory "
                          "(mode 0700), scram-sha-256 for every role, no TCP")
        out.print(facts)
        if override is not None:
            out.print("[yellow]DATABASE_URL is set, so other commands use that database "
                      "instead[/]")

    ui.emit(document, render)
    return 0


def cmd_db_url(args: argparse.Namespace, ui: Ui) -> int:
    db = embedded.start(local_home())
    dsn = db.owner_dsn if args.role == "owner" else db.worker_dsn
    ui.emit({"role": args.role, "url": dsn}, lambda out: out.print(dsn, markup=False))
    return 0
