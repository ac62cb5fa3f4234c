"""The board shows a partial plan as accepted: its resources, less the parts the result
says it did not apply, and which those were."""

from __future__ import annotations

import itertools

from handlers.console.board import Board
from schemas.envelope import Event
from schemas.jobs import JobMeta, JobSubmitted, RoleSpec
from schemas.plans import (
    NodeGroupResource,
    NodeResource,
    NotApplied,
    ScalePlan,
    ScaleResult,
    ScaleStatus,
)

JOB = JobMeta(uuid="j1")


def events() -> list[Event]:
    grow = {"worker": NodeGroupResource(count=3, node_resource=NodeResource(cpu=8, gpu_memory=9))}
    return [
        JobSubmitted(env="e", job=JOB, roles={"worker": RoleSpec(replicas=1, cpu=2, memory=5)}),
        ScalePlan(env="e", job=JOB, plan_id="s1", node_group_resources=grow),
        ScaleResult(
            env="e",
            job=JOB,
            plan_id="s1",
            status=ScaleStatus.PARTIAL,
            not_applied=[NotApplied(part="worker.gpu_memory", reason="no GPU memory size")],
        ),
    ]


def test_a_partial_plan_shows_what_it_applied_in_any_order() -> None:
    views = []
    for order in itertools.permutations(events()):
        board = Board()
        for event in order:
            board.apply(event)
        (view,) = board.snapshot()
        view.pop("updated_at")
        views.append(view)
    first = views[0]
    assert all(v == first for v in views)
    assert first["resources"] == {"worker": {"replicas": 3, "cpu": 8.0, "memory": 5, "gpu_num": 0}}
    assert first["last_scale"]["status"] == "partial"
    assert first["last_scale"]["not_applied"] == [
        {"part": "worker.gpu_memory", "reason": "no GPU memory size"}
    ]
