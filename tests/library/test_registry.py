"""The registry maps each kind to exactly one handler, and says so when it cannot."""

from __future__ import annotations

from typing import Any

import pytest
from leaseq import ConfigurationError, JobContext, Registry, RetryPolicy


def handler(payload: Any, ctx: JobContext) -> None:
    return None


def test_the_decorator_registers_and_returns_the_function_unchanged() -> None:
    registry = Registry()
    policy = RetryPolicy(max_attempts=2)
    decorated = registry.handler("email.send", timeout=5, retry=policy)(handler)
    assert decorated is handler
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


def test_a_non_positive_timeout_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="positive"):
        Registry().register("email.send", handler, timeout=0)
