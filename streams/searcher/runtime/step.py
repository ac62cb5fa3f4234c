"""What one input does to one experiment, pure: the core's decisions (streams/searcher/
core/state.py) and, beside them, what the runtime keeps to turn them into effects on the
env's operator (trials.py). The I/O shell (`processor.py`) loads an experiment, steps
it through its inputs in the order read and writes it back with what to publish.

The core decides on experiment actions, trial metrics and trials' ends. The runtime
feeds it those and keeps, in the experiment's `Wing`, what the core does not know about:
each trial's job as the operator named it (a ScalePlan names its job by uid, learned from
the operator's JobRequestResult or the job's own events), the effects that wait for that
uid, and which trials' ends were already told. From the operator's and the jobs' events:

- a trial's creation answered ``created``: its job is known, its waiting plans go out;
  answered ``exists`` (someone else's job of that name), ``refused`` or ``failed``: the
  trial failed, with the operator's reason;
- the deletion of a killed experiment's trial answered ``deleted`` or ``absent``: the
  trial ended, ``deleted``;
- ``job.completed`` or ``job.failed`` of a trial's job (its name ``<exp>-t<i>``, its label
  ``dlrover-events.io/experiment`` the experiment): the trial ended, succeeded or failed.

Each trial's end is told to the core once, whatever says it first.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pydantic import TypeAdapter

from schemas.envelope import Event
from schemas.experiments import (
    DecisionKind,
    ExperimentAction,
    ExperimentActionKind,
    ExperimentSpec,
    ExperimentSubmitted,
    TrialDecision,
    TrialMetrics,
    trial_of_job,
)
from schemas.jobs import JobCompleted, JobFailed, JobMeta
from schemas.requests import JobRequestResult, JobRequestStatus
from streams.searcher import trials
from streams.searcher.core.state import ExperimentState, TrialEnded, begin, decide

#: Who the searcher is on the bus: its decisions' and requests' source, and so the
#: requester its operator's answers name.
SOURCE = "searcher"

Outcome = Literal["succeeded", "failed", "deleted"]
_DECISIONS: TypeAdapter[list[TrialDecision]] = TypeAdapter(list[TrialDecision])
#: What a creation that made no job of the trial's says about the trial: it failed.
_NO_JOB = frozenset({JobRequestStatus.EXISTS, JobRequestStatus.REFUSED, JobRequestStatus.FAILED})
#: What a deletion that leaves no job of the trial's says: it ended, deleted.
_GONE = frozenset({JobRequestStatus.DELETED, JobRequestStatus.ABSENT})


@dataclass(frozen=True)
class TrialJob:
    """One trial's job as the runtime knows it: ``job`` once the operator named it;
    ``waiting``: decisions whose ScalePlan needs that job, in order; ``ended``: its end
    was told to the core."""

    job: JobMeta | None = None
    waiting: tuple[TrialDecision, ...] = ()
    ended: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "job": None if self.job is None else self.job.model_dump(mode="json"),
            "waiting": [d.model_dump(mode="json") for d in self.waiting],
            "ended": self.ended,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> TrialJob:
        job = raw.get("job")
        return cls(
            job=None if job is None else JobMeta.model_validate(job),
            waiting=tuple(_DECISIONS.validate_python(raw.get("waiting") or [])),
            ended=bool(raw.get("ended")),
        )


@dataclass(frozen=True)
class Wing:
    """What the runtime keeps of an experiment beside the core's state: its trials' jobs,
    and whether its kill was carried out."""

    trials: Mapping[int, TrialJob] = field(default_factory=dict)
    killed: bool = False

    def trial(self, index: int) -> TrialJob:
        return self.trials.get(index, TrialJob())

    def with_trial(self, index: int, trial: TrialJob) -> Wing:
        return replace(self, trials={**self.trials, index: trial})

    def to_json(self) -> dict[str, Any]:
        return {
            "trials": {str(i): t.to_json() for i, t in sorted(self.trials.items())},
            "killed": self.killed,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Wing:
        return cls(
            trials={int(i): TrialJob.from_json(t) for i, t in (raw.get("trials") or {}).items()},
            killed=bool(raw.get("killed")),
        )


@dataclass(frozen=True)
class Experiment:
    """An experiment as the searcher checkpoints it: the core's state and the wing."""

    name: str
    state: ExperimentState
    wing: Wing

    @property
    def spec(self) -> ExperimentSpec:
        return self.state.spec

    def state_json(self) -> str:
        return json.dumps(self.state.to_json(), separators=(",", ":"))

    def wing_json(self) -> str:
        return json.dumps(self.wing.to_json(), separators=(",", ":"))

    @classmethod
    def from_json(cls, name: str, state: str, wing: str) -> Experiment:
        """What `state_json` and `wing_json` wrote."""
        return cls(
            name, ExperimentState.from_json(json.loads(state)), Wing.from_json(json.loads(wing))
        )


