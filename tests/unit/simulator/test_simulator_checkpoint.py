"""The virtual operator's checkpoint: a simulated cluster saved at any point and restored
says, from then on, exactly what the one that never stopped says, event for event."""

from __future__ import annotations

from datetime import timedelta

import orjson
import pytest

from handlers.simulator.checkpoint import (
    CheckpointError,
    OperatorState,
    Outgoing,
    dump,
    held_plans,
    load,
    shape_differs,
    tick_clock_for,
)
from handlers.simulator.cluster import Cluster, GiB
from handlers.simulator.fleet import VirtualCluster
from handlers.simulator.job import DEFAULT_ORIGIN
from handlers.simulator.lockstep import TickClock, TickGate
from schemas.jobs import JobEvent, JobMeta, JobSubmitted, RoleSpec
from schemas.lockstep import Barrier
from schemas.plans import NodeGroupResource, NodeResource, ScalePlan, ScaleStatus

Said = list[tuple[str, str | None, object, object]]


def submitted(name: str, app: str = "cifar10", replicas: int = 1, at: float = 0.0) -> JobSubmitted:
    return JobSubmitted(
        env="sim",
        occurred_at=DEFAULT_ORIGIN + timedelta(seconds=at),
        job=JobMeta(uuid=name, name=name, app=app),
        application=app,
        roles={"worker": RoleSpec(replicas=replicas, gpu_num=1, memory=16 * GiB)},
    )


def plan(job: str, plan_id: str, workers: int = 0, **fields: object) -> ScalePlan:
    if workers:
        fields["node_group_resources"] = {"worker": NodeGroupResource(count=workers)}
    return ScalePlan(env="sim", job=JobMeta(uuid=job), plan_id=plan_id, **fields)  # type: ignore[arg-type]


def said(events: list[JobEvent]) -> Said:
    return [(e.type, e.key, e.occurred_at, e.event_id) for e in events]


def restored(state: OperatorState) -> OperatorState:
    return load(dump(state))


def busy_fleet() -> VirtualCluster:
    """Jobs in every state a checkpoint may meet: running, restarting after a plan,
    waiting for capacity, stalled without memory, finished, arriving later, unsimulable."""
    fleet = VirtualCluster(Cluster(2, 4), origin=None)
    for s in (
        submitted("run", replicas=2),
        submitted("big", app="imagenet", replicas=4),
        submitted("wait", app="ncf", replicas=4),
        submitted("later", app="ncf", at=4000.0),
        submitted("ghost", app="no-such-app"),
    ):
        fleet.submit(s)
    fleet.start()
    fleet.advance_to(200.0)
    assert fleet.apply(plan("run", "p-up", 3)).status is ScaleStatus.APPLIED
    starve = {"worker": NodeGroupResource(node_resource=NodeResource(memory=1 * GiB))}
    assert fleet.apply(plan("big", "p-starve", node_group_resources=starve)).status in (
        ScaleStatus.APPLIED,
        ScaleStatus.PARTIAL,
    )
    knobs = {"local_batch_size": 64, "accumulation_steps": 2}
    typed = {"worker": NodeGroupResource(node_resource=NodeResource(gpu_type="a100"))}
    knobbed = fleet.apply(plan("run", "p-knobs", training=knobs, node_group_resources=typed))
    assert knobbed.status is ScaleStatus.PARTIAL
    fleet.advance_to(260.0)
    return fleet


def run_on(fleet: VirtualCluster, until: float) -> Said:
    """What the fleet says from now on: plans, the clock jumping, a late plan."""
    out = said(fleet.advance_to(until / 2))
    out += said(fleet.apply(plan("run", "p-down", 1)).events)
    out += said(fleet.apply(plan("run", "p-up", 3)).events)  # a repeat: nothing again
    while (step := fleet.step()) is not None and fleet.clock < until:
        out += said(step)
    return out


