"""functions/enqueue/app.py with the handlers registry (LEASEQ_ENQUEUE_HANDLERS): a job
of a kind no handler registers, or whose payload its kind's model refuses, is rejected
item by item with the model's errors before anything is stored; without the setting,
kinds and payloads are not checked at the door."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from leaseq import ConfigurationError
from leaseq_lambda import runtime
from leaseq_lambda.enqueue import EnqueueRejectedError

from tests.functions.conftest import HANDLERS_MODULE, Output, load_app, load_event
from tests.library.support import jobs
from tests.support.fakes import FakeLambdaContext
from tests.support.postgres import Conn


def invoke(app: ModuleType, event: Any) -> dict[str, Any]:
    answer: dict[str, Any] = app.lambda_handler(
        event, FakeLambdaContext(function_name="leaseq-enqueue"))
    return answer


@pytest.fixture
def checking_door(lambda_env: pytest.MonkeyPatch) -> ModuleType:
    """The function as the stack deploys it with EnqueueChecksJobs: the workers' handlers
    module named in LEASEQ_ENQUEUE_HANDLERS."""
    lambda_env.setenv("LEASEQ_ENQUEUE_HANDLERS", HANDLERS_MODULE)
    runtime.reset()
    return load_app("enqueue")


def _batch_with_bad_items() -> dict[str, Any]:
    batch = load_event("enqueue_batch")
    good, welcome, image = batch["jobs"]
    unknown = {**copy.deepcopy(good), "operation_key": "order-1001/ship", "kind": "ship_order"}
    bad_welcome = {**welcome, "payload": {"name": "Grace", "cc": "x@example.com"}}
    bad_image = {**image, "payload": {**image["payload"], "width": "wide"}}
    return {"jobs": [good, unknown, bad_welcome, bad_image]}


def test_a_checking_door_rejects_an_unknown_kind_and_bad_payloads_and_stores_the_rest(
        checking_door: ModuleType, owner: Conn, read_output: Callable[[], Output]) -> None:
    answer = invoke(checking_door, _batch_with_bad_items())

    assert [r["status"] for r in answer["results"]] == ["created"] + ["rejected"] * 3
    (row,) = jobs(owner)
    assert (str(row["id"]), row["kind"]) == (answer["results"][0]["job_id"], "charge_card")
    unknown, welcome, image = answer["results"][1:]
    assert unknown["reason"].startswith("unknown kind 'ship_order': the handlers register ")
    assert "charge_card" in unknown["reason"]
    assert unknown["errors"][0]["field"] == "kind"
    assert unknown["errors"][0]["type"] == "unknown_kind"
    # The model's own errors, field by field, under "payload"; never the value sent.
    assert {(e["field"], e["type"]) for e in welcome["errors"]} == {
        ("payload.to", "missing"), ("payload.cc", "extra_forbidden")}
    assert "WelcomeEmail" in welcome["reason"]
    assert [(e["field"], e["type"]) for e in image["errors"]] == [
        ("payload.width", "int_parsing")]
    assert "wide" not in str(image)
    assert all("sqlstate" not in r for r in answer["results"][1:])
    rejected = read_output().messages("job rejected")
    assert [line["kind"] for line in rejected] == ["ship_order", "send_welcome_email",
                                                   "resize_image"]


def test_a_checking_door_accepts_what_the_handlers_accept(
        checking_door: ModuleType, owner: Conn) -> None:
    answer = invoke(checking_door, load_event("enqueue_batch"))

    assert (answer["created"], answer["rejected"]) == (3, 0)
    assert len(jobs(owner)) == 3


def test_without_a_registry_the_door_stores_any_kind_and_payload_as_before(
        enqueue_app: ModuleType, owner: Conn) -> None:
    answer = invoke(enqueue_app, _batch_with_bad_items())

    assert [r["status"] for r in answer["results"]] == ["created"] * 4
    assert len(jobs(owner)) == 4


def test_an_asynchronous_batch_with_refused_jobs_fails_after_storing_the_others(
        checking_door: ModuleType, owner: Conn) -> None:
    event = load_event("enqueue_eventbridge")
    event["detail"] = _batch_with_bad_items()

    with pytest.raises(EnqueueRejectedError,
                       match=r"3 of 4 jobs rejected .*job 1: unknown kind 'ship_order'"):
        invoke(checking_door, event)
    assert [row["kind"] for row in jobs(owner)] == ["charge_card"]


def test_a_handlers_module_that_cannot_be_imported_fails_the_invocation_and_stores_nothing(
        lambda_env: pytest.MonkeyPatch, owner: Conn) -> None:
    lambda_env.setenv("LEASEQ_ENQUEUE_HANDLERS", "tests.functions.no_such_handlers")
    runtime.reset()
    app = load_app("enqueue")

    with pytest.raises(ConfigurationError,
                       match=r"LEASEQ_ENQUEUE_HANDLERS=.*no_such_handlers.*cannot be imported"):
        invoke(app, load_event("enqueue_direct"))
    assert jobs(owner) == []


def test_a_declared_kind_defers_through_the_enqueue_function_as_on_a_connection(
        checking_door: ModuleType, owner: Conn) -> None:
    from leaseq import IdempotencyConflictError
    from leaseq.base.errors import PayloadRejectedError
    from leaseq_lambda.producer import EnqueueFunction

    from tests.functions import handlers
    from tests.support.lambda_service import InProcessLambda

    service = InProcessLambda(checking_door)
    function = EnqueueFunction(service.function_name, client=service)
    tenant = uuid.UUID(load_event("enqueue_direct")["tenant_id"])
    welcome = handlers.WelcomeEmail(to="ada@example.com")

    first = handlers.send_welcome_email.defer(function, tenant, "welcome-ada", welcome)
    again = handlers.send_welcome_email.defer(function, tenant, "welcome-ada", welcome)

    assert (first.status, again.status, again.job_id) == ("created", "existing", first.job_id)
    (row,) = jobs(owner)
    assert (row["id"], row["payload"]) == (first.job_id, {"to": "ada@example.com",
                                                          "name": "there"})
    with pytest.raises(IdempotencyConflictError, match="idempotency conflict"):
        handlers.send_welcome_email.defer(function, tenant, "welcome-ada",
                                          handlers.WelcomeEmail(to="bob@example.com"))
    calls = len(service.calls)
    untyped: Any = {"name": "no address"}
    with pytest.raises(PayloadRejectedError, match=r"payload\.to"):
        handlers.send_welcome_email.defer(function, tenant, "welcome-x", untyped)
    assert len(service.calls) == calls  # refused before the function is invoked
