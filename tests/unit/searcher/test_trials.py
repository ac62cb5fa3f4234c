"""A trial's TrainingJob from its experiment's template, and what each decision asks of
the env's operator (streams/searcher/trials.py): named, labelled and given its variables
on every container, the template untouched; effects derived from the decision alone, so
the same decision gives the same events."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from dlrover_events.sdk.trial_env import (
    EXPERIMENT_ENV,
    TRIAL_BUDGET_ENV,
    TRIAL_BUDGET_UNIT_ENV,
    TRIAL_ENV,
    TRIAL_HPARAMS_ENV,
    TRIAL_VARIABLES,
)
from schemas.codec import encode
from schemas.experiments import (
    DecisionKind,
    ExperimentAction,
    ExperimentActionKind,
    ExperimentSpec,
    TrialDecision,
    trial_of_job,
)
from schemas.jobs import JobMeta
from schemas.plans import ScalePlan
from schemas.requests import JobDeletion, JobRequest
from streams.searcher import trials
from streams.searcher.trials import EXPERIMENT_LABEL, GROUP_LABEL, TRIAL_LABEL

ENV = "prod"
AT = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def template() -> dict[str, Any]:
    return {
        "apiVersion": "dlrover-events.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "ignored", "labels": {"dlrover-events.io/priority": "3"}},
        "spec": {
            "roles": {
                "chief": {"replicas": 1, "template": {"spec": {"containers": [{"name": "c"}]}}},
                "worker": {
                    "replicas": 2,
                    "minReplicas": 1,
                    "maxReplicas": 4,
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "main",
                                    "env": [
                                        {"name": "OMP_NUM_THREADS", "value": "1"},
                                        {"name": TRIAL_BUDGET_ENV, "value": "stale"},
                                        {"name": "POD", "valueFrom": {"fieldRef": {}}},
                                    ],
                                },
                                {"name": "sidecar"},
                            ]
                        }
                    },
                },
                "ps": {"replicas": 0},
            }
        },
    }


def spec(owner: str | None = "research", trial: dict[str, Any] | None = None) -> ExperimentSpec:
    return ExperimentSpec.model_validate(
        {
            "owner": owner,
            "hyperparameters": {"lr": {"type": "log", "minval": -4, "maxval": -1}},
            "searcher": {
                "name": "random",
                "metric": "val_loss",
                "budget": {"unit": "samples", "max": 800},
            },
            "trial": template() if trial is None else trial,
        }
    )


def decision(kind: DecisionKind, seq: int = 0, **fields: Any) -> TrialDecision:
    defaults: dict[str, Any] = {"trial": 3}
    if kind in (DecisionKind.CREATE, DecisionKind.RUN, DecisionKind.RESUME):
        defaults["budget"] = 100.0
    if kind is DecisionKind.DONE:
        defaults["trial"] = None
    return TrialDecision(
        env=ENV,
        source="searcher",
        event_id=uuid.uuid5(uuid.NAMESPACE_URL, f"mlp-sweep/{seq}"),
        occurred_at=AT,
        experiment="mlp-sweep",
        seq=seq,
        decision=kind,
        **(defaults | fields),
    )


def variables(container: dict[str, Any]) -> dict[str, Any]:
    return {v["name"]: v.get("value", v.get("valueFrom")) for v in container["env"]}


# -- the document --------------------------------------------------------------------------


def test_a_trial_s_job_is_named_labelled_and_given_its_variables_everywhere() -> None:
    exp = spec()
    before = json.dumps(exp.trial, sort_keys=True)
    body = trials.trial_document(exp, "mlp-sweep", 3, {"lr": 0.001, "act": "relu"}, 100.0)
    assert json.dumps(exp.trial, sort_keys=True) == before, "the template is not changed"

    assert body["metadata"]["name"] == "mlp-sweep-t3"
    assert trial_of_job(body["metadata"]["name"]) == ("mlp-sweep", 3)
    assert body["metadata"]["labels"] == {
        "dlrover-events.io/priority": "3",
        EXPERIMENT_LABEL: "mlp-sweep",
        TRIAL_LABEL: "3",
        GROUP_LABEL: "research",
    }
    wanted = {
        EXPERIMENT_ENV: "mlp-sweep",
        TRIAL_ENV: "3",
        TRIAL_HPARAMS_ENV: '{"act":"relu","lr":0.001}',
        TRIAL_BUDGET_ENV: "100",
        TRIAL_BUDGET_UNIT_ENV: "samples",
    }
    roles = body["spec"]["roles"]
    main, sidecar = roles["worker"]["template"]["spec"]["containers"]
    # kept, in order; the template's own budget replaced; ours last
    assert variables(main) == {"OMP_NUM_THREADS": "1", "POD": {"fieldRef": {}}} | wanted
    assert [v["name"] for v in main["env"]][:2] == ["OMP_NUM_THREADS", "POD"]
    assert variables(sidecar) == wanted
    assert variables(roles["chief"]["template"]["spec"]["containers"][0]) == wanted
    # a role with no container gets one, so its processes know they are a trial
    [made] = roles["ps"]["template"]["spec"]["containers"]
    assert made["name"] == trials.TRIAL_CONTAINER and variables(made) == wanted
    assert set(wanted) == set(TRIAL_VARIABLES)


def test_without_an_owner_the_template_s_group_stays() -> None:
    body = template()
    body["metadata"]["labels"][GROUP_LABEL] = "team-a"
    doc = trials.trial_document(spec(owner=None, trial=body), "e", 0, {}, 1.0)
    assert doc["metadata"]["labels"][GROUP_LABEL] == "team-a"
    doc = trials.trial_document(spec(owner="team-b", trial=body), "e", 0, {}, 1.0)
    assert doc["metadata"]["labels"][GROUP_LABEL] == "team-b"


def test_odd_templates_are_passed_on_for_the_operator_to_judge() -> None:
    """A template the operator will refuse is not this module's to refuse: nothing here
    raises on it, and what it does not understand is left as it is."""
    odd = {"spec": {"roles": {"worker": "x", "ps": {"template": {"spec": {"containers": "y"}}}}}}
    doc = trials.trial_document(spec(trial=odd), "e", 1, {}, 2.5)
    assert doc["metadata"] == {
        "name": "e-t1",
        "labels": {EXPERIMENT_LABEL: "e", TRIAL_LABEL: "1", GROUP_LABEL: "research"},
    }
    assert doc["spec"]["roles"]["worker"] == "x"
    [made] = doc["spec"]["roles"]["ps"]["template"]["spec"]["containers"]
    assert variables(made)[TRIAL_BUDGET_ENV] == "2.5"


@pytest.mark.parametrize(
    ("budget", "text"),
    [(800.0, "800"), (0.1, "0.1"), (1e15, "1000000000000000"), (2.5e-7, "2.5e-07")],
)
def test_a_budget_reads_back_exactly(budget: float, text: str) -> None:
    assert trials.budget_text(budget) == text
    assert float(text) == budget


# -- the effects -----------------------------------------------------------------------------


JOB = JobMeta(uuid="u-3", name="mlp-sweep-t3")


def test_create_asks_for_the_trial_s_job_owned_by_its_experiment() -> None:
    exp = spec()
    made = decision(DecisionKind.CREATE, hparams={"lr": 0.01}, reason="sampled")
    [request] = trials.effects(made, exp, None, source="searcher") or []
    assert isinstance(request, JobRequest)
    assert (request.request_id, request.name, request.key) == ("mlp-sweep-t3",) * 3
    assert request.owner == "mlp-sweep" and request.source == "searcher"
    assert request.reason == "trial 3 of experiment mlp-sweep: sampled"
    assert request.document == trials.trial_document(exp, "mlp-sweep", 3, {"lr": 0.01}, 100.0)
    assert request.occurred_at == AT
    # the same decision, the same event, byte for byte; another decision, another id
    [again] = trials.effects(made, exp, None, source="searcher") or []
    assert encode(again) == encode(request)
    [other] = trials.effects(decision(DecisionKind.CREATE, 1), exp, None, source="s") or []
    assert other.event_id != request.event_id


@pytest.mark.parametrize("kind", [DecisionKind.PAUSE, DecisionKind.STOP])
def test_pause_and_stop_hold_the_trial_s_job_once(kind: DecisionKind) -> None:
    made = decision(kind, 5)
    assert trials.effects(made, spec(), None, source="searcher") is None, "waits for the uid"
    [plan] = trials.effects(made, spec(), JOB, source="searcher") or []
    assert isinstance(plan, ScalePlan)
    assert plan.suspend and plan.hold and plan.job == JOB and plan.key == "u-3"
    assert plan.plan_id == f"searcher-{kind.value}-{made.event_id}"
    [again] = trials.effects(made, spec(), JOB, source="searcher") or []
    assert encode(again) == encode(plan)
    [later] = trials.effects(decision(kind, 6), spec(), JOB, source="searcher") or []
    assert isinstance(later, ScalePlan) and later.plan_id != plan.plan_id


def test_resume_releases_the_job_to_the_queue() -> None:
    """No count: the env's cluster scheduler admits it (sized by goodput), or the
    operator at once without one; the searcher never admits a trial itself."""
    made = decision(DecisionKind.RESUME, 7)
    assert trials.effects(made, spec(), None, source="searcher") is None
    [plan] = trials.effects(made, spec(), JOB, source="searcher") or []
    assert isinstance(plan, ScalePlan)
    assert plan.hold is False and not plan.suspend and not plan.node_group_resources
    assert plan.plan_id == f"searcher-resume-{made.event_id}"


@pytest.mark.parametrize("kind", [DecisionKind.RUN, DecisionKind.COMPLETE, DecisionKind.DONE])
def test_run_complete_and_done_ask_nothing_of_the_operator(kind: DecisionKind) -> None:
    assert trials.effects(decision(kind), spec(), JOB, source="searcher") == []
    assert trials.effects(decision(kind), spec(), None, source="searcher") == []


def test_kill_deletes_each_trial_s_job_as_its_owner() -> None:
    kill = ExperimentAction(
        env=ENV, experiment="mlp-sweep", action=ExperimentActionKind.KILL, occurred_at=AT
    )
    gone = trials.deletions(ENV, "mlp-sweep", [2, 0, 2], kill, source="searcher")
    assert [d.name for d in gone] == ["mlp-sweep-t0", "mlp-sweep-t2"]
    assert all(isinstance(d, JobDeletion) and d.owner == "mlp-sweep" for d in gone)
    assert [d.request_id for d in gone] == ["mlp-sweep-t0-del", "mlp-sweep-t2-del"]
    assert gone[0].reason == "experiment mlp-sweep killed"
    again = trials.deletions(ENV, "mlp-sweep", [0, 2], kill, source="searcher")
    assert [encode(d) for d in again] == [encode(d) for d in gone]


def test_the_longest_names_are_still_labels() -> None:
    """A 50-character experiment's last trial: its job name and both request ids are
    label values (the operator keeps them as labels)."""
    longest = "e" * 50
    JobDeletion(
        env=ENV,
        source="s",
        request_id=trials.deletion_request_id(longest, 999_999),
        name=f"{longest}-t999999",
        owner=longest,
    )


def test_a_template_that_names_no_kind_is_a_training_job_and_one_that_does_keeps_it() -> None:
    """The documented template (spec alone) must pass the operator's check, which asks for
    one TrainingJob: it gets the TrainingJob's apiVersion and kind; a template naming its
    own is passed on as it is, for the operator to judge."""
    bare = {"spec": {"roles": {"worker": {"replicas": 1}}}}
    doc = trials.trial_document(spec(trial=bare), "e", 0, {}, 1.0)
    assert (doc["apiVersion"], doc["kind"]) == ("dlrover-events.io/v1alpha1", "TrainingJob")
    named = {**bare, "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob"}
    doc = trials.trial_document(spec(trial=named), "e", 0, {}, 1.0)
    assert (doc["apiVersion"], doc["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
