"""The evaluator extension point: what an evaluator is given, what it answers, what a
registered one declares, and how a name is refused.

An evaluator is one KPI family: a pure function of the jobs of a window (the ledger's
`JobRecord`s) and the window's end (for jobs still running, None: the last event) to named
numbers. Lower is better for a metric unless its evaluator names it in
`higher_is_better`, which the A/B report reads to say which arm won. The evaluators live
beside this module (`kpis.py`) and are named in the registry (`registry.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from streams.evaluators.ledger import JobRecord

#: an evaluator's answer: metric name -> value
Metrics = dict[str, float]


class EvaluatorFn(Protocol):
    def __call__(self, jobs: Sequence[JobRecord], until: datetime | None, /) -> Metrics: ...


class EvaluatorError(Exception):
    """A request for evaluators the registry cannot answer: the caller's mistake."""


class UnknownEvaluator(EvaluatorError, KeyError):
    """Names no evaluator is registered under (a KeyError, as a mapping's lookup is)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True, slots=True)
class EvaluatorSpec:
    """A registered evaluator: its name, what it measures, the function, and which of
    the metrics it answers are better higher (the rest are better lower)."""

    name: str
    description: str
    fn: EvaluatorFn
    higher_is_better: frozenset[str] = frozenset()


__all__ = ["EvaluatorError", "EvaluatorFn", "EvaluatorSpec", "Metrics", "UnknownEvaluator"]
