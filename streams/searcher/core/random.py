"""Random search (Determined's ``random``): ``max_trials`` points drawn by Optuna's
``RandomSampler`` (``space.sample``: trial i's point depends only on the space, the seed
and i), each trial to the maximum budget; the median-stop assessor may stop one early."""

from __future__ import annotations

from schemas.experiments import ExperimentSpec
from streams.searcher.core.fixed import FixedBudgetSearcher, Point
from streams.searcher.core.space import sample


class RandomSearcher(FixedBudgetSearcher):
    name = "random"
    description = (
        "max_trials points drawn at random (Optuna's RandomSampler, seeded per trial), "
        "each to the maximum budget; median stop if asked"
    )

    def total(self, spec: ExperimentSpec) -> int:
        return spec.searcher.max_trials

    def points(self, spec: ExperimentSpec, start: int, stop: int) -> list[Point]:
        searcher = spec.searcher
        return [
            (
                sample(spec.hyperparameters, searcher.seed, i),
                f"random point {i + 1} of {searcher.max_trials} (seed {searcher.seed})",
            )
            for i in range(start, stop)
        ]


__all__ = ["RandomSearcher"]
