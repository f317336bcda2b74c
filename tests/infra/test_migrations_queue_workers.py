"""A named queue's Registration custom resource (infra/queue.yaml), served by the migrations
function against a real PostgreSQL and a real HTTP endpoint standing in for CloudFormation.

What a deployment needs from it: the queue's worker recorded for the enqueue function to
wake (readable by producers, and by nothing else but the owner), the connections of every
queue counted with the leaseq stack's own so that the sum fits the database, a refusal that
names the numbers when it does not (also when two queues deploy at once), and a Delete that
removes only its own stack's registration.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import psycopg
import pytest

from tests.conftest import Database
from tests.infra.conftest import ResponseEndpoint
from tests.infra.test_migrations_custom_resource import (
    no_connection,
    request,
    server_limits,
)
from tests.support import postgres

QUEUE_STACK = "arn:aws:cloudformation:us-east-1:123456789012:stack/leaseq-dev-Reports-1/9a8b"
OTHER_STACK = "arn:aws:cloudformation:us-east-1:123456789012:stack/other-Reports-7/1c2d"


def registration(request_type: str, endpoint: ResponseEndpoint, *, queue: str = "reports",
                 reserved: str = "3", max_workers: str = "2", stack_id: str = QUEUE_STACK,
                 function: str = "leaseq-dev-reports",
                 old: dict[str, str] | None = None) -> dict[str, Any]:
    """A request shaped like the one infra/queue.yaml's Registration makes CloudFormation
    send."""
    event: dict[str, Any] = {
        "RequestType": request_type,
        "ResponseURL": endpoint.url(f"r-{uuid.uuid4().hex[:6]}"),
        "StackId": stack_id,
        "RequestId": str(uuid.uuid4()),
        "ResourceType": "Custom::LeaseqQueueRegistration",
        "LogicalResourceId": "Registration",
        "ResourceProperties": {
            "ServiceToken": "arn:aws:lambda:us-east-1:123456789012:function:migrations",
            "QueueName": queue,
            "WorkerFunction": function,
            "ReservedConcurrency": reserved,
            "MaxWorkers": max_workers,
        },
    }
    if old is not None:
        event["OldResourceProperties"] = old
    return event


def answer(endpoint: ResponseEndpoint) -> dict[str, Any]:
    body: dict[str, Any] = endpoint.puts[-1].body
    return body


def deploy_leaseq(migrations_app: Any, database: Database, endpoint: ResponseEndpoint,
                  logins: dict[str, str], request_type: str = "Create") -> dict[str, Any]:
    migrations_app.handle(request(request_type, endpoint, logins=logins), None,
                          owner_dsn=lambda: database.owner_dsn)
    body = answer(endpoint)
    assert body["Status"] == "SUCCESS", body.get("Reason")
    return body


def registered(database: Database) -> dict[str, dict[str, Any]]:
    with database.connect(postgres.OWNER) as owner:
        rows = owner.execute("select * from app.queue_workers").fetchall()
    return {row["queue"]: row for row in rows}


def test_a_queues_registration_records_its_worker_for_producers_to_wake_and_no_one_else(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str],
) -> None:
    deploy_leaseq(migrations_app, database, response_endpoint, logins)

    migrations_app.handle(registration("Create", response_endpoint), None,
                          owner_dsn=lambda: database.owner_dsn)

    body = answer(response_endpoint)
    assert body["Status"] == "SUCCESS", body.get("Reason")
    # The leaseq stack's 14 (the template's defaults) and this queue's 3.
    assert "3 connections; the deployment can open 17 of" in body["Data"]["Registration"]
    row = registered(database)["reports"]
    assert (row["function_name"], row["connections"], row["stack_id"]) == (
        "leaseq-dev-reports", 3, QUEUE_STACK)
    with database.connect(logins["EnqueueDbUser"]) as producer:
        assert producer.execute("select app.queue_worker_function('reports') as f"
                                ).fetchone() == {"f": "leaseq-dev-reports"}
        assert producer.execute("select app.queue_worker_function('pdf') as f"
                                ).fetchone() == {"f": None}
    for prop in ("WorkerDbUser", "ReaperDbUser", "OperatorDbUser"):
        with database.connect(logins[prop]) as other, pytest.raises(
                psycopg.errors.InsufficientPrivilege):
            other.execute("select app.queue_worker_function('reports')")


def test_the_leaseq_stacks_budget_counts_every_registered_queue(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str],
) -> None:
    deploy_leaseq(migrations_app, database, response_endpoint, logins)
    migrations_app.handle(registration("Create", response_endpoint, reserved="4",
                                       max_workers="3"), None,
                          owner_dsn=lambda: database.owner_dsn)
    assert answer(response_endpoint)["Status"] == "SUCCESS"

    body = deploy_leaseq(migrations_app, database, response_endpoint, logins, "Update")

    summary = body["Data"]["ConnectionBudget"]
    assert summary.startswith("18 of "), summary
    assert "OperatorConnections 3 + queue reports 4 = 18" in summary


def test_a_registration_that_would_not_fit_the_database_is_refused_with_the_figures(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str],
) -> None:
    deploy_leaseq(migrations_app, database, response_endpoint, logins)
    limits = server_limits(database)
    allowed = min(limits.max_connections * 50 // 100, limits.ordinary - 1)
    too_many = allowed - 14 + 1

    migrations_app.handle(registration("Create", response_endpoint, reserved=str(too_many)),
                          None, owner_dsn=lambda: database.owner_dsn)

    body = answer(response_endpoint)
    assert body["Status"] == "FAILED"
    assert (f"queue reports's worker can open {too_many} connections, and with the leaseq "
            f"stack's 14 and the other queues' 0 (none) the deployment would open "
            f"{allowed + 1}, more than the {allowed} the database allows") in body["Reason"]
    assert "ProxyMaxConnectionsPercent 50%" in body["Reason"]
    assert "Lower this queue's ReservedConcurrency" in body["Reason"]
    assert registered(database) == {}


def test_two_queues_registering_at_once_are_counted_one_after_the_other(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str],
) -> None:
    """Room for one of them: the second waits for the first's commit and is refused."""
    deploy_leaseq(migrations_app, database, response_endpoint, logins)
    outcome: dict[str, Any] = {}
    with database.connect(postgres.OWNER) as first:
        first.execute("begin")
        first.execute("select app.register_queue_worker('reports', 'f-reports', 5, %s, 20)",
                      (QUEUE_STACK,))

        def second() -> None:
            with database.connect(postgres.OWNER) as conn:
                try:
                    conn.execute("select app.register_queue_worker('pdf', 'f-pdf', 5, %s, 20)",
                                 (OTHER_STACK,))
                    outcome["result"] = "registered"
                except psycopg.Error as exc:
                    outcome["result"] = exc.sqlstate

        thread = threading.Thread(target=second)
        thread.start()
        thread.join(0.5)
        assert thread.is_alive()  # waiting for the first registration's lock
        first.execute("commit")
        thread.join(10)
    assert outcome == {"result": "53400"}  # 14 + 5 + 5 > 20
    assert set(registered(database)) == {"reports"}


