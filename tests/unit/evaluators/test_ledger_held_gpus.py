"""The ledger counts the GPUs a job holds, not the ones its plans ask for (issue 26, item 8).

An applied plan whose gang waits for room holds nothing yet, a suspended job holds
nothing until its pods start again, and pods hold their GPUs from their start, before the
job says it started. Where no pod is reported, a job holds its allocation from its start.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.envelope import Event
from schemas.jobs import (
    JobCompleted,
    JobMeta,
    JobStarted,
    JobSubmitted,
    NodeExited,
    NodeRef,
    NodeStarted,
    RoleSpec,
    RuntimeSample,
)
from schemas.plans import NodeGroupResource, ScalePlan, ScaleResult, ScaleStatus
from streams.evaluators.ledger import Ledger, gpu_use, gpus_held
from streams.evaluators.registry import evaluate

T0 = datetime(2026, 1, 1, tzinfo=UTC)
JOB = JobMeta(uuid="a")


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def submitted(replicas: int = 4) -> JobSubmitted:
    return JobSubmitted(
        env="e",
        job=JOB,
        occurred_at=at(0),
        roles={"worker": RoleSpec(replicas=replicas, gpu_num=1)},
    )


def plan(plan_id: str, s: float, *, count: int = 0, suspend: bool = False) -> list[Event]:
    """The plan and its applied result, both at ``s``."""
    groups = {"worker": NodeGroupResource(count=count)} if count else {}
    return [
        ScalePlan(
            env="e",
            job=JOB,
            plan_id=plan_id,
            occurred_at=at(s),
            node_group_resources=groups,
            suspend=suspend,
        ),
        ScaleResult(
            env="e", job=JOB, plan_id=plan_id, status=ScaleStatus.APPLIED, occurred_at=at(s)
        ),
    ]


def pods(s: float, ids: range, *, running: bool = True) -> list[Event]:
    kind = NodeStarted if running else NodeExited
    return [
        kind(env="e", job=JOB, occurred_at=at(s), node=NodeRef(type="worker", id=i)) for i in ids
    ]


def fold(events: list[Event]) -> Ledger:
    ledger = Ledger()
    for e in events:
        ledger.observe(e)
    return ledger


def hours(ledger: Ledger) -> float:
    return evaluate(ledger.in_window(None, None), ledger.last_event_at, ["gpu_hours"])["gpu_hours"]


def test_a_suspended_job_holds_nothing_until_its_resume() -> None:
    # no pods reported: the plans say when the job holds its GPUs
    events = [
        submitted(),
        JobStarted(env="e", job=JOB, occurred_at=at(0)),
        *plan("suspend", 1800, suspend=True),
        *plan("resume", 2700, count=2),
        JobCompleted(env="e", job=JOB, occurred_at=at(3600)),
    ]
    ledger = fold(events)
    job = ledger.jobs["a"]
    assert [job.gpus_at(at(s)) for s in (0, 1799, 1800, 2699, 2700, 3599, 3600)] == [
        4, 4, 0, 0, 2, 2, 0,
    ]  # fmt: skip
    assert hours(ledger) == pytest.approx((4 * 1800 + 2 * 900) / 3600)


def test_pods_hold_their_gpus_from_their_start_to_their_stop() -> None:
    events = [
        submitted(),
        *pods(10, range(4)),  # the gang starts, loads its checkpoint...
        JobStarted(env="e", job=JOB, occurred_at=at(40)),  # ...and trains
        *plan("suspend", 600, suspend=True),
        *pods(600, range(4), running=False),
        # a grow to 8 is applied but waits for room: nothing runs yet
        *plan("resume", 1200, count=8),
        *pods(1500, range(8)),
        # a shrink: the platform drops pods 4-7 without a word for each
        *plan("shrink", 2400, count=4),
        JobCompleted(env="e", job=JOB, occurred_at=at(3000)),
    ]
    ledger = fold(events)
    job = ledger.jobs["a"]
    assert job.timeline()[1:] == [
        (at(10), 4),
        (at(600), 0),
        (at(1500), 8),
        (at(2400), 4),
        (at(3000), 0),
    ]
    assert hours(ledger) == pytest.approx((4 * 590 + 8 * 900 + 4 * 600) / 3600)
    assert [g for _, g in gpu_use(ledger.in_window(None, None), step_s=600)] == [4, 0, 0, 8, 4, 0]


def test_a_job_stopped_and_started_again_at_one_instant_keeps_its_pods() -> None:
    # One round: the job's gang is stopped (its plan must wait) and, once another job's
    # plan freed its nodes, started again; the result of its own plan came first.
    events = [
        submitted(),
        *pods(0, range(4)),
        *plan("move", 60, count=4),
        *pods(60, range(4), running=False),
        *pods(60, range(4)),
        JobCompleted(env="e", job=JOB, occurred_at=at(120)),
    ]
    for order in (events, [*events[:2], *events[4:-1], *events[2:4], events[-1]]):
        assert fold(order).jobs["a"].gpus_at(at(60)) == 4


def test_a_start_delivered_again_after_the_stop_does_not_restart_the_pod() -> None:
    start = pods(0, range(1))
    events = [submitted(1), *start, *pods(60, range(1), running=False), *start]
    ledger = fold(events)
    assert ledger.jobs["a"].gpus_at(at(61)) == 0


def test_the_last_sample_counts_with_the_gpus_held_until_the_end() -> None:
    events = [
        submitted(2),
        *pods(0, range(2)),
        RuntimeSample(env="e", job=JOB, global_step=9, samples_per_s=200, occurred_at=at(60)),
        JobCompleted(env="e", job=JOB, occurred_at=at(60)),
    ]
    metrics = evaluate(fold(events).in_window(None, None), None, ["throughput"])
    assert metrics["throughput_per_gpu"] == pytest.approx(100)


def life() -> list[Event]:
    return [
        submitted(),
        *pods(10, range(4)),
        JobStarted(env="e", job=JOB, occurred_at=at(40)),
        *plan("suspend", 600, suspend=True),
        *pods(600, range(4), running=False),
        *plan("resume", 1200, count=8),
        *pods(1500, range(8)),
        JobCompleted(env="e", job=JOB, occurred_at=at(3000)),
    ]


@given(st.randoms(use_true_random=False))
def test_topics_read_in_any_interleaving_give_the_same_gpus(rng: object) -> None:
    """A job's own events come in order (one partition); results, plans and the other
    topics interleave with them in any way."""
    events = life()
    own = [e for e in events if not isinstance(e, ScalePlan | ScaleResult)]
    others = [e for e in events if isinstance(e, ScalePlan | ScaleResult)]
    rng.shuffle(others)  # type: ignore[attr-defined]
    merged: list[Event] = []
    while own or others:
        source = own if not others or (own and rng.random() < 0.5) else others  # type: ignore[attr-defined]
        merged.append(source.pop(0))
    expected = fold(events)
    shuffled = fold(merged)
    jobs = shuffled.in_window(None, None)
    assert gpus_held(jobs) == gpus_held(expected.in_window(None, None))
    assert hours(shuffled) == pytest.approx((4 * 590 + 8 * 1500) / 3600)


def test_a_cpu_job_holds_no_gpus() -> None:
    """The example job of `make run` asks for CPU and memory only: 0 GPU-hours is its
    truth, whatever its number of workers."""
    job = JobMeta(uuid=str(uuid.uuid4()))
    events: list[Event] = [
        JobSubmitted(env="e", job=job, occurred_at=at(0), roles={"worker": RoleSpec(replicas=4)}),
        JobStarted(env="e", job=job, occurred_at=at(0)),
        *[
            NodeStarted(env="e", job=job, occurred_at=at(0), node=NodeRef(type="worker", id=i))
            for i in range(4)
        ],
    ]
    ledger = fold(events)
    assert ledger.jobs[job.uuid].gpus_at(at(1)) == 0
    assert evaluate(ledger.in_window(None, None), at(3600), ["gpu_hours"])["gpu_hours"] == 0
