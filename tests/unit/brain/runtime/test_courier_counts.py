"""The courier's metrics of a published batch (streams/brain/runtime/courier.py `_count`):
plans counted by kind, once each, skipping those a crashed brain had published already;
one latency observation per plan, and one publication latency per plan whose cause has a
record timestamp. Counted per batch and kind, the totals must stay those of one per plan."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from dlrover_events.runtime.metrics import BrainMetrics
from dlrover_events.settings import Settings
from schemas.jobs import JobMeta
from schemas.plans import OptimizePlan, ResourcePlan, ScalePlan
from streams.brain.core.processor import Output
from streams.brain.runtime.courier import Courier

ENV = "ce"
JOB = JobMeta(uuid="job-1", name="j", scenario="s")


@dataclass
class Cause:
    topic: str = "ce.job.metrics"
    partition: int = 0
    offset: int = 0
    key: bytes | None = None
    value: bytes | None = None
    timestamp: int = -1


def scale(plan_id: str) -> ScalePlan:
    return ScalePlan(env=ENV, job=JOB, plan_id=plan_id)


def optimize(plan_id: str) -> OptimizePlan:
    return OptimizePlan(
        env=ENV,
        job=JOB,
        plan_id=plan_id,
        stage="running",
        optimizer="gpu-oom",
        reason="r",
        resource=ResourcePlan(),
    )


async def _send(*_: object) -> None:  # never called: only `_count` is exercised
    raise AssertionError


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    got = registry.get_sample_value(name, {"env": ENV, **labels})
    return 0.0 if got is None else got


def test_a_batch_counts_each_new_plan_once_by_kind_with_its_latencies() -> None:
    registry = CollectorRegistry()
    courier = Courier(Settings(), ENV, _send, BrainMetrics(registry, ENV), asyncio.Event())
    courier.published = {"s-old"}
    now_ms = int(time.time() * 1000)
    out = Output()
    out.add([scale("s1"), scale("s2"), optimize("o1")], Cause(timestamp=now_ms - 2000))
    out.add([scale("s-old")], Cause(timestamp=now_ms))
    out.add([optimize("o2")], Cause())  # (no timestamp: -1)
    out.add([scale("s3")], None)  # a round's plan: no cause
    courier._count(out, time.monotonic() - 0.5)

    plans = "dlrover_events_brain_plans_total"
    assert value(registry, plans, kind="scale") == 3  # s1, s2, s3; s-old published before
    assert value(registry, plans, kind="optimize") == 2
    latency = "dlrover_events_brain_plan_latency_seconds"
    assert value(registry, f"{latency}_count") == 5
    assert value(registry, f"{latency}_sum") >= 5 * 0.5
    publication = "dlrover_events_brain_plan_publication_latency_seconds"
    assert value(registry, f"{publication}_count") == 3  # s1, s2, o1: the timed cause
    assert value(registry, f"{publication}_sum") >= 3 * 2.0

    courier._count(Output(), time.monotonic())  # an empty batch adds nothing
    assert value(registry, plans, kind="scale") == 3
    assert value(registry, f"{latency}_count") == 5
