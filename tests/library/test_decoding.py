"""No stored row can stop a drain: values PostgreSQL stores but Python cannot decode.

The poison rows are written as the schema owner, straight into ``app.jobs``, as a
SQL caller or an older schema could have left them: the enqueue doors refuse them, so
the read path must survive them on its own. Read-backs in these tests name their
columns (or cast to text), because a test connection decodes with plain json.loads.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

from leaseq import QueueClient, Registry, UndecodableJson, Worker, WorkerConfig, connect
from leaseq.store.db import fetch_rows

from tests.conftest import Database
from tests.library.support import enqueue
from tests.support.fakes import FakeDeadline
from tests.support.postgres import Conn

HUGE_NUMBER = '{"n": 1e5000}'  # stored by jsonb as an integer of 5,001 digits
HUGE_DIGITS = '{"n": 1' + "0" * 5000 + "}"  # the same, as json (which keeps the text) too


def insert_job(owner: Conn, tenant: uuid.UUID, key: str, payload_text: str, *,
               available_at: str = "now() - interval '1 minute'") -> uuid.UUID:
    """As the schema owner: a pending job whose payload is the given JSON text."""
    row = owner.execute(
        "insert into app.jobs (tenant_id, operation_key, kind, payload, available_at)"
        f" values (%s, %s, 'echo', %s::text::jsonb, {available_at}) returning id",
        (tenant, key, payload_text)).fetchone()
    assert row is not None
    job_id: uuid.UUID = row["id"]
    owner.execute("insert into app.job_events (tenant_id, job_id, event_type, actor, details)"
                  " values (%s, %s, 'created', 'enqueue', '{}')", (tenant, job_id))
    # Written by hand, so the fair claim learns of the tenant as after a reaper pass.
    owner.execute("select * from app.repair_tenant_turns(10000)")
    return job_id


def job_states(owner: Conn) -> dict[str, int]:
    rows = owner.execute(
        "select state::text as state, count(*) as n from app.jobs group by state").fetchall()
    return {r["state"]: int(r["n"]) for r in rows}


def last_error(owner: Conn, job_id: uuid.UUID) -> dict[str, Any]:
    row = owner.execute("select state::text as state, attempts, last_error::text as error"
                        " from app.jobs where id = %s", (job_id,)).fetchone()
    assert row is not None
    assert (row["state"], row["attempts"]) == ("dead", 1)
    error: dict[str, Any] = json.loads(row["error"])
    return error


def dead_reason(owner: Conn, job_id: uuid.UUID) -> str:
    row = owner.execute("select details->>'reason' as reason from app.job_events"
                        " where job_id = %s and event_type = 'dead'", (job_id,)).fetchone()
    assert row is not None
    return str(row["reason"])


def drain(client: QueueClient, registry: Registry) -> Any:
    worker = Worker(client, registry, WorkerConfig(owner="decode-test", batch_size=10, poll_idle=0))
    return worker.drain(FakeDeadline(120))


def echo_registry(ran: list[uuid.UUID]) -> Registry:
    registry = Registry()
    registry.register("echo", lambda payload, ctx: ran.append(ctx.job.id))
    return registry


def test_a_payload_with_a_5000_digit_number_is_dead_and_its_batch_of_other_tenants_runs(
        client: QueueClient, owner: Conn) -> None:
    poison_tenant = uuid.uuid4()
    poison = insert_job(owner, poison_tenant, "poison", HUGE_NUMBER)
    others = [job for _ in range(3) for job in enqueue(client, uuid.uuid4(), 3)]
    ran: list[uuid.UUID] = []

    report = drain(client, echo_registry(ran))

    assert report.batches == 1  # the poison shared its batch with every other job
    assert (report.claimed, report.succeeded, report.dead) == (10, 9, 1)
    assert sorted(ran) == sorted(others)
    assert job_states(owner) == {"succeeded": 9, "dead": 1}
    error = last_error(owner, poison)
    assert error["code"] == "UNDECODABLE_PAYLOAD"
    assert "4300 digits" in error["message"]
    assert error["prefix"] == '{"n": 1' + "0" * 33
    assert error["length"] == len('{"n": }') + 5001
    assert len(json.dumps(error)) < 1000  # no echo of the payload beyond its prefix
    assert dead_reason(owner, poison) == "discarded"


def test_a_payload_nested_deeper_than_python_can_decode_is_dead_and_the_drain_goes_on(
        client: QueueClient, owner: Conn) -> None:
    deep = '{"n": ' * 5000 + "1" + "}" * 5000
    poison = insert_job(owner, uuid.uuid4(), "deep", deep)
    (good,) = enqueue(client, uuid.uuid4())
    ran: list[uuid.UUID] = []

    report = drain(client, echo_registry(ran))

    assert (report.succeeded, report.dead) == (1, 1)
    assert ran == [good]
    error = last_error(owner, poison)
    assert error["code"] == "UNDECODABLE_PAYLOAD"
    assert "recursion" in error["message"]


def test_a_kind_stored_before_the_plain_text_rule_dies_with_its_reason_and_the_drain_goes_on(
        client: QueueClient, owner: Conn) -> None:
    """An upgraded database may hold kinds with a newline, an escape or a bidi override
    (enqueue refuses them now). No handler can be registered for such a kind, so the
    worker makes the job dead, saying why and naming the character, and goes on."""
    tenant = uuid.uuid4()
    poison = insert_job(owner, tenant, "old", "{}")
    owner.execute("update app.jobs set kind = %s where id = %s", ("echo\n\x1b[31m", poison))
    others = enqueue(client, tenant, 2)
    ran: list[uuid.UUID] = []

    report = drain(client, echo_registry(ran))

    assert (report.succeeded, report.dead) == (2, 1)
    assert sorted(ran) == sorted(others)
    error = last_error(owner, poison)
    assert error["code"] == "INVALID_KIND"
    assert error["kind"] == "echo\n\x1b[31m"
    assert "(found U+000A at character 5; remove it)" in error["message"]
    assert "Enqueue a corrected job under a new operation key" in error["message"]


def test_a_claimed_row_with_a_time_python_cannot_represent_is_read_clamped_and_runs(
        client: QueueClient, owner: Conn) -> None:
    """A created_at of -infinity (hand-written SQL only: available_at must be finite)."""
    tenant = uuid.uuid4()
    early = insert_job(owner, tenant, "early", '{"i": 1}')
    owner.execute("update app.jobs set created_at = '-infinity' where id = %s", (early,))
    (later,) = enqueue(client, uuid.uuid4())
    ran: list[uuid.UUID] = []

    report = drain(client, echo_registry(ran))

    assert (report.claimed, report.succeeded) == (2, 2)
    assert sorted(ran) == sorted([early, later])
    assert job_states(owner) == {"succeeded": 2}


def test_total_loaders_decode_like_json_loads_and_mark_what_it_refuses(db: Database) -> None:
    values = ['{"a": [1, 2.5, "x", null, true, {"b": {}}]}', '"é\\n"', "[]", "12", "-0.5"]
    with connect(db.worker_dsn) as conn:
        for binary in (False, True):
            for cast in ("json", "jsonb"):
                for text in values:
                    cur = conn.cursor(binary=binary)
                    row = cur.execute(f"select %s::text::{cast} as v", (text,)).fetchone()
                    assert row is not None
                    assert row["v"] == json.loads(text), (binary, cast, text)
                cur = conn.cursor(binary=binary)
                row = cur.execute(f"select %s::text::{cast} as v", (HUGE_DIGITS,)).fetchone()
                assert row is not None
                marker = row["v"]
                assert isinstance(marker, UndecodableJson), (binary, cast)
                assert "4300 digits" in marker.reason
    assert marker.text.startswith('{"n": 1000')
    assert len(marker.text) == len('{"n": }') + 5001
    assert len(repr(marker)) < 300
    assert len(marker.describe()) < 500
    assert marker.as_document() == {"undecodable": True, "reason": marker.reason,
                                    "prefix": marker.text[:40], "length": len(marker.text)}


def test_a_client_whose_connections_come_from_elsewhere_still_decodes_totally(
        db: Database, owner: Conn) -> None:
    import psycopg
    from psycopg.rows import dict_row

    poison = insert_job(owner, uuid.uuid4(), "poison", HUGE_NUMBER)
    client = QueueClient(lambda: psycopg.connect(db.worker_dsn, autocommit=True,
                                                 row_factory=dict_row))
    try:
        report = drain(client, echo_registry([]))
    finally:
        client.close()
    assert report.dead == 1
    assert last_error(owner, poison)["code"] == "UNDECODABLE_PAYLOAD"


def test_a_time_out_of_pythons_range_is_clamped_to_the_nearest_end(db: Database) -> None:
    with connect(db.worker_dsn) as conn:
        rows = fetch_rows(conn, "select '-infinity'::timestamptz as a, 'infinity'::timestamptz"
                                " as b, '0044-03-15 BC'::timestamptz as c, now() as d", {})
    (row,) = rows
    assert row["a"] == datetime.min.replace(tzinfo=UTC)
    assert row["b"] == datetime.max.replace(tzinfo=UTC)
    assert row["c"] == datetime.min.replace(tzinfo=UTC)
    assert abs((row["d"] - datetime.now(UTC)).total_seconds()) < 60
