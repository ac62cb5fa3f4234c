"""The virtual operator's side of experiments (handlers/operator/virtual/trials.py), pure:
a request creates a labelled job (a trial when its containers say so) or is refused by the
reconciler's rules; a deletion is owner-checked; the searcher's inputs are taken in one
order whatever order they were read in; and what the operator publishes that the searcher
decides on is recognised as the searcher's own rule recognises it."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from dlrover_events.errors import UserError
from handlers.operator.platform.bodies import JobView
from handlers.operator.virtual import trials
from handlers.simulator.cluster import Cluster
from handlers.simulator.fleet import VirtualCluster
from handlers.simulator.job_events import DEFAULT_ORIGIN
from schemas.env_settings import CurveSettings
from schemas.envelope import Event
from schemas.experiments import BudgetUnit, DecisionKind, TrialDecision, TrialMetrics
from schemas.jobs import JobCompleted, JobMeta, JobStarted
from schemas.plans import ScalePlan
from schemas.requests import JobDeletion, JobRequest, JobRequestResult, JobRequestStatus

ENV = "virt"


def trial_document(name: str = "sweep-t0", **env: str) -> dict[str, Any]:
    variables = {
        "DLROVER_EVENTS_EXPERIMENT": "sweep",
        "DLROVER_EVENTS_TRIAL": "0",
        "DLROVER_EVENTS_TRIAL_HPARAMS": '{"lr": 0.01}',
        "DLROVER_EVENTS_TRIAL_BUDGET": "40",
        "DLROVER_EVENTS_TRIAL_BUDGET_UNIT": "steps",
        **env,
    }
    return {
        "apiVersion": "dlrover-events.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "labels": {"dlrover-events.io/experiment": "sweep"}},
        "spec": {
            "roles": {
                "worker": {
                    "replicas": 1,
                    "resources": {"nvidia.com/gpu": 1},
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "main",
                                    "env": [{"name": k, "value": v} for k, v in variables.items()],
                                }
                            ]
                        }
                    },
                }
            }
        },
    }


def request(name: str = "sweep-t0", request_id: str | None = None, **fields: Any) -> JobRequest:
    return JobRequest(
        env=ENV,
        source="searcher",
        request_id=request_id or name,
        name=name,
        owner="sweep",
        document=fields.pop("document", trial_document(name)),
        **fields,
    )


def fleet() -> VirtualCluster:
    return VirtualCluster(Cluster(1, 4), origin=DEFAULT_ORIGIN)


def test_a_request_creates_a_labelled_trial_with_a_uid_of_its_own() -> None:
    made = trials.decide_request(ENV, request(), None)
    assert isinstance(made, trials.Creation)
    assert made.view.uid == trials.job_uid("sweep-t0")
    assert made.view.labels["dlrover-events.io/request"] == "sweep-t0"
    assert made.view.labels["dlrover-events.io/owner"] == "sweep"
    assert made.trial is not None and made.trial.budget == 40.0
    assert made.trial.unit is BudgetUnit.STEPS and made.trial.hparams == {"lr": 0.01}
    assert made.answer.status is JobRequestStatus.CREATED and made.answer.job is not None
    assert made.answer.job.uuid == made.view.uid
    # the same request again names the same job
    again = trials.decide_request(ENV, request(), None)
    assert isinstance(again, trials.Creation) and again.view.uid == made.view.uid
    f = fleet()
    submitted = trials.submission(ENV, made, f, "cifar10", "virtual-operator")
    assert submitted.job.uuid == made.view.uid and submitted.application == "cifar10"
    assert submitted.occurred_at == DEFAULT_ORIGIN and submitted.source == "virtual-operator"


def test_requests_refused_or_answered_exists_by_the_reconcilers_rules() -> None:
    not_a_job = trials.decide_request(ENV, request(document={"kind": "Pod"}), None)
    assert isinstance(not_a_job, trials.Answer) and not_a_job.status is JobRequestStatus.REFUSED
    bad_trial = trials.decide_request(
        ENV,
        request(document=trial_document(DLROVER_EVENTS_TRIAL_BUDGET="zero")),
        None,
    )
    assert isinstance(bad_trial, trials.Answer) and bad_trial.status is JobRequestStatus.REFUSED
    assert "DLROVER_EVENTS_TRIAL" in bad_trial.reason or "zero" in bad_trial.reason
    # a job of that name made by this request: created again; by another: exists
    pending: list[Event] = [request()]
    mine = trials.existing_job(ENV, None, "sweep-t0", pending)
    assert isinstance(mine, JobView)
    again = trials.decide_request(ENV, request(), mine)
    assert isinstance(again, trials.Answer) and again.status is JobRequestStatus.CREATED
    assert again.job is not None and again.job.uuid == trials.job_uid("sweep-t0")
    theirs = trials.decide_request(ENV, request(request_id="other"), mine)
    assert isinstance(theirs, trials.Answer) and theirs.status is JobRequestStatus.EXISTS


def test_a_deletion_is_checked_against_the_owner() -> None:
    f = fleet()
    made = trials.decide_request(ENV, request(), None)
    assert isinstance(made, trials.Creation)
    f.request(trials.submission(ENV, made, f, "cifar10", "op"), made.document, made.trial)
    existing = trials.existing_job(ENV, f, "sweep-t0")
    mine = JobDeletion(env=ENV, source="s", request_id="d1", name="sweep-t0", owner="sweep")
    theirs = mine.model_copy(update={"owner": "other"})
    assert trials.decide_deletion(mine, existing).status is JobRequestStatus.DELETED
    assert trials.decide_deletion(theirs, existing).status is JobRequestStatus.REFUSED
    assert trials.decide_deletion(mine, None).status is JobRequestStatus.ABSENT


def _inputs() -> list[Event]:
    job = JobMeta(uuid="u1", name="sweep-t1")
    return [
        TrialDecision(env=ENV, experiment="sweep", seq=3, decision=DecisionKind.PAUSE, trial=1),
        request("sweep-t2"),
        ScalePlan(env=ENV, job=job, plan_id="p-hold", suspend=True, hold=True),
        JobDeletion(env=ENV, source="s", request_id="d", name="sweep-t0", owner="sweep"),
        TrialDecision(
            env=ENV, experiment="sweep", seq=2, decision=DecisionKind.RUN, trial=0, budget=160
        ),
        request("sweep-t1"),
    ]


def test_the_searchers_inputs_are_taken_in_one_order_whatever_the_reading_order() -> None:
    inputs = _inputs()
    orders = {
        tuple(e.event_id for e in trials.canonical(p))
        for p in itertools.islice(itertools.permutations(inputs), 200)
    }
    assert len(orders) == 1
    taken = trials.canonical(inputs)
    assert [type(e).__name__ for e in taken] == [
        "JobRequest",
        "JobRequest",
        "TrialDecision",
        "TrialDecision",
        "ScalePlan",
        "JobDeletion",
    ]
    assert [e.seq for e in taken if isinstance(e, TrialDecision)] == [2, 3]
    # a brain's plan is no searcher's; a hold or release is
    brain = ScalePlan(env=ENV, job=JobMeta(uuid="u"), plan_id="b", source="brain")
    assert not trials.is_searchers(brain)
    assert all(trials.is_searchers(e) for e in inputs)


def test_what_the_searcher_decides_on() -> None:
    trial = JobMeta(uuid="u", name="sweep-t0", labels={"dlrover-events.io/experiment": "sweep"})
    other = JobMeta(uuid="v", name="train-1")
    assert trials.searcher_decides_on(
        TrialMetrics(
            env=ENV, experiment="sweep", trial=0, step=1, budget=1.0, metrics={"val_loss": 1.0}
        )
    )
    assert trials.searcher_decides_on(JobCompleted(env=ENV, job=trial))
    assert not trials.searcher_decides_on(JobCompleted(env=ENV, job=other))
    assert not trials.searcher_decides_on(JobStarted(env=ENV, job=trial))
    answer = JobRequestResult(
        env=ENV,
        request_id="sweep-t0",
        name="sweep-t0",
        status=JobRequestStatus.REFUSED,
        owner="sweep",
    )
    assert trials.searcher_decides_on(answer)
    assert not trials.searcher_decides_on(answer.model_copy(update={"owner": None}))


async def test_curves_from_settings_and_a_file(tmp_path: Path) -> None:
    parametric = await trials.load_curve(CurveSettings(seed=4), "unused")
    assert parametric.metrics({"lr": 0.01}, 10.0, validation=True)
    table = tmp_path / "curves.csv"
    table.write_text("hparams.lr,budget,val_loss\n0.01,10,1.5\n0.01,20,1.0\n")
    curve = await trials.load_curve(CurveSettings(kind="table", path=str(table)), "unused")
    assert curve.metrics({"lr": 0.02}, 15.0, validation=True) == {"val_loss": 1.25}
    table.write_text("hparams.lr,val_loss\n0.01,1.5\n")
    with pytest.raises(UserError, match="budget"):
        await trials.load_curve(CurveSettings(kind="table", path=str(table)), "unused")
    with pytest.raises(UserError, match=r"\.csv or \.json"):
        trials.read_table(tmp_path / "curves.yaml")
    with pytest.raises(UserError, match=r"curves\.json"):
        trials.read_table(tmp_path / "curves.json")
