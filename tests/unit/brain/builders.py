"""Small builders of job states, samples and OOMs for the brain's unit tests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from schemas.env_settings import LimitSettings
from schemas.jobs import JobMeta, NodeUsage, OOMKind
from schemas.plans import OptimizePlan
from streams.brain.core.optimizers import REGISTRY, OptimizeContext, Proposal
from streams.brain.core.optimizers.numeric import GiB, MiB
from streams.brain.core.planner import DEFAULT_LIMITS, Planned, plan_scale
from streams.brain.core.sample_structs import NodeUse
from streams.brain.core.samples import Sample
from streams.brain.core.state import (
    JobState,
    JobStatus,
    NodeState,
    NodeStatus,
    OOMRecord,
    RoleResources,
)

ENV = "test"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Rec:
    """A consumed record, as the processor reads one (faust's and aiokafka's alike)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


def plan_one(
    state: JobState, plan: OptimizePlan, now: datetime, limits: LimitSettings = DEFAULT_LIMITS
) -> Planned:
    """`plan_scale` of a plan made by the one optimizer it names."""
    return plan_scale(state, plan, now, limits, optimizers=(plan.optimizer,))


__all__ = ["ENV", "T0", "GiB", "MiB"]


def meta(uuid: str = "job-1", scenario: str = "ctr") -> JobMeta:
    return JobMeta(uuid=uuid, scenario=scenario)


def use(
    role: str,
    node_id: int,
    cpu: float = 0,
    memory: int = 0,
    step_time: float | None = None,
    gpu_memory: int | None = None,
) -> NodeUsage:
    return NodeUsage(
        type=role,
        id=node_id,
        cpu=cpu,
        memory=memory,
        step_time=step_time,
        gpu_memory=gpu_memory,
    )


def sample(
    nodes: Sequence[NodeUsage],
    i: int = 0,
    speed: float = 1.0,
    step: int | None = None,
    local_batch: int | None = None,
    accumulation: int = 1,
) -> Sample:
    return Sample(
        event_id=f"s-{i}",
        at=T0 + timedelta(seconds=15 * i),
        global_step=step if step is not None else i * 10,
        speed=speed,
        local_batch_size=local_batch,
        accumulation_steps=accumulation,
        nodes=msgspec.convert(nodes, tuple[NodeUse, ...], from_attributes=True),
    )


def samples(rows: Sequence[Sequence[NodeUsage]], speed: float = 1.0) -> list[Sample]:
    return [sample(nodes, i, speed=speed) for i, nodes in enumerate(rows)]


def node(
    role: str,
    node_id: int,
    cpu: float = 0,
    memory: int = 0,
    status: NodeStatus = NodeStatus.RUNNING,
    relaunches: int = 0,
) -> NodeState:
    return NodeState(
        type=role, id=node_id, cpu=cpu, memory=memory, status=status, relaunches=relaunches
    )


def nodes(*items: NodeState) -> dict[str, NodeState]:
    return {n.key: n for n in items}


def oom(event_id: str, kind: OOMKind = OOMKind.HOST_MEMORY, memory: int | None = None) -> OOMRecord:
    return OOMRecord(event_id=event_id, kind=kind, at=T0, memory=memory)


def state(**fields: Any) -> JobState:
    fields.setdefault("job", meta())
    return JobState(env=ENV, **fields)


def completed(uuid: str, rows: Sequence[Sequence[NodeUsage]], **fields: Any) -> JobState:
    """A finished job of the same scenario, as history-based optimizers see it."""
    fields.setdefault("job", meta(uuid))
    job = state(
        samples=samples(rows),
        status=JobStatus.COMPLETED,
        completed_at=T0 - timedelta(days=1),
        **fields,
    )
    return job


def roles(**specs: RoleResources) -> dict[str, RoleResources]:
    return dict(specs)


def run(
    name: str,
    job: JobState,
    history: Sequence[JobState] = (),
    free_gpus: int | None = None,
    now: datetime = T0,
    **params: Any,
) -> Proposal | None:
    spec = REGISTRY.get(name)
    assert spec is not None, name
    ctx = OptimizeContext(state=job, now=now, history=history, free_gpus=free_gpus)
    return spec.run(ctx, spec.parse_params(params))
