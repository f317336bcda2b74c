"""Argument shapes every function refuses alike: arrays that are not one-dimensional
and indexed from 1 (the claims' kind filters among them), and names (owner, actor) made
only of invisible characters.

Called as the all-duty worker login. Each call is otherwise valid, so the refusal is the
one under test, and a refused call changes nothing.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from tests.sql.calls import claim_one, enqueue, new_tenant, raises_sqlstate, snapshot
from tests.support.postgres import Conn


@dataclass(frozen=True)
class Argument:
    name: str
    type: str  # the SQL type of the argument, for its cast
    value: Any  # a valid value; for an array, a one-element list


@dataclass(frozen=True)
class Call:
    function: str
    arguments: tuple[Argument, ...]


@dataclass(frozen=True)
class Jobs:
    """One job in each state the array functions act on."""

    running: dict[str, Any]
    dead: uuid.UUID
    pending: uuid.UUID


def _outcome_arguments(jobs: Jobs, *, empty: bool = False) -> tuple[Argument, ...]:
    """A finish of the running job: the six outcome arrays (or six empty ones)."""
    lease = jobs.running
    values: list[tuple[str, str, list[Any]]] = [
        ("p_tenant_ids", "uuid[]", [lease["tenant_id"]]),
        ("p_job_ids", "uuid[]", [lease["id"]]),
        ("p_tokens", "uuid[]", [lease["lease_token"]]),
        ("p_outcomes", "text[]", ["succeeded"]),
        ("p_details", "jsonb[]", [Jsonb({"ok": True})]),
        ("p_retry_delays", "interval[]", [None]),
    ]
    return tuple(Argument(name, type_, [] if empty else value) for name, type_, value in values)


def _kind_filter(name: str) -> tuple[Argument, Argument]:
    """A claim's kind filter: ``name`` (p_kinds or p_exclude_kinds) set, the other NULL."""
    kinds = ["email.send"]
    return (Argument("p_kinds", "text[]", kinds if name == "p_kinds" else None),
            Argument("p_exclude_kinds", "text[]", kinds if name == "p_exclude_kinds" else None))


def _claims_by_kind(jobs: Jobs, owner: Argument) -> dict[str, Call]:
    """The three claims, with each of their two kind filters."""
    lease = Argument("p_lease", "interval", timedelta(seconds=30))
    limit = Argument("p_limit", "integer", 1)
    calls = {}
    for name in ("p_kinds", "p_exclude_kinds"):
        calls[f"claim_jobs+{name}"] = Call("claim_jobs", (
            Argument("p_tenant_id", "uuid", jobs.running["tenant_id"]), owner, limit, lease,
            *_kind_filter(name)))
        calls[f"claim_ready_jobs+{name}"] = Call("claim_ready_jobs", (
            owner, limit, lease, *_kind_filter(name)))
        calls[f"finish_and_claim_jobs+{name}"] = Call("finish_and_claim_jobs", (
            owner, *_outcome_arguments(jobs), limit, lease, *_kind_filter(name)))
    return calls


def _calls(jobs: Jobs) -> dict[str, Call]:
    owner = Argument("p_owner", "text", jobs.running["lease_owner"])
    lease = jobs.running
    tenant = new_tenant()
    return {
        **_claims_by_kind(jobs, owner),
        "enqueue_jobs": Call("enqueue_jobs", (
            Argument("p_tenant_ids", "uuid[]", [tenant]),
            Argument("p_operation_keys", "text[]", ["shape"]),
            Argument("p_kinds", "text[]", ["email.send"]),
            Argument("p_payloads", "jsonb[]", [Jsonb({})]),
            # Values the per-item checks refuse: read through the wrong subscript, the
            # old functions stored infinity and 0 attempts.
            Argument("p_available_ats", "timestamptz[]", ["infinity"]),
            Argument("p_max_attempts", "integer[]", [0]),
            Argument("p_correlation_ids", "text[]", [""]),
        )),
        "finish_jobs": Call("finish_jobs", (owner, *_outcome_arguments(jobs))),
        "finish_and_claim_jobs": Call("finish_and_claim_jobs", (
            owner, *_outcome_arguments(jobs), Argument("p_limit", "integer", 1),
            Argument("p_lease", "interval", timedelta(seconds=30)))),
        "release_jobs": Call("release_jobs", (
            owner,
            Argument("p_tenant_ids", "uuid[]", [lease["tenant_id"]]),
            Argument("p_job_ids", "uuid[]", [lease["id"]]),
            Argument("p_tokens", "uuid[]", [lease["lease_token"]]),
        )),
        "redrive_jobs": Call("redrive_jobs", (
            Argument("p_actor", "text", "ops"), Argument("p_tenant_id", "uuid", None),
            Argument("p_job_ids", "uuid[]", [jobs.dead]), Argument("p_kind", "text", None),
            Argument("p_limit", "integer", 10), Argument("p_reason", "text", None))),
        "cancel_jobs": Call("cancel_jobs", (
            Argument("p_actor", "text", "ops"), Argument("p_tenant_id", "uuid", None),
            Argument("p_job_ids", "uuid[]", [jobs.pending]), Argument("p_kind", "text", None),
            Argument("p_limit", "integer", 10), Argument("p_reason", "text", None))),
    }


