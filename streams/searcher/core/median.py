"""The median-stop assessor (NNI's and Katib's early-stopping rule, Optuna's
``MedianPruner``), for searchers that do not prune themselves (grid, random).

A trial that reports a validation value at budget b is stopped when its best value so far
is worse than the median of the other trials' values at b, once ``min_trials`` other
trials reported there and b is at least ``start_fraction`` of the maximum budget. "The
other trials' values at b" is each one's value at b or at the nearest budget below b that
it reported (its last report there), whatever its state: running, stopped, completed.

The rule is Optuna's ``MedianPruner`` (``PercentilePruner`` at 50): the trial's best value
over its steps against the median of the others' values at the same step, not before
``n_warmup_steps``, and only with ``n_min_trials`` values there; a test checks that both
answer alike wherever both apply. It is written here rather than by driving Optuna's
pruner because what Optuna would decide on is exactly what differs: its pruner compares
with *completed* trials at the *same integer step*, while a search over a shared queue is
asynchronous (the trials to compare with are mostly still running) and its budgets are
whatever a trial reported (seconds, samples: floats, rarely equal across trials). Once
each other trial's value at b is taken (the nearest-below rule, most of the work), what is
left for Optuna is a median and a comparison, and building an Optuna study of every trial
on every report would cost more than the rule.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from schemas.experiments import SearcherSpec
from streams.searcher.core.api import Trial, better, number


def median_stop(searcher: SearcherSpec, trials: Sequence[Trial], trial: Trial) -> str | None:
    """Why ``trial``, whose last validation report is its latest, must stop now (the
    reason a user reads), or None."""
    rule = searcher.early_stopping
    if rule is None or not trial.validations:
        return None
    budget = trial.validations[-1][0]
    if budget < rule.start_fraction * searcher.budget.max:
        return None
    best = trial.best(searcher.smaller_is_better, up_to=budget)
    if best is None:
        return None
    others = [
        v
        for other in trials
        if other.index != trial.index and (v := other.value_at(budget)) is not None
    ]
    if len(others) < rule.min_trials:
        return None
    median = statistics.median(others)
    if not better(median, best, searcher.smaller_is_better):
        return None
    return (
        f"median stop: {searcher.metric} {number(best)} (its best by budget {number(budget)}) is "
        f"worse than the median {number(median)} of {len(others)} other trials at budget "
        f"{number(budget)} or the nearest below"
    )


__all__ = ["median_stop"]
