"""The searcher extension point: what a searcher sees of an experiment, what it answers,
and what a registered one declares.

A searcher turns an experiment's inputs into operations on its trials, as Determined's
``SearchMethod`` does: create a trial with these hyperparameters to budget B, give a
running trial budget B (promoted in place), pause it, resume it to budget B, stop it
early, complete it. It never numbers, stamps or publishes anything, and never counts
slots itself beyond what it is told is free: that machinery is shared by every searcher
(`state.py`), so a new searcher is only its own rule.

A trial's life, as a searcher sees it (Optuna's sampler contract walks a trial the same
way):

1. ``fill`` is asked, after every input, what to do with ``SearchContext.slots`` free
   slots (how many trials may start or resume now: ``max_concurrent_trials`` less the
   trials running, none while the experiment is paused). It answers ``Create`` for trial
   ``len(ctx.trials)`` (then the next index, and so on: a trial is created once, in
   order), with its hyperparameters, which depend only on the space, the seed, the index
   and the searcher, so a replay creates the same trial; or ``Resume`` for a trial it
   paused; or ``Stop`` for paused trials that can no longer go on. A created trial is
   ``created``, then ``running`` once it reports.
2. The trial trains to the budget it was given and reports metrics. ``validated`` is
   called for each *validation* report of the experiment's metric by a trial that is
   running (or held by the experiment's pause), after the report is recorded in
   ``Trial.validations``. A report at or above the trial's ``budget`` means the trial
   reached it; the searcher answers with the trial's next step: ``Run`` to a larger
   budget, ``Pause`` (it waits, suspended, its slots free), ``Complete``, or ``Stop``. A
   report below its budget lets an assessor stop it early (``Stop``), or asks nothing.
3. A paused trial waits until the searcher ``Resume``s it (from ``fill``, when a slot is
   free) or ``Stop``s it.
4. A trial's job may end on its own (``ended``): succeeded before its budget (the trial is
   ``completed``, its last validation its final one) or failed (``failed``, which counts
   toward ``max_trials`` like any trial: a searcher must not wait on it). The trial is
   already marked ended in the context when ``ended`` is called.
5. The experiment is done when no trial is live and the searcher is ``exhausted`` (it will
   create and resume no more); the state then publishes ``done`` with the best trial.

Every call is pure: the searcher's own memory (``memo``, e.g. ASHA's rungs) comes in and a
new one goes out with the operations; a memo is immutable and JSON-serialisable (it is
checkpointed with the experiment), so a searcher restored from it decides exactly as one
that never stopped. The operations a call returns are applied in order; one the shared
machinery cannot apply (a create beyond the free slots, a resume of a running trial) is
the searcher's bug, raised as ``SearcherError``, never a user's.

The searchers live beside this module (`grid.py`, `random.py`, `asha.py`) and are named in
the registry (`registry.py`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, Protocol, TypeVar

from dlrover_events.registry import UnknownName
from schemas.experiments import ExperimentSpec, ParamValue, SearcherSpec

#: A value a memo's ``to_json`` returns and ``memo_from_json`` reads: what ``json`` writes.
JsonValue = Any


class SearcherError(Exception):
    """A searcher answered what the shared machinery cannot apply: a bug in that searcher,
    never a user's mistake (a bad input is ignored, not raised)."""


class UnknownSearcher(UnknownName):
    """A name no searcher is registered under (a KeyError, as a mapping's lookup is)."""


class TrialStatus(StrEnum):
    """Where a trial is in its life. ``created``: asked for, its job not heard from yet;
    ``running``: it reported; ``paused``: suspended (at a rung, or by the experiment's
    pause); ``stopped``: stopped early or closed out; ``completed``: at its final budget,
    or its job ended well before; ``failed``: its job failed or was deleted."""

    CREATED = "created"
    RUNNING = "running"
    PAUSED = "paused"
    STOPPED = "stopped"
    COMPLETED = "completed"
    FAILED = "failed"


#: Trials that still hold a place in the experiment (they may run again).
LIVE = frozenset({TrialStatus.CREATED, TrialStatus.RUNNING, TrialStatus.PAUSED})
#: Trials that count against ``max_concurrent_trials``: a paused one does not.
ACTIVE = frozenset({TrialStatus.CREATED, TrialStatus.RUNNING})


@dataclass(frozen=True, slots=True)
class Trial:
    """One trial as the searcher knows it.

    ``budget`` is the budget it was last given (and ``rung`` the rung of it, for searchers
    with rungs); ``validations`` the experiment's metric of each validation report, as
    ``(budget used, value)`` in the order they came; ``held`` marks a trial paused by the
    experiment's pause (not by its searcher), which ``activate`` resumes; ``ended`` says
    why it ended, once it has."""

    index: int
    hparams: Mapping[str, ParamValue]
    budget: float
    status: TrialStatus = TrialStatus.CREATED
    rung: int | None = None
    validations: tuple[tuple[float, float], ...] = ()
    held: bool = False
    ended: str = ""

    @property
    def live(self) -> bool:
        return self.status in LIVE

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    def value_at(self, budget: float) -> float | None:
        """Its value at ``budget`` or the nearest budget below it that it reported (the
        last report there); None if it reported nothing that early."""
        found: tuple[float, float] | None = None
        for used, value in self.validations:
            if used <= budget and (found is None or used >= found[0]):
                found = (used, value)
        return None if found is None else found[1]

    def best(self, smaller_is_better: bool, up_to: float = math.inf) -> float | None:
        """Its best value reported at a budget up to ``up_to``; None if none."""
        values = [v for used, v in self.validations if used <= up_to]
        if not values:
            return None
        return min(values) if smaller_is_better else max(values)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "hparams": dict(self.hparams),
            "budget": self.budget,
            "status": self.status.value,
            "rung": self.rung,
            "validations": [[used, value] for used, value in self.validations],
            "held": self.held,
            "ended": self.ended,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Trial:
        return cls(
            index=int(raw["index"]),
            hparams=dict(raw["hparams"]),
            budget=float(raw["budget"]),
            status=TrialStatus(raw["status"]),
            rung=None if raw["rung"] is None else int(raw["rung"]),
            validations=tuple((float(u), float(v)) for u, v in raw["validations"]),
            held=bool(raw["held"]),
            ended=str(raw["ended"]),
        )


