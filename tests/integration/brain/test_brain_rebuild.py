"""A brain that rebuilds its partitions from offset 0 (their logs on a journaled broker end
before its checkpoint: `Brain._rebuild`) decides what a run without the rebuild decides,
even when it is started again in the middle of the replay (issue 37: in the chaos test of
the stack, a replay from offset 0 after a kill of `up` made 2 plans the run without kills
did not).

The processor and the checkpoint's SQL on real Postgres, fed a lockstep workload of two
partitions as records; no broker stands in the way of the order of the records, so the
plans of each run are a function of what was checkpointed and loaded alone."""

from __future__ import annotations

from datetime import timedelta

import pytest

from dlrover_events.store import EnvStore
from schemas import decode, encode
from schemas.env_settings import BrainSettings
from schemas.envelope import Event
from schemas.jobs import (
    JobCompleted,
    JobMeta,
    JobStarted,
    JobSubmitted,
    NodeUsage,
    RoleSpec,
    RuntimeSample,
)
from schemas.lockstep import Barrier
from schemas.plans import OptimizePlan, ScalePlan
from streams.brain.core.optimizers.numeric import GiB
from streams.brain.core.policy import Policy
from streams.brain.core.processor import HISTORY_PER_SCENARIO, BrainProcessor
from streams.brain.runtime.checkpoint import BrainStore
from tests.conftest import EnvFactory
from tests.integration.brain.workload import T0
from tests.unit.brain.builders import Rec

pytestmark = pytest.mark.integration

TICK_S = 120
TICKS = 7
#: the cluster's GPUs: two jobs of 2 leave 1 free, so what a job may grow into depends on
#: what the other jobs hold at that tick
GPUS = 5
#: runtime samples of a job a tick (as the chaos test's virtual operator sends)
SAMPLES = 4


def _at(tick: int, second: int) -> timedelta:
    return timedelta(seconds=(tick - 1) * TICK_S + second)


def _sample(env: str, job: JobMeta, tick: int, n: int) -> RuntimeSample:
    return RuntimeSample(
        env=env,
        job=job,
        occurred_at=T0 + _at(tick, 30 + 15 * n),
        global_step=10 * (SAMPLES * tick + n),
        speed=1.0,
        samples_per_s=256,
        batch_size=256,
        local_batch_size=64,
        nodes=[
            NodeUsage(type="worker", id=k, cpu=4, memory=12 * GiB, step_time=1.0 + 0.01 * k)
            for k in range(2)
        ],
    )


def _job(env: str, name: str, first: int, last: int, done: int | None) -> list[Event]:
    """A job of two one-GPU workers: submitted and started at tick `first`, `SAMPLES`
    samples a tick up to `last`, completed at tick `done` (if any)."""
    job = JobMeta(uuid=name)
    role = RoleSpec(replicas=2, min_replicas=1, max_replicas=8, gpu_num=1, cpu=8, memory=16 * GiB)
    events: list[Event] = [
        JobSubmitted(
            env=env,
            job=job,
            occurred_at=T0 + _at(first, 10),
            roles={"worker": role},
            batch_size=256,
        ),
        JobStarted(env=env, job=job, occurred_at=T0 + _at(first, 20)),
    ]
    events += [
        _sample(env, job, tick, n) for tick in range(first, last + 1) for n in range(SAMPLES)
    ]
    if done is not None:
        events.append(JobCompleted(env=env, job=job, occurred_at=T0 + _at(done, 90)))
    return events


def workload(env: str) -> dict[tuple[str, int], list[Rec]]:
    """job-a and job-c on partition 0, job-b on partition 1, with each tick's barrier on
    both. job-b ends at tick 3, after job-a's first decision (which it leaves 1 GPU to grow
    into, not 3), and job-c comes at tick 4, after the replay's first checkpoint (below),
    into the GPU job-b left; built once per test: plan ids derive from event ids."""
    jobs = {
        0: _job(env, "job-a", 1, TICKS, None) + _job(env, "job-c", 4, 6, 6),
        1: _job(env, "job-b", 1, 3, 3),
    }
    events = f"{env}.job.events"
    out: dict[tuple[str, int], list[Rec]] = {}
    for part, evs in jobs.items():
        ordered: list[Event] = []
        for tick in range(1, TICKS + 2):  # (one more: the ticks of the stack after its kill)
            sim_at = T0 + _at(tick + 1, 0)
            ordered += sorted(
                (e for e in evs if sim_at - timedelta(seconds=TICK_S) <= e.occurred_at < sim_at),
                key=lambda e: e.occurred_at,
            )
            ordered.append(Barrier(env=env, tick=tick, sim_at=sim_at))
        out[(events, part)] = [
            Rec(events, part, i, e.key.encode() if e.key else None, encode(e))
            for i, e in enumerate(ordered)
        ]
    return out


