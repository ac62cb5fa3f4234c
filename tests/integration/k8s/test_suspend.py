"""A cluster scheduler's queue, suspend and resume, and the cluster's capacity, on a real
kube-apiserver v1.20.2 with the session's broker and Postgres (issue 26).

There is no kubelet: the KubeletLoop plays it (binds, starts, and confirms a deletion
unless told to hold it), and records the grace period each deletion asked for. Plans are
published on the env's scale.plans as the brain would. Each test has its own namespace
and env; the operator killed mid-plan is cancelled at a StepHook point, as abruptly as a
process can be stopped from inside (test_reconciler.py does the same), and started again.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from dlrover_events.bus.producer import Producer
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from handlers.operator.document.trainingjob import ANN_PLANS
from handlers.operator.kube.client import KubeApi
from handlers.operator.kube.cluster import KubeCluster
from handlers.operator.kube.pytorchjob import PYTORCH_JOB
from handlers.operator.platform.bodies import KUEUE_QUEUE_LABEL, PRIORITY_LABEL, JobView
from handlers.operator.reconcile.events import job_meta
from handlers.operator.reconcile.reconciler import RESUMED
from schemas.cluster import CapacityReported, PlatformCapabilities
from schemas.jobs import JobSubmitted
from schemas.plans import NodeGroupResource, ScalePlan, ScaleResult, ScaleStatus
from tests.integration.tap import Tap

from . import test_pytorchjob as ptj
from .kube import GROUP, PLURAL, VERSION, create_node, merge_patch, unique_name
from .test_job_commands import JobCli, one_line_error
from .test_reconciler_support import Cluster, KubeletLoop, role, until

pytestmark = pytest.mark.integration

GRACE_S = 17
SCHEDULER = {"name": "goodput-cluster", "nodes": 1, "gpus_per_node": 4}


@pytest.fixture
async def tap(settings: Settings, env: str) -> AsyncIterator[Tap]:
    t = Tap(settings, env, ("job.events", "scale.results", "cluster.capacity"))
    await t.start()
    try:
        yield t
    finally:
        await t.stop()


@pytest.fixture
async def producer(settings: Settings) -> AsyncIterator[Producer]:
    async with Producer(settings) as p:
        yield p


def results(tap: Tap, plan_id: str) -> list[ScaleResult]:
    return [r for r in tap.of(ScaleResult) if r.plan_id == plan_id]


async def result_of(tap: Tap, plan_id: str) -> ScaleResult:
    (first, *_) = await tap.until(lambda: results(tap, plan_id), f"a result of {plan_id}")
    return first


def graced(replicas: int, **overrides: Any) -> dict[str, Any]:
    """A role whose pods have GRACE_S seconds to stop (their checkpoint's time)."""
    spec = {
        "terminationGracePeriodSeconds": GRACE_S,
        "containers": [{"name": "main", "image": "train:1.0"}],
    }
    return role(replicas, template={"spec": spec}, **overrides)


async def create(
    cluster: Cluster, roles: dict[str, Any], *, labels: dict[str, str] | None = None, **spec: Any
) -> str:
    name = unique_name("job")
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"roles": roles, **spec},
    }
    await client.CustomObjectsApi(cluster.api).create_namespaced_custom_object(
        GROUP, VERSION, cluster.namespace, PLURAL, body
    )
    return name


async def condition(cluster: Cluster, name: str) -> dict[str, Any] | None:
    obj = await cluster.kube.get_job(name)
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Suspended":
            return dict(cond)
    return None


async def said(cluster: Cluster, name: str, status: str, reason: str) -> dict[str, Any] | None:
    cond = await condition(cluster, name)
    ok = cond is not None and (cond["status"], cond["reason"]) == (status, reason)
    return cond if ok else None


async def job_of(cluster: Cluster, name: str) -> JobView:
    job = await cluster.job(name)
    assert job is not None, name
    return job


def count(plan_id: str, n: int, env: str, job: JobView) -> ScalePlan:
    return ScalePlan(
        env=env,
        job=job_meta(job),
        source="test",
        plan_id=plan_id,
        node_group_resources={"worker": NodeGroupResource(count=n)},
    )


def suspend(plan_id: str, env: str, job: JobView) -> ScalePlan:
    return ScalePlan(env=env, job=job_meta(job), source="test", plan_id=plan_id, suspend=True)


