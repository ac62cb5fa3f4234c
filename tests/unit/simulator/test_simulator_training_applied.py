"""The simulated job tells the brain what a real one would: the operator's answer to a plan
with training knobs is partial, and the job confirms the knobs itself (training.applied)
once it trains with them (at once when it runs: knobs apply in place), with ids that
derive from the input alone."""

from __future__ import annotations

from typing import Any

import pytest

from handlers.simulator.cluster import Cluster, GiB
from handlers.simulator.fleet import VirtualCluster
from handlers.simulator.job import DEFAULT_ORIGIN, JobPhase, JobSimulator
from handlers.simulator.throughput import load_application
from schemas.jobs import JobEvent, JobMeta, JobSubmitted, NodeOOM, NodeStarted, RoleSpec
from schemas.plan_parts import AWAITING_JOB
from schemas.plans import (
    NodeGroupResource,
    NodeResource,
    ScalePlan,
    ScaleStatus,
    TrainingApplied,
)

JOB = JobMeta(uuid="cifar10-0", name="cifar10-0", app="cifar10")


def submitted() -> JobSubmitted:
    return JobSubmitted(
        env="sim",
        job=JOB,
        occurred_at=DEFAULT_ORIGIN,
        application="cifar10",
        batch_size=2048,
        roles={"worker": RoleSpec(replicas=4, gpu_num=1)},
    )


def plan(plan_id: str, **fields: Any) -> ScalePlan:
    return ScalePlan(env="sim", job=JOB, plan_id=plan_id, **fields)


def new_job() -> JobSimulator:
    return JobSimulator(
        submitted(), load_application("cifar10"), Cluster(4, 4), sample_interval=60.0
    )


def of(events: list[JobEvent], kind: type[JobEvent]) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


def started() -> JobSimulator:
    job = new_job()
    job.try_admit()
    job.advance(120.0)
    assert job.state is JobPhase.RUNNING
    return job


def test_a_running_job_applies_new_knobs_in_place_and_confirms_them_at_once() -> None:
    # The SDK applies knobs at a step boundary without restarting (the simulator used to
    # restart the gang for them, 30 s lost that no real job loses).
    job = started()
    step = job.status().global_step
    outcome = job.update(plan("p1", training={"local_batch_size": 256}))
    assert outcome.status is ScaleStatus.PARTIAL
    assert [(p.part, p.reason) for p in outcome.not_applied] == [
        ("training.local_batch_size", AWAITING_JOB)
    ]
    (confirmed,) = of(outcome.events, TrainingApplied)
    assert not of(outcome.events, NodeStarted), "no pod restarts"
    assert confirmed.plan_id == "p1"
    assert confirmed.training == {"local_batch_size": 256, "accumulation_steps": 1}
    assert (confirmed.occurred_at - DEFAULT_ORIGIN).total_seconds() == 120.0
    assert (confirmed.node.type, confirmed.node.id) == ("worker", 0)
    assert confirmed.global_step == step  # the first step trained with them
    status = job.status()
    assert status.state is JobPhase.RUNNING
    assert (status.local_batch_size, status.batch_size) == (256, 1024)
    app = load_application("cifar10")
    assert status.speed == pytest.approx(1 / app.step_time((4,), 256).step_time)
    assert not of(job.advance(600.0), TrainingApplied), "said once"


def test_knobs_that_come_with_new_pods_are_confirmed_when_the_gang_restarts() -> None:
    job = started()
    grow = NodeGroupResource(count=8)
    outcome = job.update(
        plan("p1", node_group_resources={"worker": grow}, training={"local_batch_size": 256})
    )
    assert not of(outcome.events, TrainingApplied), "not before it trains with them"
    assert not of(job.advance(10.0), TrainingApplied)  # still restarting (30 s)
    (confirmed,) = of(job.advance(60.0), TrainingApplied)
    assert (confirmed.occurred_at - DEFAULT_ORIGIN).total_seconds() == 150.0  # 120 + 30
    assert confirmed.training == {"local_batch_size": 256, "accumulation_steps": 1}


def test_knobs_it_already_trains_with_are_confirmed_at_once() -> None:
    job = started()
    job.update(plan("p1", training={"local_batch_size": 256}))
    job.advance(60.0)
    again = job.update(plan("p2", training={"local_batch_size": 256}))
    assert again.status is ScaleStatus.PARTIAL
    (confirmed,) = of(again.events, TrainingApplied)
    assert confirmed.plan_id == "p2"


def test_a_job_that_cannot_train_with_the_knobs_does_not_confirm_them() -> None:
    job = started()
    # in place: the replicas run out of GPU memory at the first step with them
    events = job.update(plan("big", training={"local_batch_size": 4096})).events
    events += job.advance(120.0)
    assert of(events, NodeOOM)
    assert not of(events, TrainingApplied)
    assert job.state is JobPhase.STALLED


def test_gpu_memory_and_type_are_not_modelled_so_not_applied() -> None:
    job = started()
    res = NodeResource(gpu_memory=40 * GiB, gpu_type="a100")
    outcome = job.update(
        plan("gpu", node_group_resources={"worker": NodeGroupResource(node_resource=res)})
    )
    assert outcome.status is ScaleStatus.PARTIAL
    assert {p.part for p in outcome.not_applied} == {"worker.gpu_memory", "worker.gpu_type"}
    whole = job.update(plan("more", node_group_resources={"worker": NodeGroupResource(count=2)}))
    assert whole.status is ScaleStatus.APPLIED and whole.not_applied == ()


def test_a_plan_given_again_gets_its_first_answer() -> None:
    job = started()
    first = job.update(plan("p1", training={"local_batch_size": 256}))
    again = job.update(plan("p1", training={"local_batch_size": 256}))
    assert (again.status, again.not_applied) == (first.status, first.not_applied)
    assert again.reason == "already applied" and again.events == []


def _run() -> list[JobEvent]:
    fleet = VirtualCluster(Cluster(4, 4), sample_interval=60.0)
    events: list[JobEvent] = list(fleet.submit(submitted()))
    events += fleet.advance_to(120.0)
    outcome = fleet.apply(plan("p1", training={"local_batch_size": 256, "accumulation_steps": 2}))
    assert outcome.status is ScaleStatus.PARTIAL
    events += outcome.events
    events += fleet.advance_to(600.0)
    return events


def test_the_same_input_gives_the_same_confirmation() -> None:
    first, second = _run(), _run()
    assert first == second
    confirmations = of(first, TrainingApplied)
    assert len(confirmations) == 1
    assert [e.event_id for e in first] == [e.event_id for e in second]
    assert len({e.event_id for e in first}) == len(first)
