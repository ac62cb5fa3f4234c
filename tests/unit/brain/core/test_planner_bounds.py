"""The planner never builds one object per replica from a count it was given (issue 15):
a state holding any replica count, however it was made, is planned in bounded memory
(measured by allocation, not by time: a test must not depend on the machine's speed)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import TypeVar

from schemas.bounds import MAX_REPLICAS
from schemas.plans import NodeGroupResource, NodeResource, OptimizePlan, ResourcePlan
from streams.brain.core.planner import MAX_ROLE_REPLICAS
from streams.brain.core.state import WORKER, RoleResources, Stage
from tests.unit.brain.builders import ENV, T0, GiB, meta, node, nodes, plan_one, state

HUGE = 10**30
#: What one plan may allocate at its peak: a 10,000-node launch list fits many times over;
#: one object per replica of 10**30 never would (it was a MemoryError after 1.5 GB).
PEAK_BYTES = 64 * 2**20

T = TypeVar("T")


def within_memory(make: Callable[[], T]) -> T:
    tracemalloc.start()
    try:
        result = make()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < PEAK_BYTES, f"planning allocated {peak / 2**20:.0f} MiB at its peak"
    return result


def huge(**fields: int | float) -> RoleResources:
    """A role past the contract's bounds, which a JobState now refuses to read (see
    test_brain_state): the planner must hold even for a state made without validation."""
    return RoleResources.model_construct(**{**RoleResources().__dict__, **fields})


def _plan(role: str, group: NodeGroupResource) -> OptimizePlan:
    return OptimizePlan(
        env=ENV,
        job=meta(),
        plan_id="o-1",
        stage=Stage.CREATE.value,
        optimizer="worker-create-oom",
        reason="test",
        caused_by="event-1",
        resource=ResourcePlan(node_group_resources={role: group}),
    )


def test_a_huge_replica_count_before_any_node_is_a_count_not_objects() -> None:
    job = state(roles={WORKER: huge(replicas=HUGE, cpu=8, memory=16 * GiB)})
    group_plan = NodeGroupResource(node_resource=NodeResource(memory=24 * GiB))
    planned = within_memory(lambda: plan_one(job, _plan(WORKER, group_plan), T0))
    assert planned.scale_plan is not None
    group = planned.scale_plan.node_group_resources[WORKER]
    assert group.count == MAX_ROLE_REPLICAS[WORKER]
    assert group.node_resource.memory == 24 * GiB


def test_a_role_without_a_cap_launches_at_most_the_contracts_bound() -> None:
    job = state(
        roles={"chief": huge(replicas=HUGE, min_replicas=HUGE, cpu=8, memory=GiB)},
        nodes=nodes(node("chief", 0, cpu=8, memory=GiB)),
    )
    planned = within_memory(lambda: plan_one(job, _plan("chief", NodeGroupResource(count=2)), T0))
    assert planned.scale_plan is not None
    assert planned.scale_plan.node_group_resources["chief"].count == MAX_REPLICAS
    assert len(planned.scale_plan.launch_nodes) == MAX_REPLICAS - 1
