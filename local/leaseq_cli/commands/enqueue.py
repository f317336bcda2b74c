"""leaseq enqueue: one job from options, or many from a JSON-lines file; and
``leaseq enqueue resubmit``, the enqueue dead-letter queue sent to the function again."""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from pathlib import Path
from typing import Any, TextIO

from leaseq.base.errors import InvalidRequestError
from leaseq.base.jobs import EnqueueRequest
from leaseq.base.limits import MAX_ENQUEUE, MAX_ENQUEUE_BYTES
from leaseq.base.storable import json_size
from leaseq.store.duties import ProducerClient
from pydantic import ValidationError
from rich.console import Console

from leaseq_cli.commands._shared import client_for
from leaseq_cli.failures import CliError, ConflictError, UsageError
from leaseq_cli.render import Ui, table

# enqueue --------------------------------------------------------------------------------


#: Jobs per enqueue call: the SQL contract's batch bound.
ENQUEUE_CHUNK = MAX_ENQUEUE


def _chunks(requests: list[EnqueueRequest]) -> list[tuple[int, list[EnqueueRequest]]]:
    """The file's jobs as enqueue calls, in order, with the index of each call's first
    job: each call holds at most ENQUEUE_CHUNK jobs and MAX_ENQUEUE_BYTES of payloads,
    the SQL contract's bounds on one call, so a file of any size goes in calls the
    database takes (a file is not one call, as it is not one transaction)."""
    chunks: list[tuple[int, list[EnqueueRequest]]] = []
    start, size = 0, 0
    for index, request in enumerate(requests):
        payload = json_size(request.payload)
        if index > start and (index - start == ENQUEUE_CHUNK
                              or size + payload > MAX_ENQUEUE_BYTES):
            chunks.append((start, requests[start:index]))
            start, size = index, 0
        size += payload
    chunks.append((start, requests[start:]))
    return chunks


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
        except (ValueError, RecursionError) as exc:
            # Valid JSON that Python cannot read: an integer of more than 4,300 digits,
            # or nesting deeper than the stack. Neither could be enqueued anyway.
            raise UsageError(f"{where} cannot be read ({exc}); numbers may have at most "
                             "1000 characters and payloads nest at most 100 levels") from None
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
        if (args.kind or args.payload is not None or args.key or args.priority is not None
                or args.queue is not None or args.limit_key is not None):
            raise UsageError("give either --file (each line may carry its priority and "
                             "queue) or --kind/--payload/--key/--priority/--queue/--limit-key,"
                             " not both")
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
        correlation_id=args.correlation_id, priority=args.priority, queue=args.queue,
        limit_key=args.limit_key)]


def _check_with_handlers(module: str, requests: list[EnqueueRequest]) -> list[EnqueueRequest]:
    """Refuse the whole command, naming each job at fault, when the handlers module's
    registry refuses a kind or a payload (as a bad line refuses it: nothing is sent);
    else the requests, each in its kind's declared queue when it names none."""
    from leaseq_lambda.runtime import load_registry

    registry = load_registry(module, variable="--handlers")
    problems: list[str] = []
    for number, request in enumerate(requests, start=1):
        try:
            registry.check(request.kind, request.payload)
        except InvalidRequestError as exc:
            problems.append(f"job {number} (operation key {request.operation_key!r}): "
                            f"{exc.message}")
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more"
                                            if len(problems) > 5 else "")
        raise UsageError(f"{len(problems)} of {len(requests)} jobs do not fit the handlers of "
                         f"{module} and nothing was enqueued: {shown}")
    return [registry.routed(request) for request in requests]


