"""The pure decisions of a queue with admission, suspend and resume (issue 26), on the
port's views as the workloads read them: what a plan writes (TrainingJob spec.suspend,
PyTorchJob spec.runPolicy.suspend, the admission beside it, in one patch), which pods a
suspended job keeps (none), when a new job is queued, what a Kueue-managed job refuses,
and what the job's status and job.submitted say."""

from __future__ import annotations

import json
from typing import Any

import pytest

from handlers.operator.document.trainingjob import ANN_ADMISSION, ANN_PLANS, job_patch, parse_job
from handlers.operator.kube import pytorchjob
from handlers.operator.platform.bodies import (
    ADMITTED,
    KUEUE_QUEUE_LABEL,
    PRIORITY_LABEL,
    QUEUED,
    SUSPENDED,
    JobView,
)
from handlers.operator.platform.errors import InvalidJob, PlanRejected
from handlers.operator.reconcile.events import submitted
from handlers.operator.reconcile.planning import (
    admission_change,
    diff,
    effective_admission,
    job_status,
    missing,
    phase,
    plan_change,
    remaining,
)
from tests.unit.operator.kube import test_pytorchjob as ptj

from .test_planning import group, job_obj, plan, pod


def tj(replicas: int = 2, *, labels: dict[str, str] | None = None, **spec: Any) -> JobView:
    obj = job_obj(replicas)
    obj["metadata"]["labels"] = labels or {}
    obj["spec"].update(spec)
    return parse_job(obj)


def after(job: JobView, patch: dict[str, Any]) -> JobView:
    """The job as the API server returns it after the merge patch."""
    obj = json.loads(json.dumps(dict(job.document)))
    obj["metadata"].setdefault("annotations", {}).update(patch["metadata"]["annotations"])
    spec = patch.get("spec") or {}
    if "suspend" in spec:
        obj["spec"]["suspend"] = spec["suspend"]
    for role, fields in (spec.get("roles") or {}).items():
        obj["spec"]["roles"][role].update(fields)
    return parse_job(obj)


KUEUE = {KUEUE_QUEUE_LABEL: "team-a-queue"}


# -- suspend and resume ------------------------------------------------------------------


def test_a_suspend_plan_sets_spec_suspend_and_says_who_in_the_same_patch() -> None:
    job = tj(2)
    change = plan_change(job, [pod(0), pod(1)], plan("s1", suspend=True))
    patch = job_patch(job, change.change)
    assert patch["spec"] == {"suspend": True}  # its replicas stay: a resume restores them
    annotations = patch["metadata"]["annotations"]
    assert json.loads(annotations[ANN_PLANS]) == ["s1"]
    said = json.loads(annotations[ANN_ADMISSION])
    assert (said["state"], said["reason"], said["plan"]) == (SUSPENDED, "Preempted", "s1")
    assert change.summary.startswith("suspended")
    suspended = after(job, patch)
    assert suspended.suspended and suspended.roles["worker"].replicas == 2


def test_a_suspended_job_keeps_no_pod_and_makes_none() -> None:
    job = after(tj(2), job_patch(tj(2), plan_change(tj(2), [], plan("s1", suspend=True)).change))
    pods = [pod(0), pod(1), pod(2, deleting=True)]
    actions = diff(job, pods)
    assert actions.create == ()
    assert sorted(actions.delete) == ["j-worker-0", "j-worker-1"]  # the deleting one goes anyway
    assert remaining(job, pods) == ["j-worker-0", "j-worker-1", "j-worker-2"]
    assert remaining(job, []) == []
    assert phase(job, []) == "Suspended"


def test_a_job_that_ended_before_its_suspension_came_leaves_nothing_to_wait_for() -> None:
    """Its pods exited 0 (a trial told to stop as its stop's hold came) before the
    suspension deleted them: a finished job keeps its pods, so a suspend that waited for
    them to go waited its grace period and the settle margin for nothing, and held up
    every plan read after it (seen in tests/integration/local/test_experiment_loop.py)."""
    job = after(tj(2), job_patch(tj(2), plan_change(tj(2), [], plan("s1", suspend=True)).change))
    ended = [pod(0, "Succeeded"), pod(1, "Succeeded")]
    assert diff(job, ended).delete == ()
    assert remaining(job, ended) == []
    # a pod that ends once its deletion began is still waited for, until it is gone
    leaving = [pod(0, "Succeeded", deleting=True), pod(1, deleting=True)]
    assert remaining(job, leaving) == ["j-worker-0", "j-worker-1"]


