"""An experiment's event-sourced state, and the machinery every searcher shares: one
decision list per input.

``begin`` takes a submitted experiment and answers its state and first decisions;
``decide`` takes the state and the next input (an ``ExperimentAction``, a
``TrialMetrics``, a ``TrialEnded``) and answers the next state and that input's decisions.
Both are pure and deterministic: the same inputs in the same order give the same
decisions with the same ``seq`` and ``event_id`` (``uuid5`` of a fixed namespace and
``<env>/<experiment>/<seq>``) and the input's ``occurred_at``, so a searcher restarted
from a checkpointed state (``to_json`` / ``from_json``, round-tripping exactly) publishes
what an uninterrupted one would. A bad or late input (a metric of an unknown or ended
trial, a second pause, a metric that is not the experiment's) never raises: it yields no
decision.

What the shared machinery holds for every searcher:

- ``max_concurrent_trials``: a trial is created or resumed only while fewer than that
  many are active (created or running: a paused trial does not count); 0 means the
  searcher's own default (``Searcher.concurrency``: all trials for grid and random).
- A trial reaches its budget when a *validation* report of the experiment's metric has
  ``budget`` at or above the budget it was given; training reports (``validation`` false)
  only mark a created trial running. A trial whose job ends on its own is ``completed``
  (succeeded: its last validation value is its final one) or ``failed`` (failed, deleted),
  counts toward ``max_trials``, and its searcher is told (``Searcher.ended``).
- ``pause`` suspends every active trial (``held``: the experiment's pause, not its
  searcher's) and nothing is created or resumed; a held trial that reports its budget
  meanwhile gets its searcher's answer once the experiment goes on. ``activate`` resumes
  the held trials (as slots allow) and goes on. ``kill`` stops every live trial and ends
  the experiment (the runtime deletes the trials' jobs).
- ``done`` when no trial is live and the searcher will create and resume no more, with the
  best trial (best validation value of any trial, the lowest index on a tie) in its
  reason; ``done`` also ends a killed experiment, and is the one decision of an
  experiment refused at ``begin`` (unknown searcher, a grid without counts...), whose
  reason names the field.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from dlrover_events.registry import Registry
from schemas.experiments import (
    DecisionKind,
    ExperimentAction,
    ExperimentActionKind,
    ExperimentSpec,
    ExperimentSubmitted,
    ParamValue,
    TrialDecision,
    TrialMetrics,
)
from streams.searcher.core.api import (
    Complete,
    Create,
    Operation,
    Pause,
    Resume,
    Run,
    SearchContext,
    Searcher,
    SearcherError,
    Stop,
    Trial,
    TrialStatus,
    better,
    number,
    point_text,
)
from streams.searcher.core.registry import SEARCHERS
from streams.searcher.core.space import refusal

#: The namespace of decisions' event ids: ``uuid5(DECISIONS, "<env>/<experiment>/<seq>")``.
DECISIONS = uuid.UUID("3c7e8b6a-5f0d-4a1e-9b2c-7d4e6f8a9b10")
#: A decision's reason holds at most this (the contract's bound).
_MAX_REASON = 2048


class ExperimentStatus(StrEnum):
    """``active``: trials run; ``paused``: by a user, nothing runs; ``completed``: done;
    ``killed``: by a user; ``refused``: it could not run (the ``done`` decision says why)."""

    ACTIVE = "active"
    PAUSED = "paused"
    COMPLETED = "completed"
    KILLED = "killed"
    REFUSED = "refused"


#: Statuses after which no input changes anything.
FINAL = frozenset({ExperimentStatus.COMPLETED, ExperimentStatus.KILLED, ExperimentStatus.REFUSED})


@dataclass(frozen=True, kw_only=True)
class TrialEnded:
    """A trial's job ended, as the runtime learns it from ``<env>.job.events`` (succeeded,
    failed) or from a deletion (deleted). ``occurred_at`` is the input's time, which the
    decisions made on it carry."""

    env: str
    experiment: str
    trial: int
    outcome: Literal["succeeded", "failed", "deleted"]
    reason: str = ""
    occurred_at: datetime


Input = ExperimentAction | TrialMetrics | TrialEnded


@dataclass(frozen=True)
class ExperimentState:
    """Everything the searcher knows of one experiment; immutable (``begin`` and ``decide``
    answer a new one). ``seq`` is the number of its next decision; ``trials`` holds trial i
    at position i; ``memo`` is its searcher's own memory (None for a searcher that keeps
    none, and for a refused experiment); ``reason`` says why it is paused or ended."""

    env: str
    experiment: str
    spec: ExperimentSpec
    status: ExperimentStatus
    seq: int = 0
    trials: tuple[Trial, ...] = ()
    memo: Any = None
    reason: str = ""
    submitted_at: datetime | None = None

    @property
    def live(self) -> int:
        return sum(1 for t in self.trials if t.live)

    @property
    def active(self) -> int:
        return sum(1 for t in self.trials if t.active)

    def best(self) -> Trial | None:
        """The trial with the best validation value (the lowest index on a tie)."""
        return _best(self.trials, self.spec.searcher.smaller_is_better)

    def to_json(self) -> dict[str, Any]:
        """A JSON object (``json.dumps`` takes it; Postgres ``jsonb`` keeps it) that
        ``from_json`` reads back equal."""
        return {
            "env": self.env,
            "experiment": self.experiment,
            "spec": self.spec.model_dump(mode="json"),
            "status": self.status.value,
            "seq": self.seq,
            "trials": [t.to_json() for t in self.trials],
            "memo": None if self.memo is None else self.memo.to_json(),
            "reason": self.reason,
            "submitted_at": None if self.submitted_at is None else self.submitted_at.isoformat(),
        }

    @classmethod
    def from_json(
        cls, raw: Mapping[str, Any], *, searchers: Registry[Searcher[Any]] = SEARCHERS
    ) -> ExperimentState:
        spec = ExperimentSpec.model_validate(raw["spec"])
        status = ExperimentStatus(raw["status"])
        memo: Any = None
        if raw["memo"] is not None:
            memo = searchers[spec.searcher.name].memo_from_json(raw["memo"])
        at = raw["submitted_at"]
        return cls(
            env=str(raw["env"]),
            experiment=str(raw["experiment"]),
            spec=spec,
            status=status,
            seq=int(raw["seq"]),
            trials=tuple(Trial.from_json(t) for t in raw["trials"]),
            memo=memo,
            reason=str(raw["reason"]),
            submitted_at=None if at is None else datetime.fromisoformat(at),
        )


def begin(
    submitted: ExperimentSubmitted,
    *,
    source: str,
    searchers: Registry[Searcher[Any]] = SEARCHERS,
) -> tuple[ExperimentState, list[TrialDecision]]:
    """A submitted experiment's state and its first decisions: the first trials' ``create``
    (up to the concurrency limit), or one ``done`` whose reason names the field that keeps
    it from running (its status ``refused``)."""
    spec = submitted.spec
    state = ExperimentState(
        env=submitted.env,
        experiment=submitted.experiment,
        spec=spec,
        status=ExperimentStatus.ACTIVE,
        submitted_at=submitted.occurred_at,
    )
    searcher = searchers.get(spec.searcher.name)
    why: str | None
    if searcher is None:
        known = ", ".join(searchers.names()) or "none"
        why = f"spec.searcher.name: unknown searcher {spec.searcher.name!r} (known: {known})"
    else:
        why = refusal(spec.hyperparameters) or searcher.check(spec)
    step = _Step(state, searcher, submitted.env, source, submitted.occurred_at)
    if why is not None or searcher is None:
        step.end(ExperimentStatus.REFUSED, f"refused: {why}")
        return step.result()
    step.memo = searcher.start(spec)
    step.settle()
    return step.result()


def decide(
    state: ExperimentState,
    event: Input,
    *,
    source: str,
    searchers: Registry[Searcher[Any]] = SEARCHERS,
) -> tuple[ExperimentState, list[TrialDecision]]:
    """The state after ``event`` and the decisions it causes (none for a bad or late
    input)."""
    if (
        not isinstance(event, ExperimentAction | TrialMetrics | TrialEnded)
        or state.status in FINAL
        or event.experiment != state.experiment
        or event.env != state.env
    ):
        return state, []
    searcher = searchers[state.spec.searcher.name]
    step = _Step(state, searcher, event.env, source, event.occurred_at)
    if isinstance(event, ExperimentAction):
        step.action(event)
    elif isinstance(event, TrialMetrics):
        step.metrics(event)
    else:
        step.trial_ended(event)
    return step.result()


def _best(trials: Sequence[Trial], smaller: bool) -> Trial | None:
    best: tuple[float, Trial] | None = None
    for trial in trials:
        value = trial.best(smaller)
        if value is not None and (best is None or better(value, best[0], smaller)):
            best = (value, trial)
    return None if best is None else best[1]


@dataclass
class _Step:
    """One input's work: a mutable copy of the state, the decisions so far, and the
    applying of a searcher's operations; ``result`` freezes it again."""

    state: ExperimentState
    searcher: Searcher[Any] | None
    env: str
    source: str
    at: datetime
    trials: list[Trial] = field(init=False)
    memo: Any = field(init=False)
    status: ExperimentStatus = field(init=False)
    reason: str = field(init=False)
    seq: int = field(init=False)
    decisions: list[TrialDecision] = field(default_factory=list)
    changed: bool = False
    #: trials created or running (kept as trials change: counted once per input)
    active: int = field(init=False)

    def __post_init__(self) -> None:
        self.trials = list(self.state.trials)
        self.memo = self.state.memo
        self.status = self.state.status
        self.reason = self.state.reason
        self.seq = self.state.seq
        self.active = sum(1 for t in self.trials if t.active)

    def result(self) -> tuple[ExperimentState, list[TrialDecision]]:
        if not self.changed and not self.decisions:
            return self.state, []
        state = replace(
            self.state,
            status=self.status,
            seq=self.seq,
            trials=tuple(self.trials),
            memo=self.memo,
            reason=self.reason,
        )
        return state, self.decisions

    # -- what the shared machinery knows ------------------------------------------------

    @property
    def spec(self) -> ExperimentSpec:
        return self.state.spec

    def _searcher(self) -> Searcher[Any]:
        if self.searcher is None:
            raise SearcherError("no searcher")
        return self.searcher

    def limit(self) -> int | None:
        given = self.spec.searcher.max_concurrent_trials
        return given if given > 0 else self._searcher().concurrency(self.spec)

    def slots(self) -> int:
        if self.status is not ExperimentStatus.ACTIVE:
            return 0
        limit = self.limit()
        if limit is None:  # no limit: more than there can ever be trials to start
            return len(self.trials) + self.spec.searcher.max_trials
        return max(limit - self.active, 0)

    def context(self) -> SearchContext:
        return SearchContext(
            self.spec,
            tuple(self.trials),
            self.slots(),
            paused=self.status is ExperimentStatus.PAUSED,
        )

    def _set(self, trial: Trial) -> None:
        self.active += int(trial.active) - int(self.trials[trial.index].active)
        self.trials[trial.index] = trial
        self.changed = True

    # -- decisions -----------------------------------------------------------------------

    def emit(
        self,
        kind: DecisionKind,
        reason: str,
        trial: Trial | None = None,
        *,
        hparams: Mapping[str, ParamValue] | None = None,
        budget: float | None = None,
        rung: int | None = None,
    ) -> None:
        seq = self.seq
        self.decisions.append(
            TrialDecision(
                event_id=uuid.uuid5(DECISIONS, f"{self.env}/{self.state.experiment}/{seq}"),
                env=self.env,
                source=self.source,
                occurred_at=self.at,
                experiment=self.state.experiment,
                seq=seq,
                decision=kind,
                trial=None if trial is None else trial.index,
                hparams=dict(hparams or {}),
                budget=budget,
                rung=rung,
                reason=_clip(reason),
            )
        )
        self.seq = seq + 1
        self.changed = True

    def apply(self, ops: Sequence[Operation]) -> None:
        for op in ops:
            self._apply(op)

    def _apply(self, op: Operation) -> None:
        paused = self.status is ExperimentStatus.PAUSED
        if isinstance(op, Create):
            if paused or op.trial != len(self.trials) or self.slots() <= 0:
                raise SearcherError(
                    f"{self._name()}: cannot create trial {op.trial} now ({len(self.trials)} "
                    f"created, {self.slots()} slots free, experiment {self.status.value})"
                )
            if op.trial >= self.spec.searcher.max_trials:
                raise SearcherError(f"{self._name()}: trial {op.trial} is beyond max_trials")
            trial = Trial(op.trial, dict(op.hparams), float(op.budget), rung=op.rung)
            self.trials.append(trial)
            self.active += 1
            self.changed = True
            self.emit(
                DecisionKind.CREATE,
                op.reason,
                trial,
                hparams=trial.hparams,
                budget=trial.budget,
                rung=op.rung,
            )
            return
        trial = self._trial(op.trial)
        if isinstance(op, Run):
            if not (trial.active or trial.held):
                raise SearcherError(f"{self._name()}: cannot run trial {op.trial} ({trial.status})")
            # a held trial keeps waiting for activate, which resumes it to its new budget
            status = trial.status if trial.held else TrialStatus.RUNNING
            moved = replace(trial, status=status, budget=float(op.budget), rung=op.rung)
            self._set(moved)
            if not trial.held:
                self.emit(DecisionKind.RUN, op.reason, moved, budget=moved.budget, rung=op.rung)
        elif isinstance(op, Pause):
            if trial.held:
                self._set(replace(trial, held=False))  # it waits at its rung, not for activate
            elif trial.active:
                self._set(replace(trial, status=TrialStatus.PAUSED))
                self.emit(
                    DecisionKind.PAUSE, op.reason, trial, budget=trial.budget, rung=trial.rung
                )
            else:
                raise SearcherError(
                    f"{self._name()}: cannot pause trial {op.trial} ({trial.status})"
                )
        elif isinstance(op, Resume):
            if paused or trial.status is not TrialStatus.PAUSED or trial.held or self.slots() <= 0:
                raise SearcherError(
                    f"{self._name()}: cannot resume trial {op.trial} ({trial.status}, "
                    f"{self.slots()} slots free, experiment {self.status.value})"
                )
            moved = replace(
                trial, status=TrialStatus.RUNNING, budget=float(op.budget), rung=op.rung
            )
            self._set(moved)
            self.emit(
                DecisionKind.RESUME,
                op.reason,
                moved,
                hparams=moved.hparams,
                budget=moved.budget,
                rung=op.rung,
            )
        elif isinstance(op, Stop | Complete):
            if not trial.live:
                raise SearcherError(f"{self._name()}: cannot end trial {op.trial} ({trial.status})")
            stop = isinstance(op, Stop)
            status = TrialStatus.STOPPED if stop else TrialStatus.COMPLETED
            self._set(replace(trial, status=status, held=False, ended=op.reason))
            kind = DecisionKind.STOP if stop else DecisionKind.COMPLETE
            self.emit(kind, op.reason, trial, budget=trial.budget, rung=trial.rung)

    def _trial(self, index: int) -> Trial:
        if not 0 <= index < len(self.trials):
            raise SearcherError(f"{self._name()}: no trial {index}")
        return self.trials[index]

    def _name(self) -> str:
        return self.spec.searcher.name

    # -- inputs --------------------------------------------------------------------------

    def action(self, event: ExperimentAction) -> None:
        said = f": {event.reason}" if event.reason else ""
        if event.action is ExperimentActionKind.KILL:
            for trial in list(self.trials):
                if trial.live:
                    self.apply([Stop(trial.index, f"experiment killed{said}")])
            self.end(ExperimentStatus.KILLED, f"killed{said}; {self._summary()}")
        elif event.action is ExperimentActionKind.PAUSE:
            if self.status is not ExperimentStatus.ACTIVE:
                return
            self.status = ExperimentStatus.PAUSED
            self.reason = f"paused{said}"
            self.changed = True
            for trial in list(self.trials):
                if trial.active:
                    self._set(replace(trial, status=TrialStatus.PAUSED, held=True))
                    self.emit(
                        DecisionKind.PAUSE,
                        f"experiment paused{said}",
                        trial,
                        budget=trial.budget,
                        rung=trial.rung,
                    )
            self.settle()
        else:
            if self.status is not ExperimentStatus.PAUSED:
                return
            self.status = ExperimentStatus.ACTIVE
            self.reason = ""
            self.changed = True
            self.settle()

    def metrics(self, event: TrialMetrics) -> None:
        if not 0 <= event.trial < len(self.trials):
            return
        trial = self.trials[event.trial]
        if not trial.live:
            return
        if trial.status is TrialStatus.CREATED:
            trial = replace(trial, status=TrialStatus.RUNNING)
            self._set(trial)
        value = event.metrics.get(self.spec.searcher.metric)
        if not event.validation or value is None:
            return
        trial = replace(trial, validations=(*trial.validations, (event.budget, value)))
        self._set(trial)
        if trial.status is TrialStatus.PAUSED and not trial.held:
            return  # a late report of a trial waiting at its rung: recorded, nothing to do
        answer = self._searcher().validated(
            self.context(), self.memo, trial.index, event.budget, value
        )
        self.memo = answer.memo
        self.apply(answer.ops)
        self.settle()

    def trial_ended(self, event: TrialEnded) -> None:
        if not 0 <= event.trial < len(self.trials):
            return
        trial = self.trials[event.trial]
        if not trial.live:
            return
        said = f": {event.reason}" if event.reason else ""
        if event.outcome == "succeeded":
            last = trial.validations[-1][1] if trial.validations else None
            final = (
                f", its last {self.spec.searcher.metric} {number(last)} final"
                if last is not None
                else ""
            )
            ended = replace(
                trial,
                status=TrialStatus.COMPLETED,
                held=False,
                ended=f"its job succeeded before its budget{said}{final}",
            )
        else:
            ended = replace(
                trial, status=TrialStatus.FAILED, held=False, ended=f"its job {event.outcome}{said}"
            )
        self._set(ended)
        answer = self._searcher().ended(self.context(), self.memo, trial.index)
        self.memo = answer.memo
        self.apply(answer.ops)
        self.settle()

    # -- after every input ---------------------------------------------------------------

    def settle(self) -> None:
        """Resume held trials (activate), let the searcher use the free slots, and end the
        experiment once no trial is live and its searcher has nothing more."""
        if self.status in FINAL:
            return
        searcher = self._searcher()
        if self.status is ExperimentStatus.ACTIVE:
            for trial in list(self.trials):
                if trial.held and self.slots() > 0:
                    resumed = replace(trial, status=TrialStatus.RUNNING, held=False)
                    self._set(resumed)
                    self.emit(
                        DecisionKind.RESUME,
                        "experiment activated: the trial goes on where it was paused",
                        resumed,
                        hparams=resumed.hparams,
                        budget=resumed.budget,
                        rung=resumed.rung,
                    )
        answer = searcher.fill(self.context(), self.memo)
        self.memo = answer.memo
        self.apply(answer.ops)
        if not any(t.live for t in self.trials) and searcher.exhausted(self.context(), self.memo):
            self.end(ExperimentStatus.COMPLETED, f"done: {self._summary()}")

    def end(self, status: ExperimentStatus, reason: str) -> None:
        self.status = status
        self.reason = reason
        self.changed = True
        self.emit(DecisionKind.DONE, reason)

    def _summary(self) -> str:
        counts = {status: 0 for status in TrialStatus}
        for trial in self.trials:
            counts[trial.status] += 1
        told = ", ".join(f"{n} {status.value}" for status, n in counts.items() if n)
        summary = f"{len(self.trials)} trials ({told})" if self.trials else "no trials"
        best = _best(self.trials, self.spec.searcher.smaller_is_better)
        metric = self.spec.searcher.metric
        if best is None:
            return f"{summary}; no trial reported {metric}"
        value = best.best(self.spec.searcher.smaller_is_better)
        assert value is not None
        at = max(u for u, v in best.validations if v == value)
        return (
            f"{summary}; best: trial {best.index}, {metric} {number(value)} at budget "
            f"{number(at)} ({point_text(best.hparams)})"
        )


def _clip(reason: str) -> str:
    return reason if len(reason) <= _MAX_REASON else reason[: _MAX_REASON - 3] + "..."


__all__ = [
    "DECISIONS",
    "FINAL",
    "ExperimentState",
    "ExperimentStatus",
    "Input",
    "TrialEnded",
    "begin",
    "decide",
]
