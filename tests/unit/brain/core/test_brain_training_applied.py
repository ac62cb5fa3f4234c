"""Training knobs reach the brain's state only from the job's own confirmation
(training.applied); a partial ScaleResult folds only the parts it applied."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import encode
from schemas.jobs import JobSubmitted, NodeRef, RoleSpec, RuntimeSample
from schemas.plans import (
    MigrateNode,
    Node,
    NodeGroupResource,
    NodeResource,
    NotApplied,
    OptimizePlan,
    ResourcePlan,
    ScalePlan,
    ScaleResult,
    ScaleStatus,
    TrainingApplied,
)
from streams.brain.core.folds import fold, fold_all, record_decision
from streams.brain.core.policy import Policy
from streams.brain.core.processor import BrainProcessor
from streams.brain.core.state import WORKER, AwaitedTraining, JobState
from streams.brain.core.triggers import step
from tests.unit.brain.builders import ENV, T0, GiB, Rec, meta, plan_one, use

JOB = meta()
AWAITING = "awaiting the job's confirmation (training.applied)"


def running() -> JobState:
    """A job of 2 workers (4 cores, 8 GiB) that reported a sample: local batch 32."""
    submitted = JobSubmitted(
        env=ENV,
        job=JOB,
        occurred_at=T0,
        roles={WORKER: RoleSpec(replicas=2, max_replicas=8, cpu=4, memory=8 * GiB)},
    )
    sample = RuntimeSample(
        env=ENV,
        job=JOB,
        occurred_at=T0 + timedelta(seconds=15),
        global_step=10,
        speed=1.0,
        local_batch_size=32,
        nodes=[use(WORKER, n, cpu=1, memory=GiB) for n in range(2)],
    )
    job = fold_all(None, [submitted, sample])
    assert job is not None
    return job


def pending(job: JobState, scale: ScalePlan) -> JobState:
    plan = OptimizePlan(
        env=ENV,
        job=JOB,
        plan_id=f"o-{scale.plan_id}",
        stage="running",
        optimizer="gpu-oom",
        reason="r",
        resource=ResourcePlan(),
    )
    return record_decision(job, plan, scale, [], T0)


def scale_plan(plan_id: str = "p1", **fields: object) -> ScalePlan:
    return ScalePlan(env=ENV, job=JOB, plan_id=plan_id, **fields)


def result(plan_id: str, status: ScaleStatus, *parts: str) -> ScaleResult:
    return ScaleResult(
        env=ENV,
        job=JOB,
        plan_id=plan_id,
        status=status,
        not_applied=[NotApplied(part=p, reason=AWAITING) for p in parts],
    )


def confirmed(plan_id: str, **knobs: int) -> TrainingApplied:
    return TrainingApplied(
        env=ENV,
        job=JOB,
        plan_id=plan_id,
        node=NodeRef(type=WORKER, id=0),
        training=knobs,
        global_step=20,
    )


def after(job: JobState | None, *events: object) -> JobState:
    out = fold_all(job, events)  # type: ignore[arg-type]
    assert out is not None
    return out


KNOBS = {"local_batch_size": 16, "accumulation_steps": 2}


def test_knobs_are_in_force_only_once_the_job_confirms_them() -> None:
    job = pending(running(), scale_plan(training=KNOBS))
    partial = after(
        job,
        result(
            "p1", ScaleStatus.PARTIAL, "training.local_batch_size", "training.accumulation_steps"
        ),
    )
    assert partial.pending_scale_plan is None
    assert partial.training == {"local_batch_size": 32, "accumulation_steps": 1}
    assert partial.awaiting_training == AwaitedTraining(plan_id="p1", training=KNOBS)

    done = after(partial, confirmed("p1", **KNOBS))
    assert done.training == KNOBS
    assert done.awaiting_training is None


def test_a_confirmation_of_another_plan_is_the_jobs_word_but_leaves_the_awaited_plan() -> None:
    job = after(pending(running(), scale_plan(training=KNOBS)), result("p1", ScaleStatus.APPLIED))
    assert job.awaiting_training is not None  # even "applied" does not speak for the job
    other = after(job, confirmed("p0", local_batch_size=8))
    assert other.training["local_batch_size"] == 8
    assert other.awaiting_training == job.awaiting_training


def test_a_rejected_plan_leaves_nothing_awaiting() -> None:
    job = after(pending(running(), scale_plan(training=KNOBS)), result("p1", ScaleStatus.REJECTED))
    assert job.awaiting_training is None
    assert job.training["local_batch_size"] == 32


def test_samples_still_report_the_knobs_the_job_trains_with() -> None:
    job = after(pending(running(), scale_plan(training=KNOBS)), result("p1", ScaleStatus.APPLIED))
    sample = RuntimeSample(
        env=ENV,
        job=JOB,
        occurred_at=T0 + timedelta(seconds=45),
        global_step=30,
        speed=1.0,
        local_batch_size=16,
        accumulation_steps=2,
        nodes=[use(WORKER, n, cpu=1, memory=GiB) for n in range(2)],
    )
    assert after(job, sample).training == KNOBS


def test_a_later_accepted_plan_with_knobs_supersedes_the_awaited_one() -> None:
    job = after(pending(running(), scale_plan(training=KNOBS)), result("p1", ScaleStatus.APPLIED))
    later = pending(job, scale_plan("p2", training={"local_batch_size": 8}))
    job = after(later, result("p2", ScaleStatus.PARTIAL, "training.local_batch_size"))
    assert job.awaiting_training == AwaitedTraining(plan_id="p2", training={"local_batch_size": 8})
    # a later plan without knobs leaves what awaits as it is
    resized = pending(
        job, scale_plan("p3", node_group_resources={WORKER: NodeGroupResource(count=3)})
    )
    job = after(resized, result("p3", ScaleStatus.APPLIED))
    assert job.roles[WORKER].replicas == 3
    assert job.awaiting_training is not None and job.awaiting_training.plan_id == "p2"


def test_a_partial_result_folds_only_the_parts_it_applied() -> None:
    job = running()
    scale = scale_plan(
        node_group_resources={
            WORKER: NodeGroupResource(
                count=3, node_resource=NodeResource(cpu=6, gpu_type="a100", gpu_memory=40 * GiB)
            )
        },
        launch_nodes=[Node(type=WORKER, id=2, resource=NodeResource(cpu=6, gpu_memory=40 * GiB))],
        migrate_nodes=[
            MigrateNode(
                node=NodeRef(type=WORKER, id=0),
                resource=NodeResource(memory=12 * GiB, gpu_memory=40 * GiB),
            )
        ],
        training={"local_batch_size": 16},
    )
    done = after(
        pending(job, scale),
        result(
            "p1",
            ScaleStatus.PARTIAL,
            "worker.gpu_type",
            "worker.gpu_memory",
            "worker-2.gpu_memory",
            "worker-0.gpu_memory",
            "training.local_batch_size",
        ),
    )
    role = done.roles[WORKER]
    assert (role.replicas, role.cpu, role.gpu_memory) == (3, 6, 0)
    assert (done.nodes["worker-0"].memory, done.nodes["worker-0"].gpu_memory) == (12 * GiB, 0)
    assert done.nodes["worker-0"].relaunches == 1
    assert (done.nodes["worker-2"].cpu, done.nodes["worker-2"].gpu_memory) == (6, 0)
    assert done.training["local_batch_size"] == 32


def test_a_whole_node_not_applied_is_left_as_it_was() -> None:
    job = running()
    scale = scale_plan(
        remove_nodes=[NodeRef(type=WORKER, id=1)],
        migrate_nodes=[
            MigrateNode(node=NodeRef(type=WORKER, id=0), resource=NodeResource(memory=12 * GiB))
        ],
    )
    done = after(pending(job, scale), result("p1", ScaleStatus.PARTIAL, "worker-0", "worker-1"))
    assert done.nodes == job.nodes


FIELDS = ("cpu", "memory", "gpu_num", "gpu_memory")


@settings(max_examples=100, deadline=None)
@given(
    group=st.fixed_dictionaries({f: st.integers(0, 64) for f in FIELDS}),
    node=st.fixed_dictionaries({f: st.integers(0, 64) for f in FIELDS}),
    left_out=st.sets(
        st.sampled_from(
            [f"worker.{f}" for f in FIELDS]
            + [f"worker-0.{f}" for f in FIELDS]
            + ["training.local_batch_size"]
        ),
        min_size=1,
    ),
)
def test_parts_not_applied_never_change_and_the_others_do(
    group: dict[str, int], node: dict[str, int], left_out: set[str]
) -> None:
    job = running()
    scale = scale_plan(
        node_group_resources={WORKER: NodeGroupResource(node_resource=NodeResource(**group))},
        migrate_nodes=[MigrateNode(node=NodeRef(type=WORKER, id=0), resource=NodeResource(**node))],
        training={"local_batch_size": 8},
    )
    done = after(pending(job, scale), result("p1", ScaleStatus.PARTIAL, *sorted(left_out)))
    # a part named for the role covers its nodes in the plan too
    for names, asked, before, now in (
        (("worker",), group, job.roles[WORKER], done.roles[WORKER]),
        (("worker-0", "worker"), node, job.nodes["worker-0"], done.nodes["worker-0"]),
    ):
        for f in FIELDS:
            kept = getattr(before, f)
            out = any(f"{name}.{f}" in left_out for name in names)
            expected = kept if out else (asked[f] or kept)
            assert getattr(now, f) == expected, (names, f)
    assert done.training == job.training


def test_awaited_knobs_are_not_planned_again_until_the_job_confirms() -> None:
    job = after(
        pending(running(), scale_plan(training=KNOBS)),
        result(
            "p1", ScaleStatus.PARTIAL, "training.local_batch_size", "training.accumulation_steps"
        ),
    )
    wanted = OptimizePlan(
        env=ENV,
        job=JOB,
        plan_id="o-2",
        stage="running",
        optimizer="gpu-oom",
        reason="r",
        caused_by="e-2",
        resource=ResourcePlan(training=KNOBS),
    )
    again = plan_one(job, wanted, T0)
    assert again.scale_plan is None
    assert "nothing changes" in again.notes
    # other values are news
    other = wanted.model_copy(
        update={"resource": ResourcePlan(training={"local_batch_size": 8, "accumulation_steps": 2})}
    )
    planned = plan_one(job, other, T0).scale_plan
    assert planned is not None and planned.training == {"local_batch_size": 8}
    # once confirmed, the state says the job trains with them: nothing to plan either
    done = after(job, confirmed("p1", **KNOBS))
    assert plan_one(done, wanted, T0).scale_plan is None


def test_a_confirmation_decides_nothing() -> None:
    job = after(pending(running(), scale_plan(training=KNOBS)), result("p1", ScaleStatus.APPLIED))
    outcome = step(job, confirmed("p1", **KNOBS), Policy())
    assert outcome is not None
    assert outcome.trigger is None and outcome.scale_plan is None
    assert outcome.state.training == KNOBS


def test_a_state_checkpointed_before_awaiting_training_still_loads() -> None:
    job = running()
    old = job.model_dump(mode="json", exclude={"awaiting_training"})
    assert JobState.model_validate(old).awaiting_training is None
    awaiting = after(pending(job, scale_plan(training=KNOBS)), result("p1", ScaleStatus.APPLIED))
    assert JobState.model_validate_json(awaiting.model_dump_json()) == awaiting


def test_fold_of_a_confirmation_for_a_new_job_starts_its_state() -> None:
    job = fold(None, confirmed("p1", local_batch_size=4))
    assert job is not None and job.training == {"local_batch_size": 4}


def test_the_processor_folds_a_confirmation_read_off_job_events() -> None:
    lifecycle = [
        JobSubmitted(
            env=ENV,
            job=JOB,
            occurred_at=T0,
            roles={WORKER: RoleSpec(replicas=2, cpu=4, memory=8 * GiB)},
        ),
        confirmed("p9", local_batch_size=24),
    ]
    p = BrainProcessor(ENV, f"{ENV}.brain")
    topic = f"{ENV}.job.events"
    out = p.process(
        [Rec(topic, 0, i, JOB.uuid.encode(), encode(e)) for i, e in enumerate(lifecycle)]
    )
    assert not out.letters
    assert p.states[JOB.uuid].training == {"local_batch_size": 24}
    assert p.counters.decisions == 1  # the submission; the confirmation decides nothing


def test_a_confirmation_read_before_the_result_leaves_nothing_awaiting() -> None:
    job = pending(running(), scale_plan(training=KNOBS))
    job = after(job, confirmed("p1", **KNOBS), result("p1", ScaleStatus.APPLIED))
    assert job.training == KNOBS
    assert job.awaiting_training is None
