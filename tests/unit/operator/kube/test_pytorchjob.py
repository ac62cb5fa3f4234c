"""The PyTorchJob adapter's pure parts: a PyTorchJob and the training-operator's pods as
the decisions see them, and plans as patches the training-operator can carry out. Objects
are built by hand, as the API would send them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from handlers.operator.document.trainingjob import ANN_PLANS
from handlers.operator.kube.adapter import PodCreatingAdapter
from handlers.operator.kube.adapters import adapter_for
from handlers.operator.kube.pytorchjob import (
    LABEL_JOB_NAME,
    LABEL_OPERATOR_NAME,
    LABEL_REPLICA_INDEX,
    LABEL_REPLICA_TYPE,
    LATER_PODS,
    OPERATOR_NAME,
    PYTORCH_JOB,
    UNSUPPORTED,
    parse_pytorch_pod,
    parse_pytorchjob,
)
from handlers.operator.kube.runner import kube_settings
from handlers.operator.platform.bodies import (
    FAILED,
    PENDING,
    RUNNING,
    SUCCEEDED,
    JobSpecChange,
    JobView,
    OperatorJobStatus,
    PlanChange,
    Resources,
)
from handlers.operator.platform.errors import Invalid, InvalidJob, PlanRejected
from handlers.operator.reconcile.events import job_meta, node_events
from schemas.jobs import NodeFailed, NodeRef, NodeStarted
from schemas.plan_parts import AWAITING_JOB
from schemas.plans import MigrateNode, Node, NodeGroupResource, NodeResource, ScalePlan

GiB = 2**30
UID = "ptj-uid"


def container(name: str = "pytorch", **resources: Any) -> dict[str, Any]:
    return {
        "name": name,
        "image": "echo:1",
        "resources": {"limits": {"cpu": "2", "memory": "4Gi", **resources}},
    }


def replica(replicas: int, *containers: dict[str, Any]) -> dict[str, Any]:
    return {
        "replicas": replicas,
        "restartPolicy": "OnFailure",
        "template": {"spec": {"containers": list(containers) or [container()]}},
    }


def ptj(
    workers: int = 2,
    *,
    policy: dict[str, Any] | None = None,
    master: int | None = None,
    conditions: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    worker: dict[str, Any] | None = None,
) -> dict[str, Any]:
    specs: dict[str, Any] = {"Worker": worker or replica(workers)}
    if master is not None:
        specs["Master"] = replica(master)
    spec: dict[str, Any] = {"pytorchReplicaSpecs": specs}
    if policy is not None:
        spec["elasticPolicy"] = policy
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": UID,
            "resourceVersion": "11",
            "generation": 2,
            "annotations": annotations or {},
        },
        "spec": spec,
        "status": {"conditions": conditions or []},
    }


ELASTIC = {"rdzvBackend": "c10d", "minReplicas": 1, "maxReplicas": 4, "maxRestarts": 50}


def elastic(workers: int = 2, **kw: Any) -> Any:
    return parse_pytorchjob(ptj(workers, policy=dict(ELASTIC), **kw))


def pod(
    index: int,
    *,
    role: str = "worker",
    phase: str = "Running",
    operator: str = OPERATOR_NAME,
    owner: str = UID,
    terminated: dict[str, Any] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if terminated is not None:
        status["containerStatuses"] = [{"name": "pytorch", "state": {"terminated": terminated}}]
    return {
        "metadata": {
            "name": f"p-{role}-{index}",
            "uid": f"pod-{role}-{index}",
            "labels": {
                LABEL_OPERATOR_NAME: operator,
                LABEL_JOB_NAME: "p",
                LABEL_REPLICA_TYPE: role,
                LABEL_REPLICA_INDEX: str(index),
            },
            "ownerReferences": [
                {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": "PyTorchJob",
                    "name": "p",
                    "uid": owner,
                    "controller": True,
                }
            ],
        },
        "spec": {"containers": [container()], "nodeName": "n1"},
        "status": status,
    }


def pods(n: int) -> list[Any]:
    return [parse_pytorch_pod(pod(i)) for i in range(n)]


def plan(**fields: Any) -> ScalePlan:
    job = elastic()
    return ScalePlan(env="prod", job=job_meta(job), source="t", plan_id="p1", **fields)


def workers(n: int, **resource: Any) -> dict[str, NodeGroupResource]:
    return {"worker": NodeGroupResource(count=n, node_resource=NodeResource(**resource))}


# -- the job -----------------------------------------------------------------------------


def test_worker_and_master_roles_with_the_elastic_policys_bounds() -> None:
    job = elastic(2, master=1, annotations={ANN_PLANS: json.dumps(["a", "b"])})
    assert set(job.roles) == {"worker", "master"}
    worker, master = job.roles["worker"], job.roles["master"]
    assert (worker.replicas, worker.min_replicas, worker.max_replicas) == (2, 1, 4)
    assert worker.resources == Resources(cpu_milli=2000, memory=4 * GiB)
    assert worker.elastic is not None
    assert (worker.elastic.host_rank, worker.elastic.max_restarts) == (0, 50)
    # Master keeps its size: only Worker is elastic.
    assert (master.replicas, master.min_replicas, master.max_replicas) == (1, 1, 1)
    assert master.elastic is None
    assert job.applied_plans == ("a", "b")
    assert job.last_plan_id == "b"
    assert (job.uid, job.resource_version, job.phase) == (UID, "11", PENDING)


@pytest.mark.parametrize(
    ("policy", "bounds"),
    [
        ({"maxReplicas": 5}, (5, 5)),
        ({"minReplicas": 2}, (2, 2)),
        ({}, (3, 3)),
        (None, (3, 3)),
    ],
)
def test_bounds_default_as_the_training_operator_defaults_them(
    policy: dict[str, Any] | None, bounds: tuple[int, int]
) -> None:
    worker = parse_pytorchjob(ptj(3, policy=policy)).roles["worker"]
    assert (worker.min_replicas, worker.max_replicas) == bounds
    assert (worker.elastic is None) == (policy is None)


def test_a_rendezvous_elsewhere_leaves_no_worker_hosting_it() -> None:
    job = parse_pytorchjob(ptj(2, policy={**ELASTIC, "rdzvHost": "etcd.infra"}))
    assert job.roles["worker"].elastic is not None
    assert job.roles["worker"].elastic.host_rank == -1


@pytest.mark.parametrize(
    ("conditions", "phase"),
    [
        ([], PENDING),
        ([{"type": "Created", "status": "True"}], PENDING),
        ([{"type": "Created", "status": "True"}, {"type": "Running", "status": "True"}], RUNNING),
        (
            [{"type": "Running", "status": "False"}, {"type": "Restarting", "status": "True"}],
            "Restarting",
        ),
        (
            [{"type": "Running", "status": "False"}, {"type": "Succeeded", "status": "True"}],
            SUCCEEDED,
        ),
        ([{"type": "Running", "status": "True"}, {"type": "Failed", "status": "True"}], FAILED),
    ],
)
def test_the_phase_is_the_training_operators_conditions(
    conditions: list[dict[str, Any]], phase: str
) -> None:
    assert parse_pytorchjob(ptj(conditions=conditions)).phase == phase


def test_the_outcome_comes_from_the_conditions_not_the_pods() -> None:
    done = [
        {
            "type": "Succeeded",
            "status": "True",
            "message": "PyTorchJob p is successfully completed.",
        }
    ]
    job = elastic(conditions=done)
    all_failed = [parse_pytorch_pod(pod(i, phase="Failed")) for i in range(2)]
    assert PYTORCH_JOB.outcome(job, [p for p in all_failed if p]) == (
        SUCCEEDED,
        "PyTorchJob p is successfully completed.",
    )
    failed = elastic(conditions=[{"type": "Failed", "status": "True", "message": "backoff limit"}])
    assert PYTORCH_JOB.outcome(failed, []) == (FAILED, "backoff limit")
    running = elastic(conditions=[{"type": "Running", "status": "True"}])
    assert PYTORCH_JOB.outcome(running, []) == (None, "")


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"spec": {"pytorchReplicaSpecs": {"Chief": replica(1)}}}, "replica type Chief"),
        ({"spec": {"pytorchReplicaSpecs": {}}}, "no Master or Worker"),
        (ptj(2, policy={"minReplicas": 3, "maxReplicas": 2}), "minReplicas 3 > maxReplicas 2"),
        (ptj(worker={"replicas": 1, "template": {"spec": {"containers": []}}}), "no containers"),
        (ptj(annotations={ANN_PLANS: "{oops"}), "not a JSON list"),
    ],
)
def test_what_the_decisions_cannot_use_is_an_invalid_job(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidJob, match=message):
        parse_pytorchjob(obj)


# -- pods --------------------------------------------------------------------------------


def test_the_training_operators_pods_are_the_jobs_nodes() -> None:
    got = parse_pytorch_pod(pod(2))
    assert got is not None
    assert (got.name, got.job, got.job_uid, got.role, got.rank, got.index) == (
        "p-worker-2",
        "p",
        UID,
        "worker",
        2,
        2,
    )
    assert got.running
    assert got.resources == Resources(cpu_milli=2000, memory=4 * GiB)
    master = parse_pytorch_pod(pod(0, role="master"))
    assert master is not None
    assert (master.role, master.rank) == ("master", 0)


def test_pods_of_other_controllers_or_without_the_labels_are_not_nodes() -> None:
    assert parse_pytorch_pod(pod(0, operator="tfjob-controller")) is None
    unlabelled = pod(0)
    del unlabelled["metadata"]["labels"][LABEL_REPLICA_INDEX]
    assert parse_pytorch_pod(unlabelled) is None
    assert parse_pytorch_pod(pod(0, role="launcher")) is None
    assert parse_pytorch_pod({"metadata": {"name": "x"}}) is None


def test_a_pods_state_becomes_a_node_event() -> None:
    job = elastic()
    meta = job_meta(job)
    running = parse_pytorch_pod(pod(1))
    assert running is not None
    (started,) = node_events("prod", meta, running)
    assert isinstance(started, NodeStarted)
    assert started.node == NodeRef(type="worker", id=1, name="p-worker-1")
    ended = parse_pytorch_pod(pod(1, phase="Failed", terminated={"exitCode": 3, "reason": "Error"}))
    assert ended is not None
    (failed,) = node_events("prod", meta, ended)
    assert isinstance(failed, NodeFailed)
    assert (failed.exit_code, failed.reason, failed.job.uuid) == (3, "Error", UID)


def test_the_selectors_are_the_training_operators_labels() -> None:
    assert PYTORCH_JOB.pod_selector() == f"{LABEL_OPERATOR_NAME}={OPERATOR_NAME},{LABEL_JOB_NAME}"
    assert PYTORCH_JOB.job_pod_selector("p") == (
        f"{LABEL_OPERATOR_NAME}={OPERATOR_NAME},{LABEL_JOB_NAME}=p"
    )


def patch_of(job: JobView, change: PlanChange) -> dict[str, Any]:
    """The change as the PyTorchJob's merge patch (what KubeCluster writes)."""
    return PYTORCH_JOB.job_patch(job, change.change)


