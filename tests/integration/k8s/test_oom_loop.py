"""The loop closed on real parts: an OOMKilled pod on a real kube-apiserver becomes a
host-OOM event, reaches the brain, comes back as a plan, and the reconciler applies it;
the replacement's own OOM is answered in turn, from its new size.

One env, its real reconciler (handlers/operator/reconcile on the Kubernetes platform,
handlers/operator/kube) on a fresh namespace of the test control plane, and its brain run
as `up` runs it (the `service` in this event loop), both on the session's broker and
Postgres. The test plays the kubelet: it starts the pods, and
kills one with OOMKilled / exit 137. Waiting is bounded by generous deadlines only; no
assertion depends on how long anything took.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import pytest

from dlrover_events.bus.topic_reader import read_topic
from dlrover_events.bus.topics import (
    BRAIN_PLANS,
    DLQ,
    JOB_EVENTS,
    SCALE_PLANS,
    SCALE_RESULTS,
    topic,
)
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from handlers.operator.platform.bodies import PodView
from schemas.envelope import Event
from schemas.jobs import JobStarted, NodeOOM, OOMKind
from schemas.plans import OptimizePlan, ScalePlan, ScaleResult, ScaleStatus
from streams.brain.core.optimizers.gpu import HostOOMParams
from streams.brain.core.optimizers.numeric import ceil_int
from streams.brain.core.planner import DEFAULT_LIMITS
from streams.brain.core.state import JobState
from streams.brain.runtime.app import service as brain_service
from tests.integration.tap import Tap

from .kube import FakeKubelet
from .test_reconciler_support import DEADLINE_S, Cluster, role, until

pytestmark = pytest.mark.integration

GiB = 2**30
E = TypeVar("E", bound=Event)

#: The workers' memory before the OOM. 8 GiB x 2 = 16 GiB: the host-OOM optimizer's
#: factor decides, inside its 2..8 GiB step, and the planner's 6..64 GiB bounds keep it.
WORKER_MEMORY = 8 * GiB


def bumped(memory: int) -> int:
    """What the host-OOM optimizer and the planner's limits make of a node's memory after
    one OOM, from their default parameters (spec/dlrover-optimizers.md)."""
    p, limits = HostOOMParams(), DEFAULT_LIMITS
    step = min(max(ceil_int(memory * (p.factor - 1)), p.min_increase), p.max_step)
    wanted = min(memory + step, p.max_memory)
    return min(max(wanted, limits.min_memory), limits.max_memory)


@pytest.fixture
async def bus(settings: Settings, env: str) -> AsyncIterator[Tap]:
    b = Tap(settings, env, (JOB_EVENTS, BRAIN_PLANS, SCALE_PLANS, SCALE_RESULTS))
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


@pytest.fixture
async def brain(settings: Settings, pg_dsn: str, env: str) -> AsyncIterator[ServiceContext]:
    """The env's brain as `up` runs it: the service, in this event loop, until stopped."""
    ctx = ServiceContext(settings, env, pg_dsn)
    task = asyncio.create_task(brain_service.run(ctx))
    ready = asyncio.create_task(ctx.ready.wait())
    await asyncio.wait([task, ready], timeout=DEADLINE_S, return_when=asyncio.FIRST_COMPLETED)
    try:
        if not ready.done():
            ready.cancel()
            if task.done():
                task.result()  # raises what stopped it
            pytest.fail(f"the brain of {env} was not ready within {DEADLINE_S:.0f}s")
        yield ctx
    finally:
        ctx.stop.set()
        await asyncio.wait_for(task, DEADLINE_S)  # a clean stop: no exception


def _worker(pods: list[PodView], rank: int) -> PodView | None:
    return next((p for p in pods if p.rank == rank), None)


async def answer_of(bus: Tap, oom: NodeOOM) -> tuple[OptimizePlan, ScalePlan, ScaleResult]:
    """The brain's plans caused by ``oom``, and the operator's result for them."""
    job = oom.job.uuid
    plan = await bus.first(
        OptimizePlan, job, lambda p: p.caused_by == str(oom.event_id), "the brain's plan"
    )
    scale = await bus.first(
        ScalePlan, job, lambda p: p.source_plan == plan.plan_id, "the brain's ScalePlan"
    )
    result = await bus.first(
        ScaleResult, job, lambda r: r.plan_id == scale.plan_id, "the plan's result"
    )
    return plan, scale, result


async def settled(cluster: Cluster, name: str, memory: int) -> list[PodView]:
    """The job's pods once worker-1 runs on ``memory`` and no other pod is left: the one
    of rank 0 and the one of rank 1, none being deleted."""

    async def found() -> list[PodView] | None:
        everything = await cluster.all_pods(name)  # those being deleted too
        one = _worker(everything, 1)
        done = (
            len(everything) == 2
            and all(p.running and not p.deleting for p in everything)
            and one is not None
            and one.resources.memory == memory
        )
        return everything if done else None

    return await until(found, f"worker-1 alone on a {memory} B pod, 2 pods in all")


async def brain_knows(pg_dsn: str, env: str, job: str, memory: int) -> JobState:
    """The brain's checkpointed state of ``job`` once it has folded the plan's result:
    worker-1 with ``memory``, no plan waiting for its result."""

    async def found() -> JobState | None:
        async with await EnvStore.open(pg_dsn, env, max_size=1) as store:
            text = await store.pool.fetchval(
                "SELECT state::text FROM job_states WHERE job_uuid = $1", job
            )
        if text is None:
            return None
        state = JobState.model_validate_json(text)
        node = state.nodes.get("worker-1")
        ok = node is not None and node.memory == memory and state.pending_scale_plan is None
        return state if ok else None

    return await until(found, f"the brain's state of {job} with worker-1 at {memory} B")


