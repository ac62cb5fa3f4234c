"""The reconciler's pure decisions: plans into job changes, jobs into pod actions, pods
into events. Jobs and pods are built by hand, as the API would send them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dlrover_events.errors import UserError
from handlers.operator.document.quantity import format_cpu, parse_quantity, resources_from_spec
from handlers.operator.document.trainingjob import (
    ANN_NODE_RESOURCES,
    ANN_PLANS,
    ANN_REMOVE_FIRST,
    job_patch,
    parse_job,
    status_patch,
)
from handlers.operator.doors.commands import scale_plan_id
from handlers.operator.kube.adapters import ADAPTERS, adapter_for
from handlers.operator.kube.pods import parse_pod
from handlers.operator.kube.pytorchjob import PYTORCH_JOB
from handlers.operator.kube.trainingjob import TRAINING_JOB, pod_manifest
from handlers.operator.platform.bodies import JobView, NewPod, PodView, Resources, Termination
from handlers.operator.platform.errors import InvalidJob, PlanRejected
from handlers.operator.reconcile.events import event_id, job_events, node_events, submitted
from handlers.operator.reconcile.planning import (
    counts,
    diff,
    job_status,
    outcome,
    phase,
    plan_change,
)
from schemas.jobs import NodeExited, NodeFailed, NodeOOM, NodeRef, NodeStarted, OOMKind
from schemas.plans import MigrateNode, Node, NodeGroupResource, NodeResource, ScalePlan

GiB = 2**30
UID = "uid-1"


def job_obj(
    replicas: int = 2,
    *,
    policy: str = "OnFailure",
    annotations: dict[str, str] | None = None,
    status: dict[str, Any] | None = None,
    **role: Any,
) -> dict[str, Any]:
    worker = {
        "replicas": replicas,
        "minReplicas": 1,
        "maxReplicas": 6,
        "resources": {"cpu": 2, "memory": "4Gi"},
        "restartPolicy": policy,
        "template": {"spec": {"containers": [{"name": "main", "image": "t:1"}]}},
        **role,
    }
    return {
        "apiVersion": "dlrover-events.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {
            "name": "j",
            "namespace": "ns",
            "uid": UID,
            "resourceVersion": "7",
            "generation": 3,
            "annotations": annotations or {},
        },
        "spec": {"roles": {"worker": worker}},
        "status": status or {},
    }


def job(replicas: int = 2, **kw: Any) -> JobView:
    return parse_job(job_obj(replicas, **kw))


def pod(
    rank: int,
    phase: str = "Running",
    *,
    index: int | None = None,
    memory: int = 4 * GiB,
    deleting: bool = False,
    uid: str = UID,
    termination: Termination | None = None,
) -> PodView:
    index = rank if index is None else index
    return PodView(
        name=f"j-worker-{index}",
        uid=f"pod-{index}",
        job="j",
        job_uid=uid,
        role="worker",
        rank=rank,
        index=index,
        phase=phase,
        deleting=deleting,
        resources=Resources(cpu_milli=2000, memory=memory),
        termination=termination,
    )


def plan(plan_id: str = "p1", **fields: Any) -> ScalePlan:
    return ScalePlan(
        env="prod", job={"uuid": UID, "name": "j", "namespace": "ns"}, plan_id=plan_id, **fields
    )


def group(count: int = 0, **res: Any) -> dict[str, NodeGroupResource]:
    return {"worker": NodeGroupResource(count=count, node_resource=NodeResource(**res))}


def patched(job_view: JobView, plan_: ScalePlan, pods: list[PodView]) -> dict[str, Any]:
    """The plan's change of the job as the TrainingJob's merge patch (what a platform
    writes)."""
    return job_patch(job_view, plan_change(job_view, pods, plan_).change)


def applied(job_view: JobView, change_patch: dict[str, Any]) -> JobView:
    """The job as the API server returns it after the merge patch."""
    obj = job_obj(job_view.roles["worker"].replicas)
    obj["metadata"]["annotations"] = dict(change_patch["metadata"]["annotations"])
    worker = obj["spec"]["roles"]["worker"]
    worker.update(change_patch.get("spec", {}).get("roles", {}).get("worker", {}))
    return parse_job(obj)


# -- quantities -------------------------------------------------------------------------


def test_quantities_compare_whatever_their_spelling() -> None:
    assert parse_quantity("500m") == parse_quantity(0.5)
    assert parse_quantity("16Gi") == 16 * GiB
    assert parse_quantity("1e3") == 1000
    assert resources_from_spec({"cpu": "2", "memory": "4Gi"}) == resources_from_spec(
        {"cpu": 2, "memory": 4 * GiB}
    )
    assert format_cpu(2.0) == 2
    assert format_cpu(2.5) == "2500m"
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity("lots")


# -- plan -> job change -----------------------------------------------------------------


def test_a_scale_plan_patches_replicas_with_its_id_and_the_version_it_saw() -> None:
    change = plan_change(job(2), [pod(0), pod(1)], plan(node_group_resources=group(4)))
    patch = job_patch(job(2), change.change)
    assert patch["spec"] == {"roles": {"worker": {"replicas": 4}}}
    assert change.change.replicas == {"worker": 4}
    meta = patch["metadata"]
    assert meta["resourceVersion"] == "7"
    assert json.loads(meta["annotations"][ANN_PLANS]) == ["p1"]
    assert "worker 2->4" in change.summary


def test_plans_outside_the_bounds_or_for_unknown_roles_are_rejected() -> None:
    with pytest.raises(PlanRejected, match="above maxReplicas 6"):
        plan_change(job(2), [], plan(node_group_resources=group(7)))
    with pytest.raises(PlanRejected, match="has no role ps"):
        plan_change(job(2), [], plan(node_group_resources={"ps": NodeGroupResource(count=1)}))
    with pytest.raises(PlanRejected, match="no such node"):
        plan_change(job(2), [pod(0), pod(1)], plan(remove_nodes=[NodeRef(type="worker", id=5)]))
    with pytest.raises(PlanRejected, match="has failed"):
        plan_change(job(2, status={"phase": "Failed"}), [], plan(node_group_resources=group(3)))
    with pytest.raises(PlanRejected, match="launches and removes"):
        plan_change(
            job(2),
            [pod(0), pod(1)],
            plan(
                launch_nodes=[Node(type="worker", id=2)],
                remove_nodes=[NodeRef(type="worker", id=0)],
            ),
        )


def test_a_named_removal_lowers_replicas_and_marks_the_rank() -> None:
    j = job(3)
    pods = [pod(0), pod(1), pod(2)]
    patch = patched(j, plan(remove_nodes=[NodeRef(type="worker", id=0)]), pods)
    assert patch["spec"]["roles"]["worker"]["replicas"] == 2
    assert json.loads(patch["metadata"]["annotations"][ANN_REMOVE_FIRST]) == {"worker": [0]}
    after = applied(j, patch)
    assert diff(after, pods).delete == ("j-worker-0",)


def test_migrate_records_the_node_resources_and_launch_gives_them_to_the_next_rank() -> None:
    j = job(2)
    pods = [pod(0), pod(1)]
    move = MigrateNode(node=NodeRef(type="worker", id=1), resource=NodeResource(memory=16 * GiB))
    patch = patched(j, plan(migrate_nodes=[move]), pods)
    assert "spec" not in patch  # replicas and role resources unchanged
    node_res = json.loads(patch["metadata"]["annotations"][ANN_NODE_RESOURCES])
    assert node_res == {"worker": {"1": {"cpu": 2, "memory": 16 * GiB}}}

    launch = Node(type="worker", id=9, resource=NodeResource(memory=8 * GiB))
    patch = patched(j, plan(launch_nodes=[launch]), pods)
    assert patch["spec"]["roles"]["worker"]["replicas"] == 3
    node_res = json.loads(patch["metadata"]["annotations"][ANN_NODE_RESOURCES])
    assert node_res == {"worker": {"2": {"cpu": 2, "memory": 8 * GiB}}}


def test_the_applied_plan_ids_are_bounded() -> None:
    ids = [f"p{i}" for i in range(40)]
    j = job(2, annotations={ANN_PLANS: json.dumps(ids)})
    kept = json.loads(
        patched(j, plan("new", node_group_resources=group(3)), [])["metadata"]["annotations"][
            ANN_PLANS
        ]
    )
    assert kept[-1] == "new"
    assert len(kept) == 32


# -- job -> pods ------------------------------------------------------------------------


def test_missing_pods_are_created_at_the_lowest_free_ranks() -> None:
    actions = diff(job(4), [pod(0), pod(2)])
    assert [(n.rank, n.index) for n in actions.create] == [(1, 1), (3, 3)]
    assert actions.delete == ()
    assert actions.create[0].resources == Resources(cpu_milli=2000, memory=4 * GiB)


def test_scaling_down_removes_pending_before_running_then_the_highest_rank() -> None:
    pods = [pod(0), pod(1, "Pending"), pod(2), pod(3)]
    assert diff(job(3), pods).delete == ("j-worker-1",)
    assert diff(job(2), pods).delete == ("j-worker-1", "j-worker-3")
    everything_runs = [pod(0), pod(1), pod(2), pod(3)]
    assert diff(job(2), everything_runs).delete == ("j-worker-3", "j-worker-2")


def test_a_migration_creates_the_new_pod_first_and_removes_the_old_once_it_runs() -> None:
    j = job(2, annotations={ANN_NODE_RESOURCES: json.dumps({"worker": {"0": {"memory": "16Gi"}}})})
    step1 = diff(j, [pod(0), pod(1)])
    assert step1.create == (NewPod("worker", 0, 2, j.wanted("worker", 0)),)
    assert step1.delete == ()
    new_pending = pod(0, "Pending", index=2, memory=16 * GiB)
    assert not diff(j, [pod(0), pod(1), new_pending])  # wait for it
    new_running = pod(0, "Running", index=2, memory=16 * GiB)
    assert diff(j, [pod(0), pod(1), new_running]).delete == ("j-worker-0",)
    # An old pod that does not run goes at once.
    assert diff(j, [pod(0, "Failed"), pod(1), new_pending]).delete == ("j-worker-0",)


def test_decisions_are_deterministic_and_skip_pods_being_deleted() -> None:
    pods = [pod(0), pod(1, deleting=True)]
    first, second = diff(job(2), pods), diff(job(2), list(reversed(pods)))
    assert first == second
    # Rank 1's old pod is going: a new one, under a name not in use.
    assert [(n.rank, n.index) for n in first.create] == [(1, 2)]


def test_pods_of_an_earlier_job_of_the_same_name_are_removed() -> None:
    stale = pod(0, uid="old-uid", index=7)
    actions = diff(job(1), [stale])
    assert actions.delete == ("j-worker-7",)
    assert [n.rank for n in actions.create] == [0]


@pytest.mark.parametrize(
    ("policy", "exit_code", "replaced"),
    [
        ("Never", 1, False),
        ("OnFailure", 1, True),
        ("ExitCode", 1, False),
        ("ExitCode", 137, True),
        ("Always", 1, True),
    ],
)
def test_restart_policy_decides_whether_a_failed_pod_is_replaced(
    policy: str, exit_code: int, replaced: bool
) -> None:
    failed = pod(1, "Failed", termination=Termination("main", exit_code, "Error"))
    j = job(2, policy=policy)
    actions = diff(j, [pod(0), failed])
    if replaced:
        assert [(n.rank, n.index) for n in actions.create] == [(1, 2)]
        assert actions.delete == ("j-worker-1",)
        assert outcome(j, [pod(0), failed]) == (None, "")
    else:
        assert not actions
        ended, reason = outcome(j, [pod(0), failed])
        assert ended == "Failed"
        assert f"exit code {exit_code}" in reason


def test_the_job_completes_when_all_workers_succeeded_and_then_stays_put() -> None:
    j = job(2)
    pods = [pod(0, "Succeeded"), pod(1, "Succeeded")]
    assert outcome(j, pods)[0] == "Succeeded"
    assert phase(j, pods) == "Succeeded"
    assert not diff(j, pods)
    assert outcome(j, [pod(0, "Succeeded"), pod(1)])[0] is None


def test_status_counts_and_phase() -> None:
    j = job(3)
    pods = [pod(0), pod(1, "Pending"), pod(2, "Failed"), pod(3, deleting=True)]
    assert counts(j, pods) == {"worker": {"pending": 1, "running": 1, "succeeded": 0, "failed": 1}}
    status = job_status(j, [pod(0), pod(1), pod(2)], last_plan="p9")
    assert status is not None
    patch = status_patch(status)
    assert patch["status"]["phase"] == "Running"
    assert patch["status"]["lastPlanId"] == "p9"
    assert phase(j, [pod(0)]) == "Scaling"
    same = job(3, status={**patch["status"]})
    assert job_status(same, [pod(0), pod(1), pod(2)], last_plan="p9") is None


def test_invalid_jobs_are_named() -> None:
    obj = job_obj(2)
    obj["spec"]["roles"]["Bad_Role"] = obj["spec"]["roles"]["worker"]
    with pytest.raises(InvalidJob, match="DNS label"):
        parse_job(obj)
    with pytest.raises(InvalidJob, match="minReplicas 5 > maxReplicas 2"):
        parse_job(job_obj(2, minReplicas=5, maxReplicas=2))


# -- pods -> events ---------------------------------------------------------------------


def raw_pod(phase: str, state: dict[str, Any] | None = None) -> dict[str, Any]:
    manifest = pod_manifest(job(2), NewPod("worker", 1, 4, Resources(memory=GiB)), "prod")
    manifest["metadata"]["uid"] = "pod-uid"
    manifest["status"] = {
        "phase": phase,
        "containerStatuses": [{"name": "main", "state": state or {}}],
    }
    return manifest


def test_an_oom_kill_is_a_host_oom_with_an_id_from_the_pod() -> None:
    oom = raw_pod("Failed", {"terminated": {"exitCode": 137, "reason": "OOMKilled"}})
    view = parse_pod(oom)
    assert view is not None
    meta = submitted("prod", job(2)).job
    (event,) = node_events("prod", meta, view)
    assert isinstance(event, NodeOOM)
    assert event.kind is OOMKind.HOST_MEMORY
    assert (event.exit_code, event.memory) == (137, GiB)
    assert (event.node.type, event.node.id, event.node.name) == ("worker", 1, "j-worker-4")
    assert event.event_id == event_id("prod", "pod-uid", "oom")
    # The same pod seen again (a re-list) is the same event; another env, another id.
    (again,) = node_events("prod", meta, view)
    assert again.event_id == event.event_id
    (elsewhere,) = node_events("shadow", meta.model_copy(), view)
    assert elsewhere.event_id != event.event_id
    # Exit 137 without the reason is the OOM killer too.
    sigkill = parse_pod(raw_pod("Failed", {"terminated": {"exitCode": 137, "reason": "Error"}}))
    assert sigkill is not None
    assert isinstance(node_events("prod", meta, sigkill)[0], NodeOOM)


def test_pod_phases_become_node_events() -> None:
    meta = submitted("prod", job(2)).job
    cases = {
        "Running": NodeStarted,
        "Succeeded": NodeExited,
        "Failed": NodeFailed,
    }
    for phase_name, kind in cases.items():
        state = {"terminated": {"exitCode": 2, "reason": "Error"}} if phase_name == "Failed" else {}
        view = parse_pod(raw_pod(phase_name, state))
        assert view is not None
        (event,) = node_events("prod", meta, view)
        assert isinstance(event, kind)
    pending = parse_pod(raw_pod("Pending"))
    assert pending is not None
    assert node_events("prod", meta, pending) == []
    failed = parse_pod(raw_pod("Failed", {"terminated": {"exitCode": 2, "reason": "Error"}}))
    assert failed is not None
    (event,) = node_events("prod", meta, failed)
    assert isinstance(event, NodeFailed)
    assert (event.exit_code, event.reason) == (2, "Error")


def test_job_events_follow_the_outcome() -> None:
    j = job(1)
    done = [pod(0, "Succeeded")]
    kinds = [e.type for e in job_events("prod", j, done, outcome(j, done))]
    assert kinds == ["job.completed"]
    kinds = [e.type for e in job_events("prod", j, [pod(0)], outcome(j, [pod(0)]))]
    assert kinds == ["job.started"]


def test_the_pod_manifest_carries_identity_resources_and_owner() -> None:
    manifest = pod_manifest(job(2), NewPod("worker", 1, 4, Resources(2500, GiB, 1)), "prod")
    assert manifest["metadata"]["name"] == "j-worker-4"
    labels = manifest["metadata"]["labels"]
    assert (labels["dlrover-events.io/rank"], labels["dlrover-events.io/index"]) == ("1", "4")
    (container,) = manifest["spec"]["containers"]
    expected = {"cpu": "2500m", "memory": str(GiB), "nvidia.com/gpu": "1"}
    assert container["resources"] == {"requests": expected, "limits": expected}
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["DLROVER_EVENTS_JOB_ID"] == UID
    assert env["DLROVER_EVENTS_RANK"] == "1"
    assert env["DLROVER_EVENTS_WORLD_SIZE"] == "2"
    assert manifest["metadata"]["ownerReferences"][0]["uid"] == UID
    assert manifest["spec"]["restartPolicy"] == "Never"


# -- adapters and the CLI's plan ids ----------------------------------------------------


def test_only_working_adapters_are_registered() -> None:
    assert dict(ADAPTERS) == {"TrainingJob": TRAINING_JOB, "PyTorchJob": PYTORCH_JOB}
    assert adapter_for("PyTorchJob") is PYTORCH_JOB
    with pytest.raises(
        UserError, match="unknown workload kind 'TFJob'; known: PyTorchJob, TrainingJob"
    ):
        adapter_for("TFJob")


def test_a_scale_request_has_one_plan_id_per_job_version() -> None:
    same = scale_plan_id(UID, 3, "worker", 4)
    assert same == scale_plan_id(UID, 3, "worker", 4)
    assert same != scale_plan_id(UID, 4, "worker", 4)
    assert same != scale_plan_id(UID, 3, "worker", 5)


def test_a_brains_plan_names_the_nodes_its_count_adds_or_removes_not_more() -> None:
    """The brain's planner says the role's new count and names the nodes that make the
    difference (as DLRover's ScalePlan does): 2 -> 3 launching worker-2 is three replicas,
    and 3 -> 2 removing worker-1 is two, worker-1 going first."""
    j = job(2)
    pods = [pod(0), pod(1)]
    grow = plan(node_group_resources=group(3), launch_nodes=[Node(type="worker", id=2)])
    change = plan_change(j, pods, grow)
    assert job_patch(j, change.change)["spec"]["roles"]["worker"]["replicas"] == 3
    assert "worker 2->3" in change.summary

    j3, pods3 = job(3), [pod(0), pod(1), pod(2)]
    shrink = plan(node_group_resources=group(2), remove_nodes=[NodeRef(type="worker", id=1)])
    patch = patched(j3, shrink, pods3)
    assert patch["spec"]["roles"]["worker"]["replicas"] == 2
    assert diff(applied(j3, patch), pods3).delete == ("j-worker-1",)
