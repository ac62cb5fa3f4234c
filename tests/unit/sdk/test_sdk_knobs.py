"""Training knobs: the pure arithmetic (the global batch kept) and the step-boundary switch."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover_events.sdk.identity import JobIdentity
from dlrover_events.sdk.knobs import (
    BatchKnobs,
    KnobVector,
    StepKnobs,
    accumulation_for,
    for_world,
    resolve_knobs,
)
from schemas.envelope import Event
from schemas.jobs import JobMeta
from schemas.plans import (
    JobPlan,
    NotApplied,
    ScalePlan,
    ScaleResult,
    ScaleStatus,
    TrainingApplied,
)

JOB = JobMeta(uuid="job-knobs")
sizes = st.integers(min_value=1, max_value=512)
worlds = st.integers(min_value=1, max_value=64)


@given(local=sizes, acc=st.integers(1, 64), world=worlds, new_local=sizes)
def test_a_local_batch_alone_keeps_the_global_batch_whenever_it_divides(
    local: int, acc: int, world: int, new_local: int
) -> None:
    current = BatchKnobs(local, acc)
    got = resolve_knobs(current, {"local_batch_size": new_local}, world)
    assert got.knobs.local_batch_size == new_local
    assert got.knobs.accumulation_steps >= 1
    assert got.target_global_batch == current.global_batch(world)
    if (local * acc) % new_local == 0:
        assert got.exact
        assert got.global_batch == current.global_batch(world)
    else:
        # The nearest reachable global batch: no other accumulation comes closer.
        err = abs(got.global_batch - got.target_global_batch)
        for other in (got.knobs.accumulation_steps - 1, got.knobs.accumulation_steps + 1):
            if other >= 1:
                assert abs(new_local * other * world - got.target_global_batch) >= err


@given(target=st.integers(1, 100_000), local=sizes, world=worlds)
def test_a_new_world_keeps_the_target_whenever_it_divides(
    target: int, local: int, world: int
) -> None:
    got = for_world(BatchKnobs(local, 1), target, world)
    assert got.knobs.local_batch_size == local  # never raised by the job itself
    assert got.target_global_batch == target
    if target % (local * world) == 0:
        assert got.global_batch == target


def test_not_dividing_takes_the_nearest_and_keeps_the_target() -> None:
    # 16 x 3 x 2 = 96; a local batch of 10 gives 20 per accumulation step: 4.8 -> 5 (100).
    got = resolve_knobs(BatchKnobs(16, 3), {"local_batch_size": 10}, 2)
    assert (got.knobs.accumulation_steps, got.global_batch, got.target_global_batch) == (5, 100, 96)
    assert not got.exact
    # A tie (exactly half way) takes the larger batch; never below 1 accumulation step.
    assert accumulation_for(30, 4, 5) == 2  # 20 or 40: 30 is half way
    assert accumulation_for(10, 64, 8) == 1
    # Switching back gives the original knobs: the target was kept, not the rounding.
    back = resolve_knobs(got.knobs, {"local_batch_size": 16}, 2, got.target_global_batch)
    assert back.knobs == BatchKnobs(16, 3) and back.exact


def test_accumulation_given_sets_the_global_batch() -> None:
    got = resolve_knobs(BatchKnobs(16, 2), {"accumulation_steps": 4}, 2)
    assert (got.knobs, got.target_global_batch) == (BatchKnobs(16, 4), 128)
    both = resolve_knobs(BatchKnobs(16, 2), {"local_batch_size": 8, "accumulation_steps": 3}, 2)
    assert (both.knobs, both.target_global_batch) == (BatchKnobs(8, 3), 48)
    with pytest.raises(ValueError, match="local_batch_size"):
        resolve_knobs(BatchKnobs(16, 2), {"local_batch_size": 0}, 2)


def plan(
    plan_id: str, training: dict[str, Any], status: ScaleStatus = ScaleStatus.PARTIAL
) -> JobPlan:
    base: dict[str, Any] = {"env": "unit", "job": JOB}
    not_applied = (
        [NotApplied(part="training.local_batch_size", reason="the job's")]
        if status == ScaleStatus.PARTIAL
        else []
    )
    return JobPlan(
        job=JOB,
        scale_plan=ScalePlan(**base, plan_id=plan_id, training=training),
        result=ScaleResult(**base, plan_id=plan_id, status=status, not_applied=not_applied),
    )


class FakeReporter:
    """What StepKnobs uses of a Reporter: identity, publish, set_training."""

    def __init__(self) -> None:
        self.identity = JobIdentity(job=JOB, env="unit", rank=3)
        self.published: list[Event] = []
        self.training: tuple[int | None, int] | None = None

    def publish(self, event: Event) -> None:
        self.published.append(event)

    def set_training(self, local_batch_size: int | None, accumulation_steps: int) -> None:
        self.training = (local_batch_size, accumulation_steps)


def test_a_plan_switches_at_the_next_boundary_and_is_confirmed_once() -> None:
    reporter = FakeReporter()
    knobs = StepKnobs(16, 2, reporter=reporter)  # type: ignore[arg-type]
    assert reporter.training == (16, 2)
    assert knobs.at_step_boundary(0) is None
    assert knobs.offer(plan("p1", {"local_batch_size": 8}))
    switch = knobs.at_step_boundary(41)
    assert switch is not None and switch.plan_id == "p1"
    assert (switch.before, switch.after, switch.global_batch) == (
        BatchKnobs(16, 2),
        BatchKnobs(8, 4),
        32,
    )
    assert reporter.training == (8, 4)
    [applied] = reporter.published
    assert isinstance(applied, TrainingApplied)
    assert applied.plan_id == "p1" and applied.global_step == 42
    assert applied.training == {"local_batch_size": 8, "accumulation_steps": 4}
    assert applied.node.id == 3  # the node id, not the torch rank
    # The same plan again (the gateway has not seen the confirmation yet): nothing.
    assert not knobs.offer(plan("p1", {"local_batch_size": 8}))
    assert knobs.at_step_boundary(42) is None
    assert len(reporter.published) == 1


def test_plans_without_knobs_to_apply_are_ignored() -> None:
    knobs = StepKnobs(16)
    assert not knobs.offer(plan("p2", {"local_batch_size": 8}, ScaleStatus.REJECTED))
    assert not knobs.offer(plan("p3", {"unknown": 3}))
    assert not knobs.offer(plan("p4", {"local_batch_size": 0}))
    assert knobs.at_step_boundary(1) is None and knobs.knobs == BatchKnobs(16, 1)


def test_ranks_switch_together_at_sync_steps_only_with_rank_0s_decision() -> None:
    calls: list[KnobVector] = []
    decided: list[KnobVector] = []

    def sync(proposal: KnobVector) -> KnobVector:  # a broadcast from rank 0
        calls.append(proposal)
        return decided[-1] if decided else proposal

    rank0 = StepKnobs(16, 1, world_size=2, rank=0, sync=sync, sync_every=5)
    rank1 = StepKnobs(16, 1, world_size=2, rank=1, sync=sync, sync_every=5)
    rank1.offer(plan("p5", {"local_batch_size": 4}))  # ignored: rank 1 only follows
    rank0.offer(plan("p5", {"local_batch_size": 4}))
    assert rank0.at_step_boundary(3) is None and not calls  # not a sync step: no collective
    s0 = rank0.at_step_boundary(5)
    decided.append(calls[-1])
    s1 = rank1.at_step_boundary(5)
    assert s0 is not None and s1 is not None
    assert s0.after == s1.after == BatchKnobs(4, 4)
    assert calls[0] == [1, 4, 4, 32]
    decided.clear()
    assert rank1.at_step_boundary(10) is None  # rank 1 proposes nothing of its own
    assert calls[-1] == [0, 0, 0, 0]


def test_state_survives_a_checkpoint_into_a_world_of_another_size() -> None:
    knobs = StepKnobs(8, 3, world_size=2, sync=lambda v: v, sync_every=1)  # global 48
    knobs.offer(plan("p6", {"local_batch_size": 4}))
    knobs.at_step_boundary(10)
    state = knobs.state_dict()
    assert state == {
        "local_batch_size": 4,
        "accumulation_steps": 6,
        "target_global_batch": 48,
        "world_size": 2,
        "applied_plan_id": "p6",
    }
    reporter = FakeReporter()
    bigger = StepKnobs(8, 3, world_size=3, rank=0, sync=lambda v: v, reporter=reporter)  # type: ignore[arg-type]
    switch = bigger.load_state_dict(state, step=10)
    assert bigger.knobs == BatchKnobs(4, 4) and bigger.global_batch == 48
    assert switch is not None and switch.plan_id is None
    assert reporter.training == (4, 4) and not reporter.published
    assert not bigger.offer(plan("p6", {"local_batch_size": 4}))  # applied before the restart
