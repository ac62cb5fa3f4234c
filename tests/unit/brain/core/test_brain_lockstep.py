"""The processor in lockstep (schemas.lockstep): a tick is decided whole, once its barrier
is in on every input partition, and in an order that does not depend on how the
partitions' records arrived."""

from __future__ import annotations

import itertools
from datetime import timedelta
from functools import cache

import pytest
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
from streams.brain.core.snapshot import Loaded
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


def _copies_run(
    copies: bool, cut: int
) -> tuple[list[str], list[int], dict[tuple[str, int], int], int]:
    """Ticks 1 and 2 decided, then (``copies``) the last two records of job.events[0] (job-a's
    second OOM and the barrier of tick 2) published again at the next offsets, as a
    producer does with records a broker lost after this brain had read them
    (dlrover_events/runtime/unjournaled.py: "at other offsets"), read in two batches cut
    at ``cut``; then the barriers of tick 3."""
    recs = {tp: list(r) for tp, r in partitions().items()}
    p = BrainProcessor(ENV, f"{ENV}.brain", Policy(BrainSettings(lockstep=True, cluster_gpus=8)))
    p.inputs = set(INPUTS)
    out = p.process([r for tp in INPUTS for r in recs[tp]])
    plans = [plan.plan_id for plan in out.plans]
    acks = [ack.tick for ack in out.acks]
    later: list[Rec] = []
    if copies:
        src = recs[(EVENTS, 0)]
        later += [Rec(EVENTS, 0, len(src) + i, None, r.value) for i, r in enumerate(src[-2:])]
    three = encode(Barrier(env=ENV, tick=3, sim_at=T0 + timedelta(seconds=180)))
    for tp in INPUTS:
        at = len(recs[tp]) + (2 if copies and tp == (EVENTS, 0) else 0)
        later.append(Rec(tp[0], tp[1], at, None, three))
    for batch in (later[:cut], later[cut:]):
        out = p.process(batch)
        plans += [plan.plan_id for plan in out.plans]
        acks += [ack.tick for ack in out.acks]
    return plans, acks, dict(p.offsets), p.counters.ticks


@pytest.mark.parametrize("cut", [0, 1, 2, 6])
def test_a_tick_published_again_at_other_offsets_is_not_decided_again(cut: int) -> None:
    """Copies of a tick decided already (a broker that lost them, their producer publishing
    them again after it) decide nothing: the same plans as without them, each tick
    decided once (a copied barrier is acknowledged again, with the same id: its producer
    may wait for that), and the copies read past (a restart does not read them again)."""
    plans, acks, offsets, ticks = _copies_run(True, cut)
    calm_plans, calm_acks, calm_offsets, calm_ticks = _copies_run(False, cut)
    assert ticks == calm_ticks == 3
    assert calm_acks == [1, 2, 3] and sorted(acks) == [1, 2, 2, 3]
    assert plans == calm_plans
    assert offsets == {**calm_offsets, (EVENTS, 0): calm_offsets[(EVENTS, 0)] + 2}


def test_an_event_and_its_copy_in_one_tick_are_decided_once() -> None:
    """A copy of an event not yet decided (published again before its tick's barrier came)
    is left out of the tick: the tick decides what it would without the copy."""
    recs = partitions()
    p = BrainProcessor(ENV, f"{ENV}.brain", Policy(BrainSettings(lockstep=True, cluster_gpus=8)))
    p.inputs = set(INPUTS)
    a = recs[(EVENTS, 0)]
    copy = Rec(EVENTS, 0, 100, None, a[2].value)  # job-a's first OOM again
    out = p.process([*a[:3], copy, *(r for tp in INPUTS[1:] for r in recs[tp][:4])])
    out2 = p.process([Rec(EVENTS, 0, 101, None, a[3].value)])
    calm = BrainProcessor(ENV, f"{ENV}.brain", Policy(BrainSettings(lockstep=True, cluster_gpus=8)))
    calm.inputs = set(INPUTS)
    calm_out = calm.process([r for tp in INPUTS for r in recs[tp][:4]])
    plans = [plan.plan_id for plan in [*out.plans, *out2.plans]]
    assert plans == [plan.plan_id for plan in calm_out.plans] and len(plans) >= 2
    assert p.counters.processed == calm.counters.processed  # the copy folded not at all


def test_partitions_taken_over_again_decide_their_ticks_again() -> None:
    """Not a copy: ticks read again from a checkpoint after a rebalance (the partitions
    dropped, then installed from what was checkpointed) are decided again, as before."""
    recs = partitions()
    p = BrainProcessor(ENV, f"{ENV}.brain", Policy(BrainSettings(lockstep=True, cluster_gpus=8)))
    p.inputs = set(INPUTS)
    first = p.process([r for tp in INPUTS for r in recs[tp]])
    p.drop({0, 1})
    p.install({0, 1}, Loaded(states={}, offsets={}))
    p.inputs = set(INPUTS)
    again = p.process([r for tp in INPUTS for r in recs[tp]])
    assert [a.tick for a in again.acks] == [a.tick for a in first.acks] == [1, 2]
    assert [x.plan_id for x in again.plans] == [x.plan_id for x in first.plans]


def test_a_brain_started_from_a_checkpoint_knows_the_ticks_it_decided() -> None:
    """Copies of a tick decided (records a broker lost, published again by their producer)
    that lie after the checkpoint's offsets are copies for a brain started from that
    checkpoint too: the checkpoint keeps the latest tick decided (`Snapshot.ticks`). Before,
    a brain started again (a kill, a rewind after a kill of `up`, a rebalance) took none
    for a copy and decided tick 2 again with the copied records alone, folding them a
    second time (issue 37: the chaos test of the stack made an optimize plan more after
    such a start)."""
    recs = {tp: list(r) for tp, r in partitions().items()}
    first = BrainProcessor(
        ENV, f"{ENV}.brain", Policy(BrainSettings(lockstep=True, cluster_gpus=8))
    )
    first.inputs = set(INPUTS)
    first.process([r for tp in INPUTS for r in recs[tp]])
    snap = first.snapshot()
    assert snap.ticks == {0: 2, 1: 2}
    again = BrainProcessor(
        ENV, f"{ENV}.brain", Policy(BrainSettings(lockstep=True, cluster_gpus=8))
    )
    again.install({0, 1}, Loaded(dict(snap.states), dict(snap.offsets), ticks=dict(snap.ticks)))
    again.inputs = set(INPUTS)
    src = recs[(EVENTS, 0)]
    copies = [Rec(EVENTS, 0, len(src) + i, None, r.value) for i, r in enumerate(src[-2:])]
    three = encode(Barrier(env=ENV, tick=3, sim_at=T0 + timedelta(seconds=180)))
    at = {tp: len(recs[tp]) + (2 if tp == (EVENTS, 0) else 0) for tp in INPUTS}
    out = again.process([*copies, *(Rec(tp[0], tp[1], at[tp], None, three) for tp in INPUTS)])
    calm = first.process([Rec(tp[0], tp[1], len(recs[tp]), None, three) for tp in INPUTS])
    assert again.counters.ticks == 1 and again.counters.processed == 0  # tick 3 alone
    assert again.lockstep.copies == 2
    assert sorted(a.tick for a in out.acks) == [2, 3] and [a.tick for a in calm.acks] == [3]
    assert [p.plan_id for p in out.plans] == [p.plan_id for p in calm.plans]
    assert again.offsets == {**first.offsets, (EVENTS, 0): first.offsets[(EVENTS, 0)] + 2}
