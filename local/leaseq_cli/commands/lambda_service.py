"""``leaseq lambda serve``: the local Lambda service, on the embedded PostgreSQL by default.

It runs the template's functions as Lambda runs them (see docs/local-lambda.md) and
serves the Invoke API on 127.0.0.1, so boto3 reaches it with ``endpoint_url`` or
``AWS_ENDPOINT_URL_LAMBDA``. The runtime functions log in as the embedded server's login
(a member of the four runtime duty groups), the migrations function as the schema owner;
with DATABASE_URL both
use that connection string.

The service itself lives in ``leaseq_lambda_local`` (local/, next to this package; its
packages come with the ``local`` extra): it is imported when the command runs, so the
other commands start without loading it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from leaseq_cli import arguments, checkout, demo
from leaseq_cli.commands._shared import local_home, target_for
from leaseq_cli.failures import CliError, UsageError
from leaseq_cli.render import Ui

CommandFactory = Callable[..., argparse.ArgumentParser]


def register(sub: Any, command: CommandFactory, needs_subcommand: Callable[..., int],
             parser_class: type[argparse.ArgumentParser]) -> None:
    """Add ``leaseq lambda serve`` to the parser (called from main.build_parser)."""
    group = command(sub, "lambda", needs_subcommand, "the local Lambda service")
    group_sub = group.add_subparsers(title="commands", metavar="COMMAND",
                                     parser_class=parser_class)
    group_sub.required = True
    serve = command(group_sub, "serve", cmd_lambda_serve, "run the template's functions "
                    "locally behind the Lambda Invoke API on 127.0.0.1", description=(
                        "Run template.yaml's functions as Lambda runs them (a process per "
                        "execution environment with the real runtime interface client, "
                        "timeouts, reserved concurrency, async retries, schedules) and serve "
                        "the Invoke API on 127.0.0.1 until Ctrl-C. Point boto3 at it with "
                        "endpoint_url or AWS_ENDPOINT_URL_LAMBDA."))
    serve.add_argument("--port", type=int, default=3001,
                       help="port on 127.0.0.1 (default 3001, as sam local start-lambda; "
                       "0 picks a free one)")
    serve.add_argument("--template", type=Path, help="the SAM template (default: the "
                       "checkout's template.yaml)")
    serve.add_argument("--parameter-overrides", nargs="+", default=[], metavar="NAME=VALUE",
                       help="template parameters, as sam takes them")
    serve.add_argument("--env-vars", type=Path, metavar="FILE", help="variables in sam's "
                       "--env-vars shape: {\"Parameters\": {...}, \"FunctionId\": {...}}")
    serve.add_argument("--handlers", metavar="MODULE", help="LEASEQ_HANDLERS for the "
                       "functions (default: $LEASEQ_HANDLERS, else the demo handlers)")
    serve.add_argument("--schedule-every", type=arguments.seconds, metavar="SECONDS",
                       help="fire every schedule this often instead of at its rate")
    serve.add_argument("--no-schedules", action="store_true", help="fire no schedule")
    serve.add_argument("--async-retry-delay", type=arguments.seconds, default=60.0,
                       metavar="SECONDS", help="wait before the first retry of a failed "
                       "asynchronous event, twice that before the second (default 60, as "
                       "Lambda)")
    serve.add_argument("--unreserved-concurrency", type=arguments.positive_int, default=10,
                       help="executions at once shared by functions without a reservation "
                       "(default 10; AWS accounts have 1000)")
    serve.add_argument("--max-workers", type=arguments.positive_int, metavar="N",
                       help="turn the worker pool on with at most N worker invocations at "
                       "once: fan-out and wake on enqueue (the database's maximum, set as "
                       "its schema owner as a deploy sets MaxWorkers; LEASEQ_MAX_WORKERS of "
                       "the worker and enqueue functions; the worker's reserved concurrency "
                       "N + 1)")


def _template(args: argparse.Namespace) -> Path:
    if args.template is not None:
        return Path(args.template)
    found = checkout.default_template()
    if found is None:
        raise UsageError("no template.yaml here: give --template")
    return found


def _overrides(pairs: list[str]) -> dict[str, str]:
    values: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise UsageError(f"--parameter-overrides takes NAME=VALUE, not {pair!r}")
        values[name] = value
    return values


def _env_vars(path: Path | None) -> dict[str, dict[str, str]]:
    if path is None:
        return {}
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"--env-vars {path}: {exc}") from exc
    if not isinstance(document, dict) or not all(isinstance(v, dict)
                                                 for v in document.values()):
        raise UsageError(f"--env-vars {path}: expected {{\"FunctionId\": {{\"NAME\": "
                         "\"value\"}}}}")
    return {str(k): {str(n): str(v) for n, v in vs.items()} for k, vs in document.items()}


#: The template's functions the worker pool concerns: the worker (it joins the pool and
#: fans out) and the enqueue function (it wakes a worker after its commit).
POOL_FUNCTIONS = ("WorkerFunction", "EnqueueFunction")


def pool_env_vars(max_workers: int) -> dict[str, dict[str, str]]:
    """``--env-vars`` entries that turn the worker pool on: at most ``max_workers``
    workers, started by invoking the worker function by its logical id (which the local
    service answers to, as it answers to the template's FunctionName)."""
    variables = {"LEASEQ_MAX_WORKERS": str(max_workers),
                 "LEASEQ_WORKER_FUNCTION": POOL_FUNCTIONS[0]}
    return {name: dict(variables) for name in POOL_FUNCTIONS}


def pool_parameters(template: Path, max_workers: int) -> dict[str, str]:
    """The template parameters that go with a pool of ``max_workers``, for those the
    template has: MaxWorkers, and a worker reservation of one more for the tick."""
    from leaseq_lambda_local.template import load_yaml

    try:
        declared = (load_yaml(template.read_text(encoding="utf-8")) or {}).get("Parameters")
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {template}: {exc}") from exc
    wanted = {"MaxWorkers": str(max_workers), "WorkerReservedConcurrency": str(max_workers + 1)}
    return {name: value for name, value in wanted.items() if name in (declared or {})}


def set_pool_maximum(target: Any, max_workers: int) -> str | None:
    """Make ``max_workers`` the database's own maximum (``app.settings.max_workers``), as
    its schema owner, the way a deploy writes ``MaxWorkers``: the functions'
    ``LEASEQ_MAX_WORKERS`` can only narrow it. A database this command cannot change as
    its owner (a DATABASE_URL of a runtime login) keeps its own maximum, which then caps
    the pool; the answer says so (None when it was written)."""
    from leaseq import LeaseqError, set_worker_pool_limits

    try:
        with target.connect_owner("leaseq-cli-pool") as conn:
            set_worker_pool_limits(conn, max_workers=max_workers)
    except (LeaseqError, CliError) as exc:
        return (f"the worker pool's maximum stays the database's own (app.settings.max_workers,"
                f" which only the schema owner sets; {exc.message}): --max-workers "
                f"{max_workers} can only narrow it")
    return None


def merge_env_vars(*sets: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """``--env-vars`` documents merged function by function (later ones win)."""
    merged: dict[str, dict[str, str]] = {}
    for env_vars in sets:
        for function, variables in env_vars.items():
            merged.setdefault(function, {}).update(variables)
    return merged


def local_lambda(template: Path, target: Any, handlers: str, *, log: Any, port: int = 0,
                 parameter_overrides: dict[str, str] | None = None,
                 env_vars: dict[str, dict[str, str]] | None = None,
                 max_workers: int | None = None, **options: Any) -> Any:
    """The local Lambda service of ``template`` on ``target``'s database (not started).
    With ``max_workers`` the worker pool is on (:func:`pool_env_vars`), with that maximum
    in the database too (:func:`set_pool_maximum`)."""
    try:
        from leaseq_lambda_local import LocalConfig, LocalLambda, TemplateError
    except ImportError as exc:
        raise CliError("the local Lambda service needs the 'local' extra: pip install -e "
                       f"'.[local]' ({exc})") from exc
    parameters = dict(parameter_overrides or {})
    variables = dict(env_vars or {})
    if max_workers is not None:
        parameters = {**pool_parameters(template, max_workers), **parameters}
        variables = merge_env_vars(pool_env_vars(max_workers), variables)
        note = set_pool_maximum(target, max_workers)
        if note:
            sys.stderr.write(f"leaseq: {note}\n")
    try:
        return LocalLambda(LocalConfig(
            template=template, parameter_overrides=parameters,
            database_url=target.worker_dsn, owner_database_url=target.owner_dsn,
            handlers=handlers, env_vars=variables, python_path=(Path.cwd(),), port=port,
            log=log, **options))
    except TemplateError as exc:
        raise UsageError(f"{template}: {exc}") from exc
    except OSError as exc:
        raise CliError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror}; "
                       "choose another --port") from exc


