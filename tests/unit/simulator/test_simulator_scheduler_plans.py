"""The simulated cluster does what a cluster scheduler in the brain asks and nothing else:
under the brain's admission a job starts only when a plan gives it replicas, on exactly
the nodes the plan names; a suspend frees its GPUs and keeps its progress; a batch-only
change applies in place; and its samples say what the scheduler fits its models on."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from handlers.simulator.cluster import Cluster, GiB
from handlers.simulator.fleet import VirtualCluster
from handlers.simulator.job import (
    AWAITING_RESUME,
    AWAITING_SCHEDULER,
    DEFAULT_ORIGIN,
    TERMINATED_EXIT_CODE,
    Admission,
    JobPhase,
    JobSimulator,
)
from handlers.simulator.throughput import load_application
from schemas.jobs import (
    JobCompleted,
    JobEvent,
    JobMeta,
    JobStarted,
    JobSubmitted,
    NodeExited,
    NodeStarted,
    RoleSpec,
    RuntimeSample,
)
from schemas.plans import NodeGroupResource, ScalePlan, ScaleStatus, TrainingApplied


def submitted(name: str, replicas: int = 1, app: str = "cifar10", at: float = 0.0) -> JobSubmitted:
    return JobSubmitted(
        env="sim",
        occurred_at=DEFAULT_ORIGIN + timedelta(seconds=at),
        job=JobMeta(uuid=name, name=name, app=app),
        application=app,
        roles={"worker": RoleSpec(replicas=replicas, gpu_num=1)},
    )


def plan(
    job: str,
    plan_id: str,
    workers: int = 0,
    placement: dict[str, int] | None = None,
    **fields: Any,
) -> ScalePlan:
    if workers:
        fields["node_group_resources"] = {"worker": NodeGroupResource(count=workers)}
    return ScalePlan(
        env="sim", job=JobMeta(uuid=job), plan_id=plan_id, placement=placement or {}, **fields
    )


def of(events: list[JobEvent], kind: type[JobEvent]) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


def fleet_of(*jobs: JobSubmitted, admission: Admission = "brain") -> VirtualCluster:
    fleet = VirtualCluster(Cluster(4, 4), sample_interval=60.0, admission=admission)
    for job in jobs:
        fleet.submit(job)
    return fleet


def job_of(fleet: VirtualCluster, name: str) -> JobSimulator:
    job = fleet.job(name)
    assert job is not None
    return job


def nodes_of(fleet: VirtualCluster, name: str) -> dict[int, int]:
    """Node index -> GPUs the job holds there."""
    allocation = fleet.cluster.allocation(name)
    if allocation is None:
        return {}
    held: dict[int, int] = {}
    for key, node in allocation.nodes.items():
        held[node] = held.get(node, 0) + allocation.pods[key].gpu
    return held


# -- admission ---------------------------------------------------------------------------


def test_under_the_brains_admission_a_job_waits_for_a_plan_that_gives_it_replicas() -> None:
    fleet = fleet_of(submitted("a", replicas=2))
    assert fleet.advance_to(3600.0) == []
    status = job_of(fleet, "a").status()
    assert (status.state, status.waiting_for) == (JobPhase.PENDING, AWAITING_SCHEDULER)
    assert fleet.cluster.free_gpus == 16
    assert fleet.observed("a") == {
        "worker": {"pending": 2, "running": 0, "succeeded": 0, "failed": 0}
    }
    # knobs alone give no replicas: still waiting
    knobs = fleet.apply(plan("a", "knobs", training={"local_batch_size": 64}))
    assert knobs.status is ScaleStatus.PARTIAL
    assert knobs.reason == f"waiting for {AWAITING_SCHEDULER}"
    assert job_of(fleet, "a").state is JobPhase.PENDING
    admit = fleet.apply(plan("a", "admit", 4, {"node-1": 4}))
    assert admit.status is ScaleStatus.APPLIED
    assert len(of(admit.events, NodeStarted)) == 4
    assert nodes_of(fleet, "a") == {1: 4}
    events = fleet.advance_to(3700.0)
    assert of(events, JobStarted)
    (confirmed,) = of(events, TrainingApplied)  # the knobs, with the gang that got them
    assert confirmed.training == {"local_batch_size": 64, "accumulation_steps": 1}


def test_what_frees_gpus_starts_no_gang_that_nobody_planned() -> None:
    fleet = fleet_of(submitted("a"), submitted("b"))
    fleet.apply(plan("a", "admit-a", 16, {f"node-{i}": 4 for i in range(4)}))
    events: list[JobEvent] = []
    while (step := fleet.step()) is not None:
        events += step
    assert of(events, JobCompleted) and job_of(fleet, "a").state is JobPhase.COMPLETED
    assert fleet.cluster.free_gpus == 16
    assert job_of(fleet, "b").state is JobPhase.PENDING, "the cluster starts no one on its own"
    assert not [e for e in events if e.key == "b"]


def test_the_clusters_own_admission_is_unchanged_by_default() -> None:
    fleet = fleet_of(submitted("a", replicas=2), admission="cluster")
    assert job_of(fleet, "a").state is JobPhase.RESTARTING
    assert fleet.cluster.free_gpus == 14


# -- placement ---------------------------------------------------------------------------


def test_a_gang_goes_on_exactly_the_named_nodes_and_waits_for_room_there() -> None:
    fleet = fleet_of(submitted("a"), submitted("b"))
    fleet.apply(plan("a", "a1", 4, {"node-2": 4}))
    # b is placed where a still runs: it waits, though three nodes stand empty
    waiting = fleet.apply(plan("b", "b1", 6, {"node-2": 2, "node-3": 4}))
    assert waiting.status is ScaleStatus.APPLIED
    assert waiting.reason == "waiting for room on node-2 (2 GPUs), node-3 (4 GPUs)"
    assert nodes_of(fleet, "b") == {}
    fleet.advance_to(600.0)
    assert job_of(fleet, "b").state is JobPhase.PENDING
    # a moves off node-2 (a restart): b starts there at that moment
    moved = fleet.apply(plan("a", "a2", placement={"node-0": 4}))
    assert moved.status is ScaleStatus.APPLIED
    assert nodes_of(fleet, "a") == {0: 4}
    assert nodes_of(fleet, "b") == {2: 2, 3: 4}
    assert job_of(fleet, "b").state is JobPhase.RESTARTING
    assert len(of(moved.events, NodeStarted)) == 4 + 6


def test_a_job_that_gives_up_its_nodes_to_another_stops_while_its_new_ones_are_taken() -> None:
    # Two jobs swap nodes in one decision: whatever order the plans come in, neither
    # keeps the GPUs the scheduler gave to the other.
    fleet = fleet_of(submitted("a"), submitted("b"))
    fleet.apply(plan("a", "a1", 4, {"node-0": 4}))
    fleet.apply(plan("b", "b1", 4, {"node-1": 4}))
    fleet.advance_to(120.0)
    first = fleet.apply(plan("a", "a2", placement={"node-1": 4}))
    assert len(of(first.events, NodeExited)) == 4
    assert job_of(fleet, "a").state is JobPhase.PENDING
    second = fleet.apply(plan("b", "b2", placement={"node-0": 4}))
    assert nodes_of(fleet, "a") == {1: 4} and nodes_of(fleet, "b") == {0: 4}
    assert {e.key for e in of(second.events, NodeStarted)} == {"a", "b"}


@pytest.mark.parametrize(
    ("placement", "workers", "reason"),
    [
        (
            {"node-4": 4},
            4,
            "placement names 'node-4': the simulated cluster's nodes are node-0 to node-3",
        ),
        ({"gpu-box": 4}, 4, "placement names 'gpu-box'"),
        ({"node-0": 8}, 8, "placement puts 8 GPUs on node-0, which has 4"),
        ({"node-0": 4}, 2, "placement holds 4 GPUs, the job's training replicas need 2"),
    ],
)
def test_a_placement_the_cluster_cannot_follow_is_rejected(
    placement: dict[str, int], workers: int, reason: str
) -> None:
    fleet = fleet_of(submitted("a"))
    outcome = fleet.apply(plan("a", "p", workers, placement))
    assert outcome.status is ScaleStatus.REJECTED
    assert outcome.reason.startswith(reason)
    assert "\n" not in outcome.reason
    assert job_of(fleet, "a").state is JobPhase.PENDING


def test_pods_must_fit_the_named_nodes_by_memory_too() -> None:
    big = JobSubmitted(
        env="sim",
        occurred_at=DEFAULT_ORIGIN,
        job=JobMeta(uuid="big", name="big", app="cifar10"),
        application="cifar10",
        roles={"worker": RoleSpec(replicas=1, gpu_num=1, memory=100 * GiB)},
    )
    fleet = VirtualCluster(Cluster(4, 4, memory_per_node=256 * GiB), admission="brain")
    fleet.submit(big)
    never = fleet.apply(plan("big", "three", 3, {"node-0": 3}))
    assert never.status is ScaleStatus.REJECTED
    assert never.reason == "the job's pods cannot fit on node-0 (3 GPUs)"
    assert fleet.apply(plan("big", "two", 2, {"node-0": 2})).status is ScaleStatus.APPLIED
    assert nodes_of(fleet, "big") == {0: 2}


def test_a_placement_is_applied_not_left_out() -> None:
    fleet = fleet_of(submitted("a"))
    outcome = fleet.apply(plan("a", "p", 2, {"node-3": 2}))
    assert (outcome.status, outcome.not_applied) == (ScaleStatus.APPLIED, ())


# -- suspend -----------------------------------------------------------------------------


def running(admission: Admission = "brain") -> VirtualCluster:
    fleet = fleet_of(submitted("a"), admission=admission)
    if admission == "brain":
        fleet.apply(plan("a", "admit", 4, {"node-0": 4}))
    fleet.advance_to(600.0)
    assert job_of(fleet, "a").state is JobPhase.RUNNING
    return fleet


@pytest.mark.parametrize("admission", ["brain", "cluster"])
def test_a_suspended_job_frees_its_gpus_keeps_its_progress_and_resumes_on_a_plan(
    admission: Admission,
) -> None:
    fleet = running(admission)
    job = job_of(fleet, "a")
    before = job.status()
    outcome = fleet.apply(plan("a", "stop", suspend=True))
    assert outcome.status is ScaleStatus.APPLIED
    assert outcome.reason == f"waiting for {AWAITING_RESUME}"
    exits = of(outcome.events, NodeExited)
    assert len(exits) == before.replicas
    assert {e.exit_code for e in exits} == {TERMINATED_EXIT_CODE}
    status = job.status()
    assert (status.state, status.waiting_for) == (JobPhase.SUSPENDED, AWAITING_RESUME)
    assert fleet.cluster.free_gpus == 16
    assert fleet.observed("a")["worker"]["pending"] == before.replicas
    assert job.eta() is None and fleet.next_event_at() is None
    assert fleet.advance_to(5000.0) == []
    assert job.status().progress == before.progress
    assert fleet.apply(plan("a", "stop-again", suspend=True)).events == []  # a no-op
    # a plan with a count resumes it after the checkpoint-restart delay
    resume = fleet.apply(plan("a", "resume", 2, {"node-3": 2}))
    assert len(of(resume.events, NodeStarted)) == 2
    assert job.state is JobPhase.RESTARTING
    fleet.advance_to(5029.0)
    assert job.status().state is JobPhase.RESTARTING
    assert job.status().progress == before.progress
    later = fleet.advance_to(5031.0)
    assert job.status().state is JobPhase.RUNNING
    assert not of(later, JobStarted), "started once, at its first start"
    while fleet.step() is not None:
        pass
    done = job.status()
    assert done.completed_at is not None and done.completed_at > 5030.0  # JCT kept counting


def test_suspending_a_pending_job_is_applied_and_takes_back_its_claim() -> None:
    fleet = fleet_of(submitted("a"), submitted("b"))
    fleet.apply(plan("a", "a1", 16, {f"node-{i}": 4 for i in range(4)}))
    fleet.apply(plan("b", "b1", 4, {"node-0": 4}))  # waits for a's room
    outcome = fleet.apply(plan("b", "b-stop", suspend=True))
    assert (outcome.status, outcome.events) == (ScaleStatus.APPLIED, [])
    assert job_of(fleet, "b").state is JobPhase.PENDING
    assert fleet.apply(plan("a", "a-stop", suspend=True)).status is ScaleStatus.APPLIED
    assert job_of(fleet, "b").state is JobPhase.PENDING, "its plan was taken back"
    assert fleet.cluster.free_gpus == 16


def test_a_suspend_that_also_resizes_is_rejected() -> None:
    fleet = running()
    outcome = fleet.apply(plan("a", "both", 2, suspend=True))
    assert outcome.status is ScaleStatus.REJECTED
    assert job_of(fleet, "a").state is JobPhase.RUNNING


# -- batch-only changes ------------------------------------------------------------------


def test_a_batch_only_change_in_a_placed_gang_applies_in_place() -> None:
    fleet = running()
    job = job_of(fleet, "a")
    step = job.status().global_step
    same = fleet.apply(plan("a", "rebatch", 4, {"node-0": 4}, training={"local_batch_size": 256}))
    assert not of(same.events, NodeStarted) and not of(same.events, NodeExited)
    (confirmed,) = of(same.events, TrainingApplied)
    assert confirmed.global_step == step
    assert job.state is JobPhase.RUNNING
    assert job.status().batch_size == 1024
    assert fleet.cluster.free_gpus == 12


# -- samples -----------------------------------------------------------------------------


def test_a_sample_says_what_the_scheduler_fits_its_models_on() -> None:
    app = load_application("cifar10")
    fleet = fleet_of(submitted("a"))
    knobs = {"local_batch_size": 128, "accumulation_steps": 2}
    fleet.apply(plan("a", "p", 8, {"node-0": 4, "node-1": 4}, training=knobs))
    (sample,) = of(fleet.advance_to(60.0), RuntimeSample)
    assert (sample.world_size, sample.num_nodes) == (8, 2)
    assert (sample.local_batch_size, sample.accumulation_steps, sample.batch_size) == (128, 2, 2048)
    step = app.step_time((4, 4), 128)
    assert sample.allreduce_s == pytest.approx(step.sync_time)
    assert sample.compute_s == pytest.approx(2 * step.compute_time)
    assert sample.compute_s + sample.allreduce_s == pytest.approx(1 / sample.speed)
    epoch = app.epoch_at(job_of(fleet, "a").status().progress)
    sqr, var = app.grad_stats(2048, epoch)
    assert (sample.grad_sqr, sample.grad_var) == pytest.approx((sqr, var * app.init_batch_size))
