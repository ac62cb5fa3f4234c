"""The jobs board folds one job's events from several topics, read in any order
(pure: no broker needed, but it lives beside the console it serves)."""

from __future__ import annotations

import itertools

from handlers.console.board import Board
from schemas.envelope import Event
from schemas.jobs import JobCompleted, JobMeta, JobSubmitted, NodeOOM, NodeRef, OOMKind, RoleSpec
from schemas.jobs import RuntimeSample as Sample
from schemas.plans import NodeGroupResource, NodeResource, ScalePlan, ScaleResult, ScaleStatus

JOB = JobMeta(uuid="j1")


def events() -> list[Event]:
    grow = {"worker": NodeGroupResource(count=3, node_resource=NodeResource(cpu=8))}
    return [
        JobSubmitted(env="e", job=JOB, roles={"worker": RoleSpec(replicas=1, cpu=2, memory=5)}),
        Sample(env="e", job=JOB, global_step=7, speed=1.0),
        ScalePlan(env="e", job=JOB, plan_id="s1", node_group_resources=grow),
        ScaleResult(env="e", job=JOB, plan_id="s1", status=ScaleStatus.APPLIED),
        NodeOOM(env="e", job=JOB, node=NodeRef(type="worker", id=0), kind=OOMKind.GPU_MEMORY),
    ]


def test_any_order_gives_the_same_view() -> None:
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
    assert first["status"] == "running" and first["events"] == 5
    assert first["resources"] == {"worker": {"replicas": 3, "cpu": 8.0, "memory": 5, "gpu_num": 0}}
    assert first["ooms"] == 1 and first["last_oom"] == "worker-0 gpu_memory"


def test_rejected_plans_change_nothing_and_status_never_goes_back() -> None:
    board = Board()
    grow = {"worker": NodeGroupResource(count=9)}
    board.apply(JobSubmitted(env="e", job=JOB, roles={"worker": RoleSpec(replicas=1)}))
    board.apply(ScalePlan(env="e", job=JOB, plan_id="s2", node_group_resources=grow))
    board.apply(ScaleResult(env="e", job=JOB, plan_id="s2", status=ScaleStatus.REJECTED))
    board.apply(JobCompleted(env="e", job=JOB))
    board.apply(Sample(env="e", job=JOB, global_step=1))  # a late sample
    (view,) = board.snapshot()
    assert view["resources"]["worker"]["replicas"] == 1
    assert view["last_scale"]["status"] == "rejected"
    assert view["status"] == "completed"


def test_the_board_forgets_the_jobs_quiet_longest() -> None:
    board = Board(max_jobs=2)
    for job in ("a", "b", "a", "c"):
        board.apply(Sample(env="e", job=JobMeta(uuid=job), global_step=1))
    assert sorted(board.jobs) == ["a", "c"]