def template_path(given: Path | None = None) -> Path:
    """``given`` (``--template``), else the checkout's template.yaml."""
    return _template(argparse.Namespace(template=given))


def _describe(service: Any) -> dict[str, Any]:
    functions: dict[str, Any] = {}
    for name, spec in service.template.functions.items():
        functions[name] = {
            "timeout_seconds": spec.timeout_seconds, "memory_mb": spec.memory_mb,
            "reserved_concurrency": spec.reserved_concurrency,
            "max_retry_attempts": spec.max_retry_attempts,
            "max_event_age_seconds": spec.max_event_age_seconds,
            "schedules": [{"expression": s.expression, "enabled": s.enabled}
                          for s in spec.schedules],
            "overrides": service.notes[name]}
    return functions


def _print_start(ui: Ui, service: Any, target: Any, log_path: str, every: float | None) -> None:
    out = sys.stdout
    if ui.json_output:
        out.write(json.dumps({"endpoint_url": service.url, "database": target.description,
                              "functions": _describe(service), "function_logs": log_path})
                  + "\n")
        out.flush()
        return
    out.write(f"Local Lambda service on {service.url} ({target.description})\n")
    for name, spec in service.template.functions.items():
        reserved = spec.reserved_concurrency
        schedules = ", ".join(
            s.expression + (" (disabled)" if not s.enabled
                            else " (cron: not fired locally)" if not s.period_seconds
                            else f" (every {every:g} s here)" if every else "")
            for s in spec.schedules)
        out.write(f"  {name}: timeout {spec.timeout_seconds} s, {spec.memory_mb} MB, "
                  f"{'reserved ' + str(reserved) if reserved is not None else 'unreserved'}, "
                  f"async retries {spec.max_retry_attempts}, max event age "
                  f"{spec.max_event_age_seconds} s"
                  + (f", schedule {schedules}" if schedules else "") + "\n")
        for note in service.notes[name]:
            out.write(f"      {note}\n")
    out.write(f"function logs: {log_path}\n")
    out.write(f"export AWS_ENDPOINT_URL_LAMBDA={service.url}\n")
    out.write("Ctrl-C stops it and every execution environment.\n")
    out.flush()


