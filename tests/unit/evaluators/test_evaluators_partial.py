"""A partial ScaleResult is an accepted plan: it counts as applied (allocation, churn),
less the parts it says it did not apply; in whatever order the events come."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from schemas.envelope import Event
from schemas.jobs import JobCompleted, JobMeta, JobStarted, JobSubmitted, RoleSpec
from schemas.plans import (
    NodeGroupResource,
    NodeResource,
    NotApplied,
    ScalePlan,
    ScaleResult,
    ScaleStatus,
)
from streams.evaluators.ledger import Ledger
from streams.evaluators.registry import evaluate

T0 = datetime(2026, 1, 1, tzinfo=UTC)
JOB = JobMeta(uuid="a")


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def events(*parts: str) -> list[Event]:
    grow = NodeGroupResource(count=6, node_resource=NodeResource(gpu_num=2, gpu_memory=80))
    return [
        JobSubmitted(
            env="e", job=JOB, occurred_at=at(0), roles={"worker": RoleSpec(replicas=2, gpu_num=1)}
        ),
        JobStarted(env="e", job=JOB, occurred_at=at(0)),
        ScalePlan(
            env="e",
            job=JOB,
            plan_id="p",
            occurred_at=at(1000),
            node_group_resources={"worker": grow},
            training={"local_batch_size": 16},
        ),
        ScaleResult(
            env="e",
            job=JOB,
            plan_id="p",
            status=ScaleStatus.PARTIAL,
            occurred_at=at(1800),
            not_applied=[NotApplied(part=p, reason="r") for p in parts],
        ),
        JobCompleted(env="e", job=JOB, occurred_at=at(3600)),
    ]


def metrics(evs: list[Event]) -> dict[str, float]:
    ledger = Ledger()
    for e in evs:
        ledger.observe(e)
    return evaluate(ledger.in_window(None, None), None)


def test_a_partial_plan_counts_as_applied_for_what_it_applied() -> None:
    m = metrics(events("training.local_batch_size", "worker.gpu_memory"))
    assert m["gpu_hours"] == pytest.approx((2 * 1800 + 12 * 1800) / 3600)
    assert m["plans_per_job_hour"] == pytest.approx(1.0)  # churn counts it
    assert m["failed_jobs"] == 0


def test_the_parts_not_applied_leave_the_allocation_as_it_was() -> None:
    m = metrics(events("worker.gpu_num", "training.local_batch_size"))
    assert m["gpu_hours"] == pytest.approx((2 * 1800 + 6 * 1800) / 3600)
    whole_role = metrics(events("worker"))
    assert whole_role["gpu_hours"] == pytest.approx(2 * 3600 / 3600)


def test_any_order_gives_the_same_numbers() -> None:
    evs = events("worker.gpu_num")
    first = metrics(evs)
    for order in itertools.permutations(evs[2:4]):
        assert metrics([*evs[:2], *order, evs[4]]) == first