def experiment_of(event: Event, *, source: str = SOURCE) -> str | None:
    """The experiment an input concerns, or None when it concerns none the searcher
    decides on (another requester's answer, a job that is no trial, an event it does not
    read)."""
    if isinstance(event, ExperimentSubmitted | ExperimentAction | TrialMetrics):
        return event.experiment
    if isinstance(event, JobRequestResult):
        if event.requester != source or event.owner is None:
            return None
        found = trial_of_job(event.name)
        return event.owner if found is not None and found[0] == event.owner else None
    if isinstance(event, JobCompleted | JobFailed):
        found = trial_of_job(event.job.name)
        if found is None or event.job.labels.get(trials.EXPERIMENT_LABEL) != found[0]:
            return None
        return found[0]
    return None


def start(
    submitted: ExperimentSubmitted, *, source: str = SOURCE
) -> tuple[Experiment, list[Event]]:
    """An experiment begun: the core's first decisions (its first trials) and their
    effects."""
    state, decisions = begin(submitted, source=source)
    experiment = Experiment(submitted.experiment, state, Wing())
    return _decided(experiment, state, decisions, source)


def step(
    experiment: Experiment, event: Event, *, source: str = SOURCE
) -> tuple[Experiment, list[Event]]:
    """``event`` applied to ``experiment`` (one `experiment_of` named): the experiment
    after it and what to publish, in order (each decision, then its effects)."""
    if isinstance(event, ExperimentSubmitted):
        return experiment, []  # submitted again: an experiment's spec never changes
    if isinstance(event, TrialMetrics):
        state, decisions = decide(experiment.state, event, source=source)
        return _decided(experiment, state, decisions, source)
    if isinstance(event, ExperimentAction):
        return _acted(experiment, event, source)
    if isinstance(event, JobRequestResult):
        return _answered(experiment, event, source)
    if isinstance(event, JobCompleted | JobFailed):
        return _job_ended(experiment, event, source)
    return experiment, []


def _decided(
    experiment: Experiment,
    state: ExperimentState,
    decisions: list[TrialDecision],
    source: str,
) -> tuple[Experiment, list[Event]]:
    """The core's new state and its decisions, each followed by its effects; a decision
    whose effect needs its trial's job not known yet waits in the wing for it."""
    wing = experiment.wing
    out: list[Event] = []
    for decision in decisions:
        out.append(decision)
        if decision.trial is None:
            continue
        trial = wing.trial(decision.trial)
        if trial.waiting:  # behind others that wait: in their order
            wing = wing.with_trial(
                decision.trial, replace(trial, waiting=(*trial.waiting, decision))
            )
            continue
        effects = trials.effects(decision, experiment.spec, trial.job, source=source)
        if effects is None:
            wing = wing.with_trial(decision.trial, replace(trial, waiting=(decision,)))
        else:
            if decision.decision is DecisionKind.CREATE:
                wing = wing.with_trial(decision.trial, trial)
            out.extend(effects)
    return replace(experiment, state=state, wing=wing), out