def test_a_plan_with_a_count_resumes_a_suspended_job_and_one_without_does_not() -> None:
    job = after(tj(2), job_patch(tj(2), plan_change(tj(2), [], plan("s1", suspend=True)).change))
    knobs = plan_change(job, [], plan("k1", training={"local_batch_size": 8}))
    assert knobs.change.suspend is None  # knobs alone leave it suspended
    change = plan_change(job, [], plan("r1", node_group_resources=group(3)))
    assert change.change.suspend is False
    assert change.change.admission is not None
    assert (change.change.admission.state, change.change.admission.reason) == (ADMITTED, "Resumed")
    resumed = after(job, job_patch(job, change.change))
    assert not resumed.suspended and resumed.roles["worker"].replicas == 3
    assert [p.rank for p in diff(resumed, []).create] == [0, 1, 2]
    assert missing(resumed, []) == {"worker": 3}
    assert missing(resumed, [pod(0, "Pending"), pod(1), pod(2)]) == {}


def test_a_suspend_of_a_suspended_job_applies_and_changes_nothing_else() -> None:
    job = tj(2, suspend=True)
    change = plan_change(job, [], plan("s2", suspend=True))
    assert change.summary.startswith("suspended already")
    assert change.change.replicas == {}


# -- the queue --------------------------------------------------------------------------


def test_with_a_scheduler_a_new_job_is_queued_before_its_first_pod() -> None:
    job = tj(2)
    change = admission_change(job, [], "goodput-cluster")
    assert change is not None and change.suspend is True
    assert change.admission is not None and change.admission.state == QUEUED
    assert "goodput-cluster" in change.admission.message
    queued = after(job, job_patch(job, change))
    assert phase(queued, []) == "Queued"
    assert diff(queued, []).create == ()
    status = job_status(queued, [], now="2026-01-01T00:00:00Z")
    assert status is not None and status.suspended is not None
    assert (status.suspended.status, status.suspended.reason) == (True, "Queued")
    assert status.suspended.since == "2026-01-01T00:00:00Z"
    # admitted by a plan: "Admitted", not "Resumed"
    admitted = plan_change(queued, [], plan("a1", node_group_resources=group(2)))
    assert admitted.change.admission is not None
    assert admitted.change.admission.reason == "Admitted"


def test_a_job_is_queued_only_when_new_and_never_when_kueue_or_its_user_suspends_it() -> None:
    assert admission_change(tj(2), [], None) is None  # no scheduler: it starts at once
    assert admission_change(tj(2), [pod(0), pod(1)], "tiresias") is None  # running already
    assert admission_change(tj(2, suspend=True), [], "tiresias") is None  # its user's
    assert admission_change(tj(2, labels=KUEUE), [], "tiresias") is None  # Kueue's
    planned = after(tj(2), job_patch(tj(2), plan_change(tj(2), [], plan("x")).change))
    assert admission_change(planned, [], "tiresias") is None  # a plan applied already
    # a job suspended at submission says so, and who can resume it
    state = effective_admission(tj(2, suspend=True))
    assert state is not None and (state.state, state.reason) == (SUSPENDED, "Suspended")


def test_without_a_scheduler_a_queued_job_is_admitted_and_a_preempted_one_kept() -> None:
    job = tj(2)
    queued_change = admission_change(job, [], "tiresias")
    assert queued_change is not None
    queued = after(job, job_patch(job, queued_change))
    released = admission_change(queued, [], None)
    assert released is not None and released.suspend is False
    preempted = after(job, job_patch(job, plan_change(job, [], plan("s", suspend=True)).change))
    assert admission_change(preempted, [], None) is None


# -- Kueue ------------------------------------------------------------------------------


def test_a_kueue_job_is_never_suspended_or_resumed_by_a_plan() -> None:
    with pytest.raises(PlanRejected, match=r"managed by Kueue \(queue team-a-queue\).*suspend"):
        plan_change(tj(2, labels=KUEUE), [], plan("s", suspend=True))
    with pytest.raises(PlanRejected, match="admit or resume"):
        plan_change(tj(2, labels=KUEUE, suspend=True), [], plan("r", node_group_resources=group(2)))
    state = effective_admission(tj(2, labels=KUEUE, suspend=True))
    assert state is not None and state.reason == "Kueue"


