"""A wish repeated is not a new plan, and a refused plan is not asked again at once.

Seen under `make run` with examples/elastic: the worker-resource optimizer's memory
target followed the workers' memory to the byte, so every decision (about every 4 s)
was a new OptimizePlan; and its plan to resize the workers, which the operator rejects
("cannot migrate worker-0: it hosts the job's rendezvous"), was asked again at every
decision the cooldowns let through. Pure: the brain's per-event step, no broker.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from schemas.env_settings import BrainSettings, LimitSettings
from schemas.envelope import Event
from schemas.jobs import (
    JobMeta,
    JobStarted,
    JobSubmitted,
    NodeRef,
    NodeStarted,
    NodeUsage,
    RoleSpec,
    RuntimeSample,
)
from schemas.plans import OptimizeRequest, ScalePlan, ScaleResult, ScaleStatus
from streams.brain.core.folds import fold
from streams.brain.core.policy import Policy
from streams.brain.core.state import JobState, RejectedPlan
from streams.brain.core.triggers import StepOutcome, step
from tests.unit.brain.builders import ENV, T0, GiB, plan_one

JOB = JobMeta(uuid="job-replans")
RENDEZVOUS = (
    "cannot migrate worker-0: it hosts the job's rendezvous (the c10d store of elastic role "
    "worker); scale the role by count instead"
)
#: the example's workers: 2 of 1 cpu and 4 GiB, worker-resource answering them (the
#: planner raises them to the limits' 4 cpu and 6 GiB), decided every 2 samples
POLICY = Policy(
    BrainSettings(
        sample_every=2,
        running_every=2,
        limits=LimitSettings(running_cooldown_s=0),
        job_config={"optimizer": "worker-resource"},
    )
)


def submitted() -> JobSubmitted:
    role = RoleSpec(replicas=2, min_replicas=1, max_replicas=4, cpu=1, memory=4 * GiB)
    return JobSubmitted(env=ENV, job=JOB, occurred_at=T0, roles={"worker": role})


def sample(i: int) -> RuntimeSample:
    """The workers' memory as the example's grew: a few KiB more at each sample."""
    nodes = [
        NodeUsage(type="worker", id=k, cpu=0.06, memory=351_772_672 + 9_830 * i + k)
        for k in range(2)
    ]
    at = T0 + timedelta(seconds=1 + i)
    return RuntimeSample(env=ENV, job=JOB, occurred_at=at, global_step=i, speed=5, nodes=nodes)


def answer(plan: ScalePlan, status: ScaleStatus, reason: str = "") -> ScaleResult:
    return ScaleResult(
        env=ENV,
        job=JOB,
        occurred_at=plan.occurred_at,
        plan_id=plan.plan_id,
        status=status,
        reason=reason,
    )


class Operator:
    """The brain's steps, with an operator that answers each ScalePlan at once, the way
    the local platform answered the example's (a migration of worker-0 is refused)."""

    def __init__(self, status: ScaleStatus = ScaleStatus.REJECTED) -> None:
        self.state: JobState | None = None
        self.status = status
        self.outcomes: list[StepOutcome] = []

    def run(self, events: Sequence[Event]) -> None:
        for event in events:
            self.step(event)

    def step(self, event: Event) -> None:
        outcome = step(self.state, event, POLICY)
        assert outcome is not None
        self.state = outcome.state
        self.outcomes.append(outcome)
        if outcome.scale_plan is not None:
            self.step(answer(outcome.scale_plan, self.status, RENDEZVOUS))

    @property
    def optimize_plans(self) -> int:
        return sum(o.optimize_plan is not None for o in self.outcomes)

    @property
    def scale_plans(self) -> list[ScalePlan]:
        return [o.scale_plan for o in self.outcomes if o.scale_plan is not None]

    def decided(self) -> int:
        return sum(o.trigger is not None for o in self.outcomes)