def test_a_queue_belongs_to_the_stack_that_registered_it_and_only_its_delete_removes_it(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str],
) -> None:
    deploy_leaseq(migrations_app, database, response_endpoint, logins)
    dsn = {"owner_dsn": lambda: database.owner_dsn}
    migrations_app.handle(registration("Create", response_endpoint), None, **dsn)
    assert answer(response_endpoint)["Status"] == "SUCCESS"

    migrations_app.handle(registration("Create", response_endpoint, stack_id=OTHER_STACK,
                                       function="other-reports"), None, **dsn)
    refused = answer(response_endpoint)
    assert refused["Status"] == "FAILED"
    assert f"queue reports already has a worker function, registered by stack {QUEUE_STACK}" \
        in refused["Reason"]

    migrations_app.handle(registration("Delete", response_endpoint, stack_id=OTHER_STACK),
                          None, **dsn)
    assert answer(response_endpoint)["Reason"] == "queue reports: worker was not registered"
    assert registered(database)["reports"]["function_name"] == "leaseq-dev-reports"

    migrations_app.handle(registration("Delete", response_endpoint), None, **dsn)
    assert answer(response_endpoint)["Status"] == "SUCCESS"
    assert registered(database) == {}


def test_an_update_that_renames_the_queue_moves_the_registration(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str],
) -> None:
    deploy_leaseq(migrations_app, database, response_endpoint, logins)
    dsn = {"owner_dsn": lambda: database.owner_dsn}
    migrations_app.handle(registration("Create", response_endpoint), None, **dsn)
    migrations_app.handle(registration("Update", response_endpoint, queue="invoices",
                                       old={"QueueName": "reports"}), None, **dsn)
    body = answer(response_endpoint)
    assert body["Status"] == "SUCCESS", body.get("Reason")
    assert set(registered(database)) == {"invoices"}


@pytest.mark.parametrize(("properties", "message"), [
    ({"queue": "Reports"}, "the resource property QueueName"),
    ({"function": ""}, "WorkerFunction must name the queue's worker function"),
    ({"reserved": "three"}, "ReservedConcurrency must be a whole number from 0 to 10000"),
    ({"reserved": "2", "max_workers": "2"},
     "ReservedConcurrency 2 is less than MaxWorkers 2 + 1"),
])
def test_bad_registration_properties_are_refused_before_connecting(
    migrations_app: Any, response_endpoint: ResponseEndpoint, properties: dict[str, str],
    message: str,
) -> None:
    migrations_app.handle(registration("Create", response_endpoint, **properties), None,
                          owner_dsn=no_connection)
    body = answer(response_endpoint)
    assert body["Status"] == "FAILED"
    assert message in body["Reason"]


def test_a_delete_that_cannot_reach_the_database_still_lets_the_stack_go(
    migrations_app: Any, response_endpoint: ResponseEndpoint,
) -> None:
    migrations_app.handle(registration("Delete", response_endpoint), None,
                          owner_dsn=lambda: "postgresql://nobody@127.0.0.1:1/none")
    body = answer(response_endpoint)
    assert body["Status"] == "SUCCESS"
    assert body["Reason"].startswith("registration not removed: the database is unreachable")