#: (function, array argument) pairs: every array argument of every function.
ARRAY_ARGUMENTS = [
    *(("enqueue_jobs", name) for name in (
        "p_tenant_ids", "p_operation_keys", "p_kinds", "p_payloads", "p_available_ats",
        "p_max_attempts", "p_correlation_ids")),
    *((function, name) for function in ("finish_jobs", "finish_and_claim_jobs") for name in (
        "p_tenant_ids", "p_job_ids", "p_tokens", "p_outcomes", "p_details", "p_retry_delays")),
    *(("release_jobs", name) for name in ("p_tenant_ids", "p_job_ids", "p_tokens")),
    ("redrive_jobs", "p_job_ids"),
    ("cancel_jobs", "p_job_ids"),
    *((f"{function}+{name}", name)
      for function in ("claim_jobs", "claim_ready_jobs", "finish_and_claim_jobs")
      for name in ("p_kinds", "p_exclude_kinds")),
]

#: How an array is misshaped: its one element wrapped in a second dimension, or the
#: same one-dimensional array indexed from 5.
SHAPES = {
    "two-dimensional": "array[{}]",
    "indexed-from-5": "('[5:5]=' || ({})::text)",
}


@pytest.fixture
def jobs(worker: Conn) -> Jobs:
    dead_tenant, pending_tenant, running_tenant = new_tenant(), new_tenant(), new_tenant()
    enqueue(worker, dead_tenant, "dead", max_attempts=1)
    dying = claim_one(worker, dead_tenant)
    worker.execute("select app.discard_job(%s, %s, %s, %s, '{}')",
                   (dead_tenant, dying["id"], dying["lease_owner"], dying["lease_token"]))
    pending = enqueue(worker, pending_tenant, "pending")
    enqueue(worker, running_tenant, "running")
    return Jobs(running=claim_one(worker, running_tenant), dead=dying["id"],
                pending=pending["id"])


def _statement(call: Call, broken: str | None = None, shape: str = "") -> sql.Composed:
    """``select * from app.<function>(...)``, every argument bound and cast to its type;
    the one named ``broken`` (if any) is reshaped."""
    parts = []
    for argument in call.arguments:
        cast = sql.SQL("%s::{}").format(sql.SQL(argument.type))
        if argument.name == broken:
            cast = sql.SQL("({})::{}").format(sql.SQL(shape).format(cast),
                                              sql.SQL(argument.type))
        parts.append(cast)
    return sql.SQL("select * from app.{}({})").format(
        sql.Identifier(call.function), sql.SQL(", ").join(parts))


@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
@pytest.mark.parametrize(("function", "argument"), ARRAY_ARGUMENTS,
                         ids=[f"{f}.{a}" for f, a in ARRAY_ARGUMENTS])
def test_multidimensional_and_non_one_based_arrays_are_refused_with_22023_by_every_array_function(
    worker: Conn, owner: Conn, jobs: Jobs, function: str, argument: str, shape: str
) -> None:
    call = _calls(jobs)[function]
    values = [a.value for a in call.arguments]
    before = snapshot(owner)

    with raises_sqlstate("22023", f"{argument} must be a one-dimensional array indexed from 1"):
        worker.execute(_statement(call, argument, shape), values)

    assert snapshot(owner) == before
    # The same call with the array as it should be is accepted: the shape was refused,
    # nothing else (the enqueue's per-item values are then rejected one by one).
    with worker.transaction(force_rollback=True):
        worker.execute(_statement(call), values).fetchall()


