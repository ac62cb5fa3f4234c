"""Experiments: a search space, a searcher, a metric and a trial template, and the events
of their trials (what a trial reports, what the searcher decides).

An experiment is written as Determined users write one (``hyperparameters`` with
``const``, ``int``, ``double``, ``log`` and ``categorical``; a ``searcher`` with its
metric, ``max_trials``, ``max_concurrent_trials`` and the trial's budget), so a sweep
moves here by renaming a few keys; its ``trial`` is a TrainingJob document, run on any
platform. Three topics carry an experiment's life, all keyed by the experiment's name so
the searcher reads each experiment's inputs in one partition, in order:

- ``<env>.experiments``: ExperimentSubmitted (the document) and ExperimentAction
  (pause, activate, kill);
- ``<env>.trial.metrics``: TrialMetrics, what a trial measured at a step (training or
  validation), bounded like every input;
- ``<env>.trial.decisions``: TrialDecision, each thing the searcher decided and why
  (create a trial with these hyperparameters, run it to a budget, pause it at a rung,
  resume it, stop it early, the experiment done). A trial reads its own budget here.

This module imports nothing of the project but ``schemas``.
"""

from __future__ import annotations

import math
import re
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, StringConstraints, field_validator, model_validator

from schemas.bounds import INT64_MAX, Document, Text
from schemas.envelope import Event, Model

#: An experiment's name: a DNS label short enough that its trials' job names
#: (``<experiment>-t<index>``) are DNS labels too.
ExperimentName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=50, pattern=r"^[a-z0-9]([-a-z0-9]{0,48}[a-z0-9])?$"),
]
#: A hyperparameter's or a metric's name: what Python, YAML and SQL all take unquoted.
ParamName = Annotated[
    str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
]
#: Hyperparameters of one experiment, metrics in one report.
MAX_HYPERPARAMETERS = 64
MAX_METRICS = 64
#: Values of a categorical hyperparameter, and grid points of a numeric one.
MAX_CHOICES = 1_000
#: Trials of one experiment.
MAX_TRIALS = 100_000
#: What a trial index may be: its job name keeps 6 digits.
MAX_TRIAL_INDEX = 999_999
#: A hyperparameter's value: what JSON, a shell variable and argparse all carry.
ParamValue = bool | int | float | Text
_FINITE = 1e300
_SCALAR_TEXT = 256


def _finite(value: float) -> float:
    if not math.isfinite(value) or abs(value) > _FINITE:
        raise ValueError("must be a finite number")
    return value


class ConstParam(Model):
    """A value every trial gets (Determined's ``const``)."""

    type: Literal["const"] = "const"
    val: ParamValue

    @field_validator("val")
    @classmethod
    def _bounded(cls, v: ParamValue) -> ParamValue:
        if isinstance(v, float):
            _finite(v)
        if isinstance(v, str) and len(v) > _SCALAR_TEXT:
            raise ValueError(f"a const string has at most {_SCALAR_TEXT} characters")
        return v


class IntParam(Model):
    """An integer in [minval, maxval]; ``count`` points of it for grid search."""

    type: Literal["int"] = "int"
    minval: int = Field(ge=-INT64_MAX, le=INT64_MAX)
    maxval: int = Field(ge=-INT64_MAX, le=INT64_MAX)
    count: int | None = Field(default=None, ge=1, le=MAX_CHOICES)

    @model_validator(mode="after")
    def _ordered(self) -> IntParam:
        if self.minval > self.maxval:
            raise ValueError(f"minval {self.minval} is above maxval {self.maxval}")
        return self


class DoubleParam(Model):
    """A real number in [minval, maxval], uniform; ``count`` points for grid search."""

    type: Literal["double"] = "double"
    minval: float
    maxval: float
    count: int | None = Field(default=None, ge=1, le=MAX_CHOICES)

    _check = field_validator("minval", "maxval")(classmethod(lambda cls, v: _finite(v)))

    @model_validator(mode="after")
    def _ordered(self) -> DoubleParam:
        if self.minval > self.maxval:
            raise ValueError(f"minval {self.minval} is above maxval {self.maxval}")
        return self


