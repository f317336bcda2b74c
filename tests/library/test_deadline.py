"""Lease sizing from the time left, and deadlines that tests move by hand."""

from __future__ import annotations

from datetime import timedelta

from leaseq import MonotonicDeadline, lease_for
from leaseq.base.deadline import MAX_LEASE

from tests.support.fakes import ManualClock


def test_the_lease_ends_the_margin_before_the_deadline() -> None:
    assert lease_for(60, margin=5) == timedelta(seconds=55)


def test_the_cap_shortens_the_lease_but_never_lengthens_it() -> None:
    assert lease_for(900, margin=5, cap=60) == timedelta(seconds=60)
    assert lease_for(30, margin=5, cap=60) == timedelta(seconds=25)


def test_no_lease_when_less_than_the_sql_minimum_of_one_second_would_be_left() -> None:
    assert lease_for(5.99, margin=5) is None
    assert lease_for(6, margin=5) == timedelta(seconds=1)
    assert lease_for(0, margin=0) is None


def test_the_lease_never_exceeds_the_sql_maximum_of_one_day() -> None:
    assert lease_for(10 * 86_400, margin=5) == MAX_LEASE


def test_a_monotonic_deadline_counts_down_and_stops_at_zero() -> None:
    clock = ManualClock()
    deadline = MonotonicDeadline(10, clock=clock)
    assert deadline.remaining() == 10
    clock.advance(4)
    assert deadline.remaining() == 6
    clock.advance(60)
    assert deadline.remaining() == 0
