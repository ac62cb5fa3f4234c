"""What a TrainingJob's pods and Services are on a cluster, pure: the rendezvous Service
of an elastic role, grace periods, GPU count/type/memory, and the job's identity."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from handlers.operator.document.quantity import GPU, resources_from_spec
from handlers.operator.document.trainingjob import (
    UNSUPPORTED,
    job_patch,
    parse_job,
    plan_not_applied,
)
from handlers.operator.kube.pods import ANN_CONTAINER, ANN_GPU_TYPE, parse_pod
from handlers.operator.kube.trainingjob import (
    DEFAULT_GPU_TYPE_LABEL,
    TRAINING_JOB,
    host_selector,
    pod_manifest,
    rendezvous_service,
    rendezvous_services,
    service_changes,
)
from handlers.operator.platform.bodies import NewPod, PlatformCapabilities, Resources
from handlers.operator.platform.errors import InvalidJob
from handlers.operator.reconcile.events import job_meta
from handlers.operator.reconcile.planning import DEFAULT_GRACE_S, grace_seconds, plan_change
from schemas.jobs import NodeRef
from schemas.plans import MigrateNode, NodeResource
from tests.unit.operator.reconcile.test_planning import UID, GiB, group, job, job_obj, plan, pod

ELASTIC = {"elastic": {"command": ["python", "train.py"], "rendezvousPort": 29500}}
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
TWO_CONTAINERS = {
    "spec": {
        "terminationGracePeriodSeconds": 90,
        "nodeSelector": {"pool": "train"},
        "containers": [
            {"name": "sidecar", "image": "s:1", "resources": {"limits": {"cpu": "100m"}}},
            {
                "name": "trainer",
                "image": "t:1",
                "command": ["python", "train.py"],
                "resources": {"limits": {"ephemeral-storage": "1Gi"}},
            },
        ],
    }
}


def manifest(obj: dict[str, Any], rank: int = 0, **kw: Any) -> dict[str, Any]:
    j = parse_job(obj)
    res = j.roles["worker"].resources
    return pod_manifest(j, NewPod("worker", rank, rank, res), "prod", **kw)


# -- the rendezvous Service ---------------------------------------------------------------


def test_an_elastic_role_gets_a_headless_service_resolving_to_its_host_pod() -> None:
    obj = job_obj(3, **ELASTIC)
    j = parse_job(obj)
    (svc,) = rendezvous_services(j)
    assert svc["metadata"]["name"] == "j-worker-rdzv" == rendezvous_service(j, "worker")
    assert svc["metadata"]["ownerReferences"][0]["uid"] == UID
    spec = svc["spec"]
    assert spec["clusterIP"] == "None" and spec["publishNotReadyAddresses"] is True
    assert spec["ports"][0]["port"] == 29500
    # the selector picks the host pod of this job's role, and no other pod of the job
    host, other = manifest(obj, 0), manifest(obj, 1)
    selector = spec["selector"]
    assert selector == host_selector(j, "worker", 0)
    assert selector.items() <= host["metadata"]["labels"].items()
    assert not selector.items() <= other["metadata"]["labels"].items()
    # the pods rendezvous there; rank 0 binds the store
    assert "--rdzv-endpoint=j-worker-rdzv:29500" in host["spec"]["containers"][0]["command"]
    assert rendezvous_services(job(2)) == []
    assert TRAINING_JOB.services(j, rendezvous_host="127.0.0.1") == []


@pytest.mark.parametrize("name", ["a" * 80, "team.vision.resnet", "9lives"])
def test_a_service_name_is_a_dns_label_whatever_the_jobs_name(name: str) -> None:
    obj = job_obj(2, **ELASTIC)
    obj["metadata"]["name"] = name
    j = parse_job(obj)
    got = rendezvous_service(j, "worker")
    assert len(got) <= 63 and DNS_1035.match(got), got
    assert got == rendezvous_service(j, "worker")  # stable
    assert got != rendezvous_service(j, "ps")


def test_services_are_replaced_when_another_job_or_selector_owns_the_name() -> None:
    obj = job_obj(2, **ELASTIC)
    (wanted,) = rendezvous_services(parse_job(obj))
    assert service_changes([wanted], [wanted]).create == ()
    fresh = service_changes([wanted], [])
    assert fresh.create == (wanted,) and fresh.delete == ()
    old = copy.deepcopy(wanted)
    old["metadata"]["ownerReferences"][0]["uid"] = "an-earlier-job"
    replaced = service_changes([wanted], [old])
    assert replaced.delete == ("j-worker-rdzv",) and replaced.create == (wanted,)
    stray = {**copy.deepcopy(wanted), "metadata": {"name": "j-ps-rdzv"}}
    assert service_changes([wanted], [wanted, stray]).delete == ("j-ps-rdzv",)


# -- grace periods ------------------------------------------------------------------------


def test_a_removed_pod_gets_its_templates_grace_period_or_the_default() -> None:
    assert grace_seconds(job(2), pod(1)) == DEFAULT_GRACE_S
    assert grace_seconds(job(2, template=TWO_CONTAINERS), pod(1)) == 90
    assert grace_seconds(job(2), pod(1, uid="an-earlier-job")) is None


# -- GPUs ---------------------------------------------------------------------------------


def test_resources_go_on_the_roles_container_merged_over_its_template() -> None:
    obj = job_obj(2, container="trainer", template=TWO_CONTAINERS)
    obj["spec"]["roles"]["worker"]["resources"][GPU] = 1
    got = manifest(obj)
    sidecar, trainer = got["spec"]["containers"]
    assert sidecar["resources"] == {"limits": {"cpu": "100m"}}
    assert trainer["resources"]["limits"] == {
        "ephemeral-storage": "1Gi",
        "cpu": "2",
        "memory": str(4 * GiB),
        GPU: "1",
    }
    assert trainer["resources"]["requests"] == {"cpu": "2", "memory": str(4 * GiB), GPU: "1"}
    assert got["metadata"]["annotations"][ANN_CONTAINER] == "trainer"
    parsed = parse_pod({**got, "metadata": {**got["metadata"], "uid": "p"}})
    assert parsed is not None and parsed.resources.gpu == 1
    with pytest.raises(InvalidJob, match="container 'nope' is not in its template"):
        parse_job(job_obj(2, container="nope"))


def test_a_gpu_type_is_a_node_selector_on_the_configured_label_only() -> None:
    obj = job_obj(2, template=TWO_CONTAINERS)
    obj["spec"]["roles"]["worker"]["resources"]["gpuType"] = "NVIDIA-A100"
    got = manifest(obj, gpu_type_label=DEFAULT_GPU_TYPE_LABEL)
    assert got["spec"]["nodeSelector"] == {"pool": "train", DEFAULT_GPU_TYPE_LABEL: "NVIDIA-A100"}
    assert "gpuType" not in got["spec"]["containers"][0]["resources"]["limits"]
    parsed = parse_pod({**got, "metadata": {**got["metadata"], "uid": "p"}})
    assert parsed is not None and parsed.resources.gpu_type == "NVIDIA-A100"
    assert ANN_GPU_TYPE not in manifest(obj)["metadata"]["annotations"]
    assert manifest(obj)["spec"]["nodeSelector"] == {"pool": "train"}


def test_a_plans_gpu_type_applies_with_the_label_and_gpu_memory_never() -> None:
    p = plan(node_group_resources=group(3, gpu_num=2, gpu_type="NVIDIA-H100", gpu_memory=GiB))
    change = plan_change(job(2), [pod(0), pod(1)], p, PlatformCapabilities(gpu_types=True))
    assert job_patch(job(2), change.change)["spec"]["roles"]["worker"]["resources"] == {
        "cpu": 2,
        "memory": 4 * GiB,
        GPU: 2,
        "gpuType": "NVIDIA-H100",
    }
    adapter = TRAINING_JOB.configured(gpu_type_label=DEFAULT_GPU_TYPE_LABEL)
    assert adapter.plan_change(job(2), [pod(0), pod(1)], p) == change
    not_applied = adapter.plan_not_applied(p)
    assert [(n.part, n.reason) for n in not_applied] == [
        ("worker.gpu_memory", UNSUPPORTED["gpu_memory"])
    ]
    assert "cannot request GPU memory" in UNSUPPORTED["gpu_memory"]
    assert plan_not_applied(p, gpu_types=True) == not_applied
    assert {n.part for n in TRAINING_JOB.plan_not_applied(p)} == {
        "worker.gpu_type",
        "worker.gpu_memory",
    }
    move = plan(
        migrate_nodes=[
            MigrateNode(node=NodeRef(type="worker", id=1), resource=NodeResource(gpu_type="X"))
        ]
    )
    moved = plan_change(job(2), [pod(0), pod(1)], move, PlatformCapabilities(gpu_types=True))
    assert moved.change.node_resources["worker"][1].gpu_type == "X"
    assert adapter.plan_not_applied(move) == ()
    assert resources_from_spec({"gpuType": "X"}).covers(Resources(gpu_type="X"))
    assert not Resources().covers(Resources(gpu_type="X"))


# -- who the job is -----------------------------------------------------------------------


def test_the_jobs_identity_labels_are_its_meta_and_its_pods_variables() -> None:
    obj = job_obj(2, **ELASTIC)
    obj["metadata"]["labels"] = {
        "dlrover-events.io/user": "alice",
        "dlrover-events.io/group": "vision",
        "dlrover-events.io/cluster": "gpu-a",
        "dlrover-events.io/scenario": "resnet",
        "team": "speech",
    }
    meta = job_meta(parse_job(obj))
    assert (meta.user, meta.group, meta.cluster, meta.scenario, meta.app) == (
        "alice",
        "vision",
        "gpu-a",
        "resnet",
        "",
    )
    variables = {e["name"]: e["value"] for e in manifest(obj)["spec"]["containers"][0]["env"]}
    assert variables["DLROVER_EVENTS_USER"] == "alice"
    assert variables["DLROVER_EVENTS_SCENARIO"] == "resnet"
    assert "DLROVER_EVENTS_APP" not in variables
    assert "team=speech" in variables["DLROVER_EVENTS_LABELS"].split(",")
    assert "DLROVER_EVENTS_WORLD_SIZE" not in variables  # elastic: torchrun says it
