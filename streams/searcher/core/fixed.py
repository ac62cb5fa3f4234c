"""The life grid and random search share: a fixed list of points, each trial run once to
the maximum budget, as many at once as ``max_concurrent_trials`` lets (all of them when
it is 0), each stopped early by the median-stop assessor when the experiment asks for one
(``searcher.early_stopping``). What differs is only which point trial i gets and how many
points there are.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping

from schemas.experiments import ExperimentSpec, ParamValue
from streams.searcher.core.api import (
    Answer,
    Complete,
    Create,
    JsonValue,
    Operation,
    SearchContext,
    Searcher,
    Stop,
    number,
)
from streams.searcher.core.median import median_stop

#: A trial's hyperparameters and why it is created.
Point = tuple[Mapping[str, ParamValue], str]


class FixedBudgetSearcher(Searcher[None]):
    """A searcher of ``total`` points, each trial to the maximum budget. It remembers
    nothing of its own: the next trial is the number of trials created so far."""

    @abstractmethod
    def total(self, spec: ExperimentSpec) -> int:
        """How many trials the experiment runs (at most ``max_trials``)."""

    @abstractmethod
    def points(self, spec: ExperimentSpec, start: int, stop: int) -> list[Point]:
        """The hyperparameters of trials ``start`` to ``stop - 1``, each with why it is
        created, in a user's words (one call per ``fill``: a searcher prepares what it
        needs once)."""

    def check(self, spec: ExperimentSpec) -> str | None:
        return None

    def start(self, spec: ExperimentSpec) -> None:
        return None

    def fill(self, ctx: SearchContext, memo: None) -> Answer[None]:
        start = len(ctx.trials)
        stop = min(self.total(ctx.spec), start + max(ctx.slots, 0))
        budget = ctx.searcher.budget.max
        ops: list[Operation] = [
            Create(i, hparams, budget, f"{why}, to budget {number(budget)}")
            for i, (hparams, why) in enumerate(self.points(ctx.spec, start, stop), start)
        ]
        return Answer(None, ops)

    def validated(
        self, ctx: SearchContext, memo: None, trial: int, budget: float, value: float
    ) -> Answer[None]:
        record = ctx.trials[trial]
        if budget >= record.budget:
            why = (
                f"reached its budget {number(record.budget)}: {ctx.metric} {number(value)} at "
                f"budget {number(budget)}"
            )
            return Answer(None, (Complete(trial, why),))
        stop = median_stop(ctx.searcher, ctx.trials, record)
        return Answer(None, (Stop(trial, stop),) if stop else ())

    def exhausted(self, ctx: SearchContext, memo: None) -> bool:
        return len(ctx.trials) >= self.total(ctx.spec)

    def memo_from_json(self, raw: JsonValue) -> None:
        return None


__all__ = ["FixedBudgetSearcher", "Point"]