async def scheduler_on(settings: Settings, pg_dsn: str, env: str, on: bool = True) -> None:
    def edit(stored: dict[str, Any]) -> dict[str, Any]:
        brain = dict(stored.get("brain") or {})
        if on:
            brain["scheduler"] = SCHEDULER
        else:
            brain.pop("scheduler", None)
        return {**stored, "brain": brain}

    await EnvRegistry(settings, pg_dsn).change_settings(env, edit, reason="test")


# -- suspend and resume ------------------------------------------------------------------


async def test_suspend_deletes_the_pods_with_their_grace_and_keeps_the_job_resume_recreates(
    cluster: Cluster, env: str, tap: Tap, producer: Producer
) -> None:
    kubelet: KubeletLoop = cluster.kubelet_loop  # type: ignore[attr-defined]
    await cluster.start(env)
    name = await create(cluster, {"worker": graced(2)})
    before = await until(lambda: cluster.workers_running(name, 2), "2 running workers")
    job = await job_of(cluster, name)
    # The pods' containers take their time to stop: the plan must wait for them.
    kubelet.hold_deletion.update(p.name for p in before)
    await producer.publish(suspend("s1", env, job))

    async def all_deleting() -> list[Any] | None:
        pods = await cluster.all_pods(name)
        return pods if pods and all(p.deleting for p in pods) else None

    await until(all_deleting, "both pods being deleted")
    await asyncio.sleep(2)  # a result answered before the pods are gone would be out by now
    assert results(tap, "s1") == []
    assert {kubelet.graces[p.name] for p in before} == {GRACE_S}
    kubelet.hold_deletion.clear()
    result = await result_of(tap, "s1")
    assert result.status is ScaleStatus.APPLIED, result.reason
    assert result.reason.startswith("suspended")
    assert await cluster.all_pods(name) == []  # gone, not being deleted

    job = await job_of(cluster, name)
    assert job.suspended and job.roles["worker"].replicas == 2  # the job and its size kept
    cond = await until(lambda: said(cluster, name, "True", "Preempted"), "Suspended=True")
    assert "s1" in cond["message"] and cond.get("lastTransitionTime")
    await until(lambda: _phase(cluster, name, "Suspended"), "phase Suspended")
    await asyncio.sleep(2)  # a reconcile that made pods for it would have made them now
    assert await cluster.all_pods(name) == []

    await producer.publish(count("r1", 2, env, job))
    result = await result_of(tap, "r1")
    assert result.status is ScaleStatus.APPLIED, result.reason
    assert result.reason.startswith("resumed")
    assert sum(result.observed["worker"].values()) == 2  # back when answered
    pods = await until(lambda: cluster.workers_running(name, 2), "2 running workers again")
    assert sorted(p.rank for p in pods) == [0, 1]
    await until(lambda: said(cluster, name, "False", "Resumed"), "Suspended=False, Resumed")
    assert not (await job_of(cluster, name)).suspended


async def _phase(cluster: Cluster, name: str, phase: str) -> bool:
    obj = await cluster.kube.get_job(name)
    return ((obj or {}).get("status") or {}).get("phase") == phase


# -- the queue -------------------------------------------------------------------------