def cmd_enqueue(args: argparse.Namespace, ui: Ui) -> int:
    requests = _read_requests(args)
    if args.handlers:
        requests = _check_with_handlers(args.handlers, requests)
    with client_for(args, ui, ProducerClient) as client:
        results = []
        for start, chunk in _chunks(requests):
            for result in client.enqueue_jobs(chunk):
                results.append((start + result.index, result))
    counts = {s: sum(1 for _, r in results if r.status == s)
              for s in ("created", "existing", "conflict", "rejected")}
    rows: list[dict[str, Any]] = [
        {"index": i, "job_id": r.job_id, "status": r.status,
         "state": None if r.state is None else r.state.value,
         "tenant_id": requests[i].tenant_id, "operation_key": requests[i].operation_key,
         "kind": requests[i].kind, **({"error": r.error} if r.rejected else {})}
        for i, r in results]

    def render(out: Console) -> None:
        if len(rows) <= 20:
            shown = table("job id", "tenant", "kind", "operation key", "status")
            for row in rows:
                status = row["status"]
                style = {"created": "green", "existing": "dim", "conflict": "bold red",
                         "rejected": "bold red"}[status]
                shown.add_row(str(row["job_id"] or "-"), str(row["tenant_id"]), row["kind"],
                              row["operation_key"], f"[{style}]{status}[/]")
            out.print(shown)
        out.print(f"{counts['created']} created, {counts['existing']} already existed, "
                  f"{counts['conflict']} conflicts, {counts['rejected']} rejected")

    ui.emit({"counts": counts, "jobs": rows}, render)
    if counts["rejected"]:
        first = next(r for r in rows if r["status"] == "rejected")
        raise UsageError(
            f"{counts['rejected']} jobs were rejected by the database and not enqueued "
            f"(first: operation key {first['operation_key']!r}: {first['error']}); "
            "the others were enqueued")
    if counts["conflict"]:
        first = next(r for r in rows if r["status"] == "conflict")
        raise ConflictError(
            f"{counts['conflict']} operation keys already name a job with another kind or "
            f"payload (first: {first['operation_key']!r} of tenant {first['tenant_id']}); use "
            "new keys for new jobs")
    return 0


# enqueue resubmit -----------------------------------------------------------------------


def cmd_enqueue_resubmit(args: argparse.Namespace, ui: Ui) -> int:
    """Resubmit the enqueue dead-letter queue's messages to the enqueue function."""
    from leaseq_lambda.dead_letters import MessageOutcome, resubmit
    from leaseq_lambda.producer import EnqueueFunction

    from leaseq_cli.aws import required, stack_outputs
    from leaseq_cli.commands._shared import aws_clients

    clients = aws_clients(args)
    queue_url, function = args.queue_url, args.function
    stack = getattr(args, "stack", None)
    if stack:
        outputs = stack_outputs(stack, clients)
        if not queue_url:
            (queue_url,) = required(outputs, stack, "EnqueueDeadLetterQueueUrl")
        if not function:
            (function,) = required(outputs, stack, "EnqueueFunctionArn")
    if not queue_url or not function:
        raise UsageError("say which queue and function: --stack NAME, or --queue-url URL "
                         "--function NAME")
    style = {"resubmitted": "green", "rejected": "bold red", "unreadable": "bold red",
             "failed": "bold red"}

    def show(outcome: MessageOutcome) -> None:
        if not ui.json_output:
            ui.note(f"[{style[outcome.outcome]}]{outcome.outcome}[/] {outcome.message_id}: "
                    f"{outcome.created} created, {outcome.existing} existing. "
                    f"{outcome.detail}")

    report = resubmit(queue_url, EnqueueFunction(function, client=clients.client("lambda")),
                      sqs=clients.client("sqs"), limit=args.limit, on_message=show)
    counts = {name: report.count(name)
              for name in ("resubmitted", "rejected", "unreadable", "failed")}
    ui.emit({"counts": counts, "messages": [vars(m) for m in report.messages]},
            lambda out: out.print(
                f"{counts['resubmitted']} resubmitted and deleted, {counts['rejected']} "
                f"rejected, {counts['unreadable']} unreadable (both left in the queue)"))
    if report.stopped_on_failure:
        raise CliError(f"the enqueue function failed again, so the cause is not fixed; "
                       f"stopped with the message left in the queue ({report.messages[-1].detail})")
    if counts["rejected"] or counts["unreadable"]:
        raise ConflictError(
            f"{counts['rejected'] + counts['unreadable']} messages cannot be resubmitted as "
            "they are (see above); they stay in the queue: correct the jobs and enqueue them "
            "anew, then delete the messages")
    return 0
