"""A cluster scheduler's plans on Kubernetes: a placement on named nodes is listed not
applied by every workload (the cluster's scheduler places pods); a platform that cannot
suspend says why in one line (suspend itself: test_suspend_planning.py)."""

from __future__ import annotations

from handlers.operator.document.trainingjob import job_patch, plan_not_applied
from handlers.operator.kube import pytorchjob
from handlers.operator.kube.trainingjob import TRAINING_JOB
from handlers.operator.reconcile.planning import cannot_suspend, plan_change
from schemas.plan_parts import NO_PLACEMENT
from schemas.plans import NotApplied
from tests.unit.operator.reconcile.test_planning import group, job, plan, pod

from . import test_pytorchjob as ptj

PLACEMENT = {"node-a": 4, "node-b": 4}
PLACED = NotApplied(part="placement", reason=NO_PLACEMENT)


def test_a_trainingjob_plan_lists_its_placement_not_applied() -> None:
    placed = plan(node_group_resources=group(4), placement=PLACEMENT)
    assert PLACED in plan_not_applied(placed)
    assert PLACED in plan_not_applied(placed, gpu_types=True)
    assert TRAINING_JOB.plan_not_applied(placed) == plan_not_applied(placed)
    change = plan_change(job(2), [pod(0), pod(1)], placed)
    assert job_patch(job(2), change.change)["spec"] == {"roles": {"worker": {"replicas": 4}}}


def test_a_pytorchjob_plan_lists_its_placement_not_applied() -> None:
    placed = ptj.plan(node_group_resources=ptj.workers(3), placement=PLACEMENT)
    assert PLACED in pytorchjob.plan_not_applied(placed)
    change = pytorchjob.plan_change(ptj.elastic(2), ptj.pods(2), placed)
    assert change.change.replicas == {"worker": 3}  # the rest applies
    assert PLACED in pytorchjob.PYTORCH_JOB.plan_not_applied(placed)


def test_a_plan_without_placement_lists_none() -> None:
    assert PLACED not in plan_not_applied(plan(node_group_resources=group(4)))


def test_the_suspend_reason_is_one_line_naming_the_platform() -> None:
    reason = cannot_suspend("Kubernetes")
    assert reason.startswith("the Kubernetes platform cannot suspend a job; ")
    assert "\n" not in reason