class LogParam(Model):
    """``base ** x`` for x uniform in [minval, maxval] (Determined's ``log``: the bounds are
    exponents, so a learning rate from 1e-4 to 1e-1 is minval -4, maxval -1)."""

    type: Literal["log"] = "log"
    base: float = Field(default=10.0, gt=1.0, le=1e6)
    minval: float = Field(ge=-300, le=300)
    maxval: float = Field(ge=-300, le=300)
    count: int | None = Field(default=None, ge=1, le=MAX_CHOICES)

    @model_validator(mode="after")
    def _ordered(self) -> LogParam:
        if self.minval > self.maxval:
            raise ValueError(f"minval {self.minval} is above maxval {self.maxval}")
        if self.maxval * math.log10(self.base) > 300:
            raise ValueError("base ** maxval is beyond what a double holds")
        return self


class CategoricalParam(Model):
    """One of ``vals``."""

    type: Literal["categorical"] = "categorical"
    vals: list[ParamValue] = Field(min_length=1, max_length=MAX_CHOICES)

    @field_validator("vals")
    @classmethod
    def _distinct_scalars(cls, vals: list[ParamValue]) -> list[ParamValue]:
        for v in vals:
            if isinstance(v, float):
                _finite(v)
            if isinstance(v, str) and len(v) > _SCALAR_TEXT:
                raise ValueError(f"a categorical string has at most {_SCALAR_TEXT} characters")
        keys = [(type(v).__name__, v) for v in vals]
        if len(set(keys)) != len(keys):
            raise ValueError("values must be distinct")
        return vals


HyperParameter = Annotated[
    ConstParam | IntParam | DoubleParam | LogParam | CategoricalParam,
    Field(discriminator="type"),
]


class BudgetUnit(StrEnum):
    """What a trial's budget counts: optimizer steps, training samples, or seconds of
    training (Determined's ``batches`` / ``records``, NNI's duration)."""

    STEPS = "steps"
    SAMPLES = "samples"
    SECONDS = "seconds"


class Budget(Model):
    """The most one trial trains (Determined's ``max_length``), in ``unit``."""

    unit: BudgetUnit = BudgetUnit.STEPS
    max: float = Field(gt=0, le=1e15, allow_inf_nan=False)


class AshaMode(StrEnum):
    """How many rungs a trial may start at (Determined's ``mode``): ``aggressive`` starts
    every trial at the lowest rung; ``standard`` and ``conservative`` spread the trials over
    more starting rungs (Hyperband's brackets), trading early pruning for safety."""

    AGGRESSIVE = "aggressive"
    STANDARD = "standard"
    CONSERVATIVE = "conservative"


class EarlyStopping(Model):
    """A rule that stops a trial whose metric is worse than the others' at the same
    budget (NNI's and Katib's median stop), for searchers that do not prune themselves."""

    name: Literal["median"] = "median"
    min_trials: int = Field(
        default=3, ge=1, le=MAX_TRIALS, description="trials that must have reported there"
    )
    start_fraction: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="no trial is stopped before this fraction of the budget",
    )


class SearcherSpec(Model):
    """Which searcher runs the experiment, what it optimizes, and how far.

    ``name`` is a searcher of the registry (grid, random, asha, ...); it is checked where
    the experiment enters (the CLI, the REST API, the searcher), since the registry is not
    part of the contract."""

    name: Annotated[
        str, StringConstraints(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_-]*$")
    ]
    metric: ParamName
    smaller_is_better: bool = True
    max_trials: int = Field(default=16, ge=1, le=MAX_TRIALS)
    max_concurrent_trials: int = Field(default=0, ge=0, le=MAX_TRIALS, description="0: no limit")
    budget: Budget
    seed: int = Field(default=0, ge=0, le=2**32 - 1)
    # ASHA's knobs, with Determined's defaults
    divisor: int = Field(default=4, ge=2, le=100)
    max_rungs: int = Field(default=5, ge=1, le=20)
    mode: AshaMode = AshaMode.STANDARD
    early_stopping: EarlyStopping | None = None