# Policies under which the job lives on after an OOM kill (137 is retryable for ExitCode;
# OnFailure is the CRD's default). Under Never the job fails at the OOM (test_reconciler)
# and the operator rejects plans for a failed job: there is no loop to close.
@pytest.mark.parametrize("restart_policy", ["ExitCode", "OnFailure"])
async def test_an_oom_killed_pod_comes_back_from_the_brain_as_a_plan_that_is_applied(
    cluster: Cluster,
    env: str,
    bus: Tap,
    brain: ServiceContext,
    kubelet: FakeKubelet,
    namespace: str,
    settings: Settings,
    pg_dsn: str,
    restart_policy: str,
) -> None:
    await cluster.start(env)
    worker = role(2, resources={"cpu": 2, "memory": "8Gi"}, restartPolicy=restart_policy)
    name = await cluster.create_job({"worker": worker})
    before = await until(lambda: cluster.workers_running(name, 2), "2 running workers")
    assert [p.resources.memory for p in before] == [WORKER_MEMORY, WORKER_MEMORY]
    job = await cluster.job(name)
    assert job is not None
    # A job OOMs while it trains: once the brain can know it started.
    await bus.first(JobStarted, job.uid, lambda _: True, "job.started")

    killed = _worker(before, 1)
    assert killed is not None and killed.name == f"{name}-worker-1"
    await kubelet.oom_killed(namespace, killed.name)

    # The pod watch says what happened, with what the brain needs to act on it.
    oom = await bus.first(NodeOOM, job.uid, lambda _: True, "node.oom")
    assert oom.kind is OOMKind.HOST_MEMORY
    assert oom.exit_code == 137
    assert (oom.node.type, oom.node.id, oom.node.name) == ("worker", 1, killed.name)
    assert oom.memory == WORKER_MEMORY
    assert (oom.job.uuid, oom.job.name, oom.job.namespace) == (job.uid, name, namespace)

    # The brain answers that OOM: the host-OOM optimizer's plan and its ScalePlan, which
    # the reconciler applies.
    want = bumped(WORKER_MEMORY)
    assert want == 16 * GiB  # 8 GiB x 2
    plan, scale, result = await answer_of(bus, oom)
    assert plan.optimizer == "host-oom"
    assert plan.reason == "host-oom: host OOM: worker-1 -> 16 GiB"
    assert set(plan.resource.node_resources) == {"worker-1"}
    assert plan.resource.node_resources["worker-1"].memory == want
    assert (scale.job.uuid, scale.job.name, scale.job.namespace) == (job.uid, name, namespace)
    assert [(m.node.type, m.node.id, m.resource.memory) for m in scale.migrate_nodes] == [
        ("worker", 1, want)
    ]
    assert not (scale.launch_nodes or scale.remove_nodes or scale.node_group_resources)
    assert result.status is ScaleStatus.APPLIED, result.reason

    # The cluster ends with the node on a larger pod, and nothing else.
    pods = await settled(cluster, name, want)
    zero, one = _worker(pods, 0), _worker(pods, 1)
    assert zero is not None and one is not None
    assert zero.name == f"{name}-worker-0"
    assert zero.resources.memory == WORKER_MEMORY
    assert one.uid != killed.uid  # a new pod (its name may be free again: the index)
    raw: Any = await cluster.raw_pod(one.name)
    requests = raw.spec.containers[0].resources.requests
    assert int(requests["memory"]) == want > WORKER_MEMORY
    got = await cluster.job(name)
    assert got is not None
    assert got.phase != "Failed"
    assert got.last_plan_id == scale.plan_id
    assert got.roles["worker"].replicas == 2

    # The new pod runs out too: the brain, which folded the result, bumps it from its new
    # size, and answers the first OOM never again.
    await brain_knows(pg_dsn, env, job.uid, want)
    await kubelet.oom_killed(namespace, one.name)
    again = await bus.first(NodeOOM, job.uid, lambda e: e.event_id != oom.event_id, "2nd OOM")
    assert (again.node.type, again.node.id, again.node.name) == ("worker", 1, one.name)
    assert again.memory == want
    more = bumped(want)
    assert more == 24 * GiB  # 16 GiB + 8 GiB (x 2 capped at 8 GiB a step), not 8 GiB x 2 again
    plan2, scale2, result2 = await answer_of(bus, again)
    assert plan2.reason == "host-oom: host OOM: worker-1 -> 24 GiB"
    assert [(m.node.type, m.node.id, m.resource.memory) for m in scale2.migrate_nodes] == [
        ("worker", 1, more)
    ]
    assert result2.status is ScaleStatus.APPLIED, result2.reason
    pods = await settled(cluster, name, more)
    assert {p.uid for p in pods}.isdisjoint({killed.uid, one.uid})
    assert _worker(pods, 0) == zero

    # One answer per OOM: two plans, each applied once.
    host_oom = [p.plan_id for p in bus.of(OptimizePlan, job.uid) if p.optimizer == "host-oom"]
    assert host_oom == [plan.plan_id, plan2.plan_id]
    assert [p.plan_id for p in bus.of(ScalePlan, job.uid)] == [scale.plan_id, scale2.plan_id]
    assert [(r.plan_id, r.status) for r in bus.of(ScaleResult, job.uid)] == [
        (scale.plan_id, ScaleStatus.APPLIED),
        (scale2.plan_id, ScaleStatus.APPLIED),
    ]
    assert await read_topic(settings, topic(env, DLQ)) == []  # nothing any consumer refused
