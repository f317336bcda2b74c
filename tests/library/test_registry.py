"""The registry maps each kind to exactly one handler, and says so when it cannot."""

from __future__ import annotations

import re
from typing import Any

import pytest
from leaseq import ConfigurationError, JobContext, Registry, RetryPolicy


def handler(payload: Any, ctx: JobContext) -> None:
    return None


def test_the_decorator_registers_the_function_and_returns_it_declared() -> None:
    registry = Registry()
    policy = RetryPolicy(max_attempts=2)
    decorated = registry.handler("email.send", timeout=5, retry=policy)(handler)
    # Callable as the function itself, which is what the worker gets.
    assert decorated.__wrapped__ is handler  # type: ignore[attr-defined]
    assert decorated.kind == "email.send"
    assert decorated({}, None) is None  # type: ignore[arg-type]
    registration = registry.get("email.send")
    assert registration is not None
    assert (registration.handler, registration.timeout, registration.retry) == (handler, 5, policy)
    assert registry.kinds == ["email.send"]
    assert len(registry) == 1


def test_an_unregistered_kind_has_no_registration() -> None:
    assert Registry().get("email.send") is None


def test_a_kind_registered_twice_is_refused() -> None:
    registry = Registry()
    registry.register("email.send", handler)
    with pytest.raises(ConfigurationError, match="registered twice"):
        registry.register("email.send", handler)


@pytest.mark.parametrize("kind", ["", "   ", "\t", "\u200b", "\ufeff\u2060", "k" * 129])
def test_a_kind_the_queue_would_refuse_is_refused_at_registration(kind: str) -> None:
    with pytest.raises(ConfigurationError, match="1 to 128 characters, at least one of"):
        Registry().register(kind, handler)


@pytest.mark.parametrize(("kind", "found"), [
    ("email\nsend", "U+000A at character 6"), ("email.send\x1b[0m", "U+001B at character 11"),
    ("\u202eemail.send", "U+202E at character 1"), ("email\u2028send", "U+2028 at character 6"),
])
def test_a_kind_holding_a_control_format_or_line_separator_character_cannot_be_registered(
        kind: str, found: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"\(found {re.escape(found)}; remove it\)"):
        Registry().register(kind, handler)


@pytest.mark.parametrize("kind", ["rapport_\u00e9", "\u5831\u544a"])
def test_a_kind_of_letters_of_any_script_is_registered(kind: str) -> None:
    assert Registry().register(kind, handler).kind == kind


def test_a_non_positive_timeout_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="positive"):
        Registry().register("email.send", handler, timeout=0)


def test_async_handlers_are_accepted_and_known_as_such_however_they_are_spelled() -> None:
    import functools

    registry = Registry()

    @registry.handler("async.decorated", timeout=5)
    async def decorated(payload: Any, ctx: JobContext) -> None:
        return None

    class Sender:
        async def __call__(self, payload: Any, ctx: JobContext) -> None:
            return None

    async def with_options(payload: Any, ctx: JobContext, *, retries: int) -> None:
        return None

    registry.register("async.object", Sender())
    registry.register("async.partial", functools.partial(with_options, retries=2))
    registry.register("sync.plain", handler)

    assert {kind: registry.get(kind).is_async for kind in registry.kinds} == {  # type: ignore[union-attr]
        "async.decorated": True, "async.object": True, "async.partial": True,
        "sync.plain": False}
    assert registry.has_async
    assert decorated.__name__ == "decorated"  # returned unchanged
