"""The JobSimulator answers plans the way a real job would: speed from the traces, OOM when
starved of memory, completion at the final epoch, and the same events for the same input."""

from __future__ import annotations

from typing import Any

import pytest

from handlers.simulator.cluster import Cluster, GiB
from handlers.simulator.job import JobPhase, JobSimulator, memory_model
from handlers.simulator.throughput import load_application
from schemas.jobs import (
    JobCompleted,
    JobEvent,
    JobMeta,
    JobStarted,
    JobSubmitted,
    NodeOOM,
    NodeRef,
    NodeStarted,
    OOMKind,
    RoleSpec,
    RuntimeSample,
)
from schemas.plans import (
    MigrateNode,
    NodeGroupResource,
    NodeResource,
    ScalePlan,
    ScaleStatus,
    TrainingApplied,
)

JOB = JobMeta(uuid="cifar10-0", name="cifar10-0", app="cifar10")


def submitted(replicas: int = 4, batch_size: int = 2048, memory: int = 0) -> JobSubmitted:
    return JobSubmitted(
        env="sim",
        job=JOB,
        application="cifar10",
        batch_size=batch_size,
        roles={"worker": RoleSpec(replicas=replicas, gpu_num=1, memory=memory)},
    )


def plan(plan_id: str, **fields: Any) -> ScalePlan:
    return ScalePlan(env="sim", job=JOB, plan_id=plan_id, **fields)


def new_job(cluster: Cluster | None = None, **kwargs: Any) -> JobSimulator:
    return JobSimulator(
        submitted(**kwargs),
        load_application("cifar10"),
        cluster or Cluster(4, 4),
        sample_interval=60.0,
    )


def of(events: list[JobEvent], kind: type[JobEvent]) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


def run_to_end(job: JobSimulator, step: float = 3600.0, limit: int = 1000) -> list[JobEvent]:
    events: list[JobEvent] = []
    for _ in range(limit):
        events += job.advance(step)
        if job.state is JobPhase.COMPLETED:
            return events
    raise AssertionError("job did not complete")


def test_a_job_runs_at_the_traced_speed_and_completes_at_the_final_epoch() -> None:
    cluster = Cluster(4, 4)
    job = new_job(cluster)
    started = job.try_admit()
    assert len(of(started, NodeStarted)) == 4
    assert job.status().placement == (4,)
    eta = job.eta()
    assert eta is not None
    events = job.advance(100.0)
    assert len(of(events, JobStarted)) == 1
    samples = of(events, RuntimeSample)
    assert [s.occurred_at.timestamp() for s in samples] == sorted(
        s.occurred_at.timestamp() for s in samples
    )

    app = load_application("cifar10")
    step = app.step_time((4,), 512)  # 2048 over 4 replicas
    sample = samples[-1]
    assert sample.local_batch_size == 512
    assert sample.batch_size == 2048
    assert sample.speed == pytest.approx(1 / step.step_time)
    assert sample.samples_per_s == pytest.approx(2048 / step.step_time)
    status = job.status()
    assert status.state is JobPhase.RUNNING
    # 30 s of restart, then 70 s of training at the traced step time.
    assert status.global_step == int(70 / step.step_time)

    events += run_to_end(job)
    assert of(events, JobCompleted)
    status = job.status()
    assert status.completed_at == pytest.approx(eta)
    assert status.progress == pytest.approx(app.target_progress)
    assert status.epoch == app.max_epochs
    assert cluster.free_gpus == cluster.total_gpus, "a completed job gives its GPUs back"
    steps = [s.global_step for s in of(events, RuntimeSample)]
    assert steps == sorted(steps)


def test_gradient_accumulation_costs_compute_per_extra_micro_step() -> None:
    job = new_job()
    job.try_admit()
    outcome = job.update(plan("p1", training={"local_batch_size": 256, "accumulation_steps": 2}))
    # the knobs are the job's to apply: the plan is partial until it confirms them (the
    # simulator used to answer "applied")
    assert outcome.status is ScaleStatus.PARTIAL
    assert [p.part for p in outcome.not_applied] == [
        "training.accumulation_steps",
        "training.local_batch_size",
    ]
    events = job.advance(60.0)
    (confirmed,) = of(events, TrainingApplied)
    assert confirmed.plan_id == "p1"
    assert confirmed.training == {"local_batch_size": 256, "accumulation_steps": 2}
    status = job.status()
    assert (status.local_batch_size, status.accumulation_steps, status.batch_size) == (256, 2, 2048)
    step = load_application("cifar10").step_time((4,), 256)
    assert status.speed == pytest.approx(1 / (step.step_time + step.compute_time))