@pytest.mark.parametrize("at", [0.0, 35.0, 200.0, 260.0])
def test_a_restored_fleet_says_what_the_one_that_never_stopped_says(at: float) -> None:
    fleet = busy_fleet()
    fleet.advance_to(260.0 + at)
    copy = restored(OperatorState(fleet=fleet)).fleet
    assert copy is not None
    assert copy.clock == fleet.clock
    assert [j.status() for j in copy.jobs()] == [j.status() for j in fleet.jobs()]
    assert copy.cluster.free_gpus == fleet.cluster.free_gpus
    assert run_on(copy, 50_000.0) == run_on(fleet, 50_000.0)
    assert [j.status() for j in copy.jobs()] == [j.status() for j in fleet.jobs()]


def test_plans_applied_before_the_checkpoint_are_answered_as_the_first_time() -> None:
    copy = restored(OperatorState(fleet=busy_fleet())).fleet
    assert copy is not None
    again = copy.apply(plan("run", "p-knobs", training={"local_batch_size": 64}))
    assert again.status is ScaleStatus.PARTIAL
    assert again.events == []
    assert sorted(p.part for p in again.not_applied) == [
        "training.accumulation_steps",
        "training.local_batch_size",
        "worker.gpu_type",
    ]
    ghost = copy.apply(plan("ghost", "p-ghost", 2))
    assert (ghost.status, "not simulable" in ghost.reason) == (ScaleStatus.REJECTED, True)
    # not arrived yet: kept for its arrival (tests/unit/simulator/test_fleet_plans_before_arrival)
    later = copy.apply(plan("later", "p-later", 2))
    assert (later.status, later.reason) == (
        ScaleStatus.APPLIED,
        "waiting for the job's arrival at 2021-01-01T01:06:40+00:00",
    )


def test_a_fleet_whose_clock_has_not_started_keeps_its_held_submissions() -> None:
    fleet = VirtualCluster(Cluster(2, 4), origin=None)
    fleet.submit(submitted("b", at=60.0))
    fleet.submit(submitted("a", at=30.0))
    copy = restored(OperatorState(fleet=fleet)).fleet
    assert copy is not None
    assert not copy.started
    assert said(copy.start()) == said(fleet.start())
    assert copy.origin == fleet.origin


def test_the_lockstep_tick_gate_offsets_and_outbox_come_back() -> None:
    fleet = busy_fleet()
    ticks = TickClock(30.0)
    tick = ticks.run(fleet, carrying=True)
    assert tick is not None
    gate = TickGate.over([0, 1, 2])
    gate.barrier(tick.number)
    gate.ack(0, tick.number)
    gate.plan(1, plan("run", "held-1", 2))
    gate.plan(0, plan("run", "held-2", 1))  # partition 0 acknowledged: the next tick's
    barrier = Barrier(env="sim", tick=tick.number, sim_at=tick.at)
    state = OperatorState(
        fleet=fleet,
        ticks=ticks,
        gate=gate,
        offsets={("sim.job.events", 0): 7, ("sim.scale.plans", 2): 3},
        outbox=[Outgoing(e) for e in tick.events] + [Outgoing(barrier, ("sim.job.events",))],
        unbarriered=True,
    )
    copy = restored(state)
    assert copy.ticks == ticks
    assert copy.gate is not None
    assert (copy.gate.open_tick, copy.gate.barrier_out, copy.gate.waiting_on) == (1, True, [1, 2])
    assert [p.plan_id for p in held_plans(copy.gate)] == ["held-1", "held-2"]
    assert copy.offsets == state.offsets
    assert not copy.fresh("sim.job.events", 0, 6)
    assert copy.fresh("sim.job.events", 0, 7)
    assert copy.fresh("sim.job.events", 1, 0)
    assert copy.outbox == state.outbox
    assert copy.unbarriered
    # published: the outbox is on the bus already and is not sent again
    assert load(dump(state), published=True).outbox == []
    # both gates then take the same plans, and both clocks run the same next tick
    for g in (gate, copy.gate):
        g.ack(1, 1)
        g.ack(2, 1)
    assert gate.take() == copy.gate.take()
    assert copy.fleet is not None
    ours, theirs = ticks.run(fleet, carrying=True), copy.ticks.run(copy.fleet, carrying=True)
    assert ours is not None
    assert theirs is not None
    assert (theirs.number, theirs.end_s, said(theirs.events)) == (
        ours.number,
        ours.end_s,
        said(ours.events),
    )