def test_a_memory_that_moves_by_bytes_is_one_wish_and_a_refused_plan_is_asked_once() -> None:
    brain = Operator()
    brain.run([submitted(), JobStarted(env=ENV, job=JOB, occurred_at=T0)])
    brain.run([sample(i) for i in range(40)])
    assert brain.decided() >= 20  # it decided all along (every 2 samples)
    # one wish (4 cpu, 6 GiB for both workers), published once, asked once, refused once
    assert brain.optimize_plans == 1
    assert len(brain.scale_plans) == 1
    migrated = [m.node.id for m in brain.scale_plans[0].migrate_nodes]
    assert migrated == [0, 1]
    assert brain.state is not None and brain.state.rejected is not None
    assert brain.state.rejected.reason == RENDEZVOUS


def test_a_refused_change_is_asked_again_once_the_job_changed() -> None:
    brain = Operator()
    brain.run([submitted(), JobStarted(env=ENV, job=JOB, occurred_at=T0)])
    brain.run([sample(i) for i in range(6)])
    assert len(brain.scale_plans) == 1
    # a node of the job (re)started: the job is not as it was when the platform refused
    started = NodeStarted(
        env=ENV, job=JOB, occurred_at=T0 + timedelta(seconds=7), node=NodeRef(type="worker", id=1)
    )
    brain.run([started, *(sample(i) for i in range(6, 12))])
    assert len(brain.scale_plans) == 2
    # a user's optimize request too
    request = OptimizeRequest(
        env=ENV, job=JOB, occurred_at=T0 + timedelta(seconds=13), stage="running"
    )
    brain.run([request])
    assert len(brain.scale_plans) == 3


def test_a_failed_plan_is_not_remembered_as_refused() -> None:
    """A failure to apply (an API error) may go through when asked again."""
    brain = Operator(ScaleStatus.FAILED)
    brain.run([submitted(), JobStarted(env=ENV, job=JOB, occurred_at=T0)])
    brain.run([sample(i) for i in range(8)])
    assert brain.state is not None and brain.state.rejected is None
    assert len(brain.scale_plans) == 4  # at every decision, as before


def _refused() -> tuple[JobState, ScalePlan]:
    brain = Operator()
    brain.run([submitted(), JobStarted(env=ENV, job=JOB, occurred_at=T0)])
    brain.run([sample(i) for i in range(2)])
    assert brain.state is not None and len(brain.scale_plans) == 1
    return brain.state, brain.scale_plans[0]


def test_the_rejection_is_kept_by_samples_and_forgotten_by_an_accepted_plan() -> None:
    state, plan = _refused()
    assert state.rejected == RejectedPlan(plan=plan, reason=RENDEZVOUS)
    after = fold(state, sample(3))
    assert after is not None and after.rejected == state.rejected
    # read back from a checkpoint, it is still the same change
    restored = JobState.model_validate_json(state.model_dump_json())
    assert restored.rejected == state.rejected
    pending = restored.model_copy(update={"pending_scale_plan": plan})
    applied = fold(pending, answer(plan, ScaleStatus.APPLIED))
    assert applied is not None and applied.rejected is None


def test_the_planner_holds_the_refused_change_and_says_why() -> None:
    state, plan = _refused()
    wish = state.last_plan
    assert wish is not None
    held = plan_one(state, wish, T0 + timedelta(seconds=30))
    assert held.scale_plan is None
    assert held.notes == (
        f"the platform rejected the same change (plan {plan.plan_id}): {RENDEZVOUS}",
    )
    # another change (one worker more) is asked for although the last one was refused
    group = wish.resource.node_group_resources["worker"]
    more = wish.model_copy(
        update={
            "resource": wish.resource.model_copy(
                update={"node_group_resources": {"worker": group.model_copy(update={"count": 3})}}
            )
        }
    )
    asked = plan_one(state, more, T0 + timedelta(seconds=30))
    assert asked.scale_plan is not None
