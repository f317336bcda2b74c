"""Retry timing is pure arithmetic: exponential ceiling, equal jitter, per-kind limits."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from leaseq import RetryPolicy
from leaseq.kinds.retry import MAX_RETRY_DELAY


def test_the_ceiling_doubles_with_each_attempt_from_the_base_delay() -> None:
    policy = RetryPolicy(base_delay=5, max_delay=3600)
    assert [policy.delay(n, rand=lambda: 1.0) for n in (1, 2, 3, 4)] == [
        timedelta(seconds=5), timedelta(seconds=10), timedelta(seconds=20), timedelta(seconds=40)]


def test_half_the_delay_is_fixed_and_half_is_jitter() -> None:
    policy = RetryPolicy(base_delay=8, max_delay=3600)
    assert policy.delay(1, rand=lambda: 0.0) == timedelta(seconds=4)
    assert policy.delay(1, rand=lambda: 0.5) == timedelta(seconds=6)
    assert policy.delay(1, rand=lambda: 1.0) == timedelta(seconds=8)


def test_the_delay_is_capped_at_max_delay() -> None:
    policy = RetryPolicy(base_delay=5, max_delay=60)
    assert policy.delay(20, rand=lambda: 1.0) == timedelta(seconds=60)
    assert policy.delay(1000, rand=lambda: 0.0) == timedelta(seconds=30)


@given(attempt=st.integers(min_value=1, max_value=20),
       base=st.floats(min_value=0, max_value=600),
       extra=st.floats(min_value=0, max_value=86_400),
       rand=st.floats(min_value=0, max_value=1))
def test_every_delay_lies_between_half_the_ceiling_and_the_ceiling(
        attempt: int, base: float, extra: float, rand: float) -> None:
    policy = RetryPolicy(base_delay=base, max_delay=base + extra)
    ceiling = min(policy.max_delay, base * 2.0 ** (attempt - 1))
    delay = policy.delay(attempt, rand=lambda: rand).total_seconds()
    assert ceiling / 2 - 1e-6 <= delay <= ceiling + 1e-6
    assert delay <= MAX_RETRY_DELAY.total_seconds()


def test_absurd_attempt_numbers_still_give_the_capped_delay() -> None:
    assert RetryPolicy(base_delay=1, max_delay=90).delay(10**6, rand=lambda: 1.0) == timedelta(
        seconds=90)


def test_a_kind_limit_below_the_jobs_own_limit_wins_and_never_raises_it() -> None:
    assert RetryPolicy(max_attempts=2).allows_another(1, 6)
    assert not RetryPolicy(max_attempts=2).allows_another(2, 6)
    assert not RetryPolicy(max_attempts=10).allows_another(3, 3)
    assert RetryPolicy().allows_another(5, 6)
    assert not RetryPolicy().allows_another(6, 6)


@pytest.mark.parametrize("fields", [
    {"base_delay": -1},
    {"base_delay": 86_401, "max_delay": 90_000},
    {"base_delay": 10, "max_delay": 5},
    {"max_delay": 31 * 86_400},
    {"max_attempts": 0},
    {"max_attempts": 21},
])
def test_a_policy_outside_the_sql_bounds_is_refused_when_made(fields: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"must|need"):
        RetryPolicy(**fields)  # type: ignore[arg-type]


def test_a_cap_below_the_first_delay_is_refused_naming_both() -> None:
    with pytest.raises(ValueError, match=r"max_delay \(10\) is less than base_delay \(60\)"):
        RetryPolicy(base_delay=60, max_delay=10)


def test_the_policy_and_the_worker_settings_share_one_default_and_one_range() -> None:
    from leaseq import LeaseqSettings
    from leaseq.kinds.retry import RETRY_BASE, RETRY_MAX

    worker = LeaseqSettings.from_env({"DATABASE_URL": "postgresql://h/db"}).worker
    assert (RetryPolicy().base_delay, RetryPolicy().max_delay) == (
        worker.retry_base_seconds, worker.retry_max_seconds) == (
        RETRY_BASE.default, RETRY_MAX.default)
    for bounds, name in ((RETRY_BASE, "base_delay"), (RETRY_MAX, "max_delay")):
        RetryPolicy(**{"base_delay": 0, "max_delay": bounds.high, name: bounds.high})
        with pytest.raises(ValueError, match=f"{name} must be at least 0 and at most"):
            RetryPolicy(**{"base_delay": 0, "max_delay": bounds.high, name: bounds.high + 1})
