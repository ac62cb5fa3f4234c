"""The real-cluster reconciler on a real kube-apiserver v1.20.2, broker and Postgres.

Each test has its own namespace and its own env (virtual in the registry: the reconciler
itself does not look at modes, the RealOperator above it does, see
test_reconciler_promotion.py), so topics and ledgers of one test never meet another's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio.client.rest import ApiException

from dlrover_events.bus.producer import Producer
from dlrover_events.runtime.logs import JsonFormatter, log_fields
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from handlers.operator.document.trainingjob import ANN_PLANS, UNSUPPORTED
from handlers.operator.kube.client import KubeApi
from handlers.operator.kube.pods import LABEL_JOB, LABEL_RANK, LABEL_ROLE
from handlers.operator.kube.trainingjob import TRAINING_JOB
from handlers.operator.platform.bodies import Resources
from handlers.operator.reconcile.reconciler import ALREADY_APPLIED, RESUMED
from schemas.jobs import JobSubmitted, NodeOOM, NodeRef, NodeStarted, OOMKind
from schemas.plan_parts import AWAITING_JOB
from schemas.plans import (
    MigrateNode,
    NodeGroupResource,
    NodeResource,
    ScalePlan,
    ScaleResult,
    ScaleStatus,
)
from tests.integration.tap import Tap

from .kube import FakeKubelet
from .test_reconciler_support import Cluster, role, until

pytestmark = pytest.mark.integration

GiB = 2**30


@pytest.fixture
async def tap(settings: Settings, env: str) -> AsyncIterator[Tap]:
    t = Tap(settings, env)
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


async def result_of(tap: Tap, plan_id: str, count: int = 1) -> list[ScaleResult]:
    async def found() -> list[ScaleResult] | None:
        got = results(tap, plan_id)
        return got if len(got) >= count else None

    return await until(found, f"{count} result(s) of plan {plan_id}")


async def ledger_row(pg_dsn: str, env: str, plan_id: str) -> dict[str, object] | None:
    async with await EnvStore.open(pg_dsn, env, max_size=1) as store:
        row = await store.pool.fetchrow(
            "SELECT status, reason, applied_at FROM scale_plans WHERE plan_id = $1", plan_id
        )
    return dict(row) if row else None


def ranks(pods: list) -> list[int]:  # type: ignore[type-arg]
    return [p.rank for p in pods]


async def test_a_job_is_created_with_its_pods(cluster: Cluster, env: str, tap: Tap) -> None:
    await cluster.start(env)
    name = await cluster.create_job({"worker": role(2), "ps": role(1, resources={"cpu": "500m"})})
    workers = await until(lambda: cluster.workers_running(name, 2), "2 running workers")
    assert [p.name for p in workers] == [f"{name}-worker-0", f"{name}-worker-1"]
    (ps,) = await cluster.pods(name, role="ps")
    assert ps.name == f"{name}-ps-0"
    assert ps.resources == Resources(cpu_milli=500)

    pod = await cluster.raw_pod(f"{name}-worker-1")
    assert pod.metadata.labels[LABEL_JOB] == name
    assert pod.metadata.labels[LABEL_ROLE] == "worker"
    assert pod.metadata.labels[LABEL_RANK] == "1"
    assert pod.metadata.labels["team"] == "vision"  # the template's own labels stay
    job = await cluster.job(name)
    assert job is not None
    variables = {e.name: e.value for e in pod.spec.containers[0].env}
    assert variables["DLROVER_EVENTS_JOB_ID"] == job.uid
    assert variables["DLROVER_EVENTS_ROLE"] == "worker"
    assert variables["DLROVER_EVENTS_RANK"] == "1"
    assert variables["DLROVER_EVENTS_ENV"] == env
    assert pod.spec.containers[0].resources.limits == {"cpu": "2", "memory": str(4 * GiB)}
    assert pod.spec.restart_policy == "Never"

    async def status_counts() -> dict | None:  # type: ignore[type-arg]
        got = await cluster.job(name)
        roles = dict(got.status.roles) if got and got.status else {}
        ok = roles.get("worker", {}).get("running") == 2 and roles.get("ps", {}).get("running")
        return roles if ok else None

    counts = await until(status_counts, "status with 2 running workers and 1 ps")
    assert counts["worker"] == {"pending": 0, "running": 2, "succeeded": 0, "failed": 0}

    submitted = await tap.until(lambda: tap.of(JobSubmitted, job.uid), "job.submitted")
    assert submitted[0].job.name == name
    assert submitted[0].roles["worker"].replicas == 2
    assert submitted[0].roles["worker"].memory == 4 * GiB
    started = await tap.until(
        lambda: len(tap.of(NodeStarted, job.uid)) >= 3 and tap.of(NodeStarted, job.uid),
        "3 node.started",
    )
    assert sorted((e.node.type, e.node.id) for e in started) == [
        ("ps", 0),
        ("worker", 0),
        ("worker", 1),
    ]


async def test_a_plan_scales_up_and_down_and_migrates_a_node(
    cluster: Cluster, env: str, tap: Tap, producer: Producer, pg_dsn: str
) -> None:
    await cluster.start(env)
    name = await cluster.create_job({"worker": role(2)})
    await until(lambda: cluster.workers_running(name, 2), "2 running workers")
    meta = await cluster.meta(name)

    # Up to 4, with the pod of rank 2 held pending by the kubelet.
    cluster.kubelet_loop.hold.add(f"{name}-worker-2")  # type: ignore[attr-defined]
    up = cluster.plan(
        env, meta, "up-4", node_group_resources={"worker": NodeGroupResource(count=4)}
    )
    await producer.publish(up)
    (result,) = await result_of(tap, "up-4")
    assert result.status is ScaleStatus.APPLIED, result.reason
    assert sum(result.observed["worker"].values()) == 4

    async def three_running_one_pending() -> list | None:  # type: ignore[type-arg]
        pods = await cluster.pods(name, role="worker")
        states = [(p.rank, p.running) for p in pods]
        return pods if states == [(0, True), (1, True), (2, False), (3, True)] else None

    await until(three_running_one_pending, "ranks 0, 1, 3 running and 2 pending")

    # Down to 3: the pending node goes before the running ones, though not the highest.
    down = cluster.plan(
        env, meta, "down-3", node_group_resources={"worker": NodeGroupResource(count=3)}
    )
    await producer.publish(down)
    (result,) = await result_of(tap, "down-3")
    assert result.status is ScaleStatus.APPLIED, result.reason
    assert sum(result.observed["worker"].values()) == 3
    pods = await until(lambda: cluster.workers_running(name, 3), "3 running workers")
    assert ranks(pods) == [0, 1, 3]

    # Migrate rank 0 to more memory: a new pod first, then the old one goes.
    migrate = cluster.plan(
        env,
        meta,
        "more-memory",
        migrate_nodes=[
            MigrateNode(node=NodeRef(type="worker", id=0), resource=NodeResource(memory=16 * GiB))
        ],
    )
    await producer.publish(migrate)
    (result,) = await result_of(tap, "more-memory")
    assert result.status is ScaleStatus.APPLIED, result.reason

    async def migrated() -> list | None:  # type: ignore[type-arg]
        pods = await cluster.pods(name, role="worker")
        zero = [p for p in pods if p.rank == 0]
        done = len(zero) == 1 and zero[0].resources.memory == 16 * GiB and zero[0].running
        return pods if done and len(pods) == 3 else None

    pods = await until(migrated, "rank 0 on a 16Gi pod, the old one gone")
    assert ranks(pods) == [0, 1, 3]
    (zero,) = [p for p in pods if p.rank == 0]
    assert zero.name != f"{name}-worker-0"
    assert all(p.resources.memory == 4 * GiB for p in pods if p.rank != 0)

    job = await cluster.job(name)
    assert job is not None
    assert job.last_plan_id == "more-memory"
    assert job.roles["worker"].replicas == 3
    row = await ledger_row(pg_dsn, env, "more-memory")
    assert row is not None
    assert row["status"] == "applied"
    assert row["applied_at"] is not None


async def test_pod_lines_are_info_with_the_env_service_job_and_plan_as_fields(
    cluster: Cluster, env: str, tap: Tap, producer: Producer, caplog: pytest.LogCaptureFixture
) -> None:
    """What an operator of the cluster reads: which pods were created and deleted, for
    which job and plan, as fields a JSON log line carries (not parsed from the text)."""
    caplog.set_level(logging.INFO, logger="handlers.operator")
    with log_fields(env=env, service="operator"):  # as `up` and `standalone` run it
        await cluster.start(env)
    name = await cluster.create_job({"worker": role(2)})
    await until(lambda: cluster.workers_running(name, 2), "2 running workers")
    meta = await cluster.meta(name)
    down = cluster.plan(
        env, meta, "down-1", node_group_resources={"worker": NodeGroupResource(count=1)}
    )
    await producer.publish(down)
    (result,) = await result_of(tap, "down-1")
    assert result.status is ScaleStatus.APPLIED, result.reason

    def lines(text: str) -> list[dict[str, Any]]:
        return [
            json.loads(JsonFormatter().format(r)) for r in caplog.records if text in r.getMessage()
        ]

    created = lines(f"created pod {name}-worker-")
    assert len(created) == 2, created
    for line in created:
        assert line["level"] == "INFO"
        assert line["logger"] == "handlers.operator.reconcile.reconciler"
        assert (line["env"], line["service"], line["job"]) == (env, "operator", name), line
    (deleted,) = lines(f"deleted pod {name}-worker-1")
    assert (deleted["env"], deleted["service"], deleted["job"]) == (env, "operator", name)
    assert deleted["plan_id"] == "down-1"


async def test_the_same_plan_twice_applies_once(
    cluster: Cluster, env: str, tap: Tap, producer: Producer
) -> None:
    await cluster.start(env)
    name = await cluster.create_job({"worker": role(1)})
    await until(lambda: cluster.workers_running(name, 1), "1 running worker")
    meta = await cluster.meta(name)
    plan = cluster.plan(env, meta, "plus-2", launch_nodes=[{"type": "worker", "id": 1}] * 2)
    again = plan.model_copy(update={"event_id": uuid.uuid4()})
    await producer.publish(plan)
    await producer.publish(again)
    first, second = await result_of(tap, "plus-2", 2)
    assert (first.status, second.status) == (ScaleStatus.APPLIED, ScaleStatus.APPLIED)
    assert first.reason != ALREADY_APPLIED
    # the second delivery says it was a repeat, and what the first answer said
    assert second.reason == f"{ALREADY_APPLIED}: {first.reason}"
    pods = await until(lambda: cluster.workers_running(name, 3), "3 running workers")
    assert ranks(pods) == [0, 1, 2]
    job = await cluster.job(name)
    assert job is not None
    assert job.roles["worker"].replicas == 3  # not 5
    assert job.applied_plans.count("plus-2") == 1


async def test_a_plan_with_training_knobs_is_partial_and_stays_so(
    cluster: Cluster, env: str, tap: Tap, producer: Producer, pg_dsn: str
) -> None:
    """The operator cannot change a job's micro-batch nor ask for a GPU memory size: it
    applies the rest and says which parts it left, now and when the plan comes again."""
    await cluster.start(env)
    name = await cluster.create_job({"worker": role(1)})
    await until(lambda: cluster.workers_running(name, 1), "1 running worker")
    meta = await cluster.meta(name)
    plan = cluster.plan(
        env,
        meta,
        "knobs",
        node_group_resources={
            "worker": NodeGroupResource(count=2, node_resource=NodeResource(gpu_memory=GiB))
        },
        training={"local_batch_size": 16},
    )
    await producer.publish(plan)
    (first,) = await result_of(tap, "knobs")
    assert first.status is ScaleStatus.PARTIAL, first.reason
    assert [(p.part, p.reason) for p in first.not_applied] == [
        ("worker.gpu_memory", UNSUPPORTED["gpu_memory"]),
        ("training.local_batch_size", AWAITING_JOB),
    ]
    pods = await until(lambda: cluster.workers_running(name, 2), "2 running workers")
    assert ranks(pods) == [0, 1]
    row = await ledger_row(pg_dsn, env, "knobs")
    assert row is not None
    assert row["status"] == "partial"
    assert row["applied_at"] is not None  # partial applied: at most once, as applied

    await producer.publish(plan.model_copy(update={"event_id": uuid.uuid4()}))
    _, again = await result_of(tap, "knobs", 2)
    assert again.status is ScaleStatus.PARTIAL
    assert again.not_applied == first.not_applied
    assert again.reason == f"{ALREADY_APPLIED}: {first.reason}"
    job = await cluster.job(name)
    assert job is not None
    assert job.roles["worker"].replicas == 2


async def test_an_oom_killed_pod_becomes_a_host_oom_event(
    cluster: Cluster, env: str, tap: Tap, kubelet: FakeKubelet, namespace: str
) -> None:
    await cluster.start(env)
    name = await cluster.create_job({"worker": role(2)})
    await until(lambda: cluster.workers_running(name, 2), "2 running workers")
    job = await cluster.job(name)
    assert job is not None
    await kubelet.oom_killed(namespace, f"{name}-worker-1")
    (oom,) = await tap.until(lambda: tap.of(NodeOOM, job.uid), "node.oom")
    assert oom.kind is OOMKind.HOST_MEMORY
    assert oom.exit_code == 137
    assert (oom.node.type, oom.node.id, oom.node.name) == ("worker", 1, f"{name}-worker-1")
    assert oom.memory == 4 * GiB
    assert oom.job.uuid == job.uid
    # restartPolicy Never: the job has failed, and says why.
    got = await until(lambda: _phase(cluster, name, "Failed"), "the job's status phase Failed")
    assert got == "Failed"


async def _phase(cluster: Cluster, name: str, want: str) -> str | None:
    job = await cluster.job(name)
    return job.phase if job is not None and job.phase == want else None


async def test_a_plan_for_a_deleted_job_is_rejected_with_a_reason(
    cluster: Cluster, env: str, tap: Tap, producer: Producer, pg_dsn: str
) -> None:
    await cluster.start(env)
    name = await cluster.create_job({"worker": role(1)})
    await until(lambda: cluster.workers_running(name, 1), "1 running worker")
    meta = await cluster.meta(name)
    await cluster.kube.delete_job(name)
    await until(lambda: _no_pods(cluster, name), "the deleted job's pods gone")

    plan = cluster.plan(
        env, meta, "too-late", node_group_resources={"worker": NodeGroupResource(count=2)}
    )
    await producer.publish(plan)
    (result,) = await result_of(tap, "too-late")
    assert result.status is ScaleStatus.REJECTED
    assert "not found" in result.reason
    assert name in result.reason
    row = await ledger_row(pg_dsn, env, "too-late")
    assert row is not None
    assert row["status"] == "rejected"

    # The same name again is another job: the old job's plan does not apply to it.
    await cluster.create_job({"worker": role(1)}, name=name)
    await until(lambda: cluster.workers_running(name, 1), "the new job's worker")
    stale = cluster.plan(
        env, meta, "stale", node_group_resources={"worker": NodeGroupResource(count=2)}
    )
    await producer.publish(stale)
    (result,) = await result_of(tap, "stale")
    assert result.status is ScaleStatus.REJECTED
    assert "was deleted" in result.reason
    assert len(await cluster.pods(name)) == 1

    # A plan outside the job's bounds is rejected too, and the operator goes on.
    new_meta = await cluster.meta(name)
    too_many = cluster.plan(
        env, new_meta, "nine", node_group_resources={"worker": NodeGroupResource(count=9)}
    )
    await producer.publish(too_many)
    (result,) = await result_of(tap, "nine")
    assert result.status is ScaleStatus.REJECTED
    assert "maxReplicas 8" in result.reason


async def _no_pods(cluster: Cluster, name: str) -> bool:
    return not await cluster.all_pods(name)


async def test_an_operator_restarted_mid_plan_finishes_it_without_duplicating_pods(
    cluster: Cluster, env: str, tap: Tap, producer: Producer
) -> None:
    crashed = asyncio.Event()

    async def crash_after_patch(step: str, plan: ScalePlan) -> None:
        if step == "patched":
            crashed.set()
            await asyncio.Event().wait()  # frozen here until killed

    first = await cluster.start(env, on_step=crash_after_patch)
    name = await cluster.create_job({"worker": role(1)})
    await until(lambda: cluster.workers_running(name, 1), "1 running worker")
    meta = await cluster.meta(name)
    plan = cluster.plan(
        env, meta, "to-5", node_group_resources={"worker": NodeGroupResource(count=5)}
    )
    await producer.publish(plan)
    await asyncio.wait_for(crashed.wait(), 120)
    await first.kill()

    # Half-done: the job says the plan's change, and carries its id; no result went out.
    job = await cluster.job(name)
    assert job is not None
    assert job.roles["worker"].replicas == 5
    assert "to-5" in json.loads(
        (await cluster.kube.get_job(name))["metadata"]["annotations"][ANN_PLANS]
    )  # type: ignore[index]
    assert results(tap, "to-5") == []

    await cluster.start(env)
    (result,) = await result_of(tap, "to-5")
    assert result.status is ScaleStatus.APPLIED
    assert result.reason == RESUMED
    pods = await until(lambda: cluster.workers_running(name, 5), "5 running workers")
    assert ranks(pods) == [0, 1, 2, 3, 4]
    assert len({p.name for p in await cluster.all_pods(name)}) == 5
    job = await cluster.job(name)
    assert job is not None
    assert job.roles["worker"].replicas == 5
    assert job.last_plan_id == "to-5"


class _ResumedTooLate(KubeApi):
    """The first watch of the TrainingJobs resumes from a version the API server has let
    go ("1", older than its watch cache), as a watch resumed after a long disconnect
    does; the 410 Gone is the server's own answer."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(cluster.api, TRAINING_JOB, cluster.namespace)
        self.job_lists = 0
        self.answers: Counter[int] = Counter()
        self._resumed = False

    async def list_jobs(self) -> tuple[list[dict[str, Any]], str]:
        self.job_lists += 1
        return await super().list_jobs()

    async def watch(
        self, kind: str, resource_version: str, timeout_s: int
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        if kind == "jobs" and not self._resumed:
            self._resumed = True
            resource_version = "1"
        try:
            async for event in super().watch(kind, resource_version, timeout_s):
                yield event
        except ApiException as e:
            self.answers[e.status] += 1
            raise


async def test_a_watch_the_server_expired_lists_again_and_goes_on(
    cluster: Cluster, env: str
) -> None:
    kube = _ResumedTooLate(cluster)
    cluster.kube = kube
    before = await cluster.create_job({"worker": role(1)})  # seen by the first list
    await cluster.start(env)

    async def listed_again() -> bool:
        return kube.answers[410] == 1 and kube.job_lists >= 2

    await until(listed_again, "a 410 Gone for the jobs' watch, then a second list")
    # the informer watches again from what it listed: a job made now is reconciled
    after = await cluster.create_job({"worker": role(2)})
    await until(lambda: cluster.workers_running(after, 2), "2 running workers of the new job")
    await until(lambda: cluster.workers_running(before, 1), "the running worker of the first")
    assert kube.answers == Counter({410: 1})
