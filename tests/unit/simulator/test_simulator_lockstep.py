"""Lockstep's pure core: ticks on a grid, plans held for their tick and applied in one
order, so the same input read in any interleaving gives the same events."""

from __future__ import annotations

from datetime import timedelta

import pytest

from handlers.simulator.cluster import Cluster
from handlers.simulator.fleet import VirtualCluster
from handlers.simulator.job import DEFAULT_ORIGIN
from handlers.simulator.lockstep import TickClock, TickGate, apply_order
from schemas.jobs import JobEvent, JobMeta, JobSubmitted, RoleSpec
from schemas.plans import NodeGroupResource, ScalePlan

Said = list[tuple[str, str | None, object, object]]


def submitted(name: str, replicas: int = 1, at: float = 0.0) -> JobSubmitted:
    return JobSubmitted(
        env="sim",
        occurred_at=DEFAULT_ORIGIN + timedelta(seconds=at),
        job=JobMeta(uuid=name, name=name, app="cifar10"),
        application="cifar10",
        roles={"worker": RoleSpec(replicas=replicas, gpu_num=1)},
    )


def plan(job: str, plan_id: str, workers: int, at: float = 0.0) -> ScalePlan:
    return ScalePlan(
        env="sim",
        job=JobMeta(uuid=job),
        plan_id=plan_id,
        occurred_at=DEFAULT_ORIGIN + timedelta(seconds=at),
        node_group_resources={"worker": NodeGroupResource(count=workers)},
    )


def said(events: list[JobEvent]) -> Said:
    return [(e.type, e.key, e.occurred_at, e.event_id) for e in events]


def fleet_of(*submissions: JobSubmitted) -> VirtualCluster:
    """A fleet whose clock starts at its earliest submission, as the operator's does."""
    fleet = VirtualCluster(Cluster(2, 4), origin=None)
    for s in submissions:
        fleet.submit(s)
    return fleet


def test_ticks_end_on_a_grid_from_the_origin_and_hold_what_happened_before_their_end() -> None:
    fleet = fleet_of(submitted("a", 2))
    first = fleet.start()
    clock = TickClock(30.0)
    ticks = [clock.run(fleet, carrying=bool(first)) for _ in range(5)]
    assert [t.number for t in ticks if t] == [1, 2, 3, 4, 5]
    assert [t.end_s for t in ticks if t] == [30.0, 60.0, 90.0, 120.0, 150.0]
    previous = DEFAULT_ORIGIN
    for tick in ticks:
        assert tick is not None
        assert tick.at == DEFAULT_ORIGIN + timedelta(seconds=tick.end_s)
        assert tick.events, "a running job samples every 30 s"
        assert all(previous < e.occurred_at <= tick.at for e in tick.events)
        previous = tick.at
    assert fleet.clock == 150.0


def test_a_stretch_where_nothing_happens_is_crossed_in_one_tick() -> None:
    clock = TickClock(30.0)
    assert clock.next_end(1000.0, carrying=False) == 34  # 1020 s: the tick that holds 1000 s
    assert clock.next_end(1000.0, carrying=True) == 1  # results to say: no skipping
    assert clock.next_end(None, carrying=True) == 1
    assert clock.next_end(None, carrying=False) is None  # nothing to do: idle
    assert clock.next_end(12.0, carrying=False) == 1
    clock.grid = 3
    assert clock.next_end(90.0000001, carrying=False) == 4
    assert clock.next_end(120.0, carrying=False) == 4  # an event on the grid point itself

    fleet = fleet_of(submitted("early", 1), submitted("late", 1, at=1000.0))
    fleet.start()
    ticker = TickClock(30.0)
    ends = []
    for _ in range(200):
        tick = ticker.run(fleet, carrying=False)
        if tick is None or tick.end_s > 1000.0:
            ends.append(tick and tick.end_s)
            break
    assert ends == [1020.0]
    assert fleet.job("late") is not None


def test_an_idle_fleet_runs_no_tick() -> None:
    fleet = fleet_of()
    fleet.start()
    clock = TickClock(30.0)
    assert clock.run(fleet, carrying=False) is None
    assert clock.number == 0
    tick = clock.run(fleet, carrying=True)
    assert tick is not None
    assert (tick.number, tick.end_s, tick.events) == (1, 30.0, [])


