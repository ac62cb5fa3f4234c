"""A TrainingJob's success policy on the real kube-apiserver: a job of DI-engine's roles
(coordinator, collector, learner; none of worker, chief, master) reaches Succeeded and
says job.completed, by default once every pod succeeded, with spec.successPolicy once the
roles it names did. Before, such a job stayed Pending for ever once its pods had ended."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

from dlrover_events.settings import Settings
from schemas.jobs import JobCompleted
from tests.integration.tap import Tap

from .kube import GROUP, PLURAL, VERSION, FakeKubelet, unique_name
from .test_reconciler_support import Cluster, role, until

pytestmark = pytest.mark.integration


@pytest.fixture
async def tap(settings: Settings, env: str) -> AsyncIterator[Tap]:
    t = Tap(settings, env)
    await t.start()
    try:
        yield t
    finally:
        await t.stop()


DI_ROLES = {"coordinator": role(1), "collector": role(2), "learner": role(1)}


async def create(cluster: Cluster, spec: dict[str, Any]) -> str:
    name = unique_name("di")
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": spec,
    }
    await client.CustomObjectsApi(cluster.api).create_namespaced_custom_object(
        GROUP, VERSION, cluster.namespace, PLURAL, body
    )
    return name


async def running(cluster: Cluster, name: str, n: int) -> bool:
    pods = await cluster.pods(name)
    return len(pods) == n and all(p.running for p in pods)


async def phase_is(cluster: Cluster, name: str, want: str) -> str | None:
    job = await cluster.job(name)
    return job.phase if job is not None and job.phase == want else None


async def test_a_di_engine_job_succeeds_once_every_pod_did(
    cluster: Cluster, env: str, tap: Tap, kubelet: FakeKubelet, namespace: str
) -> None:
    await cluster.start(env)
    name = await create(cluster, {"roles": DI_ROLES})
    await until(lambda: running(cluster, name, 4), "4 running pods of the DI-engine job")
    pods = await cluster.pods(name)
    for pod in pods[:-1]:
        await kubelet.succeeded(namespace, pod.name)
    # one pod left running: the job runs on
    job = await until(lambda: phase_is(cluster, name, "Running"), "phase Running")
    assert job == "Running"
    await kubelet.succeeded(namespace, pods[-1].name)
    assert await until(lambda: phase_is(cluster, name, "Succeeded"), "phase Succeeded")
    got = await cluster.job(name)
    assert got is not None
    (done,) = await tap.until(lambda: tap.of(JobCompleted, got.uid), "job.completed")
    assert done.job.name == name
    assert got.status is not None and got.status.roles["collector"]["succeeded"] == 2


async def test_a_success_policy_ends_the_job_with_the_roles_it_names(
    cluster: Cluster, env: str, tap: Tap, kubelet: FakeKubelet, namespace: str
) -> None:
    await cluster.start(env)
    name = await create(cluster, {"roles": DI_ROLES, "successPolicy": {"roles": ["coordinator"]}})
    await until(lambda: running(cluster, name, 4), "4 running pods of the DI-engine job")
    await kubelet.succeeded(namespace, f"{name}-coordinator-0")
    assert await until(lambda: phase_is(cluster, name, "Succeeded"), "phase Succeeded")
    got = await cluster.job(name)
    assert got is not None and got.success_roles == ("coordinator",)
    await tap.until(lambda: tap.of(JobCompleted, got.uid), "job.completed")
    assert got.status is not None and got.status.roles["collector"]["running"] == 2


async def test_the_crd_refuses_a_success_policy_of_the_wrong_shape(cluster: Cluster) -> None:
    for policy in ({"roles": "coordinator"}, {"roles": []}):
        with pytest.raises(ApiException) as refused:
            await create(cluster, {"roles": DI_ROLES, "successPolicy": policy})
        assert refused.value.status == 422, refused.value.body
