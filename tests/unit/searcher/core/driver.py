"""A plain driver of the searcher's core for its tests: it plays the trials (each trains
at one unit of budget per tick, reports a validation value from a known curve at its
budget, waits when paused, goes on from where it was when resumed) and checks, after
every input, what must always hold of the decisions."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from schemas.experiments import (
    DecisionKind,
    ExperimentAction,
    ExperimentActionKind,
    ExperimentSubmitted,
    ParamValue,
    TrialDecision,
    TrialMetrics,
)
from streams.searcher.core.registry import SEARCHERS
from streams.searcher.core.state import (
    DECISIONS,
    ExperimentState,
    ExperimentStatus,
    Input,
    TrialEnded,
    begin,
    decide,
)

ENV = "prod"
EXPERIMENT = "sweep"
SOURCE = "test"
T0 = datetime(2025, 1, 1, tzinfo=UTC)

#: a validation value from a trial's hyperparameters and the budget it used
Curve = Callable[[Mapping[str, ParamValue], float], float]


def loss(hparams: Mapping[str, ParamValue], budget: float) -> float:
    """A validation loss that truly depends on the hyperparameters: best at lr 10^-2.5 and
    a wide model, falling with the budget used."""
    lr = float(hparams.get("lr", 1e-3))
    width = float(hparams.get("width", 64))
    act = 0.05 if hparams.get("act") == "tanh" else 0.0
    return abs(math.log10(lr) + 2.5) + 8.0 / width + act + 20.0 / (budget + 10.0)


SPACE: dict[str, Any] = {
    "lr": {"type": "log", "base": 10, "minval": -4, "maxval": -1, "count": 4},
    "width": {"type": "int", "minval": 8, "maxval": 128, "count": 4},
    "act": {"type": "categorical", "vals": ["relu", "tanh"]},
    "epochs": {"type": "const", "val": 1},
}


def spec(name: str, space: Mapping[str, Any] | None = None, **searcher: Any) -> dict[str, Any]:
    """An experiment's spec with searcher ``name`` (``searcher`` overrides its fields)."""
    return {
        "hyperparameters": copy.deepcopy(dict(space if space is not None else SPACE)),
        "searcher": {
            "name": name,
            "metric": "val_loss",
            "max_trials": 16,
            "max_concurrent_trials": 4,
            "budget": {"unit": "steps", "max": 800},
            "seed": 7,
            **searcher,
        },
        "trial": {"spec": {"roles": {}}},
    }


def submitted(raw_spec: Mapping[str, Any]) -> ExperimentSubmitted:
    return ExperimentSubmitted(
        env=ENV, experiment=EXPERIMENT, spec=dict(raw_spec), occurred_at=T0, source="cli"
    )


