"""What a TrainingJob cannot apply is said part by part (a partial result), and an elastic
role's rendezvous host is never the pod a plan or a scale-down takes away."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from handlers.operator.document.trainingjob import job_patch, plan_not_applied
from handlers.operator.kube.trainingjob import TRAINING_JOB
from handlers.operator.platform.errors import PlanRejected
from handlers.operator.reconcile.planning import diff, plan_change
from handlers.operator.reconcile.reconciler import accepted
from schemas.jobs import NodeRef
from schemas.plan_parts import AWAITING_JOB, UNKNOWN_KNOB, bounded
from schemas.plans import (
    MAX_NOT_APPLIED,
    MigrateNode,
    Node,
    NodeGroupResource,
    NodeResource,
    NotApplied,
    ScaleResult,
    ScaleStatus,
)

from .test_planning import GiB, group, job, plan, pod

ELASTIC = {"elastic": {"command": ["python", "train.py"]}}


def parts(change_parts: tuple[NotApplied, ...]) -> dict[str, str]:
    return {p.part: p.reason for p in change_parts}


def test_training_knobs_are_left_to_the_job_and_said_so() -> None:
    knobs = plan(training={"local_batch_size": 16, "accumulation_steps": 2, "lr_scale": 2})
    change = plan_change(job(2), [pod(0), pod(1)], knobs)
    assert change.notes == ()  # no more "not applied by the operator" note
    assert parts(plan_not_applied(knobs)) == {
        "training.accumulation_steps": AWAITING_JOB,
        "training.local_batch_size": AWAITING_JOB,
        "training.lr_scale": UNKNOWN_KNOB,
    }
    assert change.summary == "nothing to change"
    assert change.change.applied_plans == ("p1",)  # the plan id is still written: accepted


def test_gpu_type_and_memory_the_pod_spec_cannot_express_are_not_applied() -> None:
    j = job(2)
    pods = [pod(0), pod(1)]
    asked = plan(
        node_group_resources=group(3, cpu=4, gpu_type="a100", gpu_memory=40 * GiB),
        migrate_nodes=[
            MigrateNode(
                node=NodeRef(type="worker", id=1),
                resource=NodeResource(memory=8 * GiB, gpu_memory=80 * GiB),
            )
        ],
    )
    change = plan_change(j, pods, asked)
    found = parts(plan_not_applied(asked))
    assert set(found) == {"worker.gpu_type", "worker.gpu_memory", "worker-1.gpu_memory"}
    assert "no GPU type" in found["worker.gpu_type"]
    assert "no GPU memory" in found["worker-1.gpu_memory"]
    # what it can express it applies
    assert job_patch(j, change.change)["spec"]["roles"]["worker"] == {
        "replicas": 3,
        "resources": {"cpu": 4, "memory": 4 * GiB},
    }
    launch = plan(launch_nodes=[Node(type="worker", id=2, resource=NodeResource(gpu_type="h100"))])
    launched = plan_change(j, pods, launch)
    assert launched.change.replicas == {"worker": 3}
    assert parts(plan_not_applied(launch)).keys() == {"worker-2.gpu_type"}


def test_a_plan_it_applies_whole_lists_no_part_and_the_result_says_applied() -> None:
    whole = plan(node_group_resources=group(4, cpu=3))
    change = plan_change(job(2), [pod(0), pod(1)], whole)
    assert change.change.replicas == {"worker": 4}
    assert plan_not_applied(whole) == ()
    # the reconciler's answer: applied only when nothing is left out
    assert accepted("r", {}, plan_not_applied(whole)).status is ScaleStatus.APPLIED
    partial = accepted("r", {}, plan_not_applied(plan(training={"local_batch_size": 8})))
    assert partial.status is ScaleStatus.PARTIAL
    ScaleResult(  # the contract's validator agrees
        env="prod",
        job={"uuid": "u"},
        plan_id="p",
        status=partial.status,
        not_applied=list(partial.not_applied),
    )


def test_the_parts_are_a_function_of_the_plan_alone() -> None:
    """A plan finished after a restart (its id already on the job) is answered the same."""
    p = plan(training={"local_batch_size": 8}, node_group_resources=group(3, gpu_memory=GiB))
    change = plan_change(job(2), [pod(0), pod(1)], p)
    assert change.change.replicas == {"worker": 3}  # the rest applies
    # the platform says the parts from the plan only (the port's not_applied takes no job)
    assert TRAINING_JOB.plan_not_applied(p) == plan_not_applied(p) != ()


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.integers(0, 120),
    knobs=st.lists(st.text("abcdefgh", min_size=1, max_size=6), max_size=80, unique=True),
)
def test_the_parts_always_fit_one_result(nodes: int, knobs: list[str]) -> None:
    moves = [
        MigrateNode(node=NodeRef(type="worker", id=i), resource=NodeResource(gpu_memory=GiB))
        for i in range(nodes)
    ]
    p = plan(migrate_nodes=moves, training={k: 1 for k in knobs})
    found = plan_not_applied(p)
    assert len(found) <= MAX_NOT_APPLIED
    names = {x.part for x in found}
    if len(moves) + len(knobs) <= MAX_NOT_APPLIED:
        assert names == {f"worker-{i}.gpu_memory" for i in range(nodes)} | {
            f"training.{k}" for k in knobs
        }
    else:  # coarser, never silent: every node is still covered by its role's part
        assert not nodes or "worker.gpu_memory" in names or "worker-0.gpu_memory" in names
        assert not knobs or "training" in names or any(n.startswith("training.") for n in names)


def test_bounded_keeps_short_lists_as_they_are() -> None:
    few = [
        NotApplied(part="worker-1.gpu_type", reason="r"),
        NotApplied(part="training.x", reason="r"),
    ]
    assert bounded(few) == few
    assert bounded([*few, *few]) == few


# -- elastic roles: the rendezvous host stays ---------------------------------------------


def elastic_job(replicas: int, **kw: Any) -> Any:
    return job(replicas, **ELASTIC, **kw)


def test_an_elastic_roles_host_rank_is_removed_last() -> None:
    pods = [pod(0, "Pending"), pod(1), pod(2)]
    # a plain role would lose its pending pod first; the elastic host stays
    assert diff(job(2), pods).delete == ("j-worker-0",)
    assert diff(elastic_job(2), pods).delete == ("j-worker-2",)
    assert diff(elastic_job(1), pods).delete == ("j-worker-2", "j-worker-1")
    # named for removal (an annotation from any plan): still last
    named = elastic_job(2, annotations={"dlrover-events.io/remove-first": '{"worker": [0]}'})
    assert diff(named, pods).delete == ("j-worker-2",)
    # only a role that goes to 0 replicas loses it
    gone = elastic_job(0, minReplicas=0)
    assert set(diff(gone, pods).delete) == {"j-worker-0", "j-worker-1", "j-worker-2"}


def test_a_plan_that_names_the_rendezvous_host_is_rejected() -> None:
    pods = [pod(0), pod(1), pod(2)]
    j = elastic_job(3)
    with pytest.raises(PlanRejected, match="hosts the job's rendezvous"):
        plan_change(j, pods, plan(remove_nodes=[NodeRef(type="worker", id=0)]))
    move = MigrateNode(node=NodeRef(type="worker", id=0), resource=NodeResource(memory=8 * GiB))
    with pytest.raises(PlanRejected, match="cannot migrate worker-0: it hosts"):
        plan_change(j, pods, plan(migrate_nodes=[move]))
    # other ranks go as usual, and a plain role's rank 0 too
    ok = plan_change(j, pods, plan(remove_nodes=[NodeRef(type="worker", id=1)]))
    assert job_patch(j, ok.change)["spec"]["roles"]["worker"]["replicas"] == 2
    plain = plan_change(job(3), pods, plan(remove_nodes=[NodeRef(type="worker", id=0)]))
    assert plain.change.replicas == {"worker": 2}
    assert plain.change.remove_first == {"worker": (0,)}
    # scaling by count never names it: fine
    down = plan_change(j, pods, plan(node_group_resources={"worker": NodeGroupResource(count=1)}))
    assert down.change.replicas == {"worker": 1}