def better(a: float, b: float, smaller_is_better: bool) -> bool:
    """Whether ``a`` is strictly better than ``b``."""
    return a < b if smaller_is_better else a > b


@dataclass(frozen=True, slots=True)
class SearchContext:
    """What a searcher is shown at a call: the experiment's spec, every trial so far (trial
    i at position i), how many trials may be created or resumed now, and whether the
    experiment is paused (then ``slots`` is 0: only stops and pauses may be answered)."""

    spec: ExperimentSpec
    trials: tuple[Trial, ...]
    slots: int
    paused: bool = False

    @property
    def searcher(self) -> SearcherSpec:
        return self.spec.searcher

    @property
    def metric(self) -> str:
        return self.spec.searcher.metric


@dataclass(frozen=True, slots=True)
class Create:
    """Create trial ``trial`` with ``hparams``, to run to ``budget``."""

    trial: int
    hparams: Mapping[str, ParamValue]
    budget: float
    reason: str
    rung: int | None = None


@dataclass(frozen=True, slots=True)
class Run:
    """A running trial that reached its budget goes on, in place, to ``budget``."""

    trial: int
    budget: float
    reason: str
    rung: int | None = None


@dataclass(frozen=True, slots=True)
class Pause:
    """A trial waits, suspended, its slots free, until it is resumed or stopped."""

    trial: int
    reason: str


@dataclass(frozen=True, slots=True)
class Resume:
    """A paused trial goes on from its checkpoint, to ``budget``."""

    trial: int
    budget: float
    reason: str
    rung: int | None = None


@dataclass(frozen=True, slots=True)
class Stop:
    """A live trial stops for good (early, or because it can go no further)."""

    trial: int
    reason: str


@dataclass(frozen=True, slots=True)
class Complete:
    """A trial reached its final budget."""

    trial: int
    reason: str


Operation = Create | Run | Pause | Resume | Stop | Complete


class Memo(Protocol):
    """A searcher's own memory of an experiment: immutable, and JSON as ``to_json`` writes
    it (the searcher's ``memo_from_json`` reads it back equal)."""

    def to_json(self) -> JsonValue: ...


M = TypeVar("M", bound=Memo | None)


@dataclass(frozen=True, slots=True)
class Answer(Generic[M]):
    """A searcher's answer to one call: its new memo and the operations, in order."""

    memo: M
    ops: Sequence[Operation] = field(default_factory=tuple)


class Searcher(ABC, Generic[M]):
    """One search method (grid, random, ASHA...), as a registry names it: its name, a
    one-line description for ``experiment searchers``, and the calls of a trial's life
    (this module's docstring). Implementations are stateless: everything they remember
    of an experiment is in its memo."""

    name: str
    description: str

    def check(self, spec: ExperimentSpec) -> str | None:
        """Why an experiment cannot run with this searcher, naming the field (``spec.
        hyperparameters.lr.count: ...``), or None. What the schema checks is not checked
        again."""
        return None

    def concurrency(self, spec: ExperimentSpec) -> int | None:
        """How many trials may run at once when ``max_concurrent_trials`` is 0 (no limit
        given): None for all of them."""
        return None

    @abstractmethod
    def start(self, spec: ExperimentSpec) -> M:
        """The memo of a new experiment (before any trial)."""

    @abstractmethod
    def fill(self, ctx: SearchContext, memo: M) -> Answer[M]:
        """What to create, resume or stop now; at most ``ctx.slots`` creates and resumes."""

    @abstractmethod
    def validated(
        self, ctx: SearchContext, memo: M, trial: int, budget: float, value: float
    ) -> Answer[M]:
        """A validation report of the experiment's metric by a running (or held) trial."""

    def ended(self, ctx: SearchContext, memo: M, trial: int) -> Answer[M]:
        """A trial's job ended on its own (the trial is already marked ended in ``ctx``)."""
        return Answer(memo)

    @abstractmethod
    def exhausted(self, ctx: SearchContext, memo: M) -> bool:
        """Whether it will create and resume no more trials (the experiment is done once no
        trial is live)."""

    @abstractmethod
    def memo_from_json(self, raw: JsonValue) -> M:
        """A memo from what its ``to_json`` wrote."""


def point_text(hparams: Mapping[str, ParamValue]) -> str:
    """Hyperparameters as a reason shows them: ``act=relu, lr=0.001``."""
    return ", ".join(f"{k}={_value_text(v)}" for k, v in sorted(hparams.items()))


def _value_text(value: ParamValue) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def number(value: float) -> str:
    """A metric or budget as a reason shows it: 6 significant digits, no trailing zeros."""
    return f"{value:.6g}"


__all__ = [
    "ACTIVE",
    "LIVE",
    "Answer",
    "Complete",
    "Create",
    "JsonValue",
    "Memo",
    "Operation",
    "Pause",
    "Resume",
    "Run",
    "SearchContext",
    "Searcher",
    "SearcherError",
    "Stop",
    "Trial",
    "TrialStatus",
    "UnknownSearcher",
    "better",
    "number",
    "point_text",
]