class ExperimentSpec(Model):
    """The search space, the searcher and the trial template (a TrainingJob document whose
    ``metadata.name`` the searcher sets per trial)."""

    hyperparameters: dict[ParamName, HyperParameter] = Field(
        min_length=1, max_length=MAX_HYPERPARAMETERS
    )
    searcher: SearcherSpec
    trial: Document = Field(
        description="the TrainingJob every trial runs, as `job submit` takes it"
    )
    owner: Annotated[str, StringConstraints(max_length=63)] | None = Field(
        default=None, description="the group whose quota and priority the trials draw on"
    )

    @model_validator(mode="after")
    def _trial_is_a_job(self) -> ExperimentSpec:
        spec = self.trial.get("spec")
        if not isinstance(spec, dict):
            raise ValueError("trial: a TrainingJob document with a spec")
        return self


class ExperimentDocument(Model):
    """An experiment as a user writes it: YAML for `experiment create`, the body of
    ``POST /v1/experiments``, an ``Experiment`` custom resource on Kubernetes."""

    apiVersion: Literal["dlrover-events.io/v1alpha1"] = "dlrover-events.io/v1alpha1"
    kind: Literal["Experiment"] = "Experiment"
    metadata: ExperimentMetadata
    spec: ExperimentSpec


class ExperimentMetadata(Model):
    model_config = Model.model_config | {"extra": "ignore"}  # a custom resource's own fields

    name: ExperimentName


ExperimentDocument.model_rebuild()

EXPERIMENTS_TOPIC = "experiments"
TRIAL_METRICS_TOPIC = "trial.metrics"
TRIAL_DECISIONS_TOPIC = "trial.decisions"


def trial_job_name(experiment: str, trial: int) -> str:
    """The job of trial ``trial``: ``<experiment>-t<index>``, a DNS label."""
    return f"{experiment}-t{trial}"


_TRIAL_JOB = re.compile(r"^(?P<experiment>[a-z0-9][-a-z0-9]*)-t(?P<trial>\d{1,6})$")


def trial_of_job(job: str) -> tuple[str, int] | None:
    """The experiment and trial a job name is of, or None."""
    m = _TRIAL_JOB.match(job)
    return (m["experiment"], int(m["trial"])) if m else None


class _ExperimentEvent(Event):
    experiment: ExperimentName

    @model_validator(mode="after")
    def _key_is_experiment(self) -> Any:
        if self.key is None:
            self.key = self.experiment
        elif self.key != self.experiment:
            raise ValueError(f"key {self.key!r} must be the experiment's name {self.experiment!r}")
        return self


class ExperimentSubmitted(_ExperimentEvent):
    """An experiment to run, as submitted (by `experiment create`, the REST API, the
    Kubernetes Experiment resource). Submitted again with the same name: ignored by the
    searcher (an experiment's spec never changes under its trials)."""

    topic: ClassVar[str] = EXPERIMENTS_TOPIC
    type: Literal["experiment.submitted"] = "experiment.submitted"
    spec: ExperimentSpec


class ExperimentActionKind(StrEnum):
    """``pause``: no trial runs or starts (running ones are suspended, their checkpoints
    kept); ``activate``: go on; ``kill``: stop every trial and delete their jobs."""

    PAUSE = "pause"
    ACTIVATE = "activate"
    KILL = "kill"


class ExperimentAction(_ExperimentEvent):
    """What a user did to an experiment."""

    topic: ClassVar[str] = EXPERIMENTS_TOPIC
    type: Literal["experiment.action"] = "experiment.action"
    action: ExperimentActionKind
    reason: Text = Field(default="", max_length=1024)


