"""A simulated trial of an experiment: a job that trains to the budget its searcher gave it,
reports what its learning curve says there, and waits for the next decision.

A trial is an ordinary job of the simulated cluster (job.py: admitted, suspended, held,
resized by plans like any other) whose training is counted against a budget instead of
the Pollux application's epochs: it trains at the speed the throughput model gives its
gang, and as it uses its budget it reports ``TrialMetrics`` whose values come from a
learning-curve model (curves.py), a pure function of its hyperparameters and the budget
used. So what a trial reports is a function of the decisions it got, never of the wall
clock: the same searcher with the same seed sees the same reports.

The budget used is counted in the experiment's unit: ``steps`` as scale-invariant
iterations (optimizer steps at the application's initial batch; a trial that keeps its
template's batch counts its optimizer steps), ``samples`` as those times the initial batch,
``seconds`` as seconds of training (restarts and waits not counted).

Its life, after the SDK's ``Trial`` (docs/experiments.md, The trial's side):

- it trains while ``used < budget``; every ``train_every`` it reports its training loss,
  every ``validate_every`` and at its budget a validation metric;
- at its budget it waits, holding its GPUs, for a decision: ``run`` or ``resume`` to a
  larger budget and it goes on; ``pause`` and the searcher's plan holds it (suspended, its
  GPUs free); ``stop`` or ``complete`` and it ends (its process exits 0: job.completed);
- suspended (a hold, or a cluster scheduler's preemption) it goes on, once resumed, from
  the checkpoint its SIGTERM saved: the budget used so far, nothing lost.

Pure: no I/O. Event ids derive from the job and its count of events.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from dlrover_events.sdk.trial_env import (
    EXPERIMENT_ENV,
    TRIAL_BUDGET_ENV,
    TRIAL_BUDGET_UNIT_ENV,
    TRIAL_ENV,
    TRIAL_HPARAMS_ENV,
)
from handlers.simulator.cluster import Cluster
from handlers.simulator.curves import LearningCurve
from handlers.simulator.job import JobPhase, JobSimulator
from handlers.simulator.throughput import SimulatedApplication
from handlers.simulator.training import EPS
from schemas.experiments import BudgetUnit, DecisionKind, ParamValue, TrialDecision, TrialMetrics
from schemas.jobs import JobEvent, JobSubmitted

_TRIAL_NAMESPACE = uuid.UUID("2c5e8f0a-7b41-4d3e-9a16-8e0d4c2b7f55")


class TrialSpecError(ValueError):
    """A trial's variables that do not say what a trial is; the message says which."""


@dataclass(frozen=True)
class TrialSpec:
    """What makes a job a trial: its experiment, index, hyperparameters, the budget it was
    created with and the budget's unit (the variables of sdk/dlrover_events/sdk/trial_env.py)."""

    experiment: str
    index: int
    hparams: Mapping[str, ParamValue]
    budget: float
    unit: BudgetUnit

    def snapshot(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "index": self.index,
            "hparams": dict(self.hparams),
            "budget": self.budget,
            "unit": self.unit.value,
        }

    @classmethod
    def restore(cls, state: Mapping[str, Any]) -> TrialSpec:
        return cls(
            state["experiment"],
            int(state["index"]),
            dict(state["hparams"]),
            float(state["budget"]),
            BudgetUnit(state["unit"]),
        )


def trial_spec(env: Mapping[str, str]) -> TrialSpec | None:
    """The trial a job's variables describe; None when they name no experiment (an
    ordinary job); TrialSpecError when they name one but say the rest wrong."""
    experiment = env.get(EXPERIMENT_ENV)
    if not experiment:
        return None
    try:
        index = int(env[TRIAL_ENV])
        hparams = json.loads(env.get(TRIAL_HPARAMS_ENV) or "{}")
        budget = float(env[TRIAL_BUDGET_ENV])
        unit = BudgetUnit(env.get(TRIAL_BUDGET_UNIT_ENV) or BudgetUnit.STEPS.value)
    except KeyError as e:
        raise TrialSpecError(f"a trial of {experiment} without {e.args[0]}") from None
    except (ValueError, json.JSONDecodeError) as e:
        raise TrialSpecError(f"a trial of {experiment}: {e}") from None
    if not isinstance(hparams, dict) or not all(
        isinstance(v, bool | int | float | str) for v in hparams.values()
    ):
        raise TrialSpecError(f"{TRIAL_HPARAMS_ENV}: a JSON object of scalars")
    if index < 0 or not math.isfinite(budget) or budget <= 0:
        raise TrialSpecError(
            f"a trial of {experiment}: index {index} and budget {budget} must be positive"
        )
    return TrialSpec(experiment, index, hparams, budget, unit)


