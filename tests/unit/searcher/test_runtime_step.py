"""One input's work on one experiment (streams/searcher/runtime/step.py), pure, with the
real core and the random searcher: each decision followed by its effects; a plan that
needs its trial's job waits for the operator to name it; the operator's answers and the
jobs' ends become the trials' ends, each told once; a kill deletes every trial's job; what
is checkpointed reads back to an experiment that decides the same."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from schemas.envelope import Event
from schemas.experiments import (
    DecisionKind,
    ExperimentAction,
    ExperimentActionKind,
    ExperimentSpec,
    ExperimentSubmitted,
    TrialDecision,
    TrialMetrics,
)
from schemas.jobs import JobCompleted, JobFailed, JobMeta, JobStarted
from schemas.plans import ScalePlan
from schemas.requests import JobDeletion, JobRequest, JobRequestResult, JobRequestStatus
from streams.searcher import trials
from streams.searcher.core.state import DECISIONS
from streams.searcher.runtime.step import SOURCE, Experiment, experiment_of, start, step

ENV = "prod"
EXP = "sweep"
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def spec(**searcher: Any) -> ExperimentSpec:
    return ExperimentSpec.model_validate(
        {
            "hyperparameters": {"lr": {"type": "log", "minval": -4, "maxval": -1}},
            "searcher": {
                "name": "random",
                "metric": "val_loss",
                "max_trials": 3,
                "max_concurrent_trials": 2,
                "budget": {"unit": "steps", "max": 100},
                "seed": 7,
            }
            | searcher,
            "trial": {
                "spec": {
                    "roles": {
                        "worker": {
                            "replicas": 1,
                            "template": {"spec": {"containers": [{"name": "main"}]}},
                        }
                    }
                }
            },
        }
    )


class Clock:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> datetime:
        self.n += 1
        return T0 + timedelta(seconds=self.n)


at = Clock()


def submitted(**searcher: Any) -> ExperimentSubmitted:
    return ExperimentSubmitted(env=ENV, experiment=EXP, spec=spec(**searcher), occurred_at=at())


def report(trial: int, value: float, budget: float = 100) -> TrialMetrics:
    return TrialMetrics(
        env=ENV,
        experiment=EXP,
        trial=trial,
        step=int(budget),
        budget=budget,
        validation=True,
        metrics={"val_loss": value},
        occurred_at=at(),
    )


def action(kind: ExperimentActionKind) -> ExperimentAction:
    return ExperimentAction(env=ENV, experiment=EXP, action=kind, occurred_at=at())


def job(trial: int) -> JobMeta:
    name = f"{EXP}-t{trial}"
    labels = {trials.EXPERIMENT_LABEL: EXP, trials.TRIAL_LABEL: str(trial)}
    return JobMeta(uuid=f"uid-{trial}", name=name, labels=labels)


def answer(
    trial: int,
    status: JobRequestStatus = JobRequestStatus.CREATED,
    *,
    request_id: str | None = None,
    requester: str = SOURCE,
    reason: str = "",
) -> JobRequestResult:
    name = f"{EXP}-t{trial}"
    named = status in (JobRequestStatus.CREATED, JobRequestStatus.EXISTS)
    return JobRequestResult(
        env=ENV,
        source="kube-operator",
        request_id=request_id or name,
        name=name,
        status=status,
        reason=reason,
        job=job(trial) if named else None,
        owner=EXP,
        requester=requester,
        occurred_at=at(),
    )


def said(out: list[Event]) -> list[tuple[str, Any]]:
    """What an output list says, in order: decisions by kind and trial, effects by what
    they ask."""
    seen: list[tuple[str, Any]] = []
    for e in out:
        if isinstance(e, TrialDecision):
            seen.append((e.decision.value, e.trial))
        elif isinstance(e, JobRequest):
            seen.append(("request", e.name))
        elif isinstance(e, JobDeletion):
            seen.append(("delete", e.name))
        elif isinstance(e, ScalePlan):
            seen.append(("hold" if e.hold else "release", e.job.name))
        else:
            raise AssertionError(f"unexpected {e!r}")
    return seen


def test_an_experiment_begins_with_its_first_trials_requested() -> None:
    exp, out = start(submitted())
    assert said(out) == [
        ("create", 0),
        ("request", "sweep-t0"),
        ("create", 1),
        ("request", "sweep-t1"),
    ]
    created, request = out[0], out[1]
    assert isinstance(created, TrialDecision) and isinstance(request, JobRequest)
    assert request.document == trials.trial_document(
        exp.spec, EXP, 0, created.hparams, created.budget or 0
    )
    assert request.event_id == trials.effect_id(created.event_id, "job.request")
    assert sorted(exp.wing.trials) == [0, 1]
    # submitted again: ignored, the experiment's spec never changes
    again, out = step(exp, submitted(max_trials=9))
    assert again is exp and out == []


def test_plans_wait_for_their_trial_s_job_and_go_out_in_order() -> None:
    exp, _ = start(submitted())
    exp, out = step(exp, answer(0))
    assert out == [] and exp.wing.trial(0).job == job(0)

    # paused by its user: trial 0's job is known, trial 1's not yet
    exp, out = step(exp, action(ExperimentActionKind.PAUSE))
    assert said(out) == [("pause", 0), ("hold", "sweep-t0"), ("pause", 1)]
    [waiting] = exp.wing.trial(1).waiting
    assert waiting.decision is DecisionKind.PAUSE

    exp, out = step(exp, action(ExperimentActionKind.ACTIVATE))
    assert said(out) == [("resume", 0), ("release", "sweep-t0"), ("resume", 1)]
    assert [d.decision for d in exp.wing.trial(1).waiting] == [
        DecisionKind.PAUSE,
        DecisionKind.RESUME,
    ]

    # its job named at last: the hold, then the release, each the plan of its decision
    pause, resume = exp.wing.trial(1).waiting
    exp, out = step(exp, answer(1))
    assert said(out) == [("hold", "sweep-t1"), ("release", "sweep-t1")]
    assert [p.plan_id for p in out if isinstance(p, ScalePlan)] == [
        trials.plan_id(pause),
        trials.plan_id(resume),
    ]
    assert exp.wing.trial(1).waiting == () and exp.wing.trial(1).job == job(1)
    # the answer delivered again: nothing more
    again, out = step(exp, answer(1))
    assert again is exp and out == []


def test_trials_end_from_the_operator_and_their_jobs_once() -> None:
    exp, _ = start(submitted())
    # trial 0: its creation refused
    exp, out = step(exp, answer(0, JobRequestStatus.REFUSED, reason="invalid job: x"))
    assert said(out) == [("create", 2), ("request", "sweep-t2")]
    assert exp.state.trials[0].status.value == "failed"
    assert (
        exp.state.trials[0].ended
    ) == "its job failed: its job was not created (refused): invalid job: x"
    # trial 1: its job completed (learnt from the job's own event, before its answer)
    done = JobCompleted(env=ENV, source="kube-operator", job=job(1), occurred_at=at())
    exp, out = step(exp, done)
    assert exp.state.trials[1].status.value == "completed"
    assert exp.wing.trial(1).job == job(1) and exp.wing.trial(1).ended
    again, out = step(exp, done)
    assert again is exp and out == []
    # trial 2: its job failed; the experiment is then done
    exp, _ = step(exp, answer(2))
    failed = JobFailed(env=ENV, source="o", job=job(2), reason="OOMKilled", occurred_at=at())
    exp, out = step(exp, failed)
    assert said(out) == [("done", None)]
    assert exp.state.trials[2].ended == "its job failed: OOMKilled"
    # another job of that name (not the one the operator named): not the trial's
    stranger = job(2).model_copy(update={"uuid": "uid-other"})
    again, out = step(exp, JobFailed(env=ENV, source="o", job=stranger, occurred_at=at()))
    assert again is exp and out == []


def test_a_kill_stops_every_trial_and_deletes_every_job_once() -> None:
    exp, _ = start(submitted())
    exp, _ = step(exp, answer(0))
    exp, _ = step(exp, report(0, 0.3))  # trial 0 complete, trial 2 created
    kill = action(ExperimentActionKind.KILL)
    exp, out = step(exp, kill)
    assert said(out) == [
        ("stop", 1),
        ("stop", 2),
        ("done", None),
        ("delete", "sweep-t0"),
        ("delete", "sweep-t1"),
        ("delete", "sweep-t2"),
    ]
    assert all(e.owner == EXP for e in out if isinstance(e, JobDeletion))
    # the stops wait for no job any more: their jobs are deleted
    assert all(t.waiting == () for t in exp.wing.trials.values()) and exp.wing.killed
    again, out = step(exp, kill)
    assert again.wing == exp.wing
    assert out == []
    # the deletions answered: the trials ended, once; the experiment is over already
    gone = answer(1, JobRequestStatus.DELETED, request_id=trials.deletion_request_id(EXP, 1))
    exp, out = step(exp, gone)
    assert out == [] and exp.wing.trial(1).ended


def test_what_concerns_an_experiment() -> None:
    assert experiment_of(report(0, 1.0)) == EXP
    assert experiment_of(answer(0)) == EXP
    assert experiment_of(answer(0, requester="someone-else")) is None
    mismatched = answer(0).model_copy(update={"owner": "other"})
    assert experiment_of(mismatched) is None
    assert experiment_of(JobCompleted(env=ENV, job=job(3))) == EXP
    unlabelled = JobMeta(uuid="u", name=f"{EXP}-t3")
    assert experiment_of(JobCompleted(env=ENV, job=unlabelled)) is None
    assert experiment_of(JobCompleted(env=ENV, job=JobMeta(uuid="u", name="train-a"))) is None
    assert experiment_of(JobStarted(env=ENV, job=job(3))) is None


def test_a_checkpointed_experiment_decides_as_one_that_never_stopped() -> None:
    exp, _ = start(submitted())
    exp, _ = step(exp, answer(0))
    exp, _ = step(exp, action(ExperimentActionKind.PAUSE))
    restored = Experiment.from_json(EXP, exp.state_json(), exp.wing_json())
    assert restored == exp
    inputs: list[Event] = [
        answer(1),
        action(ExperimentActionKind.ACTIVATE),
        report(1, 0.2),
        report(0, 0.4),
    ]
    a, b = exp, restored
    for event in inputs:
        a, out_a = step(a, event)
        b, out_b = step(b, event)
        assert out_a == out_b
    assert a.state_json() == b.state_json() and a.wing_json() == b.wing_json()
    assert [d.seq for d in out_a if isinstance(d, TrialDecision)] == [
        d.seq for d in out_b if isinstance(d, TrialDecision)
    ]


def test_decision_ids_are_the_core_s() -> None:
    _, out = start(submitted())
    first = out[0]
    assert isinstance(first, TrialDecision)
    assert first.event_id == uuid.uuid5(DECISIONS, f"{ENV}/{EXP}/0")