@dataclass
class Sim:
    """An experiment driven input by input, its decisions checked as they come."""

    state: ExperimentState
    decisions: list[TrialDecision] = field(default_factory=list)
    #: per trial: the budget it was given, what it used, whether its job runs
    target: dict[int, float] = field(default_factory=dict)
    used: dict[int, float] = field(default_factory=dict)
    running: set[int] = field(default_factory=set)
    created: list[int] = field(default_factory=list)
    hparams: dict[int, dict[str, ParamValue]] = field(default_factory=dict)
    clock: int = 0
    max_running: int = 0
    #: round-trip the state through JSON before every input (a restart at every point)
    restart_every_input: bool = False

    @classmethod
    def start(cls, raw_spec: Mapping[str, Any], *, restart: bool = False) -> Sim:
        state, decisions = begin(submitted(raw_spec), source=SOURCE)
        sim = cls(state, restart_every_input=restart)
        sim._take(decisions, T0)
        return sim

    @property
    def limit(self) -> int | None:
        searcher = self.state.spec.searcher
        given = searcher.max_concurrent_trials
        return given if given else SEARCHERS[searcher.name].concurrency(self.state.spec)

    @property
    def done(self) -> bool:
        return bool(self.decisions) and self.decisions[-1].decision is DecisionKind.DONE

    def now(self) -> datetime:
        self.clock += 1
        return T0 + timedelta(seconds=self.clock)

    # -- inputs ----------------------------------------------------------------------

    def feed(self, event: Input) -> list[TrialDecision]:
        state = self.state
        if self.restart_every_input:
            raw = json.loads(json.dumps(state.to_json()))
            state = ExperimentState.from_json(raw)
            assert state == self.state
        self.state, decisions = decide(state, event, source=SOURCE)
        self._take(decisions, event.occurred_at)
        return decisions

    def report(
        self,
        trial: int,
        budget: float | None = None,
        value: float | None = None,
        *,
        validation: bool = True,
        metric: str = "val_loss",
    ) -> list[TrialDecision]:
        used = self.target[trial] if budget is None else budget
        if value is None:
            value = loss(self.hparams[trial], used)
        event = TrialMetrics(
            env=ENV,
            experiment=EXPERIMENT,
            trial=trial,
            step=int(used),
            budget=used,
            validation=validation,
            metrics={metric: value},
            occurred_at=self.now(),
        )
        return self.feed(event)

    def end(self, trial: int, outcome: str = "failed", reason: str = "") -> list[TrialDecision]:
        self.running.discard(trial)
        event = TrialEnded(
            env=ENV,
            experiment=EXPERIMENT,
            trial=trial,
            outcome=outcome,  # type: ignore[arg-type]
            reason=reason,
            occurred_at=self.now(),
        )
        return self.feed(event)

    def act(self, action: str, reason: str = "") -> list[TrialDecision]:
        event = ExperimentAction(
            env=ENV,
            experiment=EXPERIMENT,
            action=ExperimentActionKind(action),
            reason=reason,
            occurred_at=self.now(),
        )
        return self.feed(event)

    def step(self, curve: Curve = loss) -> list[TrialDecision]:
        """The running trial nearest its budget trains to it (all running trials train
        as long) and reports its validation value there."""
        trial = min(self.running, key=lambda t: (self.target[t] - self.used[t], t))
        dt = self.target[trial] - self.used[trial]
        for other in self.running:
            self.used[other] = min(self.used[other] + dt, self.target[other])
        budget = self.target[trial]
        return self.report(trial, budget, curve(self.hparams[trial], budget))

    def run(self, curve: Curve = loss, limit: int = 10_000) -> None:
        """Step until the experiment is done."""
        for _ in range(limit):
            if self.done or not self.running:
                break
            self.step(curve)
        assert self.done, f"not done: {self.state.status}, running {sorted(self.running)}"

    # -- what the decisions must keep ------------------------------------------------

    def _take(self, decisions: list[TrialDecision], at: datetime) -> None:
        for d in decisions:
            assert d.seq == len(self.decisions), "seq counts from 0 with no gap"
            assert d.event_id == _event_id(d.seq)
            assert d.occurred_at == at and d.env == ENV and d.experiment == EXPERIMENT
            assert d.source == SOURCE
            again = TrialDecision.model_validate_json(d.model_dump_json())
            assert again == d
            assert not self.done, "nothing after done"
            self.decisions.append(d)
            self._follow(d)
            limit = self.limit
            if limit is not None:
                assert len(self.running) <= limit, f"{len(self.running)} running > {limit}"
            self.max_running = max(self.max_running, len(self.running))
        searcher = self.state.spec.searcher
        limit = self.limit
        if limit is not None:
            assert self.state.active <= limit
        assert len(self.created) <= searcher.max_trials

    def _follow(self, d: TrialDecision) -> None:
        kind, trial = d.decision, d.trial
        if kind is DecisionKind.DONE:
            return
        assert trial is not None
        if kind is DecisionKind.CREATE:
            assert trial == len(self.created) and trial not in self.target, "created once"
            assert d.budget is not None
            self.created.append(trial)
            self.hparams[trial] = dict(d.hparams)
            self.target[trial], self.used[trial] = d.budget, 0.0
            self.running.add(trial)
        elif kind is DecisionKind.RUN:
            assert trial in self.running and d.budget is not None
            assert d.budget > self.target[trial]
            self.target[trial] = d.budget
        elif kind is DecisionKind.RESUME:
            assert trial not in self.running and d.budget is not None
            assert d.hparams == self.hparams[trial]
            assert d.budget >= self.target[trial]
            self.target[trial] = d.budget
            self.running.add(trial)
        elif kind is DecisionKind.PAUSE:
            assert trial in self.running
            self.running.discard(trial)
        else:  # stop, complete
            assert trial in self.target
            self.running.discard(trial)

    # -- views -----------------------------------------------------------------------

    def kinds(self, decisions: list[TrialDecision] | None = None) -> list[tuple[str, int | None]]:
        return [
            (d.decision.value, d.trial)
            for d in (self.decisions if decisions is None else decisions)
        ]

    def of(self, kind: str) -> list[TrialDecision]:
        return [d for d in self.decisions if d.decision.value == kind]

    def best_trial(self) -> int:
        """The trial with the best value any of its reports had (lowest index on a tie)."""
        best = self.state.best()
        assert best is not None
        return best.index


def _event_id(seq: int) -> Any:
    import uuid

    return uuid.uuid5(DECISIONS, f"{ENV}/{EXPERIMENT}/{seq}")


def finished(sim: Sim) -> bool:
    return sim.state.status in (ExperimentStatus.COMPLETED, ExperimentStatus.KILLED)
