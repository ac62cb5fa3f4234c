"""A job held by its owner (an experiment's trial paused at a rung, issue 34): the plan
that holds it suspends it and says so; no plan resumes or resizes it, a cluster
scheduler's included, until its owner releases it; a release queues it (a cluster
scheduler admits it, else the operator at once), and a release of a job not held
changes nothing."""

from __future__ import annotations

import json

import pytest

from handlers.operator.document.trainingjob import ANN_ADMISSION, job_patch
from handlers.operator.platform.bodies import ADMITTED, QUEUED, SUSPENDED
from handlers.operator.platform.errors import PlanRejected
from handlers.operator.reconcile.planning import (
    HELD,
    admission_change,
    effective_admission,
    held,
    plan_change,
)
from schemas.plans import ScalePlan

from .test_planning import group, plan, pod
from .test_suspend_planning import after, tj


def test_a_hold_suspends_the_job_and_records_its_owner_holds_it() -> None:
    job = tj(2)
    change = plan_change(job, [pod(0), pod(1)], plan("h1", suspend=True, hold=True))
    patch = job_patch(job, change.change)
    assert patch["spec"] == {"suspend": True}
    said = json.loads(patch["metadata"]["annotations"][ANN_ADMISSION])
    assert (said["state"], said["reason"], said["plan"]) == (SUSPENDED, HELD, "h1")
    assert change.summary.startswith("held")
    assert held(after(job, patch))


def test_no_plan_resumes_or_resizes_a_held_job() -> None:
    job = tj(2)
    patch = job_patch(job, plan_change(job, [], plan("h1", suspend=True, hold=True)).change)
    holding = after(job, patch)
    for attempt in (
        plan("admit", node_group_resources=group(2)),
        plan("grow", node_group_resources=group(3)),
    ):
        with pytest.raises(PlanRejected, match="held by its owner"):
            plan_change(holding, [], attempt)
    # suspended again (a cluster scheduler's preemption): still held, nothing changes
    again = plan_change(holding, [], plan("s2", suspend=True, hold=True))
    assert again.change.suspend is True


def test_a_release_queues_the_held_job_and_only_the_queue_admits_it() -> None:
    job = tj(2)
    holding = after(
        job, job_patch(job, plan_change(job, [], plan("h1", suspend=True, hold=True)).change)
    )
    release = plan_change(holding, [], plan("r1", hold=False))
    patch = job_patch(holding, release.change)
    released = after(holding, patch)
    assert released.suspended and not held(released)
    state = effective_admission(released)
    assert state is not None and (state.state, state.reason) == (QUEUED, "Released")
    # with a cluster scheduler, the operator leaves it queued: the scheduler admits it
    assert admission_change(released, [], "goodput-cluster") is None
    admitted = plan_change(released, [], plan("a1", node_group_resources=group(2)))
    assert admitted.change.suspend is False
    # without one, the operator admits it at once
    own = admission_change(released, [], None)
    assert own is not None and own.suspend is False and own.admission is not None
    assert own.admission.state == ADMITTED


def test_a_release_of_a_job_not_held_changes_nothing() -> None:
    job = tj(2)
    release = plan_change(job, [pod(0), pod(1)], plan("r1", hold=False))
    assert release.change.suspend is None and release.change.admission is None
    assert release.summary == "not held: nothing to release"


@pytest.mark.parametrize(
    "fields",
    [{"hold": True}, {"hold": False, "suspend": True}, {"hold": False, "placement": {"n": 1}}],
)
def test_a_hold_plan_says_one_thing(fields: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"holds a job|only releases"):
        ScalePlan(env="prod", job={"uuid": "u", "name": "j"}, plan_id="p", **fields)  # type: ignore[arg-type]


def test_a_plan_without_hold_is_the_same_bytes_as_before() -> None:
    p = plan("p", suspend=True)
    assert "hold" not in p.model_dump_json()
