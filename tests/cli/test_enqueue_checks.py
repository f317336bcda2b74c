"""leaseq enqueue --handlers: jobs checked against the handlers module's registry first."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from tests.cli.conftest import Cli
from tests.library.support import jobs
from tests.support.postgres import Conn

HANDLERS = "tests.functions.handlers"


def test_enqueue_with_handlers_refuses_unknown_kinds_and_bad_payloads_and_enqueues_nothing(
        cli: Cli, tmp_path: Path, owner: Conn) -> None:
    path = tmp_path / "jobs.jsonl"
    lines = [{"operation_key": "ok", "kind": "charge_card",
              "payload": {"order_id": "1", "amount_cents": 5}},
             {"operation_key": "typo", "kind": "charge_crad", "payload": {}},
             {"operation_key": "short", "kind": "charge_card", "payload": {"order_id": "2"}}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")

    result = cli("enqueue", "--file", str(path), "--tenant", str(uuid.uuid4()),
                 "--handlers", HANDLERS)

    assert result.code != 0
    message = " ".join(result.err.split())
    assert "2 of 3 jobs do not fit the handlers of tests.functions.handlers" in message
    assert "job 2 (operation key 'typo'): unknown kind 'charge_crad'" in message
    assert "job 3 (operation key 'short'): the payload does not fit" in message
    assert "payload.amount_cents: Field required" in message
    assert jobs(owner) == []


def test_enqueue_with_handlers_enqueues_jobs_that_fit(cli: Cli, owner: Conn) -> None:
    result = cli("enqueue", "--tenant", str(uuid.uuid4()), "--kind", "send_welcome_email",
                 "--payload", '{"to": "ada@example.com"}', "--handlers", HANDLERS, "--json")

    assert result.code == 0, result.err
    assert [row["kind"] for row in jobs(owner)] == ["send_welcome_email"]


def test_enqueue_without_handlers_does_not_check_kinds(cli: Cli, owner: Conn) -> None:
    result = cli("enqueue", "--tenant", str(uuid.uuid4()), "--kind", "charge_crad", "--json")

    assert result.code == 0, result.err
    assert [row["kind"] for row in jobs(owner)] == ["charge_crad"]


def test_enqueue_with_a_handlers_module_that_cannot_be_imported_says_so(cli: Cli) -> None:
    result = cli("enqueue", "--tenant", str(uuid.uuid4()), "--kind", "x",
                 "--handlers", "no_such_module_here")

    assert result.code != 0
    assert "--handlers='no_such_module_here' cannot be imported" in " ".join(result.err.split())