async def test_with_a_scheduler_jobs_are_created_suspended_and_run_once_admitted(
    settings: Settings,
    pg_dsn: str,
    cluster: Cluster,
    env: str,
    tap: Tap,
    producer: Producer,
) -> None:
    await scheduler_on(settings, pg_dsn, env)
    await cluster.start(env)
    labels = {PRIORITY_LABEL: "5", "dlrover-events.io/group": "vision"}
    batch = {"size": 256, "maxSize": 1024, "adaptive": True}
    name = await create(cluster, {"worker": graced(2)}, labels=labels, batch=batch)
    held = await create(cluster, {"worker": graced(1)}, suspend=True)  # its user's
    kueue = await create(cluster, {"worker": graced(1)}, labels={KUEUE_QUEUE_LABEL: "lq"})

    cond = await until(lambda: said(cluster, name, "True", "Queued"), "the job queued")
    assert "goodput-cluster" in cond["message"]
    job = await job_of(cluster, name)
    assert job.suspended
    sub = await tap.first(JobSubmitted, job.uid, lambda e: True, "job.submitted")
    assert (sub.priority, sub.group, sub.kueue_queue) == (5, "vision", None)
    # its spec.batch kept by the API server (the CRD's schema) and told the scheduler
    assert (sub.batch_size, sub.max_batch_size, sub.adaptive_batch_size) == (256, 1024, True)
    await until(lambda: said(cluster, held, "True", "Suspended"), "the held job said so")
    # Kueue's job is not queued by the operator: it runs as Kueue lets it.
    await until(lambda: cluster.workers_running(kueue, 1), "the Kueue job's worker")
    kueue_job = await job_of(cluster, kueue)
    assert not kueue_job.suspended
    ksub = await tap.first(JobSubmitted, kueue_job.uid, lambda e: True, "its job.submitted")
    assert ksub.kueue_queue == "lq"
    await asyncio.sleep(2)  # pods of the queued jobs would have been made by now
    assert await cluster.all_pods(name) == [] and await cluster.all_pods(held) == []

    await producer.publish(count("admit-1", 2, env, job))
    result = await result_of(tap, "admit-1")
    assert result.status is ScaleStatus.APPLIED, result.reason
    assert result.reason.startswith("admitted")
    await until(lambda: cluster.workers_running(name, 2), "the admitted job's workers")
    await until(lambda: said(cluster, name, "False", "Admitted"), "Suspended=False, Admitted")

    # A plan never suspends (nor resumes) Kueue's job.
    await producer.publish(suspend("k-s", env, kueue_job))
    refused = await result_of(tap, "k-s")
    assert refused.status is ScaleStatus.REJECTED
    assert "managed by Kueue (queue lq)" in refused.reason
    assert not (await job_of(cluster, kueue)).suspended
    assert await cluster.workers_running(kueue, 1)

    # The scheduler turned off: what it queued is admitted, what its user held is not.
    late = await create(cluster, {"worker": graced(1)})
    await until(lambda: said(cluster, late, "True", "Queued"), "a second job queued")
    await scheduler_on(settings, pg_dsn, env, on=False)
    await until(lambda: cluster.workers_running(late, 1), "the queued job admitted")
    await until(lambda: said(cluster, late, "False", "Admitted"), "admitted by the operator")
    assert (await job_of(cluster, held)).suspended


# -- the operator killed mid-plan ---------------------------------------------------------


@pytest.mark.parametrize("step", ["patched", "pods"])
async def test_an_operator_killed_during_a_suspend_and_a_resume_applies_each_once(
    cluster: Cluster, env: str, tap: Tap, producer: Producer, pg_dsn: str, step: str
) -> None:
    await cluster.start(env)
    name = await create(cluster, {"worker": graced(2)})
    await until(lambda: cluster.workers_running(name, 2), "2 running workers")
    job = await job_of(cluster, name)
    await cluster.running[0].halt()

    for plan in (suspend(f"s-{step}", env, job), count(f"r-{step}", 2, env, job)):
        stopped = asyncio.Event()

        async def freeze(
            at: str, seen: ScalePlan, plan_id: str = plan.plan_id, stopped: asyncio.Event = stopped
        ) -> None:
            if at == step and seen.plan_id == plan_id:
                stopped.set()
                await asyncio.Event().wait()  # frozen here until killed

        op = await cluster.start(env, on_step=freeze)
        await producer.publish(plan)
        await asyncio.wait_for(stopped.wait(), 120)
        await op.kill()
        assert results(tap, plan.plan_id) == []  # killed before its answer
        op = await cluster.start(env)
        result = await result_of(tap, plan.plan_id)
        assert result.status is ScaleStatus.APPLIED, result.reason
        assert result.reason == RESUMED  # the job had the change: finished, not made again
        await op.halt()

    # Each plan once: on the job, in the ledger, and in its pods (2, never more).
    obj = await cluster.kube.get_job(name)
    assert obj is not None
    applied = json.loads(obj["metadata"]["annotations"][ANN_PLANS])
    assert applied == [f"s-{step}", f"r-{step}"]
    async with await EnvStore.open(pg_dsn, env, max_size=1) as store:
        rows = await store.pool.fetch("SELECT plan_id FROM scale_plans ORDER BY plan_id")
    assert sorted(r["plan_id"] for r in rows) == sorted(applied)
    await cluster.start(env)
    pods = await until(lambda: cluster.workers_running(name, 2), "2 running workers")
    await asyncio.sleep(2)  # a duplicate would have been made by now
    assert len(await cluster.all_pods(name)) == 2, [p.name for p in pods]
    assert not (await job_of(cluster, name)).suspended


