"""The virtual operator's side of experiments: jobs asked for on the bus (JobRequest,
JobDeletion) answered by the reconciler's rules, the searcher's inputs taken in one order,
and where the simulated trials' learning curves come from.

A virtual env answers a JobRequest as the real env's reconciler does (its rules, pure, are
handlers.operator.reconcile.requests): the document checked as `job submit` checks one,
labelled with the request and its owner, a job of that name answered ``exists`` (or
``created`` when this request made it), and every final answer kept in the env's
``job_requests`` ledger, so a request delivered again gets its first answer again. The
job is simulated; a job whose containers carry a trial's variables is a trial
(handlers/simulator/trial.py).

The searcher's effects reach the operator on three topics and several partitions
(job.requests keyed by job, trial.decisions by experiment, scale.plans by job), so the
order they are read in depends on the broker and the wall clock. Out of wall-clock pace
the operator takes them at a point of its simulated clock where the searcher has decided
everything (see ``SearcherProgress``) and in one order of their own (``canonical``), so
the simulated cluster does the same whatever the reading order.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlrover_events.errors import UserError
from dlrover_events.store import EnvStore
from handlers.operator.document.trainingjob import parse_job
from handlers.operator.platform.bodies import DOMAIN, JobView, UnreadableJob
from handlers.operator.platform.errors import InvalidJob
from handlers.operator.reconcile import events, requests
from handlers.operator.reconcile.requests import Answer
from handlers.simulator.curves import (
    CurveError,
    CurvePoint,
    LearningCurve,
    ParametricCurve,
    TableCurve,
    parse_table,
)
from handlers.simulator.fleet import VirtualCluster
from handlers.simulator.trial import TrialSpec, TrialSpecError, trial_spec
from schemas.env_settings import CurveSettings
from schemas.envelope import Event
from schemas.experiments import TrialDecision, TrialMetrics, trial_of_job
from schemas.jobs import JobCompleted, JobFailed, JobSubmitted
from schemas.plans import ScalePlan
from schemas.requests import JobDeletion, JobRequest, JobRequestResult, JobRequestStatus

log = logging.getLogger(__name__)

#: The platform a virtual env's answers name.
PLATFORM = "virtual"

_UID_NAMESPACE = uuid.UUID("8d4e2b17-5a90-4c3f-b6e1-0f2a7c9d3e84")


def job_uid(request_id: str) -> str:
    """The uid of the job a request creates: a function of the request alone, so the
    request read again (after a crash before its answer was kept) names the same job,
    and the same trial has the same uid in every arm of an A/B test (a cluster scheduler
    breaks ties by uid: the arms' trials must not differ by it). Unique in an env, as a
    request id is."""
    return str(uuid.uuid5(_UID_NAMESPACE, request_id))


@dataclass(frozen=True)
class Creation:
    """A job a request creates: its document as created (labelled, its uid set), the job
    as the decisions see it, and its trial if it is one."""

    request: JobRequest
    document: dict[str, Any]
    view: JobView
    trial: TrialSpec | None

    @property
    def answer(self) -> Answer:
        return requests.created(self.view, PLATFORM)


def decide_request(env: str, request: JobRequest, existing: Any) -> Creation | Answer:
    """What a request makes: the job to create, or the answer without one (refused, or
    a job of that name there already: ``existing``, a JobEntry or None)."""
    document = requests.document_of(request)
    if isinstance(document, Answer):
        return document
    if existing is not None:
        return requests.answer_existing(request, existing)
    meta = {**document["metadata"], "uid": job_uid(request.request_id), "namespace": ""}
    document = {**document, "metadata": meta}
    try:
        view = parse_job(document)
    except InvalidJob as e:
        return Answer(JobRequestStatus.REFUSED, f"invalid job: {e}")
    try:
        trial = _trial_of(view)
    except TrialSpecError as e:
        return Answer(JobRequestStatus.REFUSED, f"the {PLATFORM} platform: {e}")
    return Creation(request, document, view, trial)


def _trial_of(view: JobView) -> TrialSpec | None:
    """The trial the job's roles' variables describe (the first role that names one)."""
    for role in view.roles.values():
        spec = trial_spec(role.env)
        if spec is not None:
            return spec
    return None


def submission(
    env: str, creation: Creation, fleet: VirtualCluster, application: str, source: str
) -> JobSubmitted:
    """The job.submitted of a created job, at the fleet's time: as the reconciler says it
    (events.submitted), from this operator, with ``application`` when its document names
    no traced one (label dlrover-events.io/app)."""
    at = fleet.at() if fleet.started else None
    said = events.submitted(env, creation.view, at)
    return said.model_copy(
        update={"source": source, "application": said.application or application}
    )


def existing_job(
    env: str, fleet: VirtualCluster | None, name: str, pending: Sequence[Event] = ()
) -> JobView | UnreadableJob | None:
    """The job of that name as the rules read it: a requested job from its document
    (created, or answered created and waiting in ``pending``); a job of the env's
    workload (replayed, no document) as one whose owner cannot be read."""
    for event in pending:
        if isinstance(event, JobRequest) and event.name == name:
            made = decide_request(env, event, None)
            if isinstance(made, Creation):
                return made.view
    if fleet is None:
        return None
    document = fleet.requested(name)
    if document is not None:
        return _view(document)
    job = fleet.job_named(name)
    if job is None:
        return None
    return UnreadableJob(name, job.job.uuid, "", "a job of the env's workload, made by no request")


def _view(document: Mapping[str, Any]) -> JobView | UnreadableJob:
    meta = document.get("metadata") or {}
    try:
        return parse_job(document)
    except (InvalidJob, AttributeError, TypeError, ValueError) as e:
        return UnreadableJob(str(meta.get("name", "")), str(meta.get("uid", "")), "", str(e))


def decide_deletion(deletion: JobDeletion, existing: JobView | UnreadableJob | None) -> Answer:
    """The answer to a deletion by the reconciler's rules (owner-checked); when it is
    ``deleted`` the caller deletes the job."""
    refusal = requests.deletion_refusal(deletion, existing)
    if refusal is not None:
        return refusal
    assert isinstance(existing, JobView)  # (deletion_refusal answers every other case)
    return requests.deleted(existing, PLATFORM)


#: The label a trial's job carries naming its experiment (streams/searcher/trials.py).
EXPERIMENT_LABEL = f"{DOMAIN}/experiment"


def searcher_decides_on(event: Event) -> bool:
    """Whether the searcher decides on an event the operator publishes (and so records
    its offset once decided: its runtime stores the offsets of a batch only when the batch
    concerns an experiment): a trial's report, the answer to a request for an
    experiment's trial, the end of a trial's job. The same rule as the searcher's
    (streams/searcher/runtime/step.py, experiment_of)."""
    if isinstance(event, TrialMetrics):
        return True
    if isinstance(event, JobRequestResult):
        found = trial_of_job(event.name)
        return found is not None and event.owner is not None and found[0] == event.owner
    if isinstance(event, JobCompleted | JobFailed):
        found = trial_of_job(event.job.name)
        return found is not None and event.job.labels.get(EXPERIMENT_LABEL) == found[0]
    return False


def is_searchers(event: Event) -> bool:
    """Whether an input is the searcher's, taken at the clock's next stop in one order
    (canonical): a creation, a deletion, a decision, or a plan that holds or releases a
    job (what a searcher pauses and resumes trials with; a brain's plans never do)."""
    if isinstance(event, JobRequest | JobDeletion | TrialDecision):
        return True
    return isinstance(event, ScalePlan) and event.hold is not None


def canonical(pending: Iterable[Event]) -> list[Event]:
    """The searcher's inputs in the order the operator takes them, whatever order they
    were read in: creations (by job name), decisions (by experiment and seq), plans (by
    job and plan id), deletions (by job name). New trials join the queue first; a stop
    ends a trial before its hold would suspend it; a deletion comes last."""

    def key(event: Event) -> tuple[int, str, str, int]:
        if isinstance(event, JobRequest):
            return (0, event.name, event.request_id, 0)
        if isinstance(event, TrialDecision):
            return (1, event.experiment, "", event.seq)
        if isinstance(event, ScalePlan):
            return (2, event.job.name or event.job.uuid, event.plan_id, 0)
        if isinstance(event, JobDeletion):
            return (3, event.name, event.request_id, 0)
        raise TypeError(f"not a searcher's input: {event.type}")

    return sorted(pending, key=key)


# -- learning curves -------------------------------------------------------------------------


async def load_curve(settings: CurveSettings, dsn: str) -> LearningCurve:
    """The learning curves a virtual env's trials follow; UserError says why it has none
    (a table that does not parse, an experiment with no recorded validation metric)."""
    if settings.kind == "parametric":
        return ParametricCurve(seed=settings.seed, scale=settings.scale, noise=settings.noise)
    try:
        if settings.kind == "table":
            assert settings.path is not None
            return TableCurve(read_table(Path(settings.path)))
        assert settings.env is not None
        assert settings.experiment is not None
        points = await recorded_points(dsn, settings.env, settings.experiment)
        if not points:
            raise UserError(
                f"env {settings.env} recorded no validation metric of experiment "
                f"{settings.experiment}: no curves to follow"
            )
        return TableCurve(points)
    except CurveError as e:
        raise UserError(f"operator.trials.curves: {e}") from None


def read_table(path: Path) -> list[CurvePoint]:
    """A curve table from a file: CSV or JSON by its suffix."""
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in ("csv", "json"):
        raise UserError(f"curve table {path}: a .csv or .json file")
    try:
        text = path.read_text()
    except OSError as e:
        raise UserError(f"curve table {path}: {e.strerror}") from None
    try:
        return parse_table(text, fmt=fmt)
    except CurveError as e:
        raise UserError(f"curve table {path}: {e}") from None


#: An experiment's recorded curves: each trial's hyperparameters (from its create
#: decision) and what it measured, validation and training.
_RECORDED = """
SELECT d.hparams, m.budget, m.validation, m.metrics
FROM trial_metrics m
JOIN trial_decisions d
  ON d.experiment = m.experiment AND d.trial = m.trial AND d.decision = 'create'
WHERE m.experiment = $1
ORDER BY m.trial, m.budget, m.step
"""


async def recorded_points(dsn: str, env: str, experiment: str) -> list[CurvePoint]:
    """What experiment ``experiment`` of env ``env`` measured, as curve points (from the
    tables the experiments recorder writes: dlrover_events/store/sql/env/0009)."""
    store = await EnvStore.open(dsn, env, max_size=1)
    try:
        rows = await store.pool.fetch(_RECORDED, experiment)
    finally:
        await store.close()
    return [
        CurvePoint(
            dict(_json(row["hparams"])),
            float(row["budget"]),
            {k: float(v) for k, v in _json(row["metrics"]).items()},
            bool(row["validation"]),
        )
        for row in rows
    ]


def _json(value: Any) -> Mapping[str, Any]:
    """A jsonb column as asyncpg gives it (text, unless a codec was set)."""
    return json.loads(value) if isinstance(value, str | bytes) else dict(value)


__all__ = [
    "EXPERIMENT_LABEL",
    "PLATFORM",
    "Creation",
    "canonical",
    "decide_deletion",
    "decide_request",
    "existing_job",
    "is_searchers",
    "job_uid",
    "load_curve",
    "read_table",
    "recorded_points",
    "searcher_decides_on",
    "submission",
]
