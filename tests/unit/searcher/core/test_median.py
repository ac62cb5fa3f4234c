"""The median-stop rule on hand-made trials (its agreement with Optuna's MedianPruner is a
property test: tests/property/test_searcher.py)."""

from __future__ import annotations

from typing import Any

from schemas.experiments import SearcherSpec
from streams.searcher.core.api import Trial, TrialStatus
from streams.searcher.core.median import median_stop


def searcher(**overrides: Any) -> SearcherSpec:
    raw: dict[str, Any] = {
        "name": "random",
        "metric": "val_loss",
        "budget": {"max": 1000},
        "early_stopping": {"min_trials": 3, "start_fraction": 0.1},
    }
    raw.update(overrides)
    return SearcherSpec.model_validate(raw)


def trial(
    index: int, *reports: tuple[float, float], status: TrialStatus = TrialStatus.RUNNING
) -> Trial:
    return Trial(index, {}, 1000.0, status, validations=tuple(reports))


OTHERS = [
    trial(0, (100, 0.3), (200, 0.2)),
    trial(1, (100, 0.4), (200, 0.35), status=TrialStatus.STOPPED),
    trial(2, (50, 0.9), (100, 0.5), status=TrialStatus.COMPLETED),
]


def test_a_trial_worse_than_the_median_of_the_others_at_its_budget_stops() -> None:
    bad = trial(3, (100, 0.9))
    why = median_stop(searcher(), [*OTHERS, bad], bad)
    assert why == (
        "median stop: val_loss 0.9 (its best by budget 100) is worse than the median 0.4 of 3 "
        "other trials at budget 100 or the nearest below"
    )


def test_a_trial_at_or_better_than_the_median_goes_on() -> None:
    at = trial(3, (100, 0.4))
    assert median_stop(searcher(), [*OTHERS, at], at) is None
    good = trial(3, (100, 0.1))
    assert median_stop(searcher(), [*OTHERS, good], good) is None


def test_others_count_at_the_nearest_budget_below() -> None:
    # at 150: trial 0 and 1 at 100, trial 2 at 100: median 0.4
    late = trial(3, (150, 0.45))
    why = median_stop(searcher(), [*OTHERS, late], late)
    assert why is not None and "median 0.4 of 3" in why
    # at 60: only trial 2 reported that early: fewer than min_trials
    early = trial(3, (60, 5.0))
    assert median_stop(searcher(), [*OTHERS, early], early) is None


def test_its_best_value_so_far_is_what_is_compared() -> None:
    # worse now (0.9) than the median, but its best by this budget (0.1) is not
    recovering = trial(3, (50, 0.1), (100, 0.9))
    assert median_stop(searcher(), [*OTHERS, recovering], recovering) is None


def test_not_before_start_fraction_nor_min_trials_nor_without_the_rule() -> None:
    bad = trial(3, (90, 9.0))
    assert median_stop(searcher(), [*OTHERS, bad], bad) is None  # 90 < 0.1 * 1000
    bad = trial(3, (100, 9.0))
    rule = {"min_trials": 4, "start_fraction": 0.1}
    assert median_stop(searcher(early_stopping=rule), [*OTHERS, bad], bad) is None
    assert median_stop(searcher(early_stopping=None), [*OTHERS, bad], bad) is None
    assert median_stop(searcher(), [*OTHERS, bad], bad) is not None


def test_larger_is_better_turns_the_comparison() -> None:
    accuracy = searcher(metric="acc", smaller_is_better=False)
    low = trial(3, (100, 0.35))
    why = median_stop(accuracy, [*OTHERS, low], low)
    assert why is not None and "acc 0.35" in why
    high = trial(3, (100, 0.45))
    assert median_stop(accuracy, [*OTHERS, high], high) is None
