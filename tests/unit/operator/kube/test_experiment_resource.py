"""The Experiment resource, pure (handlers/operator/kube/experiment.py): what the operator
does with one it sees, the ids of what it publishes, and its patches."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import pytest

from handlers.operator.kube import experiment
from handlers.operator.kube.experiment import FINALIZER, Phase, Step
from schemas.experiments import ExperimentActionKind, ExperimentDocument
from tests.unit.experiments.documents import document

UID = "0d9c1a44-7f8e-4a55-9b1e-2f6c9f0a1b2c"


def resource(
    name: str = "mlp-sweep",
    *,
    uid: str = UID,
    finalizers: list[str] | None = None,
    deleting: bool = False,
    status: dict[str, Any] | None = None,
    spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An Experiment as the API server sends it."""
    doc = document(name)
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "uid": uid,
        "generation": 1,
        "resourceVersion": "42",
        "creationTimestamp": "2026-11-29T11:00:00Z",
        "managedFields": [{"manager": "kubectl"}],
    }
    if finalizers is not None:
        meta["finalizers"] = finalizers
    if deleting:
        meta["deletionTimestamp"] = "2026-11-29T12:00:00Z"
    obj = {**doc, "metadata": meta}
    if spec is not None:
        obj["spec"] = spec
    if status is not None:
        obj["status"] = status
    return obj


def test_a_new_experiment_is_submitted_with_its_document() -> None:
    what, doc = experiment.step(experiment.read(resource()))
    assert what is Step.SUBMIT
    assert isinstance(doc, ExperimentDocument)
    assert doc.metadata.name == "mlp-sweep"
    assert doc.spec.searcher.name == "asha"


def test_a_submitted_experiment_needs_nothing_more() -> None:
    res = experiment.read(resource(finalizers=[FINALIZER], status={"submittedUid": UID}))
    assert res.submitted
    assert experiment.step(res) == (Step.NOTHING, None)


def test_the_status_of_another_uid_does_not_count_as_submitted() -> None:
    """An Experiment made again under the same name is a new resource: submitted anew."""
    res = experiment.read(resource(status={"submittedUid": "an-earlier-uid"}))
    assert not res.submitted
    assert experiment.step(res)[0] is Step.SUBMIT


def test_an_invalid_spec_is_said_once_naming_the_field() -> None:
    spec = copy.deepcopy(document()["spec"])
    spec["searcher"]["budget"]["max"] = 0
    res = experiment.read(resource(spec=spec))
    what, why = experiment.step(res)
    assert what is Step.INVALID
    assert isinstance(why, str)
    assert why.startswith("spec.searcher.budget.max: "), why
    said = experiment.read(resource(spec=spec, status=experiment.invalid_status(why)["status"]))
    assert experiment.step(said) == (Step.NOTHING, why)


@pytest.mark.parametrize(
    ("name", "field"),
    [("a" * 51, "metadata.name"), ("x.y", "metadata.name")],
)
def test_a_name_no_experiment_may_have_is_invalid(name: str, field: str) -> None:
    what, why = experiment.step(experiment.read(resource(name)))
    assert what is Step.INVALID
    assert isinstance(why, str) and why.startswith(f"{field}: "), why


def test_a_deleted_experiment_held_by_the_operator_is_killed_else_left_alone() -> None:
    held = experiment.read(resource(finalizers=["other", FINALIZER], deleting=True))
    assert experiment.step(held) == (Step.KILL, None)
    let_go = experiment.read(resource(finalizers=["other"], deleting=True))
    assert experiment.step(let_go) == (Step.NOTHING, None)


def test_events_have_ids_derived_from_the_env_and_the_uid() -> None:
    res = experiment.read(resource())
    doc = experiment.document(res)
    assert isinstance(doc, ExperimentDocument)
    first = experiment.submitted("prod", res, doc, "operator")
    again = experiment.submitted("prod", res, doc, "operator-2")
    assert first.event_id == again.event_id
    assert first.key == "mlp-sweep"
    assert first.spec == doc.spec
    other = experiment.read(resource(uid=str(uuid.uuid4())))
    assert experiment.submitted("prod", other, doc, "operator").event_id != first.event_id
    assert experiment.submitted("lab", res, doc, "operator").event_id != first.event_id
    kill = experiment.killed("prod", res, "operator")
    assert kill.action is ExperimentActionKind.KILL
    assert kill.event_id == experiment.killed("prod", res, "x").event_id != first.event_id
    assert kill.reason == experiment.KILL_REASON


def test_the_finalizer_patches_keep_the_others_and_the_version_read() -> None:
    res = experiment.read(resource(finalizers=["other"]))
    assert experiment.hold_patch(res) == {
        "metadata": {"finalizers": ["other", FINALIZER], "resourceVersion": "42"}
    }
    held = experiment.read(resource(finalizers=["other", FINALIZER], deleting=True))
    assert experiment.release_patch(held) == {
        "metadata": {"finalizers": ["other"], "resourceVersion": "42"}
    }


def test_the_submitted_status_names_the_uid_env_and_generation() -> None:
    res = experiment.read(resource())
    assert experiment.submitted_status("prod", res) == {
        "status": {
            "phase": Phase.SUBMITTED.value,
            "message": "submitted to env prod",
            "env": "prod",
            "submittedUid": UID,
            "observedGeneration": 1,
        }
    }


def test_a_trial_job_is_owned_by_its_experiment() -> None:
    job = {
        "apiVersion": "dlrover-events.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "mlp-sweep-t3", "labels": {experiment.EXPERIMENT_LABEL: "mlp-sweep"}},
        "spec": {"roles": {}},
    }
    assert experiment.experiment_of(job) == "mlp-sweep"
    owner = experiment.owner_reference("mlp-sweep", UID)
    owned = experiment.with_owner(job, owner)
    assert owned["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "dlrover-events.io/v1alpha1",
            "kind": "Experiment",
            "name": "mlp-sweep",
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": False,
        }
    ]
    assert "ownerReferences" not in job["metadata"]  # the caller's document is not changed
    assert experiment.with_owner(owned, owner) == owned  # once
    # a job some other controller owns: the experiment is an owner beside it, not its
    # controller (a job has one)
    other = {"apiVersion": "v1", "kind": "X", "name": "x", "uid": "u", "controller": True}
    both = experiment.with_owner(experiment.with_owner(job, other), owner)
    assert [r["controller"] for r in both["metadata"]["ownerReferences"]] == [True, False]


@pytest.mark.parametrize(
    "job",
    [
        {"metadata": {"name": "j"}},
        {"metadata": {"name": "j", "labels": {"dlrover-events.io/owner": "mlp-sweep"}}},
        {"metadata": {"name": "j", "labels": {experiment.EXPERIMENT_LABEL: ""}}},
        {"metadata": "odd"},
        {},
    ],
)
def test_a_job_without_the_experiment_label_is_no_trial(job: dict[str, Any]) -> None:
    assert experiment.experiment_of(job) is None
