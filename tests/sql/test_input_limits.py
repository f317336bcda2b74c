"""Enqueue input that is bounded as a whole, and text that must be plain: the payloads of
one enqueue call together, and the characters a stored name may hold. Every check calls
the functions as the producer login; the owner only arranges and reads.
"""

from __future__ import annotations

from typing import Any

import pytest
from psycopg.types.json import Jsonb

from tests.sql.calls import claim_one, enqueue, new_tenant, raises_sqlstate, snapshot
from tests.support.postgres import Conn

#: The SQL contract's bound on the payloads of one call, written out: the test checks
#: the number itself, not a name shared with the code it tests.
CALL_BOUND = 16_777_216
DOCUMENT_BOUND = 262_144


def payload_of(size: int) -> dict[str, str]:
    """A payload of exactly ``size`` bytes as PostgreSQL writes it: ``{"d": "x..."}``."""
    return {"d": "x" * (size - 9)}


def enqueue_batch(conn: Conn, payloads: list[Any], **arrays: list[Any]) -> list[dict[str, Any]]:
    count = len(payloads)
    tenant = new_tenant()
    return conn.execute(
        "select * from app.enqueue_jobs(%s, %s, %s, %s, null, null, %s) order by ord",
        ([tenant] * count, arrays.get("keys", [f"k-{i}" for i in range(count)]),
         arrays.get("kinds", ["report"] * count), [Jsonb(p) for p in payloads],
         arrays.get("correlation_ids"))).fetchall()


# The payloads of one call ---------------------------------------------------------------


