"""Hypothesis strategies for hostile enqueue input: what producers, attackers and
broken clients send. Shared by the library, SQL and Lambda fuzz tests."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import strategies as st

#: Tenants drawn from a small pool, so repeats hit existing jobs and conflicts.
TENANT_POOL = [uuid.UUID(int=n) for n in (1, 2, 3)]
KEY_POOL = ["op-1", "op-2", "op-3"]

#: The contract refuses payloads nested more than 100 levels; the fuzzers straddle that
#: bound and go well past it (Python's json module itself gives up near 1,000).
MAX_FUZZ_DEPTH = 300

SQL_FRAGMENTS = [
    "'; drop table app.jobs; --",
    "') or ('1'='1",
    "$$; select pg_sleep(10); $$",
    "app.jobs",
    "%s",
    "%(tenant_ids)s",
    "\\",
    "NULL",
    "' || (select lease_token::text from app.jobs limit 1) || '",
    "1; truncate app.job_events",
    "\"; grant all on app.jobs to public; --",
]


def _with_nul(text: str) -> str:
    return f"{text}\x00{text}"


def _invalid_utf8(raw: bytes) -> str:
    """Undecodable bytes as Python represents them after a lenient decode: lone
    surrogates, which no UTF-8 encoder accepts."""
    return (b"\xff" + raw + b"\xc3\x28").decode("utf-8", "surrogateescape")


#: Text that shows nothing: White_Space and invisible format characters (category Cf).
INVISIBLE_TEXT = ["", " ", "\t\n", "\u200b", "\ufeff", "\u200c\u200d", "\u2060", "\u00ad",
                  "\u202e", "\u3000", "\U000e0001", " \u200b\t "]

#: Integers around the contract's 1,000-character bound on JSON numbers, built when
#: drawn (Hypothesis shows its examples with repr(), which refuses integers of more than
#: 4,300 digits: those are tested one by one instead).
long_integers = st.tuples(st.sampled_from([1, -1]), st.integers(990, 1010),
                          st.sampled_from([0, -1])).map(lambda t: t[0] * (10 ** t[1] + t[2]))

nasty_text = st.one_of(
    st.text(max_size=12),
    st.sampled_from(SQL_FRAGMENTS),
    st.sampled_from([*INVISIBLE_TEXT, "é" * 130, "x" * 256]),
    st.text(min_size=250, max_size=260),
    st.text(max_size=5).map(_with_nul),
    st.binary(max_size=6).map(_invalid_utf8),
)

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    long_integers,
    st.floats(allow_nan=True, allow_infinity=True),
    nasty_text,
)

def mostly(valid: st.SearchStrategy[Any], hostile: st.SearchStrategy[Any]
           ) -> st.SearchStrategy[Any]:
    """Valid seven times in ten: enough hostile input to probe every field, enough
    valid input that whole batches reach the database."""
    return st.integers(0, 9).flatmap(lambda n: valid if n < 7 else hostile)


plain_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1,
                     max_size=40).filter(lambda t: t.strip() != "")

valid_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**18), 10**18)
    | st.floats(allow_nan=False, allow_infinity=False) | plain_text,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(plain_text, children,
                                                                      max_size=3),
    max_leaves=8,
)

json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(nasty_text, children,
                                                                      max_size=4),
    max_leaves=16,
)


def nested(depth: int) -> dict[str, Any]:
    payload: dict[str, Any] = {"leaf": True}
    for _ in range(depth):
        payload = {"n": payload}
    return payload


payloads = mostly(st.dictionaries(plain_text, valid_json, max_size=4), st.one_of(
    st.dictionaries(st.text(max_size=8), json_values, max_size=5),
    st.integers(1, MAX_FUZZ_DEPTH).map(nested),
    st.integers(95, 105).map(nested),
    # Around the 256 KiB bound: {"blob": "..."} is the string plus 12 bytes.
    st.integers(262_144 - 16, 262_144 - 8).map(lambda n: {"blob": "x" * n}),
    st.integers(262_144 - 12, 262_144 + 64).map(lambda n: {"blob": "é" * (n // 2)}),
    # Around the 1000-character bound on a number's text (10**n has n + 1 digits).
    st.integers(995, 1005).map(lambda n: {"n": 10**n}),
    st.integers(995, 1005).map(lambda n: {"a": [1, {"n": -(10**n)}]}),
    json_values,
))

tenant_ids = mostly(
    st.sampled_from(TENANT_POOL).map(str),
    st.one_of(st.sampled_from(TENANT_POOL).map(lambda t: t.hex.upper()), st.uuids().map(str),
              nasty_text, st.integers(), st.none()),
)

operation_keys = mostly(st.sampled_from(KEY_POOL) | st.uuids().map(str) | plain_text,
                        st.one_of(nasty_text, st.integers(), st.none()))
kinds = mostly(st.sampled_from(["echo", "email.send"]), st.one_of(nasty_text, st.none()))

#: UTC offsets Python allows; PostgreSQL refuses those beyond +-15:59 (22009).
offsets = st.integers(-(24 * 60 - 1), 24 * 60 - 1).map(
    lambda minutes: timezone(timedelta(minutes=minutes)))

available_ats = mostly(
    st.tuples(st.integers(-30, 800), offsets).map(
        lambda t: (datetime.now(UTC) + timedelta(days=t[0])).astimezone(t[1]).isoformat()),
    st.one_of(st.datetimes(timezones=st.just(UTC)).map(datetime.isoformat),
              st.datetimes(timezones=offsets).map(datetime.isoformat),
              st.datetimes().map(datetime.isoformat), nasty_text, st.none()),
)
max_attempts = mostly(st.integers(1, 20), st.one_of(
    st.none(), st.integers(-3, 25), st.floats(), st.booleans(),
    st.integers(1, 20).map(str), st.integers(1, 20).map(float), nasty_text))
correlation_ids = mostly(plain_text, st.one_of(st.none(), nasty_text))


@st.composite
def enqueue_items(draw: st.DrawFn) -> Any:
    """One job as a producer would send it, every field possibly hostile."""
    item: dict[str, Any] = {
        "tenant_id": draw(tenant_ids),
        "operation_key": draw(operation_keys),
        "kind": draw(kinds),
        "payload": draw(payloads),
    }
    optional = {"available_at": available_ats, "max_attempts": max_attempts,
                "correlation_id": correlation_ids}
    for name, values in optional.items():
        if draw(st.integers(0, 2)) == 0:
            item[name] = draw(values)
    if draw(st.integers(0, 19)) == 0:
        item[draw(st.sampled_from(["lease_token", "state", "attempts", "queue"]))] = draw(
            json_values)
    for name in ("tenant_id", "operation_key", "kind", "payload"):
        if draw(st.integers(0, 39)) == 0:
            del item[name]
    return item if draw(st.integers(0, 29)) else draw(json_values)


@st.composite
def enqueue_events(draw: st.DrawFn) -> Any:
    """A whole event for the enqueue function: one job, a batch, an EventBridge
    envelope around either, or something else entirely."""
    shape = draw(st.sampled_from(["item", "batch", "eventbridge", "eventbridge", "junk"]))
    if shape == "junk":
        return draw(st.one_of(json_values, st.lists(enqueue_items(), max_size=3),
                              st.fixed_dictionaries({"jobs": json_values})))
    body = draw(enqueue_items()) if shape == "item" or draw(st.booleans()) else {
        "jobs": draw(st.lists(enqueue_items(), min_size=0, max_size=6))}
    if shape != "eventbridge":
        return body
    envelope: dict[str, Any] = {
        "version": "0",
        "id": str(draw(st.uuids())),
        "detail-type": draw(st.sampled_from(["leaseq.enqueue", "leaseq.enqueue",
                                             "order.placed", ""])),
        "source": "com.example.fuzz",
        "account": "123456789012",
        "time": draw(st.sampled_from(["2026-11-29T17:00:00Z", "not a time"])),
        "region": "us-east-1",
        "resources": [],
        "detail": body,
    }
    if draw(st.integers(0, 9)) == 0:
        del envelope[draw(st.sampled_from(sorted(envelope)))]
    return envelope


@st.composite
def nested_near_the_bound(draw: st.DrawFn) -> dict[str, Any]:
    """A payload whose deepest branch is 90 to 110 levels of objects and arrays (empty
    or not at the bottom), with shallower siblings along the way."""
    value: Any = draw(st.sampled_from([1, "x", None, [], {}]))
    for _ in range(draw(st.integers(90, 110))):
        sibling: Any = draw(st.none() | st.just([1, [2]]) | st.just({"s": {}}))
        if draw(st.booleans()):
            value = [value] if sibling is None else [sibling, value]
        else:
            value = {"n": value} if sibling is None else {"s": sibling, "n": value}
    return {"top": value}
