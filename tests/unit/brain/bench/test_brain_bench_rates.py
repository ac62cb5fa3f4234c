"""`bench brain` prints its rates rounded, and ratios that agree with what it prints."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streams.brain.bench.run import printed_rates

rates = st.floats(min_value=1.0, max_value=1e7, allow_nan=False)


@given(rates, rates, st.none() | rates)
def test_each_printed_ratio_is_the_ratio_of_the_printed_rates(
    brain: float, baseline: float, raw: float | None
) -> None:
    out = printed_rates(brain, baseline, raw)
    assert out["events_per_s"] == round(brain)
    assert out["baseline_events_per_s"] == round(baseline)
    assert out["ratio_to_baseline"] == round(out["events_per_s"] / out["baseline_events_per_s"], 4)
    if raw is None:
        assert out["faust_raw_events_per_s"] is None and out["ratio_to_faust_raw"] is None
    else:
        assert out["ratio_to_faust_raw"] == round(
            out["events_per_s"] / out["faust_raw_events_per_s"], 4
        )


def test_a_case_where_the_unrounded_ratio_disagrees_with_the_printed_rates() -> None:
    """1228.7 / 25002.1 rounds to 0.0491, but the printed 1229 / 25002 is 0.0492: the
    bench test divided the printed rates and failed now and then (0.0487 != 0.0486)."""
    out = printed_rates(1228.7, 25002.1, 1228.7)
    assert (out["events_per_s"], out["baseline_events_per_s"]) == (1229, 25002)
    assert out["ratio_to_baseline"] == 0.0492
    assert out["ratio_to_faust_raw"] == 1.0
