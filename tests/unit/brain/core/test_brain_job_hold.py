"""A job held by its owner (job.held: an experiment's trial paused at a rung) is out of
the cluster scheduler's hands: its GPUs are free in the brain's view at once, no round
admits or sizes it, and once released it waits to be admitted like any queued job."""

from __future__ import annotations

from datetime import timedelta

from schemas.jobs import JobHeld
from schemas.plans import ScalePlan, ScaleResult, ScaleStatus
from streams.brain.core.cluster_round import run_round, scheduled
from streams.brain.core.folds import fold
from streams.brain.core.state import JobState, gpus_claimed
from tests.unit.brain.builders import ENV, T0

from .test_brain_scheduler import SCHEDULER, processor, profiled, sample, scale_plans


def _held(state: JobState, held: bool, at_s: float) -> JobState:
    after = fold(
        state,
        JobHeld(
            env=ENV,
            job=state.job,
            occurred_at=T0 + timedelta(seconds=at_s),
            held=held,
            plan_id=f"hold-{held}",
        ),
    )
    assert after is not None
    return after


def _running() -> JobState:
    """Job a, admitted by a round and its plan taken on by the platform."""
    policy = processor(scheduler=SCHEDULER).policy
    state = profiled(sample("a", 30, 1, 32, 0.5))
    result = run_round({"a": state}, T0 + timedelta(seconds=60), policy)
    (plan,) = scale_plans(list(result.plans))
    taken = fold(
        result.states["a"],
        ScaleResult(
            env=ENV,
            job=state.job,
            occurred_at=T0 + timedelta(seconds=61),
            plan_id=plan.plan_id,
            status=ScaleStatus.APPLIED,
        ),
    )
    assert taken is not None and taken.share is not None and taken.share.placement
    return taken


def test_a_held_job_frees_its_gpus_and_no_round_decides_for_it() -> None:
    policy = processor(scheduler=SCHEDULER).policy
    running = _running()
    held = _held(running, True, 70)
    assert held.on_hold and not scheduled(held) and gpus_claimed(held) == 0
    assert held.share is not None and held.share.placement == {}
    assert held.share.attained_gpu_s == running.share.attained_gpu_s  # type: ignore[union-attr]
    result = run_round({"a": held}, T0 + timedelta(seconds=120), policy)
    assert scale_plans(list(result.plans)) == []


def test_a_released_job_is_admitted_by_the_next_round() -> None:
    policy = processor(scheduler=SCHEDULER).policy
    released = _held(_held(_running(), True, 70), False, 80)
    assert not released.on_hold and scheduled(released)
    result = run_round({"a": released}, T0 + timedelta(seconds=120), policy)
    plans: list[ScalePlan] = scale_plans(list(result.plans))
    assert len(plans) == 1 and plans[0].node_group_resources["worker"].count >= 1
    assert not plans[0].suspend


def test_a_state_never_held_is_the_same_json_as_before() -> None:
    assert "on_hold" not in _running().model_dump_json()
    assert '"on_hold":true' in _held(_running(), True, 70).model_dump_json()
