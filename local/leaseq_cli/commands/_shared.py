"""What every command needs: the database, the local home, the audit actor."""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from leaseq.settings import DatabaseSettings, WorkerSettings, variable
from leaseq.store.client import QueueClient
from leaseq.store.duties import DutyClient

from leaseq_cli import demo, embedded
from leaseq_cli.aws import AwsClients
from leaseq_cli.failures import UsageError
from leaseq_cli.render import Ui
from leaseq_cli.target import Target, configured_url, resolve

Face = TypeVar("Face", bound=DutyClient)

STATES = ("pending", "running", "retry_wait", "succeeded", "dead", "cancelled")


def local_home() -> Path:
    return embedded.leaseq_home()


def aws_clients(args: argparse.Namespace) -> AwsClients:
    """The AWS clients of this run (``--region``; tests replace ``AWS_CLIENTS``)."""
    return AWS_CLIENTS(getattr(args, "region", None))


#: Makes the AWS clients; tests put a factory here that serves moto or in-process doubles.
AWS_CLIENTS: Callable[[str | None], AwsClients] = lambda region: AwsClients(region)  # noqa: E731


def target_for(args: argparse.Namespace, ui: Ui) -> Target:
    stack = getattr(args, "stack", None)
    tunnel = getattr(args, "tunnel", None)
    if stack:
        return resolve(args.database_url, stack=stack, clients=aws_clients(args),
                       sslrootcert=getattr(args, "sslrootcert", None) or "system",
                       tunnel=tunnel)
    if tunnel is not None:
        raise UsageError("--tunnel reaches a deployed stack's database: give --stack NAME too")
    home = local_home()
    was_running = embedded.state(home).running if configured_url(args.database_url) is None \
        else True
    target = resolve(args.database_url, home=home)
    if target.embedded is not None and not was_running:
        ui.note(f"[dim]started the embedded PostgreSQL in {home / 'pgdata'} "
                "(stop it with: leaseq db stop)[/]")
    return target


@contextmanager
def client_for(args: argparse.Namespace, ui: Ui, face: type[Face]) -> Iterator[Face]:
    """The command's duty face of the queue (``face``: ``ProducerClient``,
    ``OperatorClient``, ...) on the command's database, as its worker login (a member of
    every duty's group on the embedded server; on a deployed stack, of the groups the
    login was granted): a command reaches only its own duty's calls.

    It connects at once, so a refused login fails before the command does anything, and
    is closed when the command ends; like every client, it reconnects once if the
    connection drops in between.
    """
    target = target_for(args, ui)
    client = QueueClient(target.connect_worker)
    try:
        client.check()
        yield face(client)
    finally:
        client.close()


def actor(args: argparse.Namespace) -> str:
    if getattr(args, "actor", None):
        return str(args.actor)
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"leaseq-cli:{user}"[:200]


def handlers_env(args: argparse.Namespace, target: Target) -> dict[str, str | None]:
    """The environment the functions' handlers run with in this process: the target's
    database, the handlers module, and the command's options in place of the worker
    settings they replace (each variable named where its setting is declared)."""
    handlers_variable = variable(WorkerSettings, "handlers_module")
    handlers = getattr(args, "handlers", None) or os.environ.get(handlers_variable) \
        or demo.DEMO_HANDLERS
    # Like `python -m`, let a handlers module in the current directory be found.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    env: dict[str, str | None] = {variable(DatabaseSettings, "url"): target.worker_dsn,
                                  handlers_variable: handlers}
    if getattr(args, "job_timeout", None):
        env[variable(WorkerSettings, "job_timeout_seconds")] = f"{args.job_timeout:g}"
    # --kind / --exclude-kind replace whichever filter the environment sets.
    filters = {option: variable(WorkerSettings, option) for option in ("kinds", "exclude_kinds")}
    for option, name in filters.items():
        if getattr(args, option, None):
            env.update(dict.fromkeys(filters.values()))
            env[name] = ",".join(getattr(args, option))
    # --queue: the named queue the drained worker claims (LEASEQ_QUEUE).
    if getattr(args, "queue", None):
        env[variable(WorkerSettings, "queue")] = args.queue
    # The command waits between invocations itself (--wait), so an invocation ends as
    # soon as the queue is empty, unless the environment asks it to poll.
    poll_idle = variable(WorkerSettings, "poll_idle_seconds")
    if not os.environ.get(poll_idle):
        env[poll_idle] = "0"
    return env