def test_a_plan_that_gives_less_memory_than_needed_ends_in_host_oom() -> None:
    job = new_job()
    job.try_admit()
    job.advance(120.0)
    before = job.status().progress
    need = memory_model("cifar10").need(512)
    starve = NodeGroupResource(node_resource=NodeResource(memory=need // 2))
    outcome = job.update(plan("starve", node_group_resources={"worker": starve}))
    assert outcome.status is ScaleStatus.APPLIED
    events = job.advance(300.0)
    ooms = of(events, NodeOOM)
    assert len(ooms) == 4
    assert {o.kind for o in ooms} == {OOMKind.HOST_MEMORY}
    assert {o.exit_code for o in ooms} == {137}
    assert {o.node.id for o in ooms} == {0, 1, 2, 3}
    assert job.state is JobPhase.STALLED
    assert job.status().progress == before, "a crash-looping job makes no progress"
    assert job.eta() is None

    # Migrating every worker to a node with enough memory brings the job back.
    moves = [
        MigrateNode(node=NodeRef(type="worker", id=i), resource=NodeResource(memory=need + GiB))
        for i in range(4)
    ]
    outcome = job.update(plan("fix", migrate_nodes=moves))
    assert outcome.status is ScaleStatus.APPLIED
    events = job.advance(300.0)
    assert not of(events, NodeOOM)
    assert job.status().state is JobPhase.RUNNING
    assert job.status().progress > before


def test_a_local_batch_beyond_gpu_memory_ends_in_gpu_oom() -> None:
    job = new_job()
    job.try_admit()
    job.update(plan("big", training={"local_batch_size": 4096}))
    events = job.advance(60.0)
    assert {o.kind for o in of(events, NodeOOM)} == {OOMKind.GPU_MEMORY}
    assert job.state is JobPhase.STALLED


def test_scaling_changes_placement_and_speed_and_gives_gpus_back() -> None:
    cluster = Cluster(4, 4)
    job = new_job(cluster, replicas=2)
    job.try_admit()
    job.advance(60.0)
    slow = job.status().samples_per_s
    up = job.update(plan("up", node_group_resources={"worker": NodeGroupResource(count=8)}))
    assert up.status is ScaleStatus.APPLIED
    assert len(of(up.events, NodeStarted)) == 6
    job.advance(60.0)
    status = job.status()
    assert status.replicas == 8
    assert status.placement == (4, 4)
    assert status.batch_size == 2048
    assert status.samples_per_s > slow
    down = job.update(
        plan("down", remove_nodes=[NodeRef(type="worker", id=i) for i in (4, 5, 6, 7)])
    )
    assert down.status is ScaleStatus.APPLIED
    assert cluster.free_gpus == 12
    assert job.status().replicas == 4


def test_a_plan_applies_once_and_only_to_its_job() -> None:
    job = new_job()
    job.try_admit()
    first = job.update(plan("p", node_group_resources={"worker": NodeGroupResource(count=6)}))
    assert first.events
    again = job.update(plan("p", node_group_resources={"worker": NodeGroupResource(count=6)}))
    assert again.status is ScaleStatus.APPLIED
    assert not again.events
    other = ScalePlan(env="sim", job=JobMeta(uuid="other"), plan_id="q")
    assert job.update(other).status is ScaleStatus.REJECTED
    too_big = job.update(plan("huge", node_group_resources={"worker": NodeGroupResource(count=99)}))
    assert too_big.status is ScaleStatus.REJECTED
    assert job.status().replicas == 6


def test_a_job_waits_for_its_whole_gang() -> None:
    cluster = Cluster(1, 4)
    first = new_job(cluster, replicas=3)
    first.try_admit()
    second = JobSimulator(
        JobSubmitted(
            env="sim",
            job=JobMeta(uuid="cifar10-1"),
            application="cifar10",
            batch_size=1024,
            roles={"worker": RoleSpec(replicas=2)},
        ),
        load_application("cifar10"),
        cluster,
    )
    assert second.try_admit() == []
    assert second.state is JobPhase.PENDING
    assert "capacity" in second.status().waiting_for
    assert cluster.free_gpus == 1
    run_to_end(first)
    assert second.try_admit()
    assert second.status().state is JobPhase.RESTARTING


def drive() -> list[dict[str, Any]]:
    job = new_job(memory=memory_model("cifar10").need(512))
    events = job.try_admit()
    events += job.advance(500.0)
    events += job.update(
        plan("up", node_group_resources={"worker": NodeGroupResource(count=8)})
    ).events
    events += run_to_end(job, step=997.0)
    return [e.model_dump(mode="json") for e in events]


def test_same_input_same_events() -> None:
    first, second = drive(), drive()
    assert first == second
    assert len({e["event_id"] for e in first}) == len(first)
