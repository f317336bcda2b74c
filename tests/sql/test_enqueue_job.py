"""Contract of app.enqueue_job and app.enqueue_jobs, called as the all-duty ``worker`` login."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
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
    first = enqueue(worker, tenant, "notify", kind="email.send", payload={"to": "a@example.com"})
    before = snapshot(owner)

    with pytest.raises(psycopg.Error) as refused:
        enqueue(worker, tenant, "notify", kind=kind, payload=payload)

    assert refused.value.sqlstate == "23505"
    assert "already names a job with a different kind or payload" in str(refused.value)
    # Neither the stored job's id nor its kind: a conflict is no answer to a probe.
    assert str(first["id"]) not in str(refused.value)
    assert "email.send" not in str(refused.value)
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


def _enqueue_text(conn: Conn, key: str, payload_text: str) -> dict[str, Any]:
    """Enqueue a payload given as JSON text, parsed by PostgreSQL (not by Python)."""
    row = conn.execute(
        "select * from app.enqueue_job(%s, %s, 'echo', %s::text::jsonb)",
        (new_tenant(), key, payload_text),
    ).fetchone()
    assert row is not None
    return row


#: Numbers as a producer may write them, and the length of their text as PostgreSQL
#: writes it back (jsonb keeps them as decimals, without exponent).
LONG_NUMBERS = {
    "1e5000": '{"n": 1e5000}',
    "1001-digit-integer": '{"n": 1e1000}',
    "negative-1000-digit-integer": '{"n": -1e999}',
    "1001-character-fraction": '{"n": 0.' + "0" * 998 + "1}",
    "deep-in-an-array-of-a-large-payload": (
        '{"pad": "' + "x" * 2000 + '", "a": [1, 2, {"b": [3, 1e2000]}]}'),
    "next-to-a-string-of-digits": '{"s": "' + "9" * 3000 + '", "n": 1e1500}',
}


@pytest.mark.parametrize("payload_text", list(LONG_NUMBERS.values()), ids=list(LONG_NUMBERS))
def test_a_payload_number_longer_than_1000_characters_is_refused_with_22023(
    worker: Conn, owner: Conn, payload_text: str
) -> None:
    """jsonb stores {"n": 1e5000} and writes it back as a 5,001-digit integer, which
    Python's json module refuses to decode (more than 4,300 digits): stored, it would
    break the claim of every worker that reaches it."""
    with raises_sqlstate(
            "22023", match="job 1: payload numbers must be at most 1000 characters as JSON text"):
        _enqueue_text(worker, "long-number", payload_text)
    assert snapshot(owner) == ([], [])


@pytest.mark.parametrize(
    "payload_text",
    ['{"n": 1e999}', '{"n": -1e998}', '{"n": 0.' + "0" * 997 + "1}",
     '{"s": "' + "9" * 5000 + '"}', '{"a": [' + ", ".join(["123456789"] * 3000) + "]}"],
    ids=["1000-digit-integer", "negative-1000-characters", "1000-character-fraction",
         "5000-digits-in-a-string", "many-short-numbers"],
)
def test_numbers_of_at_most_1000_characters_and_digits_in_strings_are_accepted(
    worker: Conn, owner: Conn, payload_text: str
) -> None:
    row = _enqueue_text(worker, "fits", payload_text)
    stored = owner.execute(
        "select payload::text as text from app.jobs where id = %s", (row["id"],)).fetchone()
    assert stored is not None
    json.loads(stored["text"])  # what a worker will do with it


@pytest.mark.parametrize(
    ("payload_text", "sqlstate"),
    [('{"a": "\\ud800"}', "22P02"), ('{"a": "\\udc00x"}', "22P02"),
     ('{"a": "\\u0000"}', "22P05"), ('{"\\u0000": 1}', "22P05"), ('{"a": NaN}', "22P02"),
     ('{"a": Infinity}', "22P02"), ('{"a": 1, }', "22P02")],
    ids=["lone-high-surrogate", "lone-low-surrogate", "nul-in-a-value", "nul-in-a-key", "nan",
         "infinity", "trailing-comma"],
)
def test_what_a_json_decoder_refuses_jsonb_refuses_too_before_any_function_runs(
    worker: Conn, owner: Conn, payload_text: str, sqlstate: str
) -> None:
    """Lone surrogates, NUL, NaN and Infinity never reach the enqueue functions: jsonb
    itself refuses them (class 22). Long numbers (above) and deep nesting are the
    two things jsonb accepts that a standard decoder does not, and the functions
    refuse those."""
    with raises_sqlstate(sqlstate):
        _enqueue_text(worker, "refused", payload_text)
    assert snapshot(owner) == ([], [])


def test_nan_and_infinity_computed_in_sql_become_strings_not_numbers(
    worker: Conn, owner: Conn
) -> None:
    """A payload computed in SQL cannot smuggle a non-finite number in either: to_jsonb
    and jsonb_build_object turn numeric NaN and Infinity into JSON strings."""
    row = worker.execute(
        "select * from app.enqueue_job(%s, 'computed', 'echo',"
        " jsonb_build_object('nan', 'NaN'::numeric, 'inf', 'Infinity'::float8))",
        (new_tenant(),),
    ).fetchone()
    assert row is not None
    stored = owner.execute(
        "select payload::text as text from app.jobs where id = %s", (row["id"],)).fetchone()
    assert stored is not None
    assert json.loads(stored["text"])["nan"] == "NaN"
    assert json.loads(stored["text"])["inf"] == "Infinity"


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


#: Values that look empty: Unicode whitespace beyond ASCII and invisible format
#: characters (the set is listed in sql/README.md, "Shared argument rules").
INVISIBLE_VALUES = {
    "zero-width-space": "\u200b",
    "no-break-space": "\u00a0",
    "ideographic-space": "\u3000",
    "byte-order-mark": "\ufeff",
    "word-joiner-and-tab": "\u2060\t",
    "bidi-controls": "\u202a\u202c\u2066\u2069",
    "soft-hyphen-and-mongolian-separator": "\u00ad\u180e",
    "line-separator-and-en-quad": "\u2028\u2000",
    "arabic-number-sign-and-tag": "\u0600\U000e0041",
}


@pytest.mark.parametrize("field", ["operation_key", "kind"])
@pytest.mark.parametrize("value", list(INVISIBLE_VALUES.values()), ids=list(INVISIBLE_VALUES))
def test_an_operation_key_or_kind_of_invisible_characters_only_is_refused_with_22023(
    worker: Conn, owner: Conn, field: str, value: str
) -> None:
    key, kind = (value, "email.send") if field == "operation_key" else ("op", value)
    with raises_sqlstate("22023", match=f"{field} must be a non-blank text"):
        worker.execute(
            "select app.enqueue_job(%s, %s, %s, %s)", (new_tenant(), key, kind, Jsonb({}))
        )
    assert snapshot(owner) == ([], [])


def test_a_key_and_kind_with_something_visible_around_white_space_are_accepted(
    worker: Conn,
) -> None:
    row = enqueue(worker, new_tenant(), "order\u00a0-1", kind="\u3000email.send ")
    assert (row["operation_key"], row["kind"]) == ("order\u00a0-1", "\u3000email.send ")


def test_control_characters_are_not_blank_but_refused_as_control_characters(
        worker: Conn) -> None:
    """U+001C-U+001F are not Unicode White_Space (Python's str.isspace() says they are):
    such a kind is not blank, and is refused for holding a control character."""
    with raises_sqlstate("22023", match="job 1: kind must not contain control, format "
                                        "(invisible or bidirectional) or line separator "
                                        "characters (found U+001C at character 1; remove it)"):
        enqueue(worker, new_tenant(), "key", kind="\u001c")


def test_the_blank_rule_holds_whatever_the_callers_string_settings(worker: Conn) -> None:
    """The character set is an E'' literal: a caller that turns standard_conforming_strings
    off cannot change what the rule reads."""
    worker.execute("set standard_conforming_strings = off")
    try:
        with raises_sqlstate("22023", match="kind must be a non-blank text"):
            worker.execute(
                "select app.enqueue_job(%s, 'op', %s, %s)", (new_tenant(), "\t", Jsonb({}))
            )
    finally:
        worker.execute("reset standard_conforming_strings")


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


def test_an_infinite_available_at_is_refused_and_cannot_be_stored(
    worker: Conn, owner: Conn
) -> None:
    """A job stored at infinity made app.queue_status fail for every tenant (22008)."""
    tenant = new_tenant()
    with raises_sqlstate("22023", match="job 1: available_at must be at most 365 days ahead"
                                        " (got infinity)"):
        enqueue(worker, tenant, "for-ever", available_at="infinity")
    rows = _enqueue_batch(worker, [(tenant, "for-ever", "k", {}), (tenant, "now", "k", {})],
                          available_ats=["infinity", None])
    assert [(r["status"], r["error"]) for r in rows] == [
        ("rejected", "job 1: available_at must be at most 365 days ahead (got infinity)"),
        ("created", None)]
    # Even the owner, writing the table directly, cannot store a non-finite time.
    with raises_sqlstate("23514", "jobs_available_at_finite"):
        owner.execute(
            "insert into app.jobs (tenant_id, operation_key, kind, payload, available_at)"
            " values (%s, 'direct', 'k', '{}', 'infinity')", (tenant,))
    with raises_sqlstate("23514", "jobs_available_at_finite"):
        owner.execute("update app.jobs set available_at = '-infinity' where id = %s",
                      (rows[1]["job_id"],))
    status = worker.execute("select * from app.queue_status(%s)", (tenant,)).fetchall()
    assert [(r["state"], r["jobs"]) for r in status] == [("pending", 1)]


def test_a_minus_infinite_available_at_is_in_the_past_and_so_clamped_to_now(
    worker: Conn,
) -> None:
    row = enqueue(worker, new_tenant(), "long-ago", available_at="-infinity")
    assert row["available_at"] == row["created_at"]


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
    # A conflict names no job (its id would answer a probe of the key): id and state NULL.
    assert (rows[2]["job_id"], rows[2]["state"]) == (None, None)
    assert [r["state"] for r in rows] == ["pending", "pending", None, "pending"]
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
    assert rows[0]["job_id"] == rows[1]["job_id"]
    assert rows[2]["job_id"] is None
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


def test_a_batch_with_one_bad_item_stores_the_good_ones_and_rejects_that_one(
    worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    rows = _enqueue_batch(
        worker, [(tenant, "a", "k", {}), (tenant, "b", "k", [1]), (tenant, "c", "k", {})])

    assert [(r["ord"], r["status"], r["error"]) for r in rows] == [
        (1, "created", None),
        (2, "rejected", "job 2: payload must be a JSON object (got array)"),
        (3, "created", None)]
    assert (rows[1]["job_id"], rows[1]["state"]) == (None, None)
    stored = owner.execute("select operation_key from app.jobs order by 1").fetchall()
    assert [r["operation_key"] for r in stored] == ["a", "c"]
    assert [event_types(owner, r["job_id"]) for r in (rows[0], rows[2])] == [
        ["created"], ["created"]]
    assert owner.execute("select count(*) as n from app.job_events").fetchone() == {"n": 2}


def _nested(levels: int) -> dict[str, Any]:
    """An object with a value ``levels`` levels below it."""
    value: Any = 1
    for _ in range(levels - 1):
        value = [value]
    return {"n": value}


#: One bad field per item, with the message its rejection carries (after "job 2: ").
BAD_ITEMS: dict[str, tuple[dict[str, Any], str]] = {
    "null-tenant": ({"tenant": None}, "tenant_id is required (got NULL)"),
    "tab-key": ({"key": "\t"},
                "operation_key must be a non-blank text of at most 255 characters"),
    "zero-width-space-key": ({"key": "\u200b"},
                             "operation_key must be a non-blank text of at most 255 characters"),
    "long-key": ({"key": "k" * 256},
                 "operation_key must be a non-blank text of at most 255 characters"),
    "blank-kind": ({"kind": "\u3000"}, "kind must be a non-blank text of at most 128 characters"),
    "null-payload": ({"payload": None}, "payload must be a JSON object (got NULL)"),
    "string-payload": ({"payload": "x"}, "payload must be a JSON object (got string)"),
    "deep-payload": ({"payload": _nested(101)},
                     "payload must nest at most 100 levels below its top level"),
    "large-payload": ({"payload": {"blob": "x" * 262_144}},
                      "payload must be at most 262144 bytes as JSON text (got 262156)"),
    "long-number": ({"payload": {"n": 10**1000}},
                    "payload numbers must be at most 1000 characters as JSON text"),
    "far-available-at": ({"available_at": datetime(9999, 1, 1, tzinfo=UTC)},
                         "available_at must be at most 365 days ahead (got 9999-01-01"),
    "zero-max-attempts": ({"max_attempts": 0}, "max_attempts must be between 1 and 20 (got 0)"),
    "empty-correlation-id": ({"correlation_id": ""},
                             "correlation_id must have 1 to 200 characters"),
}


@pytest.mark.parametrize("bad", list(BAD_ITEMS.values()), ids=list(BAD_ITEMS))
def test_each_kind_of_bad_item_is_rejected_with_its_message_while_its_neighbours_are_stored(
    worker: Conn, owner: Conn, bad: tuple[dict[str, Any], str]
) -> None:
    fields, message = bad
    tenant = new_tenant()
    item = {"tenant": tenant, "key": "bad", "kind": "k", "payload": {}, "available_at": None,
            "max_attempts": None, "correlation_id": None, **fields}
    items = [{"tenant": tenant, "key": f"good-{i}", "kind": "k", "payload": {},
              "available_at": None, "max_attempts": None, "correlation_id": None}
             for i in (1, 3)]
    batch = [items[0], item, items[1]]

    rows = worker.execute(
        "select * from app.enqueue_jobs(%s, %s, %s, %s, %s, %s, %s) order by ord",
        ([i["tenant"] for i in batch], [i["key"] for i in batch], [i["kind"] for i in batch],
         [None if i["payload"] is None else Jsonb(i["payload"]) for i in batch],
         [i["available_at"] for i in batch], [i["max_attempts"] for i in batch],
         [i["correlation_id"] for i in batch]),
    ).fetchall()

    assert [r["status"] for r in rows] == ["created", "rejected", "created"]
    assert rows[1]["error"].startswith(f"job 2: {message}"), rows[1]["error"]
    assert (rows[1]["job_id"], rows[1]["state"]) == (None, None)
    keys = owner.execute("select operation_key from app.jobs order by 1").fetchall()
    assert [k["operation_key"] for k in keys] == ["good-1", "good-3"]


def test_a_rejected_item_does_not_take_its_key_from_a_valid_repeat_in_the_same_batch(
    worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    rows = _enqueue_batch(worker, [(tenant, "dup", "k", [1]), (tenant, "dup", "k", {"v": 1}),
                                   (tenant, "dup", "k", {"v": 1})])
    assert [r["status"] for r in rows] == ["rejected", "created", "existing"]
    assert rows[1]["job_id"] == rows[2]["job_id"]
    assert event_types(owner, rows[1]["job_id"]) == ["created"]


def test_a_batch_of_only_bad_items_stores_nothing_and_rejects_each(
    worker: Conn, owner: Conn
) -> None:
    tenant = new_tenant()
    rows = _enqueue_batch(worker, [(tenant, " ", "k", {}), (None, "b", "k", {})])
    assert [(r["ord"], r["status"]) for r in rows] == [(1, "rejected"), (2, "rejected")]
    assert snapshot(owner) == ([], [])


def test_the_single_enqueue_still_raises_22023_for_a_bad_item(worker: Conn, owner: Conn) -> None:
    with raises_sqlstate("22023", match="job 1: kind must be a non-blank text"):
        worker.execute(
            "select app.enqueue_job(%s, 'k', %s, %s)", (new_tenant(), "\u200b\t", Jsonb({})))
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
    assert "lease_token" not in again  # the job row holds none (app.leases does)


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