def test_a_call_whose_payloads_total_16_mib_is_stored(producer: Conn, owner: Conn) -> None:
    payloads = [payload_of(DOCUMENT_BOUND)] * (CALL_BOUND // DOCUMENT_BOUND)
    assert owner.execute("select octet_length(%s::jsonb::text) as n",
                         (Jsonb(payloads[0]),)).fetchone() == {"n": DOCUMENT_BOUND}

    rows = enqueue_batch(producer, payloads)

    assert [r["status"] for r in rows] == ["created"] * len(payloads)


def test_a_call_whose_payloads_pass_16_mib_together_is_refused_whole_and_stores_nothing(
        producer: Conn, owner: Conn) -> None:
    """Payloads of 256 KiB each pass every per-item check; 1,000 of them would be
    256 MiB in one statement. The first payload that takes the sum past the bound
    refuses the call, and nothing of it is written (100 here: the arguments arrive
    whole before any check, which is the slow part of such a call)."""
    payloads = [payload_of(DOCUMENT_BOUND)] * 100
    before = snapshot(owner)

    with raises_sqlstate("22023", match=(
            "enqueue call too large: its payloads must total at most 16777216 bytes as "
            "JSON text, and job 65 brings them to 17039360; split the batch into smaller "
            "calls")):
        enqueue_batch(producer, payloads)

    assert snapshot(owner) == before


def test_one_byte_more_than_the_bound_is_refused(producer: Conn, owner: Conn) -> None:
    payloads = [payload_of(DOCUMENT_BOUND)] * 63 + [payload_of(DOCUMENT_BOUND - 1), {}]

    with raises_sqlstate("22023", match="job 65 brings them to 16777217;"):
        enqueue_batch(producer, payloads)

    assert snapshot(owner) == ([], [])


def test_the_payloads_of_rejected_items_do_not_count_toward_the_bound(producer: Conn) -> None:
    """A rejected item is not stored, so its payload costs the call nothing: 64 payloads
    at the bound plus refused items of 256 KiB each still go in."""
    payloads = [payload_of(DOCUMENT_BOUND)] * 70
    kinds = ["report"] * 64 + [" "] * 6

    rows = enqueue_batch(producer, payloads, kinds=kinds)

    assert [r["status"] for r in rows] == ["created"] * 64 + ["rejected"] * 6


def test_a_single_enqueue_of_a_payload_over_its_own_bound_is_rejected_as_the_item(
        producer: Conn) -> None:
    """A payload over 256 KiB is the item's problem, however large: never counted
    toward the call."""
    with raises_sqlstate("22023", match="job 1: payload must be at most 262144 bytes"):
        enqueue(producer, new_tenant(), "huge", payload=payload_of(CALL_BOUND + 1))


# Plain text -----------------------------------------------------------------------------

#: One character of each refused class, with its code point as the message names it.
REFUSED_CHARACTERS = {
    "\n": "U+000A",         # newline: a forged log line
    "\r": "U+000D",
    "\t": "U+0009",
    "\x1b": "U+001B",       # escape: terminal colours and cursor moves
    "\x7f": "U+007F",
    "\x85": "U+0085",       # NEL, a C1 control and a line break
    "\u200b": "U+200B",     # zero-width space
    "\u200e": "U+200E",     # left-to-right mark
    "\u061c": "U+061C",     # Arabic letter mark
    "\u202e": "U+202E",     # right-to-left override
    "\u2066": "U+2066",     # left-to-right isolate
    "\u2067": "U+2067",
    "\u2068": "U+2068",
    "\u2069": "U+2069",     # pop directional isolate
    "\ufeff": "U+FEFF",     # byte order mark
    "\u2028": "U+2028",     # line separator
    "\u2029": "U+2029",     # paragraph separator
    "\U000e0041": "U+E0041",  # a tag character
}


def character_message(code_point: str, position: int) -> str:
    return ("must not contain control, format (invisible or bidirectional) or line separator "
            f"characters (found {code_point} at character {position}; remove it)")


@pytest.mark.parametrize("char", REFUSED_CHARACTERS, ids=REFUSED_CHARACTERS.values())
@pytest.mark.parametrize("field", ["kind", "operation_key", "correlation_id"])
def test_a_name_holding_a_control_format_or_line_separator_character_is_rejected(
        producer: Conn, owner: Conn, field: str, char: str) -> None:
    value = f"ab{char}c"
    arrays: dict[str, list[Any]] = {"kinds": ["report", "report"], "keys": ["k-0", "k-1"],
                                    "correlation_ids": ["c-0", "c-1"]}
    arrays[{"kind": "kinds", "operation_key": "keys",
            "correlation_id": "correlation_ids"}[field]][1] = value

    rows = enqueue_batch(producer, [{}, {}], **arrays)

    assert [r["status"] for r in rows] == ["created", "rejected"]
    assert rows[1]["error"] == (f"job 2: {field} "
                                + character_message(REFUSED_CHARACTERS[char], 3))
    assert len(snapshot(owner)[0]) == 1


@pytest.mark.parametrize("text", [
    "rapport_\u00e9", "\u5831\u544a", "\u043e\u0442\u0447\u0451\u0442",
    "\u062a\u0642\u0631\u064a\u0631", "caf\u0065\u0301", "a b", "\u00a0nbsp\u3000wide"])
def test_names_of_letters_of_any_script_and_spaces_are_stored(producer: Conn,
                                                               text: str) -> None:
    rows = enqueue_batch(producer, [{}], kinds=[text], keys=[text], correlation_ids=[text])

    assert [r["status"] for r in rows] == ["created"]


def test_the_first_refused_character_is_named_by_its_position(producer: Conn) -> None:
    rows = enqueue_batch(producer, [{}], kinds=["\u5831\u544a\u202e\ngo"])

    assert rows[0]["error"] == "job 1: kind " + character_message("U+202E", 3)


def test_a_blank_kind_is_refused_as_blank_first(producer: Conn) -> None:
    rows = enqueue_batch(producer, [{}], kinds=["\n"])

    assert rows[0]["error"] == "job 1: kind must be a non-blank text of at most 128 characters"


def test_the_single_enqueue_raises_the_same_message(producer: Conn) -> None:
    with raises_sqlstate("22023", match="job 1: kind " + character_message("U+001B", 7)):
        enqueue(producer, new_tenant(), "k", kind="report\x1b[31m")


@pytest.mark.parametrize(("statement", "argument"), [
    ("select * from app.claim_ready_jobs(%s, 1, '30 s')", "p_owner"),
    ("select * from app.finish_jobs(%s, '{}', '{}', '{}', '{}', '{}', '{}')", "p_owner"),
    ("select * from app.redrive_jobs(%s, null, null, null, 10, null)", "p_actor"),
    ("select * from app.cancel_jobs('op', null, null, null, 10, %s)", "p_reason"),
])
def test_owners_actors_and_reasons_are_held_to_the_same_rule(
        worker: Conn, statement: str, argument: str) -> None:
    """A worker's name becomes the lease owner and the actor of its events, an
    operator's name and reason the actor and details of theirs: each is shown to
    tenant readers, operators and logs as it is."""
    with raises_sqlstate("22023", match=f"{argument} " + character_message("U+202E", 2)):
        worker.execute(statement, ("w\u202e1",))


def test_filters_still_select_kinds_stored_before_the_rule(worker: Conn, owner: Conn) -> None:
    """A database upgraded with such kinds keeps its jobs; filters only select, so an
    operator can still cancel or redrive them by kind, and a worker filter claim them."""
    tenant = new_tenant()
    enqueue(owner, tenant, "ok")
    owner.execute("update app.jobs set kind = 'old\nkind' where tenant_id = %s", (tenant,))

    cancelled = worker.execute(
        "select * from app.cancel_jobs('op', %s, null, %s, 10, 'renamed')",
        (tenant, "old\nkind")).fetchall()
    assert len(cancelled) == 1
    enqueue(owner, tenant, "again")
    owner.execute("update app.jobs set kind = 'old\nkind' where operation_key = 'again'")
    claimed = worker.execute("select * from app.claim_jobs(%s, 'w', 1, '30 s', %s)",
                             (tenant, ["old\nkind"])).fetchall()
    assert [row["operation_key"] for row in claimed] == ["again"]


def test_a_key_stored_before_the_rule_is_rejected_when_enqueued_again(
        producer: Conn, owner: Conn) -> None:
    """The job stays and runs; the repeat gets the rule's clear rejection instead of
    'existing', so the producer learns its keys break it."""
    tenant = new_tenant()
    row = enqueue(owner, tenant, "placeholder")
    owner.execute("update app.jobs set operation_key = 'order\n42' where id = %s", (row["id"],))

    rows = producer.execute(
        "select * from app.enqueue_jobs(%s, %s, %s, %s)",
        ([tenant], ["order\n42"], ["email.send"], [Jsonb({"n": "placeholder"})])).fetchall()

    assert rows[0]["status"] == "rejected"
    assert claim_one(owner, tenant)["id"] == row["id"]


def test_the_rule_is_the_same_whatever_the_callers_string_settings(producer: Conn) -> None:
    producer.execute("set standard_conforming_strings = off")
    try:
        rows = enqueue_batch(producer, [{}], kinds=["a\\u202eb"])
        assert rows[0]["status"] == "created"  # a backslash and letters, not an override
        rows = enqueue_batch(producer, [{}], kinds=["a\u202eb"])
        assert rows[0]["status"] == "rejected"
    finally:
        producer.execute("reset standard_conforming_strings")


def test_the_message_names_the_character_without_repeating_it(producer: Conn) -> None:
    """A message is written into logs too: it must not carry the character it refuses."""
    kinds = [f"a{char}b" for char in REFUSED_CHARACTERS]
    rows = enqueue_batch(producer, [{}] * len(kinds), kinds=kinds)

    for row, char in zip(rows, REFUSED_CHARACTERS, strict=True):
        assert row["error"].endswith(character_message(REFUSED_CHARACTERS[char], 2))
        assert char not in row["error"]


def test_the_refused_characters_are_exactly_those_of_the_python_model(owner: Conn) -> None:
    """Every code point PostgreSQL can store, through the SQL rule and the model's: the
    two sets are one (Cc, the fixed Cf list, U+2028 and U+2029), and nothing else."""
    from leaseq.base.storable import character_problem

    row = owner.execute(
        "select array_agg(n order by n) as refused from generate_series(1, 1114111) n"
        " where n not between 55296 and 57343"
        " and app.character_problem('a' || chr(n)) is not null").fetchone()
    assert row is not None
    in_python = [n for n in range(1, 0x110000) if not 0xD800 <= n <= 0xDFFF
                 and character_problem("a" + chr(n)) is not None]

    assert row["refused"] == in_python
    # The functions test '[^ -~]' first and check only what it matches: every code
    # point outside printable ASCII must match, whatever the database's collation.
    missed = owner.execute(
        "select array_agg(n) as n from generate_series(1, 1114111) n"
        " where n not between 55296 and 57343 and n not between 32 and 126"
        " and not ('a' || chr(n)) ~ '[^ -~]'").fetchone()
    assert missed == {"n": None}
    assert {0x0A, 0x1B, 0x85, 0x200E, 0x202E, 0x2066, 0x2069, 0xFEFF, 0x2028,
            0x2029} <= set(in_python)
    assert not {0x20, 0xA0, 0xE9, 0x3000, 0x5831, 0x0301} & set(in_python)