def test_the_training_operator_owns_the_pods_and_the_status() -> None:
    assert PYTORCH_JOB.creates_pods is False
    status = OperatorJobStatus("Running", {"worker": {"running": 2}}, 1, last_plan_id="p1")
    assert PYTORCH_JOB.status_patch(status) is None
    # No pod manifest at all: the operator cannot make a PyTorchJob's pods.
    assert not isinstance(PYTORCH_JOB, PodCreatingAdapter)
    assert not hasattr(PYTORCH_JOB, "pod_manifest")


# -- plans -------------------------------------------------------------------------------


def test_a_plan_patches_the_worker_replicas_and_records_its_id() -> None:
    job = elastic(2, annotations={ANN_PLANS: json.dumps(["old"])})
    change = PYTORCH_JOB.plan_change(job, pods(2), plan(node_group_resources=workers(3)))
    assert patch_of(job, change) == {
        "metadata": {
            "resourceVersion": "11",
            "annotations": {ANN_PLANS: json.dumps(["old", "p1"])},
        },
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 3}}},
    }
    assert change.summary == "worker 2->3"
    assert PYTORCH_JOB.plan_not_applied(plan(node_group_resources=workers(3))) == ()


def test_launched_nodes_are_replicas_the_training_operator_adds() -> None:
    change = PYTORCH_JOB.plan_change(
        elastic(2),
        pods(2),
        plan(launch_nodes=[Node(type="worker", id=2), Node(type="worker", id=3)]),
    )
    assert patch_of(elastic(2), change)["spec"] == {
        "pytorchReplicaSpecs": {"Worker": {"replicas": 4}}
    }


