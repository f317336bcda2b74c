"""leaseq.base.limits names the SQL contract's bounds: each is exactly the database's own.

At each bound the call goes through; one step beyond it the database refuses it
(SQLSTATE 22023), so a Python check written with these names refuses what the database
would and nothing more.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from leaseq import EnqueueRequest, InvalidRequestError, JobOutcome, QueueClient
from leaseq.base import limits
from psycopg.types.json import Jsonb
from pydantic import ValidationError

from tests.library.support import enqueue, requests
from tests.support.postgres import Conn

SECOND = timedelta(seconds=1)


def claim(lease: timedelta = timedelta(seconds=30), count: int = 1) -> Callable[[QueueClient],
                                                                              Any]:
    return lambda client: client.claim_ready_jobs("limits", count, lease)


@pytest.mark.parametrize(("at_bound", "beyond"), [
    pytest.param(claim(count=limits.MAX_CLAIM), claim(count=limits.MAX_CLAIM + 1),
                 id="MAX_CLAIM"),
    pytest.param(claim(lease=limits.MAX_LEASE), claim(lease=limits.MAX_LEASE + SECOND),
                 id="MAX_LEASE"),
    pytest.param(claim(lease=limits.MIN_LEASE), claim(lease=limits.MIN_LEASE - SECOND / 2),
                 id="MIN_LEASE"),
    pytest.param(lambda c: c.release_all_expired_jobs(limits.MAX_PAGE),
                 lambda c: c.release_all_expired_jobs(limits.MAX_PAGE + 1),
                 id="MAX_PAGE release_all_expired_jobs"),
    pytest.param(lambda c: c.repair_tenant_turns(limits.MAX_PAGE),
                 lambda c: c.repair_tenant_turns(limits.MAX_PAGE + 1),
                 id="MAX_PAGE repair_tenant_turns"),
    pytest.param(lambda c: c.prune_retained_jobs(limits.MAX_RETENTION, limits.MAX_PAGE),
                 lambda c: c.prune_retained_jobs(limits.MAX_RETENTION, limits.MAX_PAGE + 1),
                 id="MAX_PAGE prune_retained_jobs"),
    pytest.param(lambda c: c.prune_retained_jobs(limits.MAX_RETENTION, 1),
                 lambda c: c.prune_retained_jobs(limits.MAX_RETENTION + SECOND, 1),
                 id="MAX_RETENTION"),
])
def test_a_call_at_the_bound_goes_through_and_one_beyond_it_is_refused(
        client: QueueClient, at_bound: Callable[[QueueClient], Any],
        beyond: Callable[[QueueClient], Any]) -> None:
    at_bound(client)
    with pytest.raises(InvalidRequestError) as refused:
        beyond(client)
    assert refused.value.sqlstate == "22023"


def test_an_enqueue_call_takes_max_enqueue_jobs_and_no_more(client: QueueClient) -> None:
    tenant = uuid.uuid4()
    batch = requests(tenant, limits.MAX_ENQUEUE + 1)

    assert all(r.created for r in client.enqueue_jobs(batch[:-1]))
    with pytest.raises(InvalidRequestError, match="number of jobs must be between 1 and "
                                                  f"{limits.MAX_ENQUEUE}"):
        client.enqueue_jobs(batch)


def test_a_job_takes_max_attempts_and_no_more(client: QueueClient) -> None:
    tenant = uuid.uuid4()
    # Past the model's own check (the same bound), to reach the database's.
    at_bound, beyond = (EnqueueRequest.model_construct(
        tenant_id=tenant, operation_key=f"attempts-{n}", kind="echo", payload={},
        available_at=None, max_attempts=n, correlation_id=None)
        for n in (limits.MAX_ATTEMPTS, limits.MAX_ATTEMPTS + 1))

    results = client.enqueue_jobs([at_bound, beyond])

    assert [r.status for r in results] == ["created", "rejected"]
    assert f"max_attempts must be between 1 and {limits.MAX_ATTEMPTS}" in str(results[1].error)


def test_a_retry_waits_at_most_max_retry_delay(client: QueueClient) -> None:
    enqueue(client, uuid.uuid4(), 2)
    first, second = client.claim_ready_jobs("limits", 2, timedelta(seconds=30))

    with pytest.raises(InvalidRequestError) as refused:
        client.finish_jobs("limits", [JobOutcome(
            second, "retry", {"code": "X", "message": "later"},
            retry_delay=limits.MAX_RETRY_DELAY + SECOND)])
    states = client.finish_jobs("limits", [JobOutcome(
        first, "retry", {"code": "X", "message": "later"}, retry_delay=limits.MAX_RETRY_DELAY)])

    assert refused.value.sqlstate == "22023"
    assert list(states.values()) == ["retry_wait"]


def _payload_of(size: int) -> dict[str, str]:
    """A payload of exactly ``size`` bytes as JSON text: ``{"d": "x..."}``."""
    return {"d": "x" * (size - 9)}


def _sql_answer(owner: Conn, requests: list[EnqueueRequest]) -> str:
    """What app.enqueue_jobs itself says of ``requests`` (sent past the library)."""
    with pytest.raises(psycopg.errors.InvalidParameterValue) as refused, \
            owner.transaction(force_rollback=True):
        owner.execute("select * from app.enqueue_jobs(%s, %s, %s, %s)", (
            [r.tenant_id for r in requests], [r.operation_key for r in requests],
            [r.kind for r in requests], [Jsonb(r.payload) for r in requests]))
    return refused.value.diag.message_primary or ""


def test_an_enqueue_call_takes_max_enqueue_bytes_of_payloads_and_no_more(
        client: QueueClient, owner: Conn) -> None:
    """At the bound the call is stored; one payload more and the library refuses it
    before sending anything, with the database's own message."""
    tenant = uuid.uuid4()
    per_payload = limits.MAX_ENQUEUE_BYTES // 64
    at_bound = [EnqueueRequest(tenant_id=tenant, operation_key=f"big-{i}", kind="echo",
                               payload=_payload_of(per_payload)) for i in range(64)]
    beyond = [*at_bound, EnqueueRequest(tenant_id=tenant, operation_key="one-more",
                                        kind="echo")]
    database_says = _sql_answer(owner, beyond)

    with pytest.raises(InvalidRequestError) as refused:
        client.enqueue_jobs(beyond)
    assert refused.value.sqlstate == "22023"
    assert refused.value.message == database_says
    assert database_says.startswith("enqueue call too large:")
    assert owner.execute("select count(*) as n from app.jobs").fetchone() == {"n": 0}

    assert all(r.created for r in client.enqueue_jobs(at_bound))


@pytest.mark.parametrize(("field", "value", "code_point"), [
    ("kind", "report\n", "U+000A at character 7"),
    ("kind", "\u202ereport", "U+202E at character 1"),
    ("operation_key", "order-1\x1b[2J", "U+001B at character 8"),
    ("correlation_id", "trace\u2028id", "U+2028 at character 6"),
])
def test_the_model_refuses_a_name_with_the_database_message(
        client: QueueClient, field: str, value: str, code_point: str) -> None:
    fields: dict[str, Any] = {"tenant_id": uuid.uuid4(), "operation_key": "k",
                              "kind": "echo", "payload": {}, "available_at": None,
                              "max_attempts": None, "correlation_id": None, field: value}
    (sent,) = client.enqueue_jobs([EnqueueRequest.model_construct(**fields)])

    with pytest.raises(ValidationError) as refused:
        EnqueueRequest.model_validate(fields)

    assert sent.status == "rejected"
    assert sent.error == f"job 1: {field} {refused.value.errors()[0]['ctx']['error']!s}"
    assert f"(found {code_point}; remove it)" in str(sent.error)