# -- capacity -----------------------------------------------------------------------------


def reports(tap: Tap) -> list[CapacityReported]:
    return tap.of(CapacityReported)


async def test_capacity_follows_nodes_added_cordoned_not_ready_and_deleted(
    cluster: Cluster, env: str, tap: Tap, api: client.ApiClient
) -> None:
    pool = unique_name("pool")
    labels = {"pool": pool, "nvidia.com/gpu.product": "NVIDIA-H100"}
    a = await create_node(api, f"{pool}-a", gpus=8, labels=labels)
    kube = KubeCluster(
        cluster.kube, gpu_type_label="nvidia.com/gpu.product", node_selector=f"pool={pool}"
    )
    await cluster.start(env, platform=kube, capacity=True)

    def last(check: Any) -> Any:
        async def found() -> CapacityReported | None:
            got = reports(tap)
            return got[-1] if got and check(got[-1]) else None

        return found

    def hosts(report: CapacityReported) -> dict[str, tuple[int, bool, str | None]]:
        return {h.name: (h.gpus, h.schedulable, h.gpu_type) for h in report.hosts}

    first = await until(last(lambda r: r.hosts), "the first capacity report")
    assert hosts(first) == {a: (8, True, "NVIDIA-H100")}
    assert first.platform == "kubernetes" and first.gpus == 8
    # with it, what a TrainingJob on this cluster can be asked for, never a migration of
    # an elastic role's rendezvous host (no GPU type: this test's workload adapter is not
    # configured with the label; the operator configures both from GPU_TYPE_LABEL)
    assert first.capabilities == PlatformCapabilities(
        gpu_types=False,
        spares=True,
        suspend=True,
        migrates_nodes=True,
        replaces_rendezvous_host=False,
    )

    b = await create_node(api, f"{pool}-b", gpus=4, labels={"pool": pool})
    got = await until(last(lambda r: len(r.hosts) == 2), "node b added")
    assert hosts(got) == {a: (8, True, "NVIDIA-H100"), b: (4, True, None)}
    assert got.gpus == 12

    core = client.CoreV1Api(api)
    await merge_patch(core.patch_node, a, body={"spec": {"unschedulable": True}})
    got = await until(last(lambda r: not hosts(r)[a][1]), "node a cordoned")
    assert got.gpus == 4

    not_ready = {"type": "Ready", "status": "False", "reason": "KubeletStopped"}
    await merge_patch(core.patch_node_status, b, body={"status": {"conditions": [not_ready]}})
    got = await until(last(lambda r: r.gpus == 0 and len(r.hosts) == 2), "node b NotReady")

    await core.delete_node(a)
    got = await until(last(lambda r: list(hosts(r)) == [b]), "node a deleted")
    assert hosts(got) == {b: (4, False, None)}
    # nothing of other tests' nodes (outside the selector) was ever reported
    assert all(set(hosts(r)) <= {a, b} for r in reports(tap))


# -- by hand: the job commands ------------------------------------------------------------