def _acted(
    experiment: Experiment, action: ExperimentAction, source: str
) -> tuple[Experiment, list[Event]]:
    """A user's pause, activate or kill: the core's decisions, and for a kill (once) the
    deletion of every trial's job; plans still waiting for a job are dropped then, as the
    job goes."""
    state, decisions = decide(experiment.state, action, source=source)
    experiment, out = _decided(experiment, state, decisions, source)
    if action.action is not ExperimentActionKind.KILL or experiment.wing.killed:
        return experiment, out
    wing = experiment.wing
    out.extend(
        trials.deletions(action.env, experiment.name, sorted(wing.trials), action, source=source)
    )
    wing = replace(
        wing,
        killed=True,
        trials={i: replace(t, waiting=()) for i, t in wing.trials.items()},
    )
    return replace(experiment, wing=wing), out


def _answered(
    experiment: Experiment, result: JobRequestResult, source: str
) -> tuple[Experiment, list[Event]]:
    found = trial_of_job(result.name)
    assert found is not None  # experiment_of named this experiment
    index = found[1]
    if result.request_id == trials.deletion_request_id(experiment.name, index):
        if result.status in _GONE:
            return _ended(experiment, index, "deleted", result.reason, result, source)
        return experiment, []  # refused: someone else's job; nothing of ours to end
    if result.request_id != result.name:
        return experiment, []  # no request of this searcher's
    if result.status is JobRequestStatus.CREATED and result.job is not None:
        return _job_known(experiment, index, result.job, source)
    if result.status in _NO_JOB:
        why = f"its job was not created ({result.status.value}): {result.reason}"
        return _ended(experiment, index, "failed", why, result, source)
    return experiment, []


def _job_known(
    experiment: Experiment, index: int, job: JobMeta, source: str
) -> tuple[Experiment, list[Event]]:
    """The trial's job learned: the plans that waited for it go out, in order."""
    trial = experiment.wing.trial(index)
    if trial.job is not None and trial.job.uuid == job.uuid and not trial.waiting:
        return experiment, []
    out: list[Event] = []
    for decision in trial.waiting:
        out.extend(trials.effects(decision, experiment.spec, job, source=source) or [])
    wing = experiment.wing.with_trial(index, replace(trial, job=job, waiting=()))
    return replace(experiment, wing=wing), out


def _job_ended(
    experiment: Experiment, event: JobCompleted | JobFailed, source: str
) -> tuple[Experiment, list[Event]]:
    found = trial_of_job(event.job.name)
    assert found is not None  # experiment_of named this experiment
    index = found[1]
    known = experiment.wing.trial(index).job
    if known is not None and known.uuid != event.job.uuid:
        return experiment, []  # another job of that name: not the trial's
    experiment, out = _job_known(experiment, index, event.job, source)
    outcome: Outcome = "succeeded" if isinstance(event, JobCompleted) else "failed"
    reason = event.reason if isinstance(event, JobFailed) else ""
    experiment, more = _ended(experiment, index, outcome, reason, event, source)
    return experiment, out + more


def _ended(
    experiment: Experiment,
    index: int,
    outcome: Outcome,
    reason: str,
    cause: Event,
    source: str,
) -> tuple[Experiment, list[Event]]:
    """The trial's end told to the core, once."""
    trial = experiment.wing.trial(index)
    if trial.ended or index not in experiment.wing.trials:
        return experiment, []
    ended = TrialEnded(
        experiment=experiment.name,
        trial=index,
        outcome=outcome,
        reason=reason,
        occurred_at=cause.occurred_at,
        env=cause.env,
    )
    state, decisions = decide(experiment.state, ended, source=source)
    wing = experiment.wing.with_trial(index, replace(trial, ended=True))
    return _decided(replace(experiment, wing=wing), state, decisions, source)


__all__ = [
    "SOURCE",
    "Experiment",
    "TrialJob",
    "Wing",
    "experiment_of",
    "start",
    "step",
]