@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
@pytest.mark.parametrize("argument", ["p_tenant_ids", "p_tokens", "p_outcomes", "p_details",
                                      "p_retry_delays"])
def test_a_misshaped_array_is_refused_even_when_there_is_no_outcome_to_record(
    worker: Conn, owner: Conn, jobs: Jobs, argument: str, shape: str
) -> None:
    """finish_and_claim_jobs with no outcomes does not call finish_jobs; it still
    checks every array it was given."""
    call = _calls(jobs)["finish_and_claim_jobs"]
    empty = {a.name: a for a in _outcome_arguments(jobs, empty=True)}
    full = {a.name: a for a in _outcome_arguments(jobs)}
    arguments = tuple(full[a.name] if a.name == argument else empty.get(a.name, a)
                      for a in call.arguments)
    before = snapshot(owner)

    with raises_sqlstate("22023", f"{argument} must be a one-dimensional array indexed from 1"):
        worker.execute(_statement(Call(call.function, arguments), argument, shape),
                       [a.value for a in arguments])

    assert snapshot(owner) == before


#: Names that look empty: whitespace beyond ASCII and invisible format characters.
INVISIBLE_NAMES = {"zero-width-space": "\u200b", "tab": "\t",
                   "no-break-space-and-word-joiner": "\u00a0\u2060",
                   "byte-order-mark": "\ufeff"}


def _named_calls(jobs: Jobs, name: str) -> dict[str, tuple[str, str, list[Any]]]:
    """Each function taking a worker's or an operator's name, called with ``name``:
    (statement, the name's argument, the values to bind)."""
    lease = jobs.running
    tenant, job_id, token = lease["tenant_id"], lease["id"], lease["lease_token"]
    return {
        "claim_jobs": ("select * from app.claim_jobs(%s, %s)", "p_owner", [tenant, name]),
        "claim_ready_jobs": ("select * from app.claim_ready_jobs(%s)", "p_owner", [name]),
        "renew_job_lease": ("select app.renew_job_lease(%s, %s, %s, %s)", "p_owner",
                            [tenant, job_id, name, token]),
        "complete_job": ("select app.complete_job(%s, %s, %s, %s, null)", "p_owner",
                         [tenant, job_id, name, token]),
        "finish_jobs": ("select * from app.finish_jobs(%s, %s, %s, %s, '{succeeded}',"
                        " '{null}', '{null}')", "p_owner", [name, [tenant], [job_id], [token]]),
        "finish_and_claim_jobs": ("select * from app.finish_and_claim_jobs(%s, %s, %s, %s,"
                                  " '{succeeded}', '{null}', '{null}')", "p_owner",
                                  [name, [tenant], [job_id], [token]]),
        "release_jobs": ("select * from app.release_jobs(%s, %s, %s, %s)", "p_owner",
                         [name, [tenant], [job_id], [token]]),
        "redrive_jobs": ("select * from app.redrive_jobs(%s)", "p_actor", [name]),
        "cancel_jobs": ("select * from app.cancel_jobs(%s)", "p_actor", [name]),
        "join_worker_pool": ("select app.join_worker_pool(%s, 'schedule', null, 4,"
                             " '1 minute')", "p_owner", [name]),
        "leave_worker_pool": ("select app.leave_worker_pool(%s)", "p_owner", [name]),
    }


NAMED_FUNCTIONS = ["claim_jobs", "claim_ready_jobs", "renew_job_lease", "complete_job",
                   "finish_jobs", "finish_and_claim_jobs", "release_jobs", "redrive_jobs",
                   "cancel_jobs", "join_worker_pool", "leave_worker_pool"]


@pytest.mark.parametrize("name", list(INVISIBLE_NAMES.values()), ids=list(INVISIBLE_NAMES))
@pytest.mark.parametrize("function", NAMED_FUNCTIONS)
def test_an_owner_or_actor_of_invisible_characters_only_is_refused_with_22023(
    worker: Conn, owner: Conn, jobs: Jobs, function: str, name: str
) -> None:
    statement, argument, values = _named_calls(jobs, name)[function]
    before = snapshot(owner)

    with raises_sqlstate("22023", f"{argument} must be a non-blank text of at most 200"):
        worker.execute(statement.encode(), values)

    assert snapshot(owner) == before