@pytest.mark.parametrize(
    ("count", "message"),
    [(5, "role worker: 5 replicas, above maxReplicas 4"), (6, "above maxReplicas 4")],
)
def test_a_plan_above_the_elastic_policy_is_rejected(count: int, message: str) -> None:
    with pytest.raises(PlanRejected, match=message):
        PYTORCH_JOB.plan_change(elastic(2), pods(2), plan(node_group_resources=workers(count)))


def test_a_plan_below_the_elastic_policy_is_rejected() -> None:
    job = parse_pytorchjob(ptj(3, policy={"minReplicas": 2, "maxReplicas": 4}))
    with pytest.raises(PlanRejected, match="below minReplicas 2"):
        PYTORCH_JOB.plan_change(job, pods(3), plan(node_group_resources=workers(1)))


def test_without_an_elastic_policy_or_for_master_the_size_is_fixed() -> None:
    fixed = parse_pytorchjob(ptj(2))
    with pytest.raises(
        PlanRejected, match="cannot resize its Worker replicas: it has no elasticPolicy"
    ):
        PYTORCH_JOB.plan_change(fixed, pods(2), plan(node_group_resources=workers(3)))
    job = elastic(2, master=1)
    master = {"master": NodeGroupResource(count=2)}
    with pytest.raises(PlanRejected, match="cannot resize its Master replicas: only Worker"):
        PYTORCH_JOB.plan_change(job, pods(2), plan(node_group_resources=master))
    # The same count is no resize: a plan that only restates it applies.
    same = PYTORCH_JOB.plan_change(fixed, pods(2), plan(node_group_resources=workers(2)))
    assert "spec" not in patch_of(fixed, same)


