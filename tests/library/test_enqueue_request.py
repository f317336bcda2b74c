"""EnqueueRequest refuses what PostgreSQL would refuse for the whole batch, or what a
worker could not read back: long numbers, NaN, times PostgreSQL cannot parse, loose
integers, and kinds or keys that show nothing."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from leaseq import EnqueueRequest, QueueClient
from leaseq.base.storable import (
    FORMAT_CHARACTER_RANGES,
    MAX_NUMBER_CHARS,
    MAX_SCHEDULE_AHEAD,
    WHITE_SPACE,
    is_blank,
    storage_problem,
)
from pydantic import ValidationError

from tests.support.postgres import Conn


def make(**fields: Any) -> EnqueueRequest:
    base: dict[str, Any] = {"tenant_id": uuid.uuid4(), "operation_key": "k", "kind": "echo",
                            "payload": {}}
    return EnqueueRequest.model_validate({**base, **fields})


def refusal(**fields: Any) -> str:
    with pytest.raises(ValidationError) as raised:
        make(**fields)
    return str(raised.value)


# Numbers ----------------------------------------------------------------------------------


@pytest.mark.parametrize("number", [
    10**MAX_NUMBER_CHARS - 1,            # 1000 digits
    -(10 ** (MAX_NUMBER_CHARS - 1) - 1),  # 999 digits and a minus sign: 1000 characters
    0, -1, 2**63, 1.5e308, 5e-324, -0.0,
], ids=["1000-digits", "999-digits-negative", "zero", "minus-one", "2**63", "largest-float",
        "smallest-float", "negative-zero"])
def test_a_number_of_at_most_1000_characters_is_accepted(number: float) -> None:
    assert make(payload={"n": number}).payload == {"n": number}


@pytest.mark.parametrize("number", [
    10**MAX_NUMBER_CHARS,                 # 1001 digits
    -(10 ** (MAX_NUMBER_CHARS - 1)),      # 1000 digits and a minus sign
    10**5000,                             # beyond Python's own 4,300-digit text limit
    -(10**200_000),
], ids=["1001-digits", "1000-digits-negative", "5001-digits", "200001-digits-negative"])
def test_a_number_longer_than_1000_characters_is_refused_with_its_path(number: int) -> None:
    message = refusal(payload={"order": {"lines": [1, {"qty": number}]}})
    assert "$.order.lines[1].qty: an integer of about" in message
    assert "at most 1000 characters" in message
    assert "4300" not in message  # our rule, not Python's conversion error


def test_a_long_integer_is_measured_without_converting_it_to_text() -> None:
    # str() of this would raise (and take quadratic time below the limit).
    problem = storage_problem([10**100_000])
    assert problem is not None
    assert problem.startswith("$[0]: an integer of about 100001 digits")


def test_a_long_integer_key_is_refused_too() -> None:
    problem = storage_problem({"a": {10**5000: 1}})
    assert problem is not None
    assert problem.startswith("$.a: a key is an integer of about 5001 digits")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinity_are_refused_wherever_they_are(value: float) -> None:
    message = refusal(payload={"a": [{"b": 1}, {"c": value}]})
    assert f"$.a[1].c: {value!r} is not a JSON number" in message


def test_the_first_problem_in_document_order_is_named() -> None:
    problem = storage_problem({"a": [1, "x\x00"], "b": float("nan")})
    assert problem is not None
    assert problem.startswith("$.a[1]: must not contain NUL")


def test_keys_that_are_not_identifiers_are_quoted_in_the_path() -> None:
    assert storage_problem({"a b": {"é": float("nan")}}) == (
        '$["a b"].é: nan is not a JSON number (JSON has no NaN or Infinity); '
        "send null or a string instead")


def test_a_refusal_names_a_key_holding_lone_surrogates_in_ascii() -> None:
    """A message must itself be valid Unicode: pydantic cannot carry one that is not."""
    message = refusal(payload={"a": {"\udcff": "nul \x00"}})
    assert '$.a["\\udcff"]: must not contain NUL' in message


# available_at -----------------------------------------------------------------------------


@pytest.mark.parametrize("offset", [timedelta(hours=16), timedelta(hours=23, minutes=59),
                                    -timedelta(hours=16), -timedelta(hours=23, minutes=59)])
def test_an_offset_postgresql_refuses_is_moved_to_utc_keeping_the_instant(
        offset: timedelta) -> None:
    local = (datetime.now(UTC) + timedelta(days=3)).astimezone(timezone(offset))
    request = make(available_at=local.isoformat())
    assert request.available_at == local
    assert request.available_at is not None
    assert request.available_at.utcoffset() == timedelta(0)


def test_a_time_without_a_zone_is_refused() -> None:
    assert "must include a time zone" in refusal(available_at="2030-01-01T00:00:00")


def test_a_time_more_than_365_days_ahead_is_refused_and_one_just_inside_accepted() -> None:
    now = datetime.now(UTC)
    assert "must be at most 365 days ahead" in refusal(
        available_at=now + MAX_SCHEDULE_AHEAD + timedelta(minutes=1))
    assert make(available_at=now + MAX_SCHEDULE_AHEAD - timedelta(minutes=1)).available_at


def test_a_time_that_leaves_pythons_range_once_in_utc_is_refused() -> None:
    assert "is out of range" in refusal(
        available_at=datetime(1, 1, 1, 1, tzinfo=timezone(timedelta(hours=23))))


def test_every_accepted_time_is_stored_as_the_same_instant(
        client: QueueClient, owner: Conn) -> None:
    tenant = uuid.uuid4()
    when = (datetime.now(UTC) + timedelta(days=30)).replace(microsecond=0)
    offsets = [timedelta(hours=h) for h in (-23, -16, -15, 0, 5.5, 14, 16, 23)]
    requests = [make(tenant_id=tenant, operation_key=f"k{i}",
                     available_at=when.astimezone(timezone(offset)))
                for i, offset in enumerate(offsets)]

    results = client.enqueue_jobs(requests)

    assert [r.status for r in results] == ["created"] * len(offsets)
    rows = owner.execute("select available_at from app.jobs").fetchall()
    assert {row["available_at"] for row in rows} == {when}


# max_attempts -----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [True, False, 1.5, 5.0, "5", "5.0", []])
def test_max_attempts_takes_integers_only(value: Any) -> None:
    assert "max_attempts" in refusal(max_attempts=value)


@pytest.mark.parametrize(("value", "accepted"), [(0, False), (1, True), (20, True), (21, False)])
def test_max_attempts_is_between_1_and_20(value: int, accepted: bool) -> None:
    if accepted:
        assert make(max_attempts=value).max_attempts == value
    else:
        assert "max_attempts" in refusal(max_attempts=value)


# kind and operation_key -------------------------------------------------------------------


BLANK = ["", " ", "\t", "\n\r", "\u00a0", "\u3000", "\u200b", "\u200c\u200d", "\u2060",
         "\ufeff", "\u00ad", "\u202e", "\U000e0001", " \u200b\t\ufeff "]


@pytest.mark.parametrize("text", BLANK)
@pytest.mark.parametrize("field", ["kind", "operation_key"])
def test_a_kind_or_key_that_shows_nothing_is_refused(field: str, text: str) -> None:
    message = refusal(**{field: text})
    assert field in message
    assert "must not be blank" in message or "at least 1 character" in message


@pytest.mark.parametrize("text", ["a", " a ", "\u00a0a", "a\u3000b", "\u00e9", "\u0301"])
def test_a_kind_with_one_visible_character_is_accepted(text: str) -> None:
    assert make(kind=text, operation_key=text).kind == text


def test_the_blank_rule_is_white_space_and_format_characters_exactly() -> None:
    import unicodedata

    format_characters = {chr(code) for first, last in FORMAT_CHARACTER_RANGES
                         for code in range(first, last + 1)}
    assert all(unicodedata.category(c) in ("Cf", "Cn") for c in format_characters)
    assert {chr(c) for c in range(0x110000)
            if unicodedata.category(chr(c)) == "Cf"} <= format_characters
    assert all(c.isspace() for c in WHITE_SPACE)
    assert not is_blank("\x1c")  # str.isspace() says yes; White_Space says no
    assert all(is_blank(c) for c in WHITE_SPACE | format_characters)


# A batch ------------------------------------------------------------------------------------


def test_bad_items_are_refused_one_by_one_and_the_rest_go_in_one_call(
        client: QueueClient, owner: Conn) -> None:
    """Each bad item here used to pass the model and fail the whole statement (22009
    for the offset, 22P02 for NaN) or poison the worker (the number)."""
    tenant = uuid.uuid4()
    soon = (datetime.now(UTC) + timedelta(days=1)).replace(microsecond=0)
    raw: list[dict[str, Any]] = [
        {"operation_key": "good-1", "kind": "echo"},
        {"operation_key": "far-east", "kind": "echo",
         "available_at": soon.astimezone(timezone(timedelta(hours=16))).isoformat()},
        {"operation_key": "huge", "kind": "echo", "payload": {"n": 10**5000}},
        {"operation_key": "nan", "kind": "echo", "payload": {"x": float("nan")}},
        {"operation_key": "blank", "kind": "\u200b"},
        {"operation_key": "good-2", "kind": "echo", "max_attempts": 3},
    ]
    accepted: list[EnqueueRequest] = []
    refused: dict[str, tuple[str, ...]] = {}
    for item in raw:
        try:
            accepted.append(EnqueueRequest.model_validate({"tenant_id": tenant, **item}))
        except ValidationError as exc:
            refused[item["operation_key"]] = tuple(
                str(e["loc"][0]) for e in exc.errors(include_input=False))

    results = client.enqueue_jobs(accepted)

    assert refused == {"huge": ("payload",), "nan": ("payload",), "blank": ("kind",)}
    assert [r.status for r in results] == ["created"] * 3
    rows = owner.execute("select operation_key, available_at from app.jobs").fetchall()
    stored = {row["operation_key"]: row["available_at"] for row in rows}
    assert set(stored) == {"good-1", "far-east", "good-2"}
    assert stored["far-east"] == soon


# Priority ---------------------------------------------------------------------------------


@pytest.mark.parametrize("priority", [1, 5, 9, None])
def test_a_priority_from_1_to_9_or_none_is_accepted(priority: int | None) -> None:
    assert make(priority=priority).priority == priority


@pytest.mark.parametrize(("priority", "expected"), [
    (0, "greater than or equal to 1"), (10, "less than or equal to 9"),
    (-3, "greater than or equal to 1"), (True, "valid integer"), ("5", "valid integer"),
    (5.0, "valid integer"),
], ids=["zero", "ten", "negative", "bool", "text", "float"])
def test_a_priority_outside_1_to_9_or_not_an_integer_is_refused(
        priority: Any, expected: str) -> None:
    message = refusal(priority=priority)
    assert "priority" in message
    assert expected in message