def _print_stop(ui: Ui, stats: dict[str, Any]) -> None:
    if ui.json_output:
        sys.stdout.write(json.dumps({"stopped": True, "stats": stats}) + "\n")
    else:
        for name, counters in stats["functions"].items():
            sys.stdout.write(
                f"  {name}: {counters['invocations']} invocations, {counters['cold_starts']} "
                f"cold starts, {counters['timeouts']} timeouts, {counters['throttles']} "
                f"throttles, peak concurrency {counters['peak_concurrency']}"
                + (f", {counters['async_dropped_shutdown']} queued events dropped at stop"
                   if counters["async_dropped_shutdown"] else "") + "\n")
        sys.stdout.write("stopped\n")
    sys.stdout.flush()


def cmd_lambda_serve(args: argparse.Namespace, ui: Ui) -> int:
    """Serve until SIGINT or SIGTERM, then stop every environment and print the counts."""
    try:
        from leaseq_lambda_local import LogWriter
    except ImportError as exc:
        raise CliError("the local Lambda service needs the 'local' extra: pip install -e "
                       f"'.[local]' ({exc})") from exc
    template = _template(args)
    target = target_for(args, ui)
    handlers = args.handlers or os.environ.get("LEASEQ_HANDLERS") or demo.DEMO_HANDLERS
    home = local_home()
    log_stream: TextIO | None
    if ui.verbose:
        log_stream, log_path, log_file = sys.stderr, "stderr", None
    else:
        home.mkdir(parents=True, exist_ok=True)
        log_file = (home / "lambda.log").open("a", encoding="utf-8")
        log_stream, log_path = log_file, str(home / "lambda.log")
    delay = args.async_retry_delay
    try:
        service = local_lambda(
            template, target, handlers, log=LogWriter(log_stream), port=args.port,
            parameter_overrides=_overrides(args.parameter_overrides),
            env_vars=_env_vars(args.env_vars), max_workers=args.max_workers,
            schedules=not args.no_schedules, schedule_every=args.schedule_every,
            async_retry_delays=(delay, 2 * delay),
            unreserved_concurrency=args.unreserved_concurrency)
        _serve(service, ui, target, log_path, args.schedule_every)
    finally:
        if log_file is not None:
            log_file.close()
    return 0


def _serve(service: Any, ui: Ui, target: Any, log_path: str, every: float | None) -> None:
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        with service:
            _print_start(ui, service, target, log_path, every)
            try:
                while not stop.wait(0.5):
                    pass
            except KeyboardInterrupt:
                pass
        stats = service.service.stats()
    finally:
        signal.signal(signal.SIGTERM, previous)
    _print_stop(ui, stats)
