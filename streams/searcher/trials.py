"""A trial as the env's operator sees it: its TrainingJob, and what each of the searcher's
decisions asks of that job (docs/experiments.md, "Decisions and their effects"). Pure.

Every effect is derived from the decision that causes it, never from the time or a
counter: a decision published again after a crash yields the same JobRequest (its
``request_id`` is the trial's job name, which the operator creates at most once), the same
ScalePlan (its ``plan_id`` is the decision's id, which the operator applies at most once)
and the same JobDeletion, byte for byte.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from dlrover_events.sdk.trial_env import (
    EXPERIMENT_ENV,
    TRIAL_BUDGET_ENV,
    TRIAL_BUDGET_UNIT_ENV,
    TRIAL_ENV,
    TRIAL_HPARAMS_ENV,
)
from schemas.envelope import Event
from schemas.experiments import (
    DecisionKind,
    ExperimentSpec,
    ParamValue,
    TrialDecision,
    trial_job_name,
)
from schemas.jobs import JobMeta
from schemas.plans import ScalePlan
from schemas.requests import JobDeletion, JobRequest

#: The labels every trial's job carries: its experiment and its index, so a job, its pods
#: and its events say which trial they are of (the operator adds ``/request`` and
#: ``/owner`` when it creates the job).
EXPERIMENT_LABEL = "dlrover-events.io/experiment"
TRIAL_LABEL = "dlrover-events.io/trial"
#: Whose quota a job draws on (the operator's identity label ``group``, read into the
#: job's ``job.submitted`` for the cluster schedulers): the experiment's ``owner``.
GROUP_LABEL = "dlrover-events.io/group"
#: The container a role without one gets, so that its processes still learn that they are
#: a trial (a platform that runs no container, the local one, reads its variables).
TRIAL_CONTAINER = "trial"
#: A JobRequest's and a JobDeletion's reason hold at most this.
_MAX_REASON = 1024
#: Ids of the events a decision causes: uuid5 of the decision's id and the effect.
_EFFECT_NAMESPACE = uuid.UUID("6a0f3c52-8d14-4b7e-9e21-3f5b7c9d1e08")


def trial_variables(
    experiment: str,
    trial: int,
    hparams: Mapping[str, ParamValue],
    budget: float,
    spec: ExperimentSpec,
) -> dict[str, str]:
    """What a trial's processes read to know what they are (the SDK's ``Trial``)."""
    return {
        EXPERIMENT_ENV: experiment,
        TRIAL_ENV: str(trial),
        TRIAL_HPARAMS_ENV: json.dumps(dict(hparams), sort_keys=True, separators=(",", ":")),
        TRIAL_BUDGET_ENV: budget_text(budget),
        TRIAL_BUDGET_UNIT_ENV: spec.searcher.budget.unit.value,
    }


def budget_text(budget: float) -> str:
    """A budget as ``float()`` reads it back exactly: ``800`` rather than ``800.0`` for a
    whole one (steps, samples), the shortest exact form otherwise."""
    value = float(budget)
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


#: What a trial's job is when its template does not say: a TrainingJob.
TRAINING_JOB_KIND = {"apiVersion": "dlrover-events.io/v1alpha1", "kind": "TrainingJob"}


def trial_document(
    spec: ExperimentSpec,
    experiment: str,
    trial: int,
    hparams: Mapping[str, ParamValue],
    budget: float,
) -> dict[str, Any]:
    """Trial ``trial``'s TrainingJob: the experiment's template, named ``<exp>-t<i>``,
    labelled with its experiment and trial (and the owner's group, whose quota and
    priority it draws on), and on every container of every role the trial's variables
    (a template's variable of the same name is replaced; the others are kept). The
    template itself is not changed. A template that names no apiVersion or kind (an
    experiment's ``trial`` is a TrainingJob by definition) gets the TrainingJob's."""
    body: dict[str, Any] = {**TRAINING_JOB_KIND, **copy.deepcopy(dict(spec.trial))}
    meta = body.get("metadata")
    meta = dict(meta) if isinstance(meta, Mapping) else {}
    labels = meta.get("labels")
    labels = dict(labels) if isinstance(labels, Mapping) else {}
    labels |= {EXPERIMENT_LABEL: experiment, TRIAL_LABEL: str(trial)}
    if spec.owner:
        labels[GROUP_LABEL] = spec.owner
    meta |= {"name": trial_job_name(experiment, trial), "labels": labels}
    body["metadata"] = meta
    variables = trial_variables(experiment, trial, hparams, budget, spec)
    roles = body["spec"].get("roles")
    if isinstance(roles, Mapping):
        for role in roles.values():
            if isinstance(role, dict):
                _set_variables(role, variables)
    return body


def _set_variables(role: dict[str, Any], variables: Mapping[str, str]) -> None:
    template = role.get("template")
    if not isinstance(template, dict):
        template = role["template"] = {}
    pod = template.get("spec")
    if not isinstance(pod, dict):
        pod = template["spec"] = {}
    containers = pod.get("containers")
    if not isinstance(containers, list) or not containers:
        containers = pod["containers"] = [{"name": TRIAL_CONTAINER}]
    for container in containers:
        if not isinstance(container, dict):
            continue
        env = container.get("env")
        kept = [
            var
            for var in (env if isinstance(env, list) else [])
            if not (isinstance(var, Mapping) and var.get("name") in variables)
        ]
        container["env"] = kept + [{"name": n, "value": v} for n, v in variables.items()]


def effect_id(cause: uuid.UUID, what: str) -> uuid.UUID:
    """The id of the event ``cause`` makes as ``what``: the same on every replay."""
    return uuid.uuid5(_EFFECT_NAMESPACE, f"{cause}/{what}")


def plan_id(decision: TrialDecision) -> str:
    """A decision's ScalePlan's id: one plan per decision, however often it is published."""
    return f"searcher-{decision.decision.value}-{decision.event_id}"


def deletion_request_id(experiment: str, trial: int) -> str:
    """The id of the request that deletes a trial's job (at most 62 characters: a label
    value, as the creation's id ``<exp>-t<i>`` is)."""
    return f"{trial_job_name(experiment, trial)}-del"


#: The decisions whose effect is a ScalePlan on the trial's job: it needs the job's uid.
NEEDS_JOB = frozenset({DecisionKind.PAUSE, DecisionKind.STOP, DecisionKind.RESUME})


def creation(decision: TrialDecision, spec: ExperimentSpec, *, source: str) -> JobRequest:
    """The JobRequest of a ``create`` decision: the trial's job, owned by its experiment."""
    if decision.decision is not DecisionKind.CREATE or decision.trial is None:
        raise ValueError(f"a {decision.decision.value} decision creates no trial")
    if decision.budget is None:  # the schema sees to it
        raise ValueError("a create decision gives the trial its budget")
    name = trial_job_name(decision.experiment, decision.trial)
    return JobRequest(
        env=decision.env,
        event_id=effect_id(decision.event_id, "job.request"),
        occurred_at=decision.occurred_at,
        source=source,
        request_id=name,
        name=name,
        document=trial_document(
            spec, decision.experiment, decision.trial, decision.hparams, decision.budget
        ),
        reason=_reason(f"trial {decision.trial} of experiment {decision.experiment}", decision),
        owner=decision.experiment,
    )


def scale_plan(decision: TrialDecision, job: JobMeta, *, source: str) -> ScalePlan | None:
    """The ScalePlan of a ``pause`` or ``stop``: the job held by its owner (suspended: its
    pods save their checkpoint on SIGTERM and free their slots; no plan resumes it, a
    cluster scheduler's included, until it is released); of a ``resume``: the job released
    to the queue (admitted by the env's cluster scheduler when it has room, at once
    without one; it goes on from its checkpoint). None for a decision that asks nothing
    of the job."""
    if decision.decision not in NEEDS_JOB:
        return None
    held = decision.decision is not DecisionKind.RESUME
    return ScalePlan(
        env=decision.env,
        event_id=effect_id(decision.event_id, "scale.plan"),
        occurred_at=decision.occurred_at,
        source=source,
        job=job,
        plan_id=plan_id(decision),
        suspend=held,
        hold=held,
    )


def effects(
    decision: TrialDecision, spec: ExperimentSpec, job: JobMeta | None, *, source: str
) -> list[Event] | None:
    """What ``decision`` asks of the env's operator (``job``: the trial's job, as the
    operator's answer to its creation named it). None when it asks something of a job not
    known yet: its effect waits for the job's uid."""
    if decision.decision is DecisionKind.CREATE:
        return [creation(decision, spec, source=source)]
    if decision.decision in NEEDS_JOB:
        if job is None:
            return None
        plan = scale_plan(decision, job, source=source)
        return [] if plan is None else [plan]
    return []


def deletions(
    env: str,
    experiment: str,
    trials: Sequence[int],
    cause: Event,
    *,
    source: str,
    reason: str = "",
) -> list[JobDeletion]:
    """The JobDeletions of a killed experiment's trials' jobs, caused by ``cause`` (the
    ExperimentAction ``kill``): only jobs owned by ``experiment`` are deleted."""
    why = reason or f"experiment {experiment} killed"
    return [
        JobDeletion(
            env=env,
            event_id=effect_id(cause.event_id, f"job.deletion/{trial}"),
            occurred_at=cause.occurred_at,
            source=source,
            request_id=deletion_request_id(experiment, trial),
            name=trial_job_name(experiment, trial),
            owner=experiment,
            reason=why[:_MAX_REASON],
        )
        for trial in sorted(set(trials))
    ]


def _reason(what: str, decision: TrialDecision) -> str:
    text = f"{what}: {decision.reason}" if decision.reason else what
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 3] + "..."


__all__ = [
    "EXPERIMENT_LABEL",
    "GROUP_LABEL",
    "NEEDS_JOB",
    "TRIAL_CONTAINER",
    "TRIAL_LABEL",
    "budget_text",
    "creation",
    "deletion_request_id",
    "deletions",
    "effect_id",
    "effects",
    "plan_id",
    "scale_plan",
    "trial_document",
    "trial_variables",
]
