"""The console's board stays bounded however long it runs: jobs, each job's timeline and
series, the evaluators' reports, the dead letters (pure: no broker needed)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from handlers.console.board import Board, Series
from schemas.dlq import FailureKind, fitting_letter
from schemas.evaluation import EvaluationReport
from schemas.jobs import JobMeta, JobSubmitted, NodeUsage, RoleSpec, RuntimeSample
from schemas.plans import (
    NodeGroupResource,
    NodeResource,
    OptimizePlan,
    ResourcePlan,
    ScalePlan,
    ScaleResult,
    ScaleStatus,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
JOB = JobMeta(uuid="j1", name="resnet")


def sample(i: int, world: int | None = 2) -> RuntimeSample:
    return RuntimeSample(
        env="e",
        job=JOB,
        global_step=i,
        speed=1.0,
        samples_per_s=8.0,
        world_size=world,
        occurred_at=T0 + timedelta(seconds=i),
        nodes=[NodeUsage(type="worker", id=0, memory=419_625_370)],
    )


@given(st.integers(min_value=4, max_value=64), st.integers(min_value=0, max_value=2000))
def test_a_series_is_bounded_starts_at_the_first_point_and_ends_at_the_last(
    size: int, n: int
) -> None:
    series = Series(size)
    for i in range(n):
        series.add(float(i), i % 7 or None, 1.0, 2.0)
    out = series.as_json()
    assert len(out["t"]) <= size  # kept points, and the newest
    assert len(series) < size
    if n:
        assert out["t"][0] == 0.0
        assert out["t"][-1] == float(n - 1)
        assert out["t"] == sorted(set(out["t"]))
        assert all(len(column) == len(out["t"]) for column in out.values())
        # kept points are evenly spaced: every stride-th sample
        kept = out["t"][:-1] if (n - 1) % series.stride else out["t"]
        assert all(t % series.stride == 0 for t in kept)
    else:
        assert out["t"] == []


def test_a_world_size_not_reported_is_a_gap_not_a_zero() -> None:
    series = Series(8)
    series.add(0.0, None, 1.0, 1.0)
    series.add(1.0, 4, 1.0, 1.0)
    assert series.as_json()["world_size"] == [None, 4]


def test_the_timeline_keeps_the_newest_entries_oldest_first() -> None:
    board = Board(timeline=3)
    grow = {"worker": NodeGroupResource(count=3)}
    board.apply(JobSubmitted(env="e", job=JOB, roles={"worker": RoleSpec(replicas=1)}))
    for i in range(5):
        at = T0 + timedelta(minutes=i)
        board.apply(
            ScalePlan(env="e", job=JOB, plan_id=f"p{i}", node_group_resources=grow, occurred_at=at)
        )
        board.apply(sample(i))  # samples are in the series, not the timeline
    later = T0 + timedelta(hours=1)
    board.apply(
        ScaleResult(env="e", job=JOB, plan_id="p4", status=ScaleStatus.APPLIED, occurred_at=later)
    )
    detail = board.jobs["j1"].detail()
    assert [(e["type"], e["plan_id"], e["status"]) for e in detail["timeline"]] == [
        ("scale.plan", "p3", None),
        ("scale.plan", "p4", None),
        ("scale.result", "p4", "applied"),
    ]
    assert detail["series"]["t"] == [(T0 + timedelta(seconds=i)).timestamp() for i in range(5)]
    assert detail["usage_text"] == "worker-0 400 MiB"


def report(evaluator: str, value: float, jobs: int = 1) -> EvaluationReport:
    return EvaluationReport(
        env="e",
        evaluator=evaluator,
        window_start=T0,
        window_end=T0,
        jobs=jobs,
        metrics={"gpu_hours": value},
    )


def test_a_report_with_the_same_values_is_a_repeat_not_news() -> None:
    board = Board()
    assert board.apply(report("gpu", 1.0)) is True
    assert board.apply(report("gpu", 1.0)) is False
    assert board.apply(report("gpu", 1.0)) is False
    assert board.apply(report("jct", 1.0)) is True  # another evaluator
    assert board.apply(report("gpu", 1.0, jobs=2)) is True  # other jobs: news
    assert board.apply(report("gpu", 2.0, jobs=2)) is True  # other values: news
    rows = {r["evaluator"]: r for r in board.report_rows()}
    assert rows["gpu"]["repeats"] == 0
    assert rows["gpu"]["metrics"] == {"gpu_hours": 2.0}
    board.apply(report("gpu", 2.0, jobs=2))
    assert {r["evaluator"]: r for r in board.report_rows()}["gpu"]["repeats"] == 1


def test_reports_and_letters_are_bounded() -> None:
    board = Board(max_reports=3, max_letters=2)
    for name in ("a", "b", "c", "d"):
        board.apply(report(name, 1.0))
    assert [r["evaluator"] for r in board.report_rows()] == ["b", "c", "d"]
    for offset in range(5):
        board.apply(
            fitting_letter(
                env="e",
                original_topic="e.job.metrics",
                partition=0,
                offset=offset,
                key=None,
                value=b"x" * 10_000,
                kind=FailureKind.MALFORMED,
                error="not JSON",
                group="e.brain",
            )
        )
    assert board.letters_seen == 5
    assert [row["offset"] for row in board.letters] == [3, 4]
    assert all(len(row["preview"]) <= 240 for row in board.letters)


def plan(i: int, cpu: float, reason: str, memory: int = 0) -> OptimizePlan:
    group = NodeGroupResource(node_resource=NodeResource(cpu=cpu, memory=memory))
    return OptimizePlan(
        env="e",
        job=JOB,
        plan_id=f"b{i}",
        stage="running",
        optimizer="worker-resource",
        reason=reason,
        resource=ResourcePlan(node_group_resources={"worker": group}),
        occurred_at=T0 + timedelta(seconds=i),
    )


def test_the_same_plan_again_counts_on_its_entry_and_keeps_the_history_in_sight() -> None:
    """Seen after `make run`: the brain re-planned the same resources every 4 s (the
    usage in its reason moved), and the timeline held nothing else."""
    board = Board(timeline=5)
    for i in range(20):  # the memory it asks for moves by bytes: 404 MiB all the same
        board.apply(plan(i, 2, f"cpu 2 from use 0.04{i}", memory=404 * 2**20 + 997 * i))
    rejected = T0 + timedelta(seconds=25)
    board.apply(
        ScaleResult(
            env="e", job=JOB, plan_id="s", status=ScaleStatus.REJECTED, occurred_at=rejected
        )
    )
    board.apply(plan(30, 2, "use 0.05", memory=404 * 2**20))  # after the result: its own entry
    board.apply(plan(31, 2, "more memory", memory=500 * 2**20))  # another plan
    entries = board.jobs["j1"].detail()["timeline"]
    assert [(e["type"], e["plan_id"], e["again"]) for e in entries] == [
        ("brain.plan", "b0", 19),
        ("scale.result", "s", 0),
        ("brain.plan", "b30", 0),
        ("brain.plan", "b31", 0),
    ]
    assert entries[0]["last_at"] == (T0 + timedelta(seconds=19)).isoformat()


def test_the_usage_shown_is_of_the_nodes_the_job_has_now() -> None:
    """Seen after `make run`: scaled from 4 workers to 2, the job's row still listed the
    last usage of worker-2 and worker-3."""
    board = Board()
    board.apply(JobSubmitted(env="e", job=JOB, roles={"worker": RoleSpec(replicas=4)}))
    for n in range(4):
        board.apply(
            RuntimeSample(
                env="e",
                job=JOB,
                global_step=1,
                nodes=[NodeUsage(type="worker", id=n, memory=2**30)],
            )
        )
    assert len(board.snapshot()[0]["usage"]) == 4
    shrink = {"worker": NodeGroupResource(count=2)}
    board.apply(ScalePlan(env="e", job=JOB, plan_id="s", node_group_resources=shrink))
    board.apply(ScaleResult(env="e", job=JOB, plan_id="s", status=ScaleStatus.APPLIED))
    (row,) = board.snapshot()
    assert sorted(row["usage"]) == ["worker-0", "worker-1"]
    assert row["usage_text"] == "worker-0 1 GiB; worker-1 1 GiB"