async def test_job_suspend_resume_and_list_say_it_as_a_user_runs_them(
    settings: Settings,
    pg_dsn: str,
    kube: Path,
    cluster: Cluster,
    env: str,
    tap: Tap,
) -> None:
    await cluster.start(env)
    job = JobCli(settings, pg_dsn, kube, cluster.namespace)
    name = await create(cluster, {"worker": graced(1)})
    kueue = await create(cluster, {"worker": graced(1)}, labels={KUEUE_QUEUE_LABEL: "lq"})
    await until(lambda: cluster.workers_running(name, 1), "the job's worker")
    uid = (await job_of(cluster, name)).uid

    done = await job("suspend", name, "--env", env)
    assert done.returncode == 0, done.stderr
    plan_id = done.stdout.split()[1]
    assert f"published to {env}.scale.plans: suspend {name}" in done.stdout
    answer = await tap.first(ScaleResult, uid, lambda r: r.plan_id == plan_id, "its result")
    assert answer.status is ScaleStatus.APPLIED, answer.reason
    await until(lambda: said(cluster, name, "True", "Preempted"), "Suspended=True")
    listed = await job("list")
    (line,) = [ln for ln in listed.stdout.splitlines() if ln.startswith(name)]
    assert "Suspended" in line and f"suspended (Preempted: suspended by plan {plan_id}" in line
    described = await job("describe", name)
    assert "admission: suspended (Preempted)" in described.stdout, described.stdout
    one_line_error(await job("suspend", name, "--env", env), "is suspended already")
    one_line_error(await job("suspend", kueue, "--env", env), "managed by Kueue (queue lq)")

    done = await job("resume", name, "--env", env)
    assert done.returncode == 0, done.stderr
    plan_id = done.stdout.split()[1]
    answer = await tap.first(ScaleResult, uid, lambda r: r.plan_id == plan_id, "its result")
    assert answer.status is ScaleStatus.APPLIED, answer.reason
    await until(lambda: cluster.workers_running(name, 1), "the job's worker again")
    await until(lambda: said(cluster, name, "False", "Resumed"), "Suspended=False")
    as_json = await job("list", "--json")
    (doc,) = [d for d in json.loads(as_json.stdout) if d["metadata"]["name"] == name]
    (cond,) = doc["status"]["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("Suspended", "False", "Resumed")
    one_line_error(await job("resume", name, "--env", env), "is not suspended")


# -- PyTorchJob: the training-operator's pods ----------------------------------------------


@pytest.fixture
async def pytorch_cluster(cluster: Cluster, pytorchjob_crd: str) -> Cluster:
    """The test's cluster, its reconcilers driving PyTorchJobs."""
    cluster.kube = KubeApi(cluster.api, PYTORCH_JOB, cluster.namespace)
    return cluster


async def test_a_pytorchjob_suspends_by_its_run_policy_and_its_pods_are_waited_for(
    pytorch_cluster: Cluster, env: str, tap: Tap, producer: Producer
) -> None:
    """The test plays the training-operator (v1.7+): it deletes a suspended job's pods and
    makes them again once resumed. The operator only patches runPolicy.suspend, and
    answers each plan once the training-operator did its part."""
    cluster = pytorch_cluster
    await cluster.start(env)
    name = unique_name("ptj")
    body = await ptj.create_job(cluster, ptj.pytorchjob(name, replicas=2))
    core = client.CoreV1Api(cluster.api)
    for i in range(2):
        await core.create_namespaced_pod(cluster.namespace, ptj.operator_pod(body, i))
    await until(lambda: _pods_running(cluster, name, 2), "the training-operator's 2 pods")
    job = PYTORCH_JOB.parse(await ptj.get_job(cluster, name))

    await producer.publish(suspend("ptj-s", env, job))

    async def suspended() -> bool:
        got = await ptj.get_job(cluster, name)
        return bool((got["spec"].get("runPolicy") or {}).get("suspend"))

    await until(suspended, "spec.runPolicy.suspend set")
    await asyncio.sleep(2)  # answered while its pods run, it would be out by now
    assert results(tap, "ptj-s") == []
    for i in range(2):  # the training-operator's part
        await core.delete_namespaced_pod(f"{name}-worker-{i}", cluster.namespace)
    answer = await result_of(tap, "ptj-s")
    assert answer.status is ScaleStatus.APPLIED, answer.reason
    assert await ptj.pod_names(cluster) == []

    await producer.publish(count("ptj-r", 2, env, job))

    async def resumed() -> bool:
        got = await ptj.get_job(cluster, name)
        return (got["spec"].get("runPolicy") or {}).get("suspend") is False

    await until(resumed, "spec.runPolicy.suspend cleared")
    await asyncio.sleep(2)
    assert results(tap, "ptj-r") == []  # no pod yet: not answered
    body = await ptj.get_job(cluster, name)
    for i in range(2):
        await core.create_namespaced_pod(cluster.namespace, ptj.operator_pod(body, i))
    answer = await result_of(tap, "ptj-r")
    assert answer.status is ScaleStatus.APPLIED, answer.reason


async def _pods_running(cluster: Cluster, name: str, n: int) -> bool:
    pods = await client.CoreV1Api(cluster.api).list_namespaced_pod(cluster.namespace)
    mine = [p for p in pods.items if p.metadata.name.startswith(f"{name}-worker-")]
    return len(mine) == n and all(p.status.phase == "Running" for p in mine)
