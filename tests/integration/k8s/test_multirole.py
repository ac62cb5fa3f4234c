"""Jobs of several roles (issue 40) on the real kube-apiserver v1.20.2: a Service per role
and every pod under it at its rank's name, the peers each pod is told (variables, a
downward-API file kept current across a scale, TF_CONFIG for the PS example), roles that
start after the coordinator is ready, job volumes that reach the pods (the CRD keeps
them), and the job's status per role. The test plays kubelet (conftest's loop)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]
from kubernetes_asyncio import client

from dlrover_events.bus.producer import Producer
from handlers.operator.kube.pods import ANN_PEERS
from handlers.operator.kube.trainingjob import PEERS_FILE
from schemas.plans import NodeGroupResource

from .kube import GROUP, PLURAL, VERSION
from .test_reconciler_support import Cluster, role, until

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"


def env_of(container: Any) -> dict[str, str]:
    return {e.name: e.value for e in container.env or []}


async def test_every_role_gets_its_service_peers_volumes_and_order(
    cluster: Cluster, env: str, settings: Any
) -> None:
    await cluster.start(env)
    loop = cluster.kubelet_loop  # type: ignore[attr-defined]
    name = "rl"
    loop.hold.add(f"{name}-coordinator-0")  # its pod stays Pending, not ready, until let go
    roles = {
        "coordinator": role(1, port=9000, scales=["collector"]),
        "collector": role(
            2,
            minReplicas=1,
            maxReplicas=4,
            restartPolicy="OnFailure",
            startAfter=["coordinator"],
            volumes=[{"name": "replay", "mountPath": "/replay", "readOnly": True}],
        ),
        "learner": role(
            1, startAfter=["coordinator"], volumes=[{"name": "replay", "mountPath": "/replay"}]
        ),
    }
    volumes = [{"name": "replay", "persistentVolumeClaim": {"claimName": "replay"}}]
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "roles": roles,
            "volumes": volumes,
        },
    }
    await client.CustomObjectsApi(cluster.api).create_namespaced_custom_object(
        GROUP, VERSION, cluster.namespace, PLURAL, body
    )
    # the CRD keeps what the operator reads (a schema without them pruned them silently)
    kept = await cluster.kube.get_job(name)
    assert kept is not None
    assert kept["spec"]["volumes"] == volumes
    spec_roles = kept["spec"]["roles"]
    assert spec_roles["collector"]["startAfter"] == ["coordinator"]
    assert spec_roles["collector"]["volumes"] == roles["collector"]["volumes"]
    assert (spec_roles["coordinator"]["port"], spec_roles["coordinator"]["scales"]) == (
        9000,
        ["collector"],
    )

    # the coordinator first: while it is not ready, no other role has a pod
    async def looked_at() -> Any:
        job = await cluster.job(name)
        seen = job.status.roles if job is not None and job.status is not None else {}
        return seen if seen.get("coordinator", {}).get("pending") == 1 else None

    await until(looked_at, "the job's status with its coordinator pending")
    assert [p.role for p in await cluster.pods(name)] == ["coordinator"]
    coordinator = await cluster.raw_pod(f"{name}-coordinator-0")
    (main,) = coordinator.spec.containers
    assert main.readiness_probe is not None  # others wait for it: the SDK's ready file
    loop.hold.discard(f"{name}-coordinator-0")

    async def all_running() -> Any:
        pods = await cluster.pods(name)
        ok = len(pods) == 4 and all(p.running for p in pods)
        return pods if ok else None

    await until(all_running, "every role's pods running")

    # a headless Service per role, each pod its rank's name under it
    services = await client.CoreV1Api(cluster.api).list_namespaced_service(
        cluster.namespace, label_selector=f"dlrover-events.io/job={name}"
    )
    by_name = {s.metadata.name: s for s in services.items}
    assert set(by_name) == {"rl-coordinator", "rl-collector", "rl-learner"}
    for role_name in ("coordinator", "collector", "learner"):
        svc = by_name[f"rl-{role_name}"]
        assert svc.spec.cluster_ip == "None" and svc.spec.publish_not_ready_addresses
        assert svc.spec.selector["dlrover-events.io/role"] == role_name
    assert by_name["rl-coordinator"].spec.ports[0].port == 9000
    ns = cluster.namespace
    collector = await cluster.raw_pod(f"{name}-collector-1")
    assert (collector.spec.hostname, collector.spec.subdomain) == ("collector-1", "rl-collector")
    (container,) = collector.spec.containers
    variables = env_of(container)
    assert (
        variables["DLROVER_EVENTS_PEERS_COORDINATOR"]
        == f"coordinator-0.rl-coordinator.{ns}.svc:9000"
    )
    assert variables["DLROVER_EVENTS_PEERS_COLLECTOR"] == ",".join(
        f"collector-{r}.rl-collector.{ns}.svc:2222" for r in (0, 1)
    )
    assert variables["DLROVER_EVENTS_ADDRESS"] == f"collector-1.rl-collector.{ns}.svc:2222"
    assert variables["DLROVER_EVENTS_PEERS_FILE"] == PEERS_FILE
    assert variables["DLROVER_EVENTS_VOLUME_REPLAY"] == "/replay"
    # the job's volume, mounted where the role says; the peers file as a downward-API one
    pod_volumes = {v.name: v for v in collector.spec.volumes}
    assert pod_volumes["replay"].persistent_volume_claim.claim_name == "replay"
    mounts = {m.name: m for m in container.volume_mounts}
    assert (mounts["replay"].mount_path, mounts["replay"].read_only) == ("/replay", True)
    peers_volume = pod_volumes["dlrover-events-peers"].downward_api.items[0]
    assert peers_volume.field_ref.field_path == f"metadata.annotations['{ANN_PEERS}']"
    assert "replay" not in {v.name for v in coordinator.spec.volumes or []}

    # the coordinator's scale (here as its plan): every pod's peers file follows
    job = await cluster.job(name)
    assert job is not None
    async with Producer(settings) as producer:
        await producer.publish(
            cluster.plan(
                env,
                await cluster.meta(name),
                "collectors-4",
                node_group_resources={"collector": NodeGroupResource(count=4)},
            )
        )

    async def told_of_four() -> Any:
        pod = await cluster.raw_pod(f"{name}-learner-0")
        doc = json.loads(pod.metadata.annotations.get(ANN_PEERS) or "{}")
        addresses = doc.get("roles", {}).get("collector", {}).get("addresses", [])
        return addresses if len(addresses) == 4 else None

    addresses = await until(told_of_four, "the learner's peers file with 4 collectors")
    assert addresses[3] == f"collector-3.rl-collector.{ns}.svc:2222"

    # status per role, as kubectl describe shows it
    async def six_running() -> Any:
        got = await cluster.job(name)
        seen = got.status.roles if got is not None and got.status is not None else {}
        return seen if seen.get("collector", {}).get("running") == 4 else None

    seen = await until(six_running, "the status of 4 running collectors")
    assert seen["coordinator"]["running"] == 1 and seen["learner"]["running"] == 1

    # a collector's pod killed: replaced under a new name, at its rank's address
    await loop.kubelet.terminated(ns, f"{name}-collector-1", exit_code=137, reason="Error")

    async def replaced() -> Any:
        pods = await cluster.pods(name, role="collector")
        again = [p for p in pods if p.rank == 1 and p.index > 1 and p.running]
        return again[0] if again else None

    again = await until(replaced, "a new pod of collector 1")
    pod = await cluster.raw_pod(again.name)
    assert (pod.spec.hostname, pod.spec.subdomain) == ("collector-1", "rl-collector")
    assert (
        env_of(pod.spec.containers[0])["DLROVER_EVENTS_ADDRESS"]
        == variables["DLROVER_EVENTS_ADDRESS"]
    )


async def test_the_ps_example_gets_tf_config(cluster: Cluster, env: str) -> None:
    await cluster.start(env)
    body = yaml.safe_load((DEPLOY / "examples" / "trainingjob-ps.yaml").read_text())
    body["spec"]["roles"]["worker"]["replicas"] = 3  # the example's 8 workers, fewer
    name = body["metadata"]["name"]
    await client.CustomObjectsApi(cluster.api).create_namespaced_custom_object(
        GROUP, VERSION, cluster.namespace, PLURAL, body
    )

    async def five() -> Any:
        pods = await cluster.pods(name)
        return pods if len(pods) == 5 else None

    await until(five, "2 ps and 3 worker pods")
    ns = cluster.namespace
    for pod_name, task in ((f"{name}-worker-1", ("worker", 1)), (f"{name}-ps-0", ("ps", 0))):
        (container,) = (await cluster.raw_pod(pod_name)).spec.containers
        config = json.loads(env_of(container)["TF_CONFIG"])
        assert config["task"] == {"type": task[0], "index": task[1]}
        assert config["cluster"] == {
            "ps": [f"ps-{r}.{name}-ps.{ns}.svc:2222" for r in range(2)],
            "worker": [f"worker-{r}.{name}-worker.{ns}.svc:2222" for r in range(3)],
        }
