"""The virtual operator in lockstep on the real broker: the test plays the brain, reading
the barriers and publishing plans and acknowledgements itself.

What no wall clock can change: a tick's barrier follows its events on every partition,
the clock does not move until every partition of the plans topic acknowledged the tick,
and a plan lands at the end of the tick it was read in.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import pytest
from aiokafka import AIOKafkaConsumer

from dlrover_events.bus.kafka_client import stop_consumer, topic_partitions
from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topic_reader import read_topic
from dlrover_events.bus.topics import (
    DLQ,
    JOB_EVENTS,
    JOB_METRICS,
    SCALE_PLANS,
    SCALE_RESULTS,
    topic,
)
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from handlers.operator.virtual.operator import BARRIER_TOPICS
from handlers.operator.wiring.modes import run_operator
from schemas.codec import decode
from schemas.envelope import Event
from schemas.jobs import (
    JobCompleted,
    JobMeta,
    JobStarted,
    JobSubmitted,
    NodeStarted,
    RoleSpec,
    RuntimeSample,
)
from schemas.lockstep import Barrier, BarrierAck
from schemas.plans import NodeGroupResource, ScalePlan, ScaleResult, ScaleStatus
from tests.conftest import EnvFactory
from tests.integration.operator.conftest import Sim
from tests.integration.tap import DEADLINE_S

pytestmark = pytest.mark.integration

T = TypeVar("T")

TICK_S = 30.0
LOCKSTEP = {"lockstep": True, "tick_s": TICK_S}

#: Wall seconds the test waits to see that the clock does NOT move without the brain.
HOLD_S = 2.0


@dataclass(frozen=True)
class Read:
    topic: str
    partition: int
    offset: int
    event: Event


async def read(sim: Sim, names: tuple[str, ...] = BARRIER_TOPICS) -> list[Read]:
    """Everything on the env's topics now, with where each record lies."""
    out = []
    for name in names:
        for r in await read_topic(sim.settings, topic(sim.env, name), timeout_s=5.0):
            out.append(Read(name, r.partition, r.offset, decode(r.value)))
    return out


def barriers(reads: list[Read], tick: int) -> list[Read]:
    return [r for r in reads if isinstance(r.event, Barrier) and r.event.tick == tick]


async def until(sim: Sim, found: Callable[[list[Read]], T | None], what: str) -> T:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while loop.time() < deadline:
        if result := found(await read(sim)):
            return result
        await asyncio.sleep(0.2)
    pytest.fail(f"no {what} within {DEADLINE_S:.0f}s")


async def barrier_everywhere(sim: Sim, tick: int) -> datetime:
    """Wait for barrier ``tick`` on every partition of the three topics; its end time."""
    partitions = 3 * len(BARRIER_TOPICS)
    found = await until(
        sim, lambda reads: b if len(b := barriers(reads, tick)) == partitions else None, "barrier"
    )
    ends = {r.event.sim_at for r in found if isinstance(r.event, Barrier)}
    assert len(ends) == 1, "one end per tick"
    return ends.pop()


def after(reads: list[Read], at: datetime) -> list[Read]:
    return [r for r in reads if not isinstance(r.event, Barrier) and r.event.occurred_at > at]


async def ack(sim: Sim, tick: int, sim_at: datetime, partitions: list[int]) -> None:
    done = BarrierAck(env=sim.env, source="test-brain", tick=tick, sim_at=sim_at)
    await sim.producer.publish_to_partitions(done, topic(sim.env, SCALE_PLANS), partitions)


async def plan_partition(sim: Sim, plan_id: str) -> int:
    for r in await read(sim, (SCALE_PLANS,)):
        if isinstance(r.event, ScalePlan) and r.event.plan_id == plan_id:
            return r.partition
    pytest.fail(f"plan {plan_id} is not on {SCALE_PLANS}")


def result_of(reads: list[Read], plan_id: str) -> ScaleResult | None:
    for r in reads:
        if isinstance(r.event, ScaleResult) and r.event.plan_id == plan_id:
            return r.event
    return None


