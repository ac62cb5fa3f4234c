"""An elastic role in place (``elastic.mode: inPlace``): what its spec may say, the pod it
gets (each agent standalone, the job's membership store in the workers' environment),
and the mode a ScaleResult reports for a plan."""

from __future__ import annotations

from typing import Any, get_args

import pytest
from pydantic import ValidationError

from dlrover_events.sdk.identity import (
    ELASTIC_EXPECT_ENV,
    ELASTIC_STORE_ENV,
    ELASTIC_STORE_HOST_ENV,
)
from handlers.operator.kube.runner import KubeSettings
from handlers.operator.kube.trainingjob import TRAINING_JOB, pod_manifest
from handlers.operator.platform.bodies import JobView, NewPod, Resources
from handlers.operator.platform.errors import InvalidJob
from handlers.operator.reconcile.launch import C10D, DLROVER_C10D
from handlers.operator.reconcile.planning import rescale_mode
from schemas.jobs import NodeRef
from schemas.plans import NodeGroupResource, RescaleMode

from .test_planning import job, plan


def elastic(mode: str | None = None, **more: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"command": ["python", "train.py"], "rendezvousPort": 29555, **more}
    if mode is not None:
        spec["mode"] = mode
    return {"elastic": spec}


def env_of(manifest: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in manifest["spec"]["containers"][0]["env"]}


def manifest(j: JobView, rank: int) -> dict[str, Any]:
    new = NewPod("worker", rank, rank, Resources())
    return pod_manifest(j, new, "prod", rendezvous_host="127.0.0.1")


def test_the_mode_and_spares_are_read_and_checked() -> None:
    policy = job(2, **elastic("inPlace", spares=2)).roles["worker"].elastic
    assert policy is not None and policy.in_place and policy.spares == 2
    restart = job(2, **elastic()).roles["worker"].elastic
    assert restart is not None and not restart.in_place and restart.mode == "restart"
    with pytest.raises(InvalidJob, match=r"elastic.mode must be one of restart, inPlace"):
        job(2, **elastic("sideways"))
    with pytest.raises(InvalidJob, match=r"elastic.spares must be 0..16"):
        job(2, **elastic("inPlace", spares=17))
    with pytest.raises(InvalidJob, match=r"elastic.spares needs elastic.mode inPlace"):
        job(2, **elastic("restart", spares=1))


def test_an_in_place_pod_runs_a_standalone_agent_and_knows_the_jobs_store() -> None:
    j = job(3, **elastic("inPlace", nprocPerNode=2, maxRestarts=7))
    host, other = manifest(j, 0), manifest(j, 2)
    command = other["spec"]["containers"][0]["command"]
    assert command[:2] == ["torchrun", "--standalone"]
    assert "--nproc-per-node=2" in command and "--max-restarts=7" in command
    assert not any(c.startswith("--rdzv") for c in command)
    assert command[-2:] == ["python", "train.py"]
    assert env_of(other)[ELASTIC_STORE_ENV] == "127.0.0.1:29555"
    assert env_of(other)[ELASTIC_EXPECT_ENV] == "6"  # 3 pods x 2 processes
    assert ELASTIC_STORE_HOST_ENV not in env_of(other)
    assert env_of(host)[ELASTIC_STORE_HOST_ENV] == "1"  # rank 0 hosts it


def test_a_restart_pod_stays_as_it_was() -> None:
    m = manifest(job(2, **elastic()), 1)
    command = m["spec"]["containers"][0]["command"]
    assert command[0] == "torchrun" and "--rdzv-backend=c10d" in command
    assert ELASTIC_STORE_ENV not in env_of(m)


def test_the_operators_setting_names_the_restart_pods_rendezvous_backend() -> None:
    assert set(get_args(KubeSettings.model_fields["rendezvous_backend"].annotation)) == {
        C10D,
        DLROVER_C10D,
    }
    conf = KubeSettings(rendezvous_backend="dlrover-c10d")
    adapter = TRAINING_JOB.configured(
        gpu_type_label=None, rendezvous_backend=conf.rendezvous_backend
    )
    j = job(2, **elastic())
    m = adapter.pod_manifest(j, NewPod("worker", 1, 1, Resources()), "prod")
    assert "--rdzv-backend=dlrover-c10d" in m["spec"]["containers"][0]["command"]
    with pytest.raises(ValidationError, match="rendezvous_backend"):
        KubeSettings(rendezvous_backend="etcd")


def test_the_result_says_how_the_processes_take_the_plan() -> None:
    count = plan(node_group_resources={"worker": NodeGroupResource(count=3)})
    assert rescale_mode(job(2, **elastic("inPlace")), count) is RescaleMode.IN_PLACE
    assert rescale_mode(job(2, **elastic()), count) is RescaleMode.RESTART
    assert rescale_mode(job(2), count) is None  # not elastic
    removed = plan(remove_nodes=[NodeRef(type="worker", id=1)])
    assert rescale_mode(job(2, **elastic("inPlace")), removed) is RescaleMode.IN_PLACE
    resources_only = plan(node_group_resources={"worker": NodeGroupResource()})
    assert rescale_mode(job(2, **elastic("inPlace")), resources_only) is None
