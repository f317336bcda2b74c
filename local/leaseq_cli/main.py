"""``leaseq``: run, inspect and operate the queue from a terminal.

Every failure ends as one line on stderr and a documented exit code (see failures.py);
``--verbose`` adds the traceback and the Lambda handlers' own log lines.
"""

from __future__ import annotations

import argparse
import sys
import traceback
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from leaseq_cli import arguments
from leaseq_cli.failures import EXIT_CODES_HELP, UsageError, describe

Command = Callable[[argparse.Namespace, Any], int]

DESCRIPTION = """\
A durable, multi-tenant job queue in PostgreSQL, drained by AWS Lambda.

Without DATABASE_URL every command uses an embedded PostgreSQL started on demand in
$LEASEQ_HOME/pgdata (default ./.leaseq), migrated automatically; `leaseq db stop`
stops it. With DATABASE_URL, commands use that server as its login, which needs the
duty group of the command: leaseq_producer (enqueue), leaseq_worker and
leaseq_operator (drain), leaseq_reaper (reap), leaseq_operator (status, jobs, dead,
cancel, prune, schedules); `leaseq migrate` runs as the schema owner. With --stack NAME, they use
that deployed stack's database as its operators' login, signed in with an RDS IAM
token."""


class Parser(argparse.ArgumentParser):
    """argparse, except that a usage error is one line and exit code 2, like the rest."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see: {self.prog} --help)")


def _common(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("output and connection")
    group.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                       help="print one JSON document on stdout, for scripts")
    group.add_argument("--no-color", action="store_true", default=argparse.SUPPRESS,
                       help="no colour even on a terminal (NO_COLOR is honoured too)")
    group.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                       help="show the Lambda handlers' logs on stderr and tracebacks")
    group.add_argument("--database-url", default=argparse.SUPPRESS, metavar="URL",
                       help="use this server instead of $DATABASE_URL or the embedded one")
    group.add_argument("--stack", default=argparse.SUPPRESS, metavar="NAME",
                       help="use the database of this deployed stack, as its operators' "
                       "login with an IAM token (AWS credentials, no password)")
    group.add_argument("--region", default=argparse.SUPPRESS,
                       help="AWS region of --stack (default: the AWS configuration's)")
    group.add_argument("--sslrootcert", default=argparse.SUPPRESS, metavar="FILE",
                       help="with --stack: trusted root certificates (default: system, the "
                       "OS store; the RDS bundle for an instance without a proxy)")
    group.add_argument("--tunnel", type=arguments.tunnel_address, default=argparse.SUPPRESS,
                       metavar="[ADDRESS:]PORT",
                       help="with --stack: connect through a port forward on this machine "
                       "(Session Manager, SSH) at ADDRESS:PORT (address 127.0.0.1 unless "
                       "given); TLS still verifies the stack's host name")


def _command(subparsers: Any, name: str, run: Command, help_text: str,
             description: str | None = None) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, help=help_text, description=description or help_text,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(run=run)
    _common(parser)
    return parser


def _selection_options(parser: argparse.ArgumentParser, what: str,
                       named: str | None = None) -> None:
    parser.add_argument("job_ids", nargs="*", type=arguments.uuid_value, metavar="JOB_ID",
                        help=f"the {named or what} to act on")
    parser.add_argument("--tenant", type=arguments.uuid_value, help="only this tenant's jobs")
    parser.add_argument("--kind", help="only jobs of this kind")
    parser.add_argument("--all", action="store_true",
                        help=f"all {what}, of every tenant and kind (no filter)")
    parser.add_argument("--limit", type=arguments.positive_int,
                        help="at most this many jobs (default: all that match)")
    parser.add_argument("--reason", help="recorded in each job's audit event")
    parser.add_argument("--actor", help="who acts, for the audit event "
                        "(default: leaseq-cli:$USER)")


def build_parser() -> Parser:
    from leaseq_cli import commands as c

    parser = Parser(prog="leaseq", description=DESCRIPTION, epilog=EXIT_CODES_HELP,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(parser)
    sub = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=Parser)
    sub.required = True

    demo = _command(sub, "demo", c.cmd_demo, "enqueue demo jobs for four tenants, drain them "
                    "with the real worker and reaper, show a summary")
    demo.add_argument("--budget", type=arguments.seconds, default=20.0,
                      help="seconds each simulated worker invocation may run (default 20)")
    demo.add_argument("--fan-out", action="store_true",
                      help="instead: a backlog enqueued through the enqueue function on the "
                      "local Lambda service wakes a worker, which starts more of itself up "
                      "to --max-workers; shows the pool as it grows and drains")
    demo.add_argument("--queues", action="store_true",
                      help="instead: three named queues, two drained in parallel by their "
                      "own workers while the third stays paused (its jobs wait)")
    demo.add_argument("--max-workers", type=arguments.positive_int, default=4, metavar="N",
                      help="with --fan-out: most worker invocations at once (default 4)")
    demo.add_argument("--jobs", type=arguments.positive_int, default=400, metavar="N",
                      help="with --fan-out: jobs in the backlog (default 400)")

    _command(sub, "migrate", c.cmd_migrate, "apply the SQL migrations (as the schema owner)")

    enqueue = _command(sub, "enqueue", c.cmd_enqueue, "enqueue one job, or many from a "
                       "JSON-lines file", description=(
                           "Enqueue one job (--tenant, --kind, --payload) or many (--file, one "
                           "JSON object per line with tenant_id, operation_key, kind, payload"
                           " and optionally max_attempts, available_at, correlation_id, "
                           "priority). Enqueueing is idempotent on (tenant, operation key)."))
    enqueue.add_argument("--tenant", type=arguments.uuid_value,
                         help="the tenant (with --file: for lines without tenant_id)")
    enqueue.add_argument("--kind", help="the job kind, as registered by the handlers")
    enqueue.add_argument("--payload", type=arguments.json_object,
                         help="the payload, a JSON object (default {})")
    enqueue.add_argument("--key", help="the operation key (default: a new random key)")
    enqueue.add_argument("--max-attempts", type=arguments.positive_int)
    enqueue.add_argument("--correlation-id")
    enqueue.add_argument("--priority", type=arguments.priority, metavar="1..9",
                         help="1 (least urgent) .. 9 (most urgent); default 5. More urgent "
                         "jobs of a tenant are claimed first, aged so that none waits more "
                         "than 8 priority steps behind newer ones")
    enqueue.add_argument("--queue", type=arguments.queue_name, metavar="QUEUE",
                         help="the named queue whose workers run it (default: the kind's "
                         "declared queue with --handlers, else its route, else 'default')")
    enqueue.add_argument("--limit-key", metavar="KEY", help="put the job under the limits set "
                         "on key:KEY (leaseq limits set), for example a partner account's rate")
    enqueue.add_argument("--file", metavar="JOBS.jsonl", help="a JSON-lines file, or - for stdin")
    enqueue.add_argument("--handlers", metavar="MODULE",
                         help="check every job against this handlers module's registry (as "
                         "LEASEQ_HANDLERS names it) first: an unknown kind or a payload its "
                         "model refuses fails the command, nothing enqueued (default: no check)")
    enqueue_sub = enqueue.add_subparsers(title="commands", metavar="COMMAND",
                                         parser_class=Parser)
    resubmit = _command(enqueue_sub, "resubmit", c.cmd_enqueue_resubmit,
                        "send the enqueue dead-letter queue's messages to the function again",
                        description=(
                            "Each message of the stack's EnqueueDeadLetterQueue is an "
                            "asynchronous enqueue that failed on every attempt. Once the cause "
                            "is fixed, this invokes the enqueue function with each message's "
                            "original request and deletes the message when all its jobs are "
                            "created or existing (enqueue is idempotent). Messages whose jobs "
                            "are rejected stay. With --stack the queue and the function come "
                            "from the stack's outputs."))
    resubmit.add_argument("--queue-url", help="the dead-letter queue (default: the stack's "
                          "EnqueueDeadLetterQueueUrl)")
    resubmit.add_argument("--function", help="the enqueue function's name or ARN (default: the "
                          "stack's EnqueueFunctionArn)")
    resubmit.add_argument("--limit", type=arguments.positive_int,
                          help="at most this many messages (default: until the queue is empty)")

    drain = _command(sub, "drain", c.cmd_drain, "run the worker Lambda handler locally until "
                     "the queue is drained", description=(
                         "Invoke the worker Lambda handler in this process again and again, "
                         "with the scheduled event and a context whose remaining time is "
                         "--budget: exactly the code path that runs in Lambda."))
    drain.add_argument("--budget", type=arguments.seconds, default=60.0,
                       help="seconds each invocation may run (default 60)")
    drain.add_argument("--invocations", type=arguments.positive_int,
                       help="stop after this many invocations (default: until drained)")
    drain.add_argument("--wait", type=arguments.seconds, default=10.0,
                       help="wait at most this long for jobs scheduled later (default 10)")
    drain.add_argument("--handlers", metavar="MODULE",
                       help="module exposing `registry` (default: $LEASEQ_HANDLERS, else the "
                       "demo handlers)")
    drain.add_argument("--job-timeout", type=arguments.seconds, metavar="SECONDS",
                       help="the default job budget (LEASEQ_JOB_TIMEOUT_SECONDS)")
    drain.add_argument("--reap", action="store_true",
                       help="run the reaper handler before each invocation too")
    drain.add_argument("--queue", type=arguments.queue_name, metavar="QUEUE",
                       help="drain this named queue, as its worker function does "
                       "(LEASEQ_QUEUE; default 'default')")
    kind_filter = drain.add_mutually_exclusive_group()
    kind_filter.add_argument("--kind", action="append", dest="kinds", metavar="KIND",
                             help="claim only jobs of this kind; repeat for more "
                             "(LEASEQ_KINDS, a slow worker's filter)")
    kind_filter.add_argument("--exclude-kind", action="append", dest="exclude_kinds",
                             metavar="KIND", help="claim every kind but this one; repeat "
                             "for more (LEASEQ_EXCLUDE_KINDS, the main worker's filter)")

    reap = _command(sub, "reap", c.cmd_reap, "run the reaper Lambda handler once: expired "
                    "leases of every tenant go back to the queue")
    reap.add_argument("--budget", type=arguments.seconds, default=30.0)

    status = _command(sub, "status", c.cmd_status, "jobs per tenant and state, ready jobs, "
                      "the oldest ready job's age, and per queue")
    status.add_argument("--tenant", type=arguments.uuid_value)

    queues = _command(sub, "queues", _needs_subcommand, "named queues: depth, workers, "
                      "pause and resume")
    queues_sub = queues.add_subparsers(title="commands", metavar="COMMAND", parser_class=Parser)
    queues_sub.required = True
    queues_list = _command(queues_sub, "list", c.cmd_queues_list, "every queue: ready, "
                           "scheduled, running, retrying and dead jobs, the oldest ready "
                           "job's age, workers, paused or not")
    queues_list.add_argument("queue", nargs="?", type=arguments.queue_name, metavar="QUEUE",
                             help="one queue, with its pauses and resumes")
    queues_list.add_argument("--history", type=arguments.positive_int, default=20,
                             metavar="N", help="with QUEUE: its last N pauses and resumes")
    pause = _command(queues_sub, "pause", c.cmd_queues_pause, "pause a queue: its jobs are "
                     "not claimed and its workers not started; running jobs finish; audited")
    pause.add_argument("queue", type=arguments.queue_name, metavar="QUEUE")
    pause.add_argument("--reason", help="why, kept with the pause and its audit row")
    resume = _command(queues_sub, "resume", c.cmd_queues_resume, "resume a paused queue; "
                      "audited")
    resume.add_argument("queue", type=arguments.queue_name, metavar="QUEUE")
    for queue_parser in (pause, resume):
        queue_parser.add_argument("--actor", help="the audit actor (default leaseq-cli:$USER)")

    jobs = _command(sub, "jobs", _needs_subcommand, "look at one job")
    jobs_sub = jobs.add_subparsers(title="commands", metavar="COMMAND", parser_class=Parser)
    jobs_sub.required = True
    show = _command(jobs_sub, "show", c.cmd_jobs_show, "a job and its event timeline")
    show.add_argument("job_id", type=arguments.uuid_value, metavar="JOB_ID")
    show.add_argument("--limit", type=arguments.positive_int, default=1000,
                      help="at most this many events (default 1000)")

    dead = _command(sub, "dead", _needs_subcommand, "list and retry dead jobs")
    dead_sub = dead.add_subparsers(title="commands", metavar="COMMAND", parser_class=Parser)
    dead_sub.required = True
    dead_list = _command(dead_sub, "list", c.cmd_dead_list, "dead jobs, most recent first, "
                         "with the reason they died")
    dead_list.add_argument("--tenant", type=arguments.uuid_value)
    dead_list.add_argument("--kind")
    dead_list.add_argument("--limit", type=arguments.positive_int, default=50)
    retry = _command(dead_sub, "retry", c.cmd_dead_retry, "redrive dead jobs: back to pending "
                     "with a fresh set of attempts and a 'redriven' audit event")
    _selection_options(retry, "dead jobs")

    cancel = _command(sub, "cancel", c.cmd_cancel, "cancel jobs, with a 'cancelled' audit "
                      "event: pending and retry_wait ones at once; a running one (by id "
                      "only) gets a cancel request its worker learns at its next lease "
                      "renewal, and it ends cancelled")
    _selection_options(cancel, "pending jobs", named="jobs (pending, retry_wait or running)")

    prune = _command(sub, "prune", c.cmd_prune, "delete finished jobs and their events older "
                     "than an age, in bounded batches")
    prune.add_argument("--older-than", type=arguments.duration, required=True,
                       metavar="AGE", help="such as 30d, 12h or 90m")
    prune.add_argument("--batch", type=arguments.positive_int, default=1000,
                       help="jobs per batch, each its own short transaction (default 1000)")
    prune.add_argument("--max-batches", type=arguments.positive_int,
                       help="stop after this many batches (default: until done)")

    schedules = _command(sub, "schedules", _needs_subcommand, "periodic jobs: schedules the "
                         "reaper's tick turns into one job per slot")
    schedules_sub = schedules.add_subparsers(title="commands", metavar="COMMAND",
                                             parser_class=Parser)
    schedules_sub.required = True
    add = _command(schedules_sub, "add", c.cmd_schedules_add, "add a schedule, or change the "
                   "one of that name", description=(
                       "Add a schedule, or change the one of that name in the tenant.\n"
                       "EXPRESSION is five-field cron (minute hour day-of-month month\n"
                       "day-of-week, such as '30 2 * * *'), a macro (@hourly, @daily,\n"
                       "@weekly, @monthly, @yearly) or an interval of at least a minute\n"
                       "(@every 10m). Each slot becomes one job of --kind in the tenant."))
    add.add_argument("name", metavar="NAME", help="unique within the tenant")
    add.add_argument("expression", metavar="EXPRESSION")
    add.add_argument("--kind", required=True, help="the kind of the jobs it makes")
    add.add_argument("--tz", default="UTC", metavar="ZONE",
                     help="IANA time zone the expression is read in (default UTC)")
    add.add_argument("--payload", type=arguments.json_object, help="the jobs' payload, a JSON "
                     "object (default {})")
    add.add_argument("--fill", type=int, default=0, metavar="N",
                     help="after an outage or a pause, enqueue up to N missed slots "
                     "(default 0: skip them)")
    add.add_argument("--max-attempts", type=arguments.positive_int, default=6)
    listing = _command(schedules_sub, "list", c.cmd_schedules_list, "schedules, their next "
                       "slots, the last slot enqueued and its job")
    listing.add_argument("--next", type=int, default=3, metavar="N",
                         help="show this many next slots (default 3)")
    for name, run, text in (
            ("pause", c.cmd_schedules_pause, "pause a schedule: no slot is enqueued"),
            ("resume", c.cmd_schedules_resume, "resume a paused schedule (missed slots "
             "follow its --fill)"),
            ("remove", c.cmd_schedules_remove, "remove a schedule; its jobs stay")):
        one = _command(schedules_sub, name, run, text)
        one.add_argument("name", metavar="NAME")
    sync = _command(schedules_sub, "sync", c.cmd_schedules_sync, "write the schedules a "
                    "handlers module declares (@registry.periodic) and remove the code-"
                    "declared ones it no longer does")
    sync.add_argument("--handlers", metavar="MODULE",
                      help="module exposing `registry` (default: $LEASEQ_HANDLERS)")
    add.add_argument("--tenant", type=arguments.uuid_value, default=arguments.SHARED_TENANT,
                     help="the tenant of its jobs (default: the shared tenant, "
                     f"{arguments.SHARED_TENANT})")
    listing.add_argument("--tenant", type=arguments.uuid_value,
                         help="only this tenant's schedules (default: every tenant's)")
    for name in ("pause", "resume", "remove"):
        schedules_sub.choices[name].add_argument(
            "--tenant", type=arguments.uuid_value, default=arguments.SHARED_TENANT,
            help="the schedule's tenant (default: the shared tenant)")

    limits = _command(sub, "limits", _needs_subcommand, "concurrency and rate limits on "
                      "kinds, tenants and limit keys, enforced when jobs are admitted")
    limits_sub = limits.add_subparsers(title="commands", metavar="COMMAND", parser_class=Parser)
    limits_sub.required = True
    names = ("NAME is kind:KIND, tenant:TENANT (tenant:* each tenant), kind:KIND/tenant:TENANT "
             "(kind:KIND/tenant:* each tenant) or key:LIMIT_KEY.")
    put = _command(limits_sub, "set", c.cmd_limits_set, "set a limit, or change it, at run "
                   "time (in force over one declared in code)", description=(
                       "Set a limit, or change it. " + names + " A raised limit admits "
                       "held jobs at once; a lowered one admits no more until the jobs "
                       "admitted drop below it (running jobs are never stopped)."))
    put.add_argument("name", metavar="NAME")
    put.add_argument("--concurrency", type=int, metavar="N", help="at most N running at once")
    put.add_argument("--rate", metavar="R/PERIOD", help="at most R starts per period: 10/s, "
                     "100/m, 1000/h, 5/10s")
    put.add_argument("--burst", type=int, metavar="B", help="at most B of the rate's starts at "
                     "once (default: all R)")
    _command(limits_sub, "list", c.cmd_limits_list, "the limits, which is in force, and each "
             "instance's admitted, running and held jobs")
    gone = _command(limits_sub, "remove", c.cmd_limits_remove, "remove an operator's limit "
                    "(one declared in code is in force again)", description=names)
    gone.add_argument("name", metavar="NAME")
    lsync = _command(limits_sub, "sync", c.cmd_limits_sync, "write the limits a handlers "
                     "module declares (@registry.handler(..., concurrency=, rate=)) and remove "
                     "the code-declared ones it no longer does")
    lsync.add_argument("--handlers", metavar="MODULE",
                       help="module exposing `registry` (default: $LEASEQ_HANDLERS)")

    dashboard = _command(sub, "dashboard", c.cmd_dashboard, "the web dashboard on "
                         "127.0.0.1: queue depth, stuck jobs, timelines, redrive and cancel",
                         description=(
                             "Serve the dashboard Lambda's pages locally: each request "
                             "becomes a function URL event with the IAM principal "
                             "local:$USER, who gets the role of --as. Only the URL it "
                             "prints (with a key made for this run) lets a browser in, "
                             "and only as http://127.0.0.1:PORT or localhost:PORT."))
    dashboard.add_argument("--port", type=int, default=8050,
                           help="port on 127.0.0.1 (default 8050; 0 picks a free one)")
    dashboard.add_argument("--as", dest="role", choices=("operator", "viewer", "tenant"),
                           default="operator",
                           help="operator (default) may redrive and cancel; viewer reads "
                           "every tenant; tenant reads one tenant through --reader-url")
    dashboard.add_argument("--tenant", type=arguments.uuid_value,
                           help="with --as tenant: the tenant to view")
    dashboard.add_argument("--reader-url", metavar="URL",
                           help="with --as tenant: a tenant reader's connection string")
    dashboard.add_argument("--log-requests", dest="verbose_http", action="store_true",
                           help="one line per request on stderr, with its time")

    db = _command(sub, "db", _needs_subcommand, "the embedded PostgreSQL")
    db_sub = db.add_subparsers(title="commands", metavar="COMMAND", parser_class=Parser)
    db_sub.required = True
    _command(db_sub, "start", c.cmd_db_start, "start it (and migrate) if it is not running")
    _command(db_sub, "stop", c.cmd_db_stop, "stop it; the data stays for next time")
    _command(db_sub, "status", c.cmd_db_status, "is it running, where, as whom")
    url = _command(db_sub, "url", c.cmd_db_url, "print a connection string for it")
    url.add_argument("--role", choices=("worker", "owner"), default="worker")

    from leaseq_cli.commands import lambda_service
    lambda_service.register(sub, _command, _needs_subcommand, Parser)
    return parser


def _needs_subcommand(args: argparse.Namespace, ui: Any) -> int:
    raise UsageError("this command needs a subcommand (see --help)")


def main(argv: Sequence[str] | None = None) -> int:
    verbose = False
    try:
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        args = build_parser().parse_args(argv)
        verbose = bool(getattr(args, "verbose", False))
        if not verbose:
            # Library warnings (Powertools' "no metrics to publish", ...) are for
            # developers: --verbose shows them, a plain run keeps stderr to one line.
            warnings.simplefilter("ignore")
        args.database_url = getattr(args, "database_url", None)
        from leaseq_cli.render import Ui

        ui = Ui(json_output=bool(getattr(args, "json", False)),
                no_color=bool(getattr(args, "no_color", False)), verbose=verbose)
        run: Command = args.run
        return int(run(args, ui))
    except SystemExit as exc:  # --help and --version print and exit 0
        return int(exc.code) if isinstance(exc.code, int) else 0
    except BaseException as exc:
        message, code = describe(exc)
        if verbose:
            traceback.print_exc()
        sys.stderr.write(f"leaseq: error: {message}\n")
        sys.stderr.flush()
        return int(code)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