async def test_a_tick_waits_for_every_acknowledgement_and_its_plans_land_at_its_end(
    sim: Sim,
) -> None:
    submitted = await sim.submit("job-l")
    origin = submitted.occurred_at
    await sim.start(**LOCKSTEP)

    end1 = await barrier_everywhere(sim, 1)
    assert end1 == origin + timedelta(seconds=TICK_S)
    reads = await read(sim)
    # On every partition the tick's events come before its barrier, and none is later.
    for r in barriers(reads, 1):
        before = [
            x for x in reads if (x.topic, x.partition) == (r.topic, r.partition) and x is not r
        ]
        assert all(x.offset < r.offset for x in before)
        assert all(x.event.occurred_at <= end1 for x in before)
    assert any(isinstance(r.event, NodeStarted) for r in reads), "the job started in tick 1"

    # The brain has said nothing: the clock stays where tick 1 ended.
    await asyncio.sleep(HOLD_S)
    reads = await read(sim)
    assert not barriers(reads, 2)
    assert not after(reads, end1)

    # The brain's answer to tick 1: a plan, then acknowledgements on all but its partition.
    plan = sim.plan(
        "job-l",
        "ls-up",
        node_group_resources={"worker": NodeGroupResource(count=2)},
        occurred_at=end1,
    )
    await sim.producer.publish(plan)
    held_back = await plan_partition(sim, "ls-up")
    await ack(sim, 1, end1, [p for p in range(3) if p != held_back])
    await asyncio.sleep(HOLD_S)
    reads = await read(sim)
    assert result_of(reads, "ls-up") is None, "one partition has not acknowledged tick 1"
    assert not barriers(reads, 2)
    assert not after(reads, end1)

    await ack(sim, 1, end1, [held_back])
    end2 = await barrier_everywhere(sim, 2)
    assert end2 == end1 + timedelta(seconds=TICK_S)
    reads = await read(sim)
    result = result_of(reads, "ls-up")
    assert result is not None
    assert result.status is ScaleStatus.APPLIED
    assert result.occurred_at == end1, "applied at the end of the tick it was read in"
    (placed,) = [r for r in reads if r.event is result]
    (closing,) = [
        b for b in barriers(reads, 2) if (b.topic, b.partition) == (SCALE_RESULTS, placed.partition)
    ]
    assert placed.offset < closing.offset, "the result belongs to the next tick"
    new_worker = [
        r.event
        for r in reads
        if isinstance(r.event, NodeStarted) and r.event.node.id == 1 and r.event.key == "job-l"
    ]
    assert [e.occurred_at for e in new_worker] == [end1]

    # A plan read on a partition after that partition acknowledged the tick belongs to the
    # next tick, even though the tick's other partitions are still to acknowledge.
    await ack(sim, 2, end2, [held_back])
    late = sim.plan(
        "job-l",
        "ls-late",
        node_group_resources={"worker": NodeGroupResource(count=3)},
        occurred_at=end2,
    )
    await sim.producer.publish(late)
    assert await plan_partition(sim, "ls-late") == held_back  # one job, one partition
    await ack(sim, 2, end2, [p for p in range(3) if p != held_back])
    end3 = await barrier_everywhere(sim, 3)
    assert result_of(await read(sim), "ls-late") is None, "held for tick 3"
    await ack(sim, 3, end3, [0, 1, 2])
    await barrier_everywhere(sim, 4)
    late_result = result_of(await read(sim), "ls-late")
    assert late_result is not None
    assert late_result.occurred_at == end3


async def test_lockstep_markers_are_no_input_for_an_operator_out_of_lockstep(sim: Sim) -> None:
    """An acknowledgement or a barrier on its topics is neither applied nor dead-lettered."""
    await sim.start(fast=True)
    submitted = await sim.submit("job-n", application="ncf")
    stray = BarrierAck(env=sim.env, tick=1, sim_at=submitted.occurred_at)
    await sim.producer.publish_to_partitions(stray, topic(sim.env, SCALE_PLANS))
    marker = Barrier(env=sim.env, tick=1, sim_at=submitted.occurred_at)
    await sim.producer.publish_to_partitions(marker, topic(sim.env, JOB_EVENTS))
    await sim.producer.publish(
        sim.plan("job-n", "n-2", node_group_resources={"worker": NodeGroupResource(count=2)})
    )
    result = await until(sim, lambda reads: result_of(reads, "n-2"), "scale result")
    assert result.status in (ScaleStatus.APPLIED, ScaleStatus.REJECTED)
    assert await read(sim, (DLQ,)) == []
    assert not [r for r in await read(sim, (JOB_METRICS,)) if isinstance(r.event, Barrier)]


class JitteryBrain:
    """Plays a lockstep brain whose timing differs from run to run: it holds each tick's
    events until the tick's barrier is on every partition it reads, rescales each job that
    started in the tick to two workers, and acknowledges after a random wall-clock delay."""

    def __init__(self, settings: Settings, env: str, seed: int) -> None:
        self.settings = settings
        self.env = env
        self.random = random.Random(seed)
        self.ticks = 0

    async def run(self, stop: asyncio.Event) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.settings.bootstrap_servers,
            group_id=None,
            enable_auto_commit=False,
            fetch_max_wait_ms=10,
        )
        await consumer.start()
        try:
            async with Producer(self.settings) as producer:
                parts = [
                    tp
                    for name in BARRIER_TOPICS
                    for tp in await topic_partitions(consumer, topic(self.env, name))
                ]
                consumer.assign(parts)
                await consumer.seek_to_beginning(*parts)
                await self._serve(consumer, producer, len(parts), stop)
        finally:
            await stop_consumer(consumer)

    async def _serve(
        self, consumer: AIOKafkaConsumer, producer: Producer, partitions: int, stop: asyncio.Event
    ) -> None:
        passed: dict[tuple[str, int], int] = {}  # barriers read per partition
        held: dict[int, list[Event]] = {}
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=100)
            for tp, records in batch.items():
                for record in records:
                    event = decode(record.value)
                    where = (tp.topic, tp.partition)
                    if not isinstance(event, Barrier):
                        held.setdefault(passed.get(where, 0) + 1, []).append(event)
                        continue
                    passed[where] = event.tick
                    if sum(1 for n in passed.values() if n >= event.tick) == partitions:
                        await self._decide(producer, event, held.pop(event.tick, []))

    async def _decide(self, producer: Producer, barrier: Barrier, events: list[Event]) -> None:
        started = sorted(
            (e for e in events if isinstance(e, JobStarted)), key=lambda e: (e.occurred_at, e.key)
        )
        for job in started:
            await asyncio.sleep(self.random.uniform(0, 0.05))
            await producer.publish(
                ScalePlan(
                    env=self.env,
                    job=job.job,
                    source="jittery-brain",
                    plan_id=f"{job.key}-up",
                    occurred_at=barrier.sim_at,
                    node_group_resources={"worker": NodeGroupResource(count=2)},
                )
            )
        await asyncio.sleep(self.random.uniform(0, 0.05))
        done = BarrierAck(env=self.env, tick=barrier.tick, sim_at=barrier.sim_at)
        await producer.publish_to_partitions(done, topic(self.env, SCALE_PLANS))
        self.ticks = barrier.tick