class TrialMetrics(_ExperimentEvent):
    """What trial ``trial`` measured when it had used ``budget`` of its budget's unit:
    training metrics, or validation metrics (``validation``), which the searcher decides
    on. Reported by the SDK (``Trial.report_metrics``)."""

    topic: ClassVar[str] = TRIAL_METRICS_TOPIC
    type: Literal["trial.metrics"] = "trial.metrics"
    trial: int = Field(ge=0, le=MAX_TRIAL_INDEX)
    step: int = Field(ge=0, le=INT64_MAX, description="the trial's global step")
    budget: float = Field(
        ge=0, le=1e15, allow_inf_nan=False, description="budget used, in the experiment's unit"
    )
    validation: bool = False
    metrics: dict[ParamName, float] = Field(min_length=1, max_length=MAX_METRICS)

    @field_validator("metrics")
    @classmethod
    def _finite_values(cls, metrics: dict[str, float]) -> dict[str, float]:
        for name, v in metrics.items():
            if not math.isfinite(v) or abs(v) > _FINITE:
                raise ValueError(f"metric {name!r} must be a finite number, not {v!r}")
        return metrics


class DecisionKind(StrEnum):
    """What the searcher decided about a trial (or, ``done``, the experiment).

    ``create``: a new trial with these hyperparameters, to run to ``budget``; ``run``: a
    running trial goes on to ``budget`` (promoted in place); ``pause``: a trial waits at a
    rung (its job suspended, its checkpoint kept, its slots free); ``resume``: a paused
    trial is promoted, its job resumed from its checkpoint to run to ``budget``; ``stop``:
    a trial stops early (its job suspended for good, kept for its metrics); ``complete``:
    a trial reached its final budget; ``done``: the experiment ended (``reason`` says why)."""

    CREATE = "create"
    RUN = "run"
    PAUSE = "pause"
    RESUME = "resume"
    STOP = "stop"
    COMPLETE = "complete"
    DONE = "done"


class TrialDecision(_ExperimentEvent):
    """One decision of an experiment's searcher, with its reason. ``seq`` numbers the
    experiment's decisions from 0: the searcher is deterministic, so a restarted searcher
    derives the same decisions with the same numbers and ids, and a consumer keeps each
    ``(experiment, seq)`` once."""

    topic: ClassVar[str] = TRIAL_DECISIONS_TOPIC
    type: Literal["trial.decision"] = "trial.decision"
    seq: int = Field(ge=0, le=INT64_MAX)
    decision: DecisionKind
    trial: int | None = Field(default=None, ge=0, le=MAX_TRIAL_INDEX)
    hparams: dict[ParamName, ParamValue] = Field(
        default_factory=dict, max_length=MAX_HYPERPARAMETERS
    )
    budget: float | None = Field(default=None, ge=0, le=1e15, allow_inf_nan=False)
    rung: int | None = Field(default=None, ge=0, le=100)
    reason: Text = Field(default="", max_length=2048)

    @model_validator(mode="after")
    def _names_its_trial(self) -> TrialDecision:
        if (self.decision is DecisionKind.DONE) != (self.trial is None):
            raise ValueError("a trial decision names its trial; only 'done' names none")
        budgeted = (DecisionKind.CREATE, DecisionKind.RUN, DecisionKind.RESUME)
        if self.decision in budgeted and self.budget is None:
            raise ValueError(f"a {self.decision.value} decision gives the trial its budget")
        return self


__all__ = [
    "EXPERIMENTS_TOPIC",
    "MAX_TRIALS",
    "TRIAL_DECISIONS_TOPIC",
    "TRIAL_METRICS_TOPIC",
    "AshaMode",
    "Budget",
    "BudgetUnit",
    "CategoricalParam",
    "ConstParam",
    "DecisionKind",
    "DoubleParam",
    "EarlyStopping",
    "ExperimentAction",
    "ExperimentActionKind",
    "ExperimentDocument",
    "ExperimentMetadata",
    "ExperimentName",
    "ExperimentSpec",
    "ExperimentSubmitted",
    "HyperParameter",
    "IntParam",
    "LogParam",
    "ParamName",
    "ParamValue",
    "SearcherSpec",
    "TrialDecision",
    "TrialMetrics",
    "trial_job_name",
    "trial_of_job",
]
