"""The one backoff: doubling up to a cap, jittered on request, never overflowing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover_events.backoff import Backoff


def test_backoff_doubles_up_to_its_cap() -> None:
    b = Backoff(initial_s=0.5, max_s=30)
    assert [b.delay(n) for n in (0, 1, 2, 3, 4, 7, 50)] == [0.5, 0.5, 1.0, 2.0, 4.0, 30.0, 30.0]


@given(st.integers(min_value=0, max_value=10**9))
def test_a_long_outage_stays_at_the_cap(failures: int) -> None:
    plain, jittered = Backoff(initial_s=0.25, max_s=8), Backoff(0.25, 8, jitter=True)
    assert 0.25 <= plain.delay(failures) <= 8
    assert plain.delay(failures) / 2 <= jittered.delay(failures) <= plain.delay(failures)


def test_jitter_spreads_the_delays() -> None:
    b = Backoff(initial_s=1.0, max_s=1.0, jitter=True)
    delays = {b.delay(3) for _ in range(50)}
    assert len(delays) > 1 and all(0.5 <= d <= 1.0 for d in delays)


def test_a_run_that_lasted_starts_the_series_again() -> None:
    b = Backoff(stable_s=60)
    assert b.failures_after(4, ran_s=59.9) == 5
    assert b.failures_after(4, ran_s=60.0) == 1


def test_a_cap_below_the_first_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="initial_s <= max_s"):
        Backoff(initial_s=2, max_s=1)
