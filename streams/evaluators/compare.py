"""Which arm of an A/B test is better, by how much, and how sure we are.

Arms are fed the same jobs, so the comparison is paired: a bootstrap over jobs resamples
job ids and recomputes the difference of means, which keeps each job's own difficulty
out of the noise. Seeded, so a report is reproducible.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    n: int


def bootstrap_mean(
    values: Sequence[float], *, resamples: int = 2000, level: float = 0.95, seed: int = 0
) -> Interval:
    if not values:
        return Interval(0.0, 0.0, 0.0, 0)
    rng = random.Random(seed)
    n = len(values)
    means = sorted(statistics.fmean(rng.choices(values, k=n)) for _ in range(resamples))
    return Interval(statistics.fmean(values), *_bounds(means, level), n)


def paired_difference(
    a: Mapping[str, float],
    b: Mapping[str, float],
    *,
    resamples: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Mean of b[job] - a[job] over jobs in both arms, with a bootstrap interval."""
    common = sorted(set(a) & set(b))
    diffs = [b[j] - a[j] for j in common]
    return bootstrap_mean(diffs, resamples=resamples, level=level, seed=seed)


def _bounds(ordered: Sequence[float], level: float) -> tuple[float, float]:
    tail = (1.0 - level) / 2.0
    lo = ordered[int(tail * (len(ordered) - 1))]
    hi = ordered[int((1.0 - tail) * (len(ordered) - 1))]
    return lo, hi


def verdict(diff: Interval, metric: str, *, higher_is_better: bool = False) -> str:
    """A sentence for the report: which arm wins on this metric, or that it is a tie."""
    if diff.n == 0:
        return f"{metric}: no jobs in common"
    if diff.low <= 0.0 <= diff.high:
        return f"{metric}: no significant difference (CI contains 0)"
    b_better = (diff.estimate > 0) == higher_is_better
    return f"{metric}: {'B' if b_better else 'A'} is better by {abs(diff.estimate):.4g}"
