"""Contract of app.enqueue_job and app.enqueue_jobs, called as a worker (service_role)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from tests.conftest import Database
from tests.sql.calls import (
    claim,
    claim_one,
    enqueue,
    enqueue_many,
    event_insert_statements,
    event_types,
    events,
    job,
    new_tenant,
    raises_sqlstate,
    snapshot,
)
from tests.support import postgres
from tests.support.postgres import Conn


def test_workers_can_create_jobs(worker: Conn, owner: Conn) -> None:
    """Reference defect 4: there was no enqueue function and no role could INSERT."""
    row = enqueue(worker, new_tenant(), "first")
    assert job(owner, row["id"])["operation_key"] == "first"


def test_new_job_is_pending_with_exactly_one_created_event(worker: Conn, owner: Conn) -> None:
    """Reference defect 5: nothing wrote the 'created' event."""
    tenant = new_tenant()
    row = enqueue(worker, tenant, "order-1", kind="invoice.render", payload={"order": 1})

    assert row["state"] == "pending"
    assert row["tenant_id"] == tenant
    assert row["operation_key"] == "order-1"
    assert row["kind"] == "invoice.render"
    assert row["payload"] == {"order": 1}
    assert row["attempts"] == 0
    assert row["max_attempts"] == 6
    audit = events(owner, row["id"])
    assert [e["event_type"] for e in audit] == ["created"]
    assert audit[0]["tenant_id"] == tenant
    assert audit[0]["details"]["kind"] == "invoice.render"
    assert audit[0]["lease_token"] is None


def test_repeat_with_same_kind_and_payload_returns_existing_job_without_new_event(
    worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    first = enqueue(worker, tenant, "k", payload={"a": 1, "b": [1, 2]})
    again = enqueue(worker, tenant, "k", payload={"b": [1, 2], "a": 1})

    assert again["id"] == first["id"]
    assert again["created_at"] == first["created_at"]
    assert owner.execute("select count(*) as n from app.jobs").fetchone() == {"n": 1}
    assert event_types(owner, first["id"]) == ["created"]


def test_repeat_after_job_succeeded_returns_the_finished_job_and_runs_nothing_again(
    worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    first = enqueue(worker, tenant, "pay-42", payload={"amount": 42})
    lease = claim_one(worker, tenant)
    done = worker.execute(
        "select app.complete_job(%s, %s, %s, %s, %s) as ok",
        (tenant, first["id"], lease["lease_owner"], lease["lease_token"], Jsonb({"ok": True})),
    ).fetchone()
    assert done == {"ok": True}

    again = enqueue(worker, tenant, "pay-42", payload={"amount": 42})

    assert again["id"] == first["id"]
    assert again["state"] == "succeeded"
    assert again["result"] == {"ok": True}
    assert event_types(owner, first["id"]) == ["created", "claimed", "succeeded"]


@pytest.mark.parametrize(
    ("kind", "payload"),
    [("email.send", {"to": "other@example.com"}), ("sms.send", {"to": "a@example.com"})],
    ids=["different-payload", "different-kind"],
)
def test_repeat_with_different_kind_or_payload_raises_23505_and_writes_nothing(
    worker: Conn, owner: Conn, kind: str, payload: dict[str, str]
) -> None:
    tenant = new_tenant()
    enqueue(worker, tenant, "notify", kind="email.send", payload={"to": "a@example.com"})
    before = snapshot(owner)

    with raises_sqlstate("23505", match="different kind or payload"):
        enqueue(worker, tenant, "notify", kind=kind, payload=payload)

    assert snapshot(owner) == before


def test_same_operation_key_in_two_tenants_names_two_jobs(worker: Conn) -> None:
    a = enqueue(worker, new_tenant(), "same-key")
    b = enqueue(worker, new_tenant(), "same-key")
    assert a["id"] != b["id"]


@pytest.mark.parametrize(
    ("payload", "typename"),
    [([1, 2], "array"), ("text", "string"), (7, "number"), (None, "null")],
)
def test_payload_that_is_not_a_json_object_raises_22023(
    worker: Conn, owner: Conn, payload: object, typename: str
) -> None:
    with raises_sqlstate("22023", match=f"payload must be a JSON object (got {typename})"):
        worker.execute(
            "select app.enqueue_job(%s, 'k', 'kind', %s)", (new_tenant(), Jsonb(payload))
        )
    assert snapshot(owner) == ([], [])


def test_sql_null_payload_raises_22023(worker: Conn) -> None:
    with raises_sqlstate("22023", match="payload must be a JSON object (got NULL)"):
        worker.execute("select app.enqueue_job(%s, 'k', 'kind', null)", (new_tenant(),))


def test_payload_over_256_kib_raises_22023_naming_the_limit(worker: Conn, owner: Conn) -> None:
    huge = {"blob": "x" * 262_144}
    with raises_sqlstate("22023", match="at most 262144 bytes"):
        enqueue(worker, new_tenant(), "big", payload=huge)
    assert snapshot(owner) == ([], [])


def test_payload_just_under_the_limit_is_accepted(worker: Conn) -> None:
    payload = {"blob": "x" * (262_144 - 20)}
    assert enqueue(worker, new_tenant(), "fits", payload=payload)["state"] == "pending"


@pytest.mark.parametrize(
    ("key", "kind"),
    [(None, "k"), ("", "k"), ("   ", "k"), ("\t\n", "k"), ("x" * 256, "k"), ("op", None),
     ("op", " "), ("op", "\t"), ("op", "k" * 129)],
    ids=["null-key", "empty-key", "blank-key", "tab-key", "long-key", "null-kind", "blank-kind",
         "tab-kind", "long-kind"],
)
def test_blank_or_oversized_operation_key_or_kind_raises_22023(
    worker: Conn, key: str | None, kind: str | None
) -> None:
    with raises_sqlstate("22023", match="non-blank text of at most"):
        worker.execute(
            "select app.enqueue_job(%s, %s, %s, %s)", (new_tenant(), key, kind, Jsonb({}))
        )


def test_null_tenant_raises_22023(worker: Conn) -> None:
    with raises_sqlstate("22023", match="tenant_id is required"):
        worker.execute("select app.enqueue_job(null, 'k', 'kind', %s)", (Jsonb({}),))


def test_available_at_in_the_past_is_clamped_to_now(worker: Conn) -> None:
    """Nothing is ever scheduled in the past, so a producer cannot jump the queue."""
    before = worker.execute("select clock_timestamp() as t").fetchone()
    assert before is not None
    row = enqueue(worker, new_tenant(), "old", available_at=datetime(2001, 1, 1, tzinfo=UTC))
    assert row["available_at"] >= before["t"]
    assert row["available_at"] == row["created_at"]


def test_available_at_in_the_future_is_kept(worker: Conn) -> None:
    later = datetime.now(UTC) + timedelta(days=3)
    row = enqueue(worker, new_tenant(), "later", available_at=later)
    assert row["available_at"] == later


def test_available_at_more_than_365_days_ahead_raises_22023(worker: Conn, owner: Conn) -> None:
    with raises_sqlstate("22023", match="at most 365 days ahead"):
        enqueue(worker, new_tenant(), "far", available_at=datetime.now(UTC) + timedelta(days=366))
    assert snapshot(owner) == ([], [])


@pytest.mark.parametrize("max_attempts", [None, 0, -1, 21])
def test_max_attempts_outside_1_to_20_raises_22023(
    worker: Conn, max_attempts: int | None
) -> None:
    with raises_sqlstate("22023", match="p_max_attempts must be between 1 and 20"):
        enqueue(worker, new_tenant(), "m", max_attempts=max_attempts)


@pytest.mark.parametrize("max_attempts", [1, 20])
def test_max_attempts_at_the_bounds_is_accepted(worker: Conn, max_attempts: int) -> None:
    row = enqueue(worker, new_tenant(), "m", max_attempts=max_attempts)
    assert row["max_attempts"] == max_attempts


# Batch ----------------------------------------------------------------------------------


def _enqueue_batch(
    conn: Conn, items: list[tuple[object, str, str, object]], **extra: object
) -> list[dict[str, Any]]:
    tenants, keys, kinds, payloads = zip(*items, strict=True)
    return conn.execute(
        "select * from app.enqueue_jobs(%s, %s, %s, %s, %s, %s, %s) order by ord",
        (
            list(tenants),
            list(keys),
            list(kinds),
            [Jsonb(p) for p in payloads],
            extra.get("available_ats"),
            extra.get("max_attempts"),
            extra.get("correlation_ids"),
        ),
    ).fetchall()


def test_batch_reports_created_existing_and_conflict_per_item_in_input_order(
    worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    old = enqueue(worker, tenant, "old", kind="k", payload={"v": 1})
    clash = enqueue(worker, tenant, "clash", kind="k", payload={"v": 1})

    rows = _enqueue_batch(
        worker,
        [
            (tenant, "new-1", "k", {"v": 1}),
            (tenant, "old", "k", {"v": 1}),
            (tenant, "clash", "k", {"v": 2}),
            (tenant, "new-2", "k", {"v": 2}),
        ],
    )

    assert [(r["ord"], r["status"]) for r in rows] == [
        (1, "created"), (2, "existing"), (3, "conflict"), (4, "created")
    ]
    assert rows[1]["job_id"] == old["id"]
    assert rows[2]["job_id"] == clash["id"]
    assert all(r["state"] == "pending" for r in rows)
    assert event_types(owner, old["id"]) == ["created"]
    assert job(owner, clash["id"])["payload"] == {"v": 1}
    created = owner.execute(
        "select count(*) as n from app.job_events where event_type = 'created'"
    ).fetchone()
    assert created == {"n": 4}


def test_duplicate_key_inside_one_batch_creates_one_job_and_one_event(
    worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    rows = _enqueue_batch(
        worker,
        [
            (tenant, "dup", "k", {"v": 1}),
            (tenant, "dup", "k", {"v": 1}),
            (tenant, "dup", "k", {"v": 9}),
        ],
    )

    assert [r["status"] for r in rows] == ["created", "existing", "conflict"]
    assert len({r["job_id"] for r in rows}) == 1
    assert event_types(owner, rows[0]["job_id"]) == ["created"]
    assert owner.execute("select count(*) as n from app.jobs").fetchone() == {"n": 1}


def test_batch_sets_correlation_id_and_per_item_schedule(worker: Conn, owner: Conn) -> None:
    tenant = new_tenant()
    later = datetime.now(UTC) + timedelta(hours=1)
    rows = _enqueue_batch(
        worker,
        [(tenant, "a", "k", {}), (tenant, "b", "k", {})],
        available_ats=[None, later],
        max_attempts=[None, 3],
        correlation_ids=["req-1", None],
    )
    a = job(owner, rows[0]["job_id"])
    b = job(owner, rows[1]["job_id"])
    assert (a["correlation_id"], a["max_attempts"]) == ("req-1", 6)
    assert (b["correlation_id"], b["max_attempts"], b["available_at"]) == (None, 3, later)


def test_one_invalid_item_refuses_the_whole_batch_and_names_its_position(
    worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    with raises_sqlstate("22023", match="job 2: payload must be a JSON object"):
        _enqueue_batch(worker, [(tenant, "a", "k", {}), (tenant, "b", "k", [1])])
    assert snapshot(owner) == ([], [])


@pytest.mark.parametrize("count", [0, 1001])
def test_batch_size_outside_1_to_1000_raises_22023(worker: Conn, count: int) -> None:
    tenant = new_tenant()
    with raises_sqlstate("22023", match="number of jobs must be between 1 and 1000"):
        worker.execute(
            "select * from app.enqueue_jobs(%s, %s, %s, %s)",
            ([tenant] * count, [f"k{i}" for i in range(count)], ["k"] * count,
             [Jsonb({})] * count),
        )


def test_batch_arrays_of_different_lengths_raise_22023(worker: Conn) -> None:
    with raises_sqlstate("22023", match="same length"):
        worker.execute(
            "select * from app.enqueue_jobs(%s, %s, %s, %s)",
            ([new_tenant()], ["a", "b"], ["k"], [Jsonb({})]),
        )


def test_batch_writes_its_created_events_with_one_insert_statement(
    worker: Conn, admin: Conn
) -> None:
    with event_insert_statements(admin, worker) as statements:
        enqueue_many(worker, new_tenant(), 5)
    assert statements == [5]


@pytest.mark.parametrize("first_commits", [True, False], ids=["commit", "rollback"])
def test_concurrent_enqueue_of_one_key_waits_and_then_returns_the_winner_or_creates(
    worker: Conn, db: Database, owner: Conn, first_commits: bool
) -> None:
    tenant = new_tenant()
    second: list[dict[str, Any]] = []
    with db.connect(postgres.WORKER) as other:
        worker.execute("begin")
        first = enqueue(worker, tenant, "race")
        thread = threading.Thread(target=lambda: second.append(enqueue(other, tenant, "race")))
        thread.start()
        thread.join(timeout=0.5)
        assert thread.is_alive(), "the second enqueue did not wait for the first"
        worker.execute("commit" if first_commits else "rollback")
        thread.join(timeout=10)

    assert len(second) == 1
    assert (second[0]["id"] == first["id"]) is first_commits
    assert owner.execute("select count(*) as n from app.jobs").fetchone() == {"n": 1}
    assert event_types(owner, second[0]["id"]) == ["created"]


def test_a_repeat_enqueue_of_a_running_job_does_not_reveal_its_lease_token(
        worker: Conn) -> None:
    tenant = new_tenant()
    enqueue(worker, tenant, "k")
    running = claim(worker, tenant, limit=1)[0]

    again = enqueue(worker, tenant, "k")

    assert (again["id"], again["state"]) == (running["id"], "running")
    assert again["lease_owner"] == running["lease_owner"]
    assert again["lease_token"] is None


def test_the_payload_must_be_an_object_on_write_and_is_not_read_again_by_updates(
        owner: Conn) -> None:
    """0009: the rule lives on the column's domain, so it holds for every write of the
    column (even the owner's own INSERT), while claims and finishes, which never set
    the payload, do not read a possibly large, toasted value back just to re-check it."""
    with raises_sqlstate("23514", "job_payload_is_object"):
        owner.execute(
            "insert into app.jobs (tenant_id, operation_key, kind, payload)"
            " values (gen_random_uuid(), 'not-an-object', 'k', '[1, 2]')")
    table_checks_reading_the_payload = owner.execute(
        "select conname from pg_constraint where conrelid = 'app.jobs'::regclass"
        " and contype = 'c' and pg_get_constraintdef(oid) like '%payload%'").fetchall()
    assert table_checks_reading_the_payload == []