def test_a_kueue_job_is_resized_within_what_it_holds_never_grown() -> None:
    job = tj(3, labels=KUEUE)
    shrunk = plan_change(job, [pod(0), pod(1), pod(2)], plan("d", node_group_resources=group(2)))
    assert shrunk.change.replicas == {"worker": 2}
    with pytest.raises(PlanRejected, match=r"not grow it \(worker 3->4"):
        plan_change(job, [pod(0), pod(1), pod(2)], plan("g", node_group_resources=group(4)))


# -- PyTorchJob ---------------------------------------------------------------------------


def test_a_pytorchjob_suspends_by_its_run_policy() -> None:
    obj = ptj.ptj(2, policy=dict(ptj.ELASTIC))
    job = pytorchjob.parse_pytorchjob(obj)
    assert not job.suspended
    change = pytorchjob.plan_change(job, ptj.pods(2), ptj.plan(suspend=True))
    patch = pytorchjob.job_patch(job, change.change)
    assert patch["spec"] == {"runPolicy": {"suspend": True}}
    assert json.loads(patch["metadata"]["annotations"][ANN_ADMISSION])["state"] == SUSPENDED
    obj["spec"]["runPolicy"] = {"suspend": True}
    assert pytorchjob.parse_pytorchjob(obj).suspended


# -- what the brain is told, and bad labels ---------------------------------------------


def test_job_submitted_carries_priority_group_and_kueue_queue() -> None:
    labels = {
        PRIORITY_LABEL: "7",
        "dlrover-events.io/user": "alice",
        "dlrover-events.io/group": "vision",
        **KUEUE,
    }
    event = submitted("prod", tj(2, labels=labels))
    assert (event.priority, event.group, event.kueue_queue) == (7, "vision", "team-a-queue")
    alone = submitted("prod", tj(2, labels={"dlrover-events.io/user": "bob"}))
    assert (alone.priority, alone.group, alone.kueue_queue) == (0, "bob", None)


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ({PRIORITY_LABEL: "high"}, "must be an integer"),
        ({PRIORITY_LABEL: "99999999999"}, "must be an integer"),
        ({"dlrover-events.io/group": "-x"}, "a group is letters"),
    ],
)
def test_a_label_the_scheduler_cannot_read_makes_the_job_invalid(
    labels: dict[str, str], message: str
) -> None:
    with pytest.raises(InvalidJob, match=message):
        tj(2, labels=labels)


def test_a_bad_admission_annotation_makes_the_job_invalid() -> None:
    obj = job_obj(2, annotations={ANN_ADMISSION: json.dumps({"state": "lost"})})
    with pytest.raises(InvalidJob, match="queued, admitted or suspended"):
        parse_job(obj)


def test_job_submitted_carries_the_batch_the_job_says() -> None:
    """spec.batch reaches the cluster scheduler (it may then choose the job's batch); a
    job without one says no batch (it is scheduled as its gang)."""
    batch = {"size": 256, "minSize": 64, "maxSize": 2048, "maxLocal": 128, "adaptive": True}
    event = submitted("prod", tj(2, batch=batch))
    assert (
        event.batch_size,
        event.min_batch_size,
        event.max_batch_size,
        event.min_local_batch_size,
        event.max_local_batch_size,
        event.adaptive_batch_size,
    ) == (256, 64, 2048, None, 128, True)
    plain = submitted("prod", tj(2))
    assert plain.batch_size is None and not plain.adaptive_batch_size


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        ({"minSize": 8}, "spec.batch.size is required"),
        ({"size": 64, "minSize": 128}, "minSize <= size <= maxSize"),
        ({"size": 64, "maxSize": 32}, "minSize <= size <= maxSize"),
        ({"size": 64, "minLocal": 16, "maxLocal": 8}, "minLocal 16 > maxLocal 8"),
        ({"size": 64, "adaptive": "yes"}, "adaptive must be true or false"),
        ({"size": 2.5}, "must be a whole number"),
        ({"size": 0}, r"within \[1, 2\^40\]"),
        ([64], "must be an object"),
    ],
)
def test_a_batch_the_schema_lets_through_out_of_order_makes_the_job_invalid(
    batch: Any, message: str
) -> None:
    with pytest.raises(InvalidJob, match=message):
        tj(2, batch=batch)