def test_what_cannot_be_restored_is_said() -> None:
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        load(b"{nope")
    with pytest.raises(CheckpointError, match="version 99"):
        load(b'{"version": 99}')
    with pytest.raises(CheckpointError, match="damaged"):
        load(b'{"version": 1, "fleet": {"cluster": 3}}')


def test_a_tick_clock_for_a_cluster_that_ran_out_of_lockstep_starts_at_its_clock() -> None:
    fleet = busy_fleet()
    clock = tick_clock_for(fleet, 30.0)
    assert clock.grid * 30.0 >= fleet.clock
    tick = clock.run(fleet, carrying=True)
    assert tick is not None
    assert tick.end_s > fleet.clock - 30.0
    assert tick_clock_for(None, 30.0).grid == 0


def test_a_different_shape_is_named() -> None:
    fleet = busy_fleet()
    assert shape_differs(fleet, Cluster(2, 4)) is None
    assert shape_differs(fleet, Cluster(4, 8)) == "2 nodes x 4 GPUs (asked: 4 x 8)"


def scheduled_fleet() -> VirtualCluster:
    """A cluster whose jobs a brain admits: one running on the nodes a plan named, one
    waiting for room on a node another holds, one suspended, one never planned."""
    fleet = VirtualCluster(Cluster(2, 4), origin=None, sample_interval=30.0, admission="brain")
    for s in (
        submitted("run", replicas=2),
        submitted("wait", app="ncf"),
        submitted("stop"),
        submitted("idle", app="ncf"),
    ):
        fleet.submit(s)
    fleet.start()
    assert fleet.apply(plan("run", "p-run", 4, placement={"node-0": 4})).status in (
        ScaleStatus.APPLIED,
        ScaleStatus.PARTIAL,
    )
    fleet.apply(plan("stop", "p-stop-start", 2, placement={"node-1": 2}))
    fleet.advance_to(200.0)
    fleet.apply(plan("stop", "p-stop", suspend=True))
    fleet.apply(plan("wait", "p-wait", 2, placement={"node-0": 2}))
    fleet.advance_to(230.0)
    return fleet


def run_scheduled(fleet: VirtualCluster, until: float) -> Said:
    """The brain moves "run" to node-1 (room for "wait"), resumes "stop" on node-0 later."""
    out = said(fleet.advance_to(300.0))
    out += said(fleet.apply(plan("run", "p-move", placement={"node-1": 4})).events)
    out += said(fleet.advance_to(900.0))
    out += said(fleet.apply(plan("run", "p-rebatch", training={"local_batch_size": 64})).events)
    out += said(fleet.apply(plan("stop", "p-resume", 2, placement={"node-0": 2})).events)
    while (step := fleet.step()) is not None and fleet.clock < until:
        out += said(step)
    return out


def test_a_restored_cluster_under_the_brains_admission_goes_on_exactly() -> None:
    fleet = scheduled_fleet()
    copy = restored(OperatorState(fleet=fleet)).fleet
    assert copy is not None
    assert copy.admission == "brain"
    assert [j.status() for j in copy.jobs()] == [j.status() for j in fleet.jobs()]
    assert {j.job.uuid: j.state.value for j in copy.jobs()} == {
        "run": "running",
        "wait": "pending",
        "stop": "suspended",
        "idle": "pending",
    }
    assert run_scheduled(copy, 20_000.0) == run_scheduled(fleet, 20_000.0)
    assert [j.status() for j in copy.jobs()] == [j.status() for j in fleet.jobs()]
    idle = copy.job("idle")
    assert idle is not None and idle.status().started_at is None, "never planned, never run"


def test_a_version_1_checkpoint_restores_as_a_cluster_that_admitted_its_jobs() -> None:
    state = orjson.loads(dump(OperatorState(fleet=busy_fleet())))
    state["version"] = 1
    del state["fleet"]["admission"]
    for job in state["fleet"]["jobs"]:
        for key in ("admission", "granted", "pin"):
            del job[key]
    old = load(orjson.dumps(state)).fleet
    assert old is not None
    assert old.admission == "cluster"
    fleet = restored(OperatorState(fleet=busy_fleet())).fleet
    assert fleet is not None
    assert run_on(old, 50_000.0) == run_on(fleet, 50_000.0)
