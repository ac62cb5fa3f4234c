"""A plan may reach the simulated cluster before its job has arrived on the simulated
clock: a brain on event time reads a trace fed all at once, ahead of the clock. The plan is
kept (the latest that sets the job's pods wins, the knobs of all apply in order), answered
at once as the arriving job would answer it, and takes effect when the job arrives, exactly
as if it had come at that moment; a checkpoint keeps it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from handlers.simulator.checkpoint import OperatorState, dump, load
from handlers.simulator.cluster import Cluster
from handlers.simulator.fleet import VirtualCluster
from handlers.simulator.job import AWAITING_SCHEDULER, DEFAULT_ORIGIN, Admission, JobPhase
from schemas.jobs import JobEvent, JobMeta, JobSubmitted, NodeStarted, RoleSpec
from schemas.plans import NodeGroupResource, ScalePlan, ScaleStatus, TrainingApplied

ARRIVES = 600.0
ARRIVAL = (
    f"waiting for the job's arrival at {(DEFAULT_ORIGIN + timedelta(seconds=ARRIVES)).isoformat()}"
)

Said = list[tuple[str, str | None, object, object]]


def submitted(name: str, at: float = 0.0, app: str = "cifar10", replicas: int = 1) -> JobSubmitted:
    return JobSubmitted(
        env="sim",
        occurred_at=DEFAULT_ORIGIN + timedelta(seconds=at),
        job=JobMeta(uuid=name, name=name, app=app),
        application=app,
        roles={"worker": RoleSpec(replicas=replicas, gpu_num=1)},
    )


def plan(
    job: str, plan_id: str, workers: int = 0, placement: dict[str, int] | None = None, **kw: Any
) -> ScalePlan:
    if workers:
        kw["node_group_resources"] = {"worker": NodeGroupResource(count=workers)}
    return ScalePlan(
        env="sim", job=JobMeta(uuid=job), plan_id=plan_id, placement=placement or {}, **kw
    )


KNOBS = {"local_batch_size": 64, "accumulation_steps": 1}


def fleet_of(*jobs: JobSubmitted, admission: Admission = "brain") -> VirtualCluster:
    fleet = VirtualCluster(Cluster(4, 4), sample_interval=60.0, admission=admission)
    for job in jobs:
        fleet.submit(job)
    return fleet


def said(events: list[JobEvent]) -> Said:
    return [(e.type, e.key, e.occurred_at, e.event_id) for e in events]


def nodes_of(fleet: VirtualCluster, name: str) -> dict[int, int]:
    allocation = fleet.cluster.allocation(name)
    if allocation is None:
        return {}
    held: dict[int, int] = {}
    for key, node in allocation.nodes.items():
        held[node] = held.get(node, 0) + allocation.pods[key].gpu
    return held


def run_to(fleet: VirtualCluster, until: float) -> Said:
    return said(fleet.advance_to(until))


def test_a_plan_before_the_arrival_is_kept_and_answered_as_the_arriving_job_would() -> None:
    fleet = fleet_of(submitted("now"), submitted("later", at=ARRIVES))
    assert fleet.job("later") is None
    outcome = fleet.apply(plan("later", "p1", 4, {"node-2": 4}, training=KNOBS))
    assert outcome.status is ScaleStatus.PARTIAL  # its knobs await the job's confirmation
    assert outcome.reason == ARRIVAL
    assert sorted(p.part for p in outcome.not_applied) == [
        "training.accumulation_steps",
        "training.local_batch_size",
    ]
    assert outcome.events == []
    assert fleet.kept_plans("later") == ("p1",)
    assert fleet.cluster.free_gpus == 16, "nothing holds GPUs for a job not yet here"
    assert run_to(fleet, ARRIVES - 1) == []
    arrival = fleet.advance_to(ARRIVES + 1)
    assert len([e for e in arrival if isinstance(e, NodeStarted)]) == 4
    assert nodes_of(fleet, "later") == {2: 4}
    assert fleet.kept_plans("later") == ()
    job = fleet.job("later")
    assert job is not None and job.submitted_at == ARRIVES
    fleet.advance_to(ARRIVES + 100)
    assert job.state is JobPhase.RUNNING


def test_a_kept_plan_takes_effect_as_if_it_had_come_at_the_arrival() -> None:
    """The same events, event for event, as the same plan applied the moment the job
    arrives: keeping it changes when it is read, not what it does."""
    early = fleet_of(submitted("a", at=ARRIVES))
    on_time = fleet_of(submitted("a", at=ARRIVES))
    p = plan("a", "p", 2, {"node-1": 2}, training=KNOBS)
    assert early.apply(p).reason == ARRIVAL
    kept = run_to(early, ARRIVES)
    at_arrival = run_to(on_time, ARRIVES) + said(on_time.apply(p).events)
    assert kept == at_arrival
    assert run_to(early, 20_000.0) == run_to(on_time, 20_000.0)


def test_under_the_clusters_admission_the_job_starts_on_the_kept_plans_gang() -> None:
    """The plan is the job's desired state when it arrives: it starts as planned, not
    first as submitted and then again."""
    fleet = fleet_of(submitted("a", at=ARRIVES), admission="cluster")
    assert fleet.apply(plan("a", "p", 2, {"node-1": 2})).reason == ARRIVAL
    started = [e for e in fleet.advance_to(ARRIVES) if isinstance(e, NodeStarted)]
    assert len(started) == 2
    assert nodes_of(fleet, "a") == {1: 2}


def test_the_latest_plan_that_sets_the_pods_wins_and_no_earlier_gang_starts() -> None:
    fleet = fleet_of(submitted("a", at=ARRIVES))
    fleet.apply(plan("a", "first", 4, {"node-0": 4}, training=KNOBS))
    fleet.apply(plan("a", "second", 2, {"node-3": 2}, training=KNOBS))
    assert fleet.kept_plans("a") == ("first", "second")  # (the first for its knobs alone)
    events = fleet.advance_to(ARRIVES)
    started = [e for e in events if isinstance(e, NodeStarted)]
    assert len(started) == 2
    assert nodes_of(fleet, "a") == {3: 2}


def test_a_rebatch_after_a_placement_keeps_the_placement() -> None:
    fleet = fleet_of(submitted("a", at=ARRIVES))
    fleet.apply(plan("a", "place", 4, {"node-1": 4}, training=KNOBS))
    rebatch = fleet.apply(plan("a", "rebatch", training={"local_batch_size": 128}))
    assert (rebatch.status, rebatch.reason) == (ScaleStatus.PARTIAL, ARRIVAL)
    events = fleet.advance_to(ARRIVES + 100)
    assert nodes_of(fleet, "a") == {1: 4}
    (confirmed,) = [e for e in events if isinstance(e, TrainingApplied)]
    assert confirmed.plan_id == "rebatch"
    assert confirmed.training == {"local_batch_size": 128, "accumulation_steps": 1}


def test_a_suspend_before_the_arrival_leaves_the_job_waiting_for_the_scheduler() -> None:
    fleet = fleet_of(submitted("a", at=ARRIVES))
    fleet.apply(plan("a", "place", 4, {"node-1": 4}))
    assert fleet.apply(plan("a", "stop", suspend=True)).reason == ARRIVAL
    assert fleet.advance_to(ARRIVES + 100) == []
    job = fleet.job("a")
    assert job is not None
    assert (job.state, job.status().waiting_for) == (JobPhase.PENDING, AWAITING_SCHEDULER)
    assert fleet.cluster.free_gpus == 16


def test_a_plan_id_is_applied_once_and_a_repeat_takes_nothing_back() -> None:
    fleet = fleet_of(submitted("a", at=ARRIVES))
    first = fleet.apply(plan("a", "first", 4, {"node-0": 4}))
    fleet.apply(plan("a", "second", 2, {"node-3": 2}))
    again = fleet.apply(plan("a", "first", 4, {"node-0": 4}))  # re-delivered
    assert (again.status, again.reason, again.events) == (first.status, first.reason, [])
    assert fleet.kept_plans("a") == ("second",)
    fleet.advance_to(ARRIVES)
    assert nodes_of(fleet, "a") == {3: 2}
    # after the arrival the job has them already: nothing again
    assert fleet.apply(plan("a", "second", 2, {"node-3": 2})).events == []
    assert nodes_of(fleet, "a") == {3: 2}


@pytest.mark.parametrize(
    ("placement", "workers", "reason"),
    [
        ({"node-4": 4}, 4, "placement names 'node-4'"),
        ({"node-0": 4}, 2, "placement holds 4 GPUs, the job's training replicas need 2"),
    ],
)
def test_a_plan_the_arriving_job_would_refuse_is_refused_now(
    placement: dict[str, int], workers: int, reason: str
) -> None:
    fleet = fleet_of(submitted("a", at=ARRIVES))
    fleet.apply(plan("a", "good", 2, {"node-2": 2}))
    outcome = fleet.apply(plan("a", "bad", workers, placement))
    assert outcome.status is ScaleStatus.REJECTED
    assert outcome.reason.startswith(reason)
    assert fleet.kept_plans("a") == ("good",), "the plan kept before it stands"
    fleet.advance_to(ARRIVES)
    assert nodes_of(fleet, "a") == {2: 2}


def test_plans_for_unknown_and_unsimulable_jobs_are_still_rejected() -> None:
    fleet = fleet_of(submitted("ghost", at=ARRIVES, app="no-such-app"))
    unknown = fleet.apply(plan("nobody", "p", 1))
    assert unknown.status is ScaleStatus.REJECTED
    assert unknown.reason.startswith("unknown job 'nobody'")
    ghost = fleet.apply(plan("ghost", "p", 1))
    assert ghost.status is ScaleStatus.REJECTED
    assert "not simulable" in ghost.reason
    assert fleet.kept_plans("ghost") == ()


def test_a_plan_for_a_submission_held_before_the_clock_starts_is_kept() -> None:
    fleet = VirtualCluster(Cluster(4, 4), origin=None, admission="brain")
    fleet.submit(submitted("a"))
    fleet.submit(submitted("b", at=ARRIVES))
    assert fleet.apply(plan("b", "p", 2, {"node-0": 2})).reason == ARRIVAL
    fleet.start()
    fleet.advance_to(ARRIVES)
    assert nodes_of(fleet, "b") == {0: 2}


def test_kept_plans_survive_a_checkpoint() -> None:
    fleet = fleet_of(submitted("now"), submitted("a", at=ARRIVES))
    fleet.apply(plan("now", "n", 1, {"node-0": 1}))
    fleet.advance_to(100.0)
    fleet.apply(plan("a", "place", 4, {"node-1": 4}, training=KNOBS))
    fleet.apply(plan("a", "rebatch", training={"local_batch_size": 128}))
    copy = load(dump(OperatorState(fleet=fleet))).fleet
    assert copy is not None
    assert copy.kept_plans("a") == fleet.kept_plans("a") == ("place", "rebatch")
    repeat = copy.apply(plan("a", "place", 4, {"node-1": 4}, training=KNOBS))
    assert (repeat.status, repeat.reason) == (ScaleStatus.PARTIAL, ARRIVAL)
    fleet.apply(plan("a", "place", 4, {"node-1": 4}, training=KNOBS))
    assert run_to(copy, 20_000.0) == run_to(fleet, 20_000.0)
    assert nodes_of(copy, "a") == nodes_of(fleet, "a")
