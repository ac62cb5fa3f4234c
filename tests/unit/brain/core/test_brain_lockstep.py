"""The processor in lockstep (schemas.lockstep): a tick is decided whole, once its barrier
is in on every input partition, and in an order that does not depend on how the
partitions' records arrived."""

from __future__ import annotations

import itertools
from datetime import timedelta
from functools import cache

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import encode
from schemas.env_settings import BrainSettings
from schemas.envelope import Event
from schemas.jobs import JobMeta, JobStarted, JobSubmitted, NodeOOM, NodeRef, OOMKind, RoleSpec
from schemas.lockstep import Barrier
from streams.brain.core.optimizers.numeric import GiB
from streams.brain.core.policy import Policy
from streams.brain.core.processor import BrainProcessor
from tests.unit.brain.builders import ENV, T0, Rec

EVENTS = f"{ENV}.job.events"
METRICS = f"{ENV}.job.metrics"
INPUTS = [(EVENTS, 0), (EVENTS, 1), (METRICS, 0), (METRICS, 1)]
JOBS = [JobMeta(uuid="job-a"), JobMeta(uuid="job-b")]


def _oom(job: JobMeta, node: int, at_s: int) -> NodeOOM:
    return NodeOOM(
        env=ENV,
        job=job,
        occurred_at=T0 + timedelta(seconds=at_s),
        node=NodeRef(type="worker", id=node),
        kind=OOMKind.HOST_MEMORY,
        memory=16 * GiB,
    )


@cache
def partitions() -> dict[tuple[str, int], list[Rec]]:
    """Two ticks: job-a on partition 0, job-b on partition 1 of job.events, each
    submitted, started and out of memory twice (once per tick); barriers everywhere. The
    same records every call: plan ids derive from event ids."""
    per_tp: dict[tuple[str, int], list[Event]] = {tp: [] for tp in INPUTS}
    role = RoleSpec(replicas=2, cpu=8, memory=16 * GiB, gpu_num=1)
    for part, job in enumerate(JOBS):
        per_tp[(EVENTS, part)] += [
            JobSubmitted(env=ENV, job=job, occurred_at=T0, roles={"worker": role}),
            JobStarted(env=ENV, job=job, occurred_at=T0),
            _oom(job, 0, 10 + part),
        ]
    for tp in INPUTS:
        per_tp[tp].append(Barrier(env=ENV, tick=1, sim_at=T0 + timedelta(seconds=60)))
    for part, job in enumerate(JOBS):
        per_tp[(EVENTS, part)].append(_oom(job, 1, 70 - part))
    for tp in INPUTS:
        per_tp[tp].append(Barrier(env=ENV, tick=2, sim_at=T0 + timedelta(seconds=120)))
    return {
        tp: [Rec(tp[0], tp[1], i, None, encode(e)) for i, e in enumerate(events)]
        for tp, events in per_tp.items()
    }


def run(order: list[int], cuts: list[int], *, lockstep: bool) -> tuple[list[str], list[int]]:
    """Feed the partitions' records interleaved as `order` says (an index into the
    partitions that still have records, per record), in batches cut at `cuts`."""
    queues = {tp: list(recs) for tp, recs in partitions().items()}
    arrived: list[Rec] = []
    for choice in order:
        live = [tp for tp in INPUTS if queues[tp]]
        if not live:
            break
        arrived.append(queues[live[choice % len(live)]].pop(0))
    for tp in INPUTS:
        arrived += queues[tp]
    p = BrainProcessor(
        ENV, f"{ENV}.brain", Policy(BrainSettings(lockstep=lockstep, cluster_gpus=8))
    )
    p.inputs = set(INPUTS)
    plans: list[str] = []
    acks: list[int] = []
    bounds = sorted({0, len(arrived), *(c % (len(arrived) + 1) for c in cuts)})
    for lo, hi in itertools.pairwise(bounds):
        out = p.process(arrived[lo:hi])
        assert not out.letters
        plans += [plan.plan_id for plan in out.plans]
        acks += [ack.tick for ack in out.acks]
    return plans, acks


def test_nothing_is_decided_before_the_tick_is_whole() -> None:
    recs = partitions()
    p = BrainProcessor(ENV, f"{ENV}.brain", Policy(BrainSettings(lockstep=True)))
    p.inputs = set(INPUTS)
    first_three = [r for tp in INPUTS[:3] for r in recs[tp][: 4 if tp[0] == EVENTS else 1]]
    out = p.process(first_three)
    assert out.plans == [] and out.acks == []
    assert p.offsets == {}  # a checkpoint now covers nothing held
    out = p.process(recs[INPUTS[3]][:1])  # the last partition's first barrier
    assert [a.tick for a in out.acks] == [1]
    assert {plan.job.uuid for plan in out.plans} == {"job-a", "job-b"}
    assert p.offsets == {(EVENTS, 0): 4, (EVENTS, 1): 4, (METRICS, 0): 1, (METRICS, 1): 1}


def test_a_record_read_again_is_not_held_twice() -> None:
    recs = partitions()
    p = BrainProcessor(ENV, f"{ENV}.brain", Policy(BrainSettings(lockstep=True)))
    p.inputs = set(INPUTS)
    p.process(recs[(EVENTS, 0)][:2])
    p.process(recs[(EVENTS, 0)][:4])  # a fetcher restarted after a rebalance
    out = p.process([r for tp in INPUTS[1:] for r in recs[tp] if r.offset < 4])
    assert p.counters.processed == 6 and [a.tick for a in out.acks] == [1]


def test_out_of_lockstep_the_order_of_arrival_shows() -> None:
    """What the property below rules out does happen without lockstep: otherwise it
    would prove nothing."""
    a_first = run([0] * 20, [], lockstep=False)
    b_first = run([1] * 20, [], lockstep=False)
    assert a_first[0] != b_first[0]


@settings(max_examples=60, deadline=None)
@given(
    order=st.lists(st.integers(min_value=0, max_value=3), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=20), max_size=6),
)
def test_lockstep_decides_the_same_whatever_the_arrival(order: list[int], cuts: list[int]) -> None:
    assert run(order, cuts, lockstep=True) == run([], [], lockstep=True)
    plans, acks = run(order, cuts, lockstep=True)
    assert acks == [1, 2] and len(plans) >= 4
