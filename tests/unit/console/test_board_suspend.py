"""A job the operator suspended shows suspended on the console's board until a plan that
gives it a count resumes it, whichever of a plan and its result is read first (pure: the
board folds events, no broker needed)."""

from __future__ import annotations

from typing import Any

import pytest

from handlers.console.board import Board
from schemas.jobs import JobCompleted, JobMeta, JobStarted, JobSubmitted, RoleSpec
from schemas.plans import NodeGroupResource, ScalePlan, ScaleResult, ScaleStatus

JOB = JobMeta(uuid="j1", name="resnet")


def suspend(plan_id: str) -> ScalePlan:
    return ScalePlan(env="e", job=JOB, plan_id=plan_id, suspend=True)


def resume(plan_id: str, workers: int = 2) -> ScalePlan:
    groups = {"worker": NodeGroupResource(count=workers)}
    return ScalePlan(env="e", job=JOB, plan_id=plan_id, node_group_resources=groups)


def result(plan_id: str, status: ScaleStatus = ScaleStatus.APPLIED) -> ScaleResult:
    return ScaleResult(env="e", job=JOB, plan_id=plan_id, status=status)


def row(board: Board) -> dict[str, Any]:
    (only,) = board.snapshot()
    return only


def running_board() -> Board:
    board = Board()
    board.apply(JobSubmitted(env="e", job=JOB, roles={"worker": RoleSpec(replicas=2)}))
    board.apply(JobStarted(env="e", job=JOB))
    return board


@pytest.mark.parametrize("result_first", [False, True])
def test_a_suspend_applied_shows_suspended_and_a_resume_brings_it_back(
    result_first: bool,
) -> None:
    board = running_board()
    steps = ((suspend("s1"), "running", "suspended"), (resume("r1"), "suspended", "running"))
    for plan, before, after in steps:
        answer = result(plan.plan_id)
        first, second = (answer, plan) if result_first else (plan, answer)
        board.apply(first)
        assert row(board)["status"] == before  # a plan, or a result, alone changes nothing
        board.apply(second)
        assert (row(board)["status"], row(board)["suspended"]) == (after, after == "suspended")
        # a suspend stops the job's nodes, not its size
        assert row(board)["resources"]["worker"]["replicas"] == 2


def test_a_suspend_not_applied_leaves_the_job_running() -> None:
    board = running_board()
    board.apply(suspend("s1"))
    board.apply(result("s1", ScaleStatus.REJECTED))
    assert row(board)["status"] == "running"


def test_a_plan_without_a_count_does_not_resume_it() -> None:
    board = running_board()
    board.apply(suspend("s1"))
    board.apply(result("s1"))
    board.apply(ScalePlan(env="e", job=JOB, plan_id="k1", training={"lr": 0.1}))
    board.apply(result("k1"))
    assert row(board)["status"] == "suspended"


def test_an_ended_job_says_how_it_ended_not_suspended() -> None:
    board = running_board()
    board.apply(suspend("s1"))
    board.apply(result("s1"))
    board.apply(JobCompleted(env="e", job=JOB))
    assert row(board)["status"] == "completed"