def test_the_grid_is_exact_over_many_ticks() -> None:
    clock = TickClock(0.1)
    for _ in range(1000):
        end = clock.next_end(None, carrying=True)
        assert end == clock.grid + 1
        clock.grid = end
    assert clock.grid * 0.1 == pytest.approx(100.0)


def test_a_tick_must_last() -> None:
    with pytest.raises(ValueError, match="positive"):
        TickClock(0.0)


def test_the_same_submissions_read_in_any_order_give_the_same_ticks() -> None:
    jobs = [submitted(f"j{i}", replicas=1 + i % 3, at=float(10 * (i // 2))) for i in range(8)]

    def run(order: list[JobSubmitted]) -> Said:
        fleet = fleet_of(*order)
        out = said(fleet.start())
        clock = TickClock(30.0)
        for _ in range(40):
            tick = clock.run(fleet, carrying=False)
            if tick is None:
                break
            out.extend(said(tick.events))
        return out

    assert run(jobs) == run(list(reversed(jobs)))
    assert run(jobs) == run(jobs[1::2] + jobs[0::2])


def test_a_plan_belongs_to_the_open_tick_until_its_partition_acknowledged_it() -> None:
    gate = TickGate.over([0, 1, 2])
    assert gate.plan(0, plan("a", "p1", 2)) == 1
    gate.barrier(1)
    assert not gate.ack(0, 1)
    assert gate.plan(0, plan("a", "p2", 3)) == 2  # after partition 0's ack: the next tick
    assert gate.plan(1, plan("b", "p3", 2)) == 1
    assert not gate.ack(1, 1)
    assert gate.waiting_on == [2]
    assert not gate.ack(2, 0), "an earlier tick's ack (a re-delivery) counts for nothing"
    with pytest.raises(ValueError, match="not acknowledged"):
        gate.take()
    assert gate.ack(2, 1)
    assert [p.plan_id for p in gate.take()] == ["p1", "p3"]
    assert gate.open_tick == 2
    assert not gate.due
    assert gate.holding  # p2 waits for tick 2
    gate.barrier(2)
    for partition in (2, 1, 0):
        gate.ack(partition, 2)
    assert [p.plan_id for p in gate.take()] == ["p2"]
    assert not gate.holding


def test_acks_before_the_barrier_do_not_release_the_tick() -> None:
    gate = TickGate.over([0])
    gate.ack(0, 1)
    assert not gate.due  # the barrier is not out yet
    gate.barrier(1)
    assert gate.due
    with pytest.raises(ValueError, match="barrier 3"):
        gate.barrier(3)


def test_a_tick_s_plans_are_applied_in_one_order_however_the_partitions_interleaved() -> None:
    plans = [
        plan("b", "b-1", 2, at=30.0),
        plan("a", "a-1", 2, at=30.0),
        plan("c", "c-1", 1, at=15.0),
        plan("a", "a-0", 4, at=30.0),
    ]

    def run(reading: list[tuple[int, ScalePlan]]) -> Said:
        fleet = fleet_of(submitted("a", 1), submitted("b", 1), submitted("c", 2))
        fleet.start()
        clock = TickClock(30.0)
        clock.run(fleet, carrying=False)
        gate = TickGate.over([0, 1])
        gate.barrier(1)
        for partition, p in reading:
            gate.plan(partition, p)
        gate.ack(0, 1)
        gate.ack(1, 1)
        out: Said = []
        for p in gate.take():
            outcome = fleet.apply(p)
            out.append(("result", p.plan_id, outcome.status, fleet.at()))
            out.extend(said(outcome.events))
        for _ in range(5):
            tick = clock.run(fleet, carrying=False)
            assert tick is not None
            out.extend(said(tick.events))
        return out

    one = run([(0, plans[0]), (1, plans[1]), (0, plans[2]), (1, plans[3])])
    other = run([(1, plans[3]), (1, plans[1]), (0, plans[2]), (0, plans[0])])
    assert one == other
    applied_at = {at for kind, _, _, at in one if kind == "result"}
    assert applied_at == {DEFAULT_ORIGIN + timedelta(seconds=30)}, "at the tick's end"
    assert sorted(plans, key=apply_order)[0].plan_id == "c-1"