async def run_lockstep_env(
    settings: Settings, pg_dsn: str, env: str, submissions: list[JobSubmitted], seed: int
) -> list[tuple[str, str | None, datetime]]:
    """Submissions, a lockstep operator and a jittery brain until every job completed:
    what the env said, in a form two envs can be compared in."""
    async with Producer(settings) as producer:
        await producer.publish_many([s.model_copy(update={"env": env}) for s in submissions])
    ctx = ServiceContext(settings, env, pg_dsn)
    operator = asyncio.create_task(run_operator(ctx, {**LOCKSTEP, "nodes": 2}))
    brain = JitteryBrain(settings, env, seed)
    thinking = asyncio.create_task(brain.run(ctx.stop))
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE_S
        while loop.time() < deadline:
            events = [
                decode(r.value)
                for r in await read_topic(settings, topic(env, JOB_EVENTS), timeout_s=5.0)
            ]
            if sum(isinstance(e, JobCompleted) for e in events) == len(submissions):
                break
            for task in (operator, thinking):
                if task.done():
                    task.result()
            await asyncio.sleep(0.5)
        else:
            pytest.fail(f"the jobs of {env} did not complete within {DEADLINE_S:.0f}s")
    finally:
        ctx.stop.set()
        await asyncio.gather(operator, thinking)
    assert brain.ticks > 10
    said = [
        decode(r.value)
        for name in BARRIER_TOPICS
        for r in await read_topic(settings, topic(env, name), timeout_s=5.0)
    ]
    return sorted(
        (e.type, e.key, e.occurred_at)
        for e in said
        if not isinstance(e, Barrier | JobSubmitted | RuntimeSample)
    ) + sorted(("sample", e.key, e.occurred_at) for e in said if isinstance(e, RuntimeSample))


async def test_the_same_input_gives_the_same_run_however_the_brain_s_timing_differs(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    t0 = datetime(2026, 3, 1, tzinfo=UTC)
    submissions = [
        JobSubmitted(
            env="placeholder",
            occurred_at=t0 + timedelta(seconds=at),
            job=JobMeta(uuid=name, name=name, app="ncf"),
            application="ncf",
            roles={"worker": RoleSpec(replicas=replicas, gpu_num=1)},
        )
        for name, at, replicas in [("ncf-0", 0, 1), ("ncf-1", 45, 2), ("ncf-2", 45, 1)]
    ]
    runs = []
    for seed in (1, 2):
        env = (await make_env()).name
        runs.append(await run_lockstep_env(settings, pg_dsn, env, submissions, seed))
    one, other = runs
    assert [e for e in one if e[0] == "scale.result"], "the brain's plans were applied"
    assert one == other


async def test_under_the_brains_admission_a_tick_follows_an_arrival_and_a_plan_starts_the_job(
    sim: Sim,
) -> None:
    # Nothing starts on its own, so an arrival makes no event; the brain still needs a
    # barrier to decide on it, or the operator and the brain would wait for each other.
    submitted = await sim.submit("job-s")
    await sim.start(admission="brain", **LOCKSTEP)
    end1 = await barrier_everywhere(sim, 1)
    assert end1 == submitted.occurred_at + timedelta(seconds=TICK_S)
    assert not [r for r in await read(sim) if isinstance(r.event, NodeStarted)]

    admit = sim.plan(
        "job-s",
        "s-admit",
        node_group_resources={"worker": NodeGroupResource(count=2)},
        placement={"node-1": 2},
        occurred_at=end1,
    )
    await sim.producer.publish(admit)
    await plan_partition(sim, "s-admit")
    await ack(sim, 1, end1, [0, 1, 2])
    await barrier_everywhere(sim, 2)
    reads = await read(sim)
    result = result_of(reads, "s-admit")
    assert result is not None
    assert result.status is ScaleStatus.APPLIED, result.reason
    assert result.occurred_at == end1
    started = [r.event for r in reads if isinstance(r.event, NodeStarted)]
    assert sorted(e.node.id for e in started) == [0, 1]
    assert {e.occurred_at for e in started} == {end1}