@dataclass(frozen=True)
class Reporting:
    """How often a simulated trial reports, in its budget's unit: a validation metric
    every ``validate_every`` (0: only at its budget) and its training loss every
    ``train_every`` (0: never)."""

    validate_every: float = 0.0
    train_every: float = 0.0


def _next_multiple(used: float, every: float) -> float:
    if every <= 0:
        return math.inf
    return (math.floor(used / every + EPS) + 1) * every


class TrialJob(JobSimulator):
    """A job that trains to its trial's budget and reports along its learning curve (see
    the module's docstring); the rest of its life is a JobSimulator's."""

    def __init__(
        self,
        submitted: JobSubmitted,
        application: SimulatedApplication,
        cluster: Cluster,
        *,
        spec: TrialSpec,
        curve: LearningCurve,
        reporting: Reporting = Reporting(),
        metric: str | None = None,
        reports: list[TrialMetrics] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(submitted, application, cluster, **kwargs)
        #: where its reports go (its fleet's, which hands them to the operator): they
        #: are on another topic than its job events, so they travel apart
        self.reports: list[TrialMetrics] = [] if reports is None else reports
        self.spec = spec
        self.curve = curve
        self.reporting = reporting
        #: the experiment's metric: a curve with one validation metric reports it under
        #: this name too (the built-in family calls its metric val_loss)
        self.metric = metric
        self._budget = spec.budget
        self._used = 0.0
        # At its budget, holding its GPUs until a decision raises the budget or ends it.
        self._waiting = False
        self._validated_at: float | None = None
        self._next_validation = _next_multiple(0.0, reporting.validate_every)
        self._next_training = _next_multiple(0.0, reporting.train_every)

    # -- what it is -----------------------------------------------------------------------

    @property
    def budget(self) -> float:
        return self._budget

    @property
    def used(self) -> float:
        return self._used

    @property
    def waiting(self) -> bool:
        """At its budget, waiting for the searcher's decision."""
        return self._waiting and self.state is JobPhase.RUNNING

    @property
    def ended(self) -> bool:
        return self.state in (JobPhase.COMPLETED, JobPhase.FAILED)

    def snapshot(self) -> dict[str, Any]:
        return {
            **super().snapshot(),
            "trial": {
                "spec": self.spec.snapshot(),
                "metric": self.metric,
                "budget": self._budget,
                "used": self._used,
                "waiting": self._waiting,
                "validated_at": self._validated_at,
                "next_validation": _finite_or_none(self._next_validation),
                "next_training": _finite_or_none(self._next_training),
            },
        }

    @classmethod
    def restore_trial(
        cls,
        state: Mapping[str, Any],
        application: SimulatedApplication,
        cluster: Cluster,
        *,
        origin: Any,
        source: str,
        curve: LearningCurve,
        reporting: Reporting,
        reports: list[TrialMetrics] | None = None,
    ) -> TrialJob:
        job = super().restore(state, application, cluster, origin=origin, source=source)
        assert isinstance(job, TrialJob)  # (restore builds an instance of cls)
        job.reports = [] if reports is None else reports
        trial = state["trial"]
        job.spec = TrialSpec.restore(trial["spec"])
        job.curve = curve
        job.reporting = reporting
        job.metric = trial["metric"]
        job._budget = trial["budget"]
        job._used = trial["used"]
        job._waiting = trial["waiting"]
        job._validated_at = trial["validated_at"]
        job._next_validation = _inf_if_none(trial["next_validation"])
        job._next_training = _inf_if_none(trial["next_training"])
        return job

    # -- decisions ------------------------------------------------------------------------

    def decide(self, decision: TrialDecision) -> list[JobEvent]:
        """What the trial does on a decision about it: ``run`` and ``resume`` set its
        budget (a larger one ends its wait), ``stop`` and ``complete`` end it; the others
        ask nothing of the trial itself (a pause's hold comes as a plan)."""
        if self.ended:
            return []
        kind = decision.decision
        if kind in (DecisionKind.RUN, DecisionKind.RESUME) and decision.budget is not None:
            self._budget = decision.budget
            if self._budget > self._used + EPS:
                self._waiting = False
            return []
        if kind in (DecisionKind.STOP, DecisionKind.COMPLETE):
            return self.end()
        return []

    def end(self) -> list[JobEvent]:
        """The trial's process returns and exits 0: its pods go, the job completes."""
        if self.ended:
            return []
        self._state = JobPhase.COMPLETED
        self._completed_at = self._clock
        self._waiting_for = ""
        self._eta = None
        self.cluster.release(self.job.uuid)
        self._allocation = None
        return [self._voice.job_completed(self._clock)]

    # -- time -----------------------------------------------------------------------------

    def _per_second(self) -> tuple[float, float, float]:
        """(budget per second, optimizer steps per second, progress per second) of the
        gang as it runs now."""
        rates = self._model.rates(self._running_pods(), self._placement(), self._progress)
        if self.spec.unit is BudgetUnit.STEPS:
            per_s = rates.goodput
        elif self.spec.unit is BudgetUnit.SAMPLES:
            per_s = rates.goodput * self.app.init_batch_size
        else:
            per_s = 1.0
        return per_s, 1.0 / rates.iteration, rates.goodput

    def _next_mark(self) -> float:
        """The budget at which it next reports or stops (where it is, when it is at its
        budget already)."""
        if self._waiting or self._budget <= self._used + EPS:
            return self._used
        marks = [self._budget, self._next_validation, self._next_training]
        return min(m for m in marks if m > self._used + EPS)

    def eta(self) -> float | None:
        """When it next reports (or reaches its budget), if nothing changes; None while it
        waits or does not train. It never completes by itself."""
        if self._state is not JobPhase.RUNNING or self._waiting:
            return None
        per_s, _, _ = self._per_second()
        return self._clock + (self._next_mark() - self._used) / per_s

    def next_event_at(self) -> float | None:
        if self._state is JobPhase.RESTARTING:
            return self._resume_at
        if self._state is not JobPhase.RUNNING or self._waiting:
            return None  # a waiting trial says nothing until a decision
        times = [t for t in (self._next_sample, self.eta()) if t is not None and t < math.inf]
        return min(times, default=None)

    def _train_until(self, end: float) -> list[JobEvent]:
        """Train to the first of: end, the next sample, the next report or the budget."""
        if self._waiting:
            self._clock = max(self._clock, end)
            return []
        per_s, steps_per_s, progress_per_s = self._per_second()
        mark = self._next_mark()
        reach = self._clock + (mark - self._used) / per_s
        horizon = min(end, self._next_sample, reach)
        elapsed = max(0.0, horizon - self._clock)
        self._steps += elapsed * steps_per_s
        self._progress += elapsed * progress_per_s
        # (a sample due a hair before the mark, by float error, must not carry it past)
        reached = reach <= horizon or self._used + elapsed * per_s >= mark - EPS
        self._used = mark if reached else self._used + elapsed * per_s
        self._clock = horizon
        events: list[JobEvent] = []
        if self.sample_interval and self._clock >= self._next_sample:
            self._next_sample += self.sample_interval
            events.append(self._sample())
        if reached:
            self.reports.extend(self._reports())
        return events

    def _reports(self) -> list[TrialMetrics]:
        """What it reports having reached a mark: its training loss when one is due, a
        validation metric when one is due or it is at its budget (once per budget), and
        at its budget it waits."""
        events: list[TrialMetrics] = []
        used = self._used
        if used >= self._next_training - EPS:
            self._next_training = _next_multiple(used, self.reporting.train_every)
            events.append(self._report(validation=False))
        periodic = used >= self._next_validation - EPS
        if periodic:
            self._next_validation = _next_multiple(used, self.reporting.validate_every)
        at_budget = used >= self._budget - EPS
        if (periodic or at_budget) and self._validated_at != used:
            self._validated_at = used
            events.append(self._report(validation=True))
        if at_budget:
            self._waiting = True
        return events

    def _report(self, *, validation: bool) -> TrialMetrics:
        metrics = dict(self.curve.metrics(self.spec.hparams, self._used, validation=validation))
        if validation and self.metric and self.metric not in metrics and len(metrics) == 1:
            metrics[self.metric] = next(iter(metrics.values()))
        self._voice.seq += 1
        kind = "validation" if validation else "training"
        return TrialMetrics(
            env=self.env,
            source=self.source,
            event_id=uuid.uuid5(_TRIAL_NAMESPACE, f"{self.job.uuid}/{self._voice.seq}/{kind}"),
            occurred_at=self.origin + timedelta(seconds=self._clock),
            experiment=self.spec.experiment,
            trial=self.spec.index,
            step=int(self._steps + EPS),
            budget=self._used,
            validation=validation,
            metrics=metrics,
        )


def _finite_or_none(value: float) -> float | None:
    return None if math.isinf(value) else value


def _inf_if_none(value: float | None) -> float:
    return math.inf if value is None else value


__all__ = ["Reporting", "TrialJob", "TrialSpec", "TrialSpecError", "trial_spec"]