def _processor(env: str, recs: dict[tuple[str, int], list[Rec]]) -> BrainProcessor:
    p = BrainProcessor(
        env,
        f"{env}.brain",
        Policy(
            BrainSettings(lockstep=True, cluster_gpus=GPUS, job_config={"optimizer": "goodput"})
        ),
    )
    p.inputs = set(recs)
    return p


def _feed(p: BrainProcessor, recs: dict[tuple[str, int], list[Rec]], ticks: int) -> list[bytes]:
    """The records up to the barrier of tick `ticks` (the processor skips what its
    offsets include); the plans they made."""
    batch = []
    for tp_recs in recs.values():
        for rec in tp_recs:
            batch.append(rec)
            event = decode(rec.value)
            if isinstance(event, Barrier) and event.tick == ticks:
                break
    out = p.process(batch)
    assert not out.letters
    return [encode(plan) for plan in out.plans]


def _said(plans: list[bytes]) -> list[str]:
    """A line a plan: job, simulated time, what it says (to read a difference)."""
    lines = []
    for raw in plans:
        plan = decode(raw)
        assert isinstance(plan, OptimizePlan | ScalePlan)
        what = plan.reason if isinstance(plan, OptimizePlan) else plan.node_group_resources
        lines.append(f"{type(plan).__name__} {plan.job.uuid} {plan.occurred_at:%H:%M:%S} {what}")
    return lines


async def _load(store: BrainStore, p: BrainProcessor, topics: list[str]) -> None:
    loaded = await store.load({0, 1}, topics, history_per_scenario=HISTORY_PER_SCENARIO)
    p.install({0, 1}, loaded)


async def test_a_rebuild_from_offset_0_started_again_midway_decides_as_before(
    pg_dsn: str, make_env: EnvFactory
) -> None:
    """The brain's first run checkpoints every tick; then the log of partition 0 ends
    before that checkpoint (a journaled broker: `Brain._load`), and the brain rebuilds
    what it loads, both partitions, from offset 0. It checkpoints after tick 2 of the
    replay and is started again there (a kill, a rebalance, a rewind), loading that
    checkpoint. Its plans, replay and rest together, are those of a brain that ran once:
    job-c, which only the first run had met by then, is not loaded finished (its
    submission ignored), and job-a's decisions of ticks 1-4 see job-b hold its GPUs as it
    did then, not as the first run left it (ended)."""
    env = (await make_env(partitions=2)).name
    recs = workload(env)
    topics = sorted({name for name, _ in recs})
    calm = _feed(_processor(env, recs), recs, TICKS + 1)
    assert len(calm) >= 6, "the jobs were planned: the test would be vacuous"
    async with await EnvStore.open(pg_dsn, env) as env_store:
        store = BrainStore(env_store)
        first = _processor(env, recs)
        await _load(store, first, topics)
        assert _feed(first, recs, TICKS) == calm
        await store.save(first.snapshot())

        # partition 0's log ends before the checkpoint: both rebuilt, as `Brain._load` does
        replay = _processor(env, recs)
        loaded = await store.load({0, 1}, topics, history_per_scenario=HISTORY_PER_SCENARIO)
        dropped = await store.rebuild(loaded, {0, 1}, topics)
        left = (loaded.states, loaded.finished, loaded.offsets)
        replay.install({0, 1}, loaded)
        plans = _feed(replay, recs, 2)
        snap = replay.snapshot()
        snap.reset = dict.fromkeys(dropped, 0)  # (as `Brain._snapshot` writes its resets)
        await store.save(snap)

        again = _processor(env, recs)
        await _load(store, again, topics)
        met = {*again.states, *again.finished}
        plans += _feed(again, recs, TICKS + 1)
    assert _said(plans) == _said(calm)
    assert [decode(p) for p in plans] == [decode(p) for p in calm]
    assert set(dropped) == set(recs) and left == ({}, {}, {})
    assert met == {"job-a", "job-b"}  # (job-c comes at tick 4)