def test_new_resources_go_into_the_template_for_the_pods_made_later() -> None:
    sidecar = {"name": "log", "image": "fluent:1", "resources": {"limits": {"cpu": "100m"}}}
    main = {
        "name": "pytorch",
        "image": "echo:1",
        "resources": {
            "requests": {"ephemeral-storage": "1Gi"},
            "limits": {"cpu": "2", "memory": "4Gi"},
        },
    }
    job = parse_pytorchjob(ptj(worker=replica(2, main, sidecar), policy=dict(ELASTIC)))
    change = PYTORCH_JOB.plan_change(
        job, pods(2), plan(node_group_resources=workers(2, memory=8 * GiB))
    )
    patch = patch_of(job, change)
    (first, second) = patch["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"][
        "containers"
    ]
    assert first["resources"] == {
        "requests": {"ephemeral-storage": "1Gi", "cpu": "2", "memory": str(8 * GiB)},
        "limits": {"cpu": "2", "memory": str(8 * GiB)},
    }
    assert second == sidecar
    assert "replicas" not in patch["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert change.notes == (LATER_PODS,)
    # the job's own template is not touched
    assert job.roles["worker"].template["spec"]["containers"][0] == main


def test_what_the_training_operator_cannot_do_is_rejected_with_why() -> None:
    job = elastic(3)
    three = pods(3)
    move = MigrateNode(node=NodeRef(type="worker", id=1), resource=NodeResource(memory=GiB))
    with pytest.raises(PlanRejected, match="cannot migrate worker-1: a PyTorchJob's pods"):
        PYTORCH_JOB.plan_change(job, three, plan(migrate_nodes=[move]))
    with pytest.raises(PlanRejected, match="highest replica indexes"):
        PYTORCH_JOB.plan_change(job, three, plan(remove_nodes=[NodeRef(type="worker", id=1)]))
    with pytest.raises(PlanRejected, match="rendezvous"):
        PYTORCH_JOB.plan_change(job, three, plan(remove_nodes=[NodeRef(type="worker", id=0)]))
    own = Node(type="worker", id=3, resource=NodeResource(memory=16 * GiB))
    with pytest.raises(PlanRejected, match="cannot have resources of its own"):
        PYTORCH_JOB.plan_change(job, three, plan(launch_nodes=[own]))
    # The highest index is the one the training-operator removes: that applies.
    change = PYTORCH_JOB.plan_change(job, three, plan(remove_nodes=[NodeRef(type="worker", id=2)]))
    patch = patch_of(job, change)
    assert patch["spec"] == {"pytorchReplicaSpecs": {"Worker": {"replicas": 2}}}
    assert set(patch["metadata"]["annotations"]) == {ANN_PLANS}


def test_a_change_that_gives_a_node_resources_of_its_own_is_invalid() -> None:
    """The port's change as the job's patch: resources of one node would be kept and never
    honoured (one template per replica type), so the change is refused; the ranks it
    removes first are not written (the training-operator removes the highest indexes)."""
    job = elastic(3)
    own = {"worker": {1: Resources(memory=GiB)}}
    with pytest.raises(Invalid, match="no node can have resources of its own"):
        PYTORCH_JOB.job_patch(job, JobSpecChange(job.resource_version, ("p1",), node_resources=own))
    removal = JobSpecChange(
        job.resource_version, ("p1",), replicas={"worker": 2}, remove_first={"worker": (2,)}
    )
    patch = PYTORCH_JOB.job_patch(job, removal)
    assert set(patch["metadata"]["annotations"]) == {ANN_PLANS}
    assert patch["spec"] == {"pytorchReplicaSpecs": {"Worker": {"replicas": 2}}}


def test_a_finished_job_takes_no_plan() -> None:
    done = elastic(conditions=[{"type": "Succeeded", "status": "True"}])
    with pytest.raises(PlanRejected, match="has succeeded"):
        PYTORCH_JOB.plan_change(done, pods(2), plan(node_group_resources=workers(3)))


def test_parts_a_pytorchjob_cannot_express_are_named_in_its_own_words() -> None:
    p = plan(node_group_resources=workers(3, gpu_memory=GiB), training={"local_batch_size": 8})
    change = PYTORCH_JOB.plan_change(elastic(2), pods(2), p)
    assert change.change.replicas == {"worker": 3}  # the rest applies
    parts = [(n.part, n.reason) for n in PYTORCH_JOB.plan_not_applied(p)]
    assert parts == [
        ("worker.gpu_memory", UNSUPPORTED["gpu_memory"]),
        ("training.local_batch_size", AWAITING_JOB),
    ]
    assert "PyTorchJob" in UNSUPPORTED["gpu_memory"]


def test_the_operator_is_started_for_pytorchjobs_by_its_workload_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert adapter_for(kube_settings({"workload": "PyTorchJob"}).workload) is PYTORCH_JOB
    monkeypatch.setenv("DLROVER_EVENTS_OPERATOR_WORKLOAD", "PyTorchJob")
    assert adapter_for(kube_settings({}).workload) is PYTORCH_JOB
