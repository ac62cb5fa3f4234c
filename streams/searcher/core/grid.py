"""Grid search (Determined's ``grid``): every point of the space's grid, in order, up to
``max_trials``, each trial to the maximum budget; the median-stop assessor may stop one
early. The grid is ``space.grid_axes``: ``count`` points of every numeric parameter, which
each must have (an experiment without one is refused, naming the parameter)."""

from __future__ import annotations

from schemas.experiments import ExperimentSpec
from streams.searcher.core.fixed import FixedBudgetSearcher, Point
from streams.searcher.core.space import (
    grid_axes,
    grid_point,
    grid_refusal,
    space_grid_size,
)


class GridSearcher(FixedBudgetSearcher):
    name = "grid"
    description = (
        "every point of the grid (count points of each numeric hyperparameter), in order, "
        "up to max_trials, each to the maximum budget; median stop if asked"
    )

    def check(self, spec: ExperimentSpec) -> str | None:
        return grid_refusal(spec.hyperparameters)

    def total(self, spec: ExperimentSpec) -> int:
        return min(spec.searcher.max_trials, space_grid_size(spec.hyperparameters))

    def points(self, spec: ExperimentSpec, start: int, stop: int) -> list[Point]:
        if start >= stop:
            return []
        axes = grid_axes(spec.hyperparameters)
        size = space_grid_size(spec.hyperparameters)
        return [(grid_point(axes, i), f"grid point {i + 1} of {size}") for i in range(start, stop)]


__all__ = ["GridSearcher"]
