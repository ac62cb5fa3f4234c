"""Folding events into a job's state."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.jobs import (
    JobCompleted,
    JobStarted,
    JobSubmitted,
    NodeFailed,
    NodeOOM,
    NodeRef,
    NodeStarted,
    OOMKind,
    RoleSpec,
    RuntimeSample,
)
from schemas.plans import (
    MigrateNode,
    Node,
    NodeGroupResource,
    NodeResource,
    OptimizePlan,
    OptimizeRequest,
    ResourcePlan,
    ScalePlan,
    ScaleResult,
    ScaleStatus,
)
from streams.brain.core.folds import fold, fold_all, read_config, record_decision
from streams.brain.core.state import (
    MAX_SAMPLES,
    PS,
    WORKER,
    JobState,
    JobStatus,
    NodeStatus,
    Stage,
    normalize_stage,
    parse_node_key,
)
from tests.unit.brain.builders import ENV, T0, GiB, meta, use

JOB = meta()


def submitted(**config: object) -> JobSubmitted:
    return JobSubmitted(
        env=ENV,
        job=JOB,
        occurred_at=T0,
        distribution="ps",
        roles={
            WORKER: RoleSpec(replicas=2, min_replicas=1, max_replicas=8, cpu=4, memory=8 * GiB),
            PS: RoleSpec(replicas=1, cpu=8, memory=16 * GiB),
        },
        config=dict(config),
    )


def runtime(i: int, workers: int = 2, memory: int = GiB) -> RuntimeSample:
    return RuntimeSample(
        env=ENV,
        job=JOB,
        occurred_at=T0 + timedelta(seconds=15 * i),
        global_step=i * 10,
        speed=1.0,
        local_batch_size=32,
        nodes=[use(WORKER, n, cpu=1 + i, memory=memory) for n in range(workers)],
    )


def base() -> JobState:
    job = fold(None, submitted(total_steps=1000, pinned={"worker": {"replicas": 4}}))
    assert job is not None
    return job


def test_submission_sets_roles_config_and_stage() -> None:
    job = base()
    assert job.stage == Stage.CREATE
    assert job.distribution == "ps"
    assert job.roles[WORKER].max_replicas == 8
    assert job.total_steps == 1000
    assert job.pinned[WORKER].replicas == 4
    assert read_config(job.config)[1] == ()


def test_bad_config_values_are_reported_not_raised() -> None:
    job = fold(None, submitted(total_steps="many", pinned={"worker": {"replicas": -1}}))
    assert job is not None
    assert job.total_steps is None
    assert job.pinned == {}
    _, errors = read_config(job.config)
    assert len(errors) == 2  # what the processor dead-letters (test_brain_processor)


def test_samples_keep_the_last_60_and_peaks_of_all() -> None:
    job = fold_all(base(), [runtime(i, memory=(GiB if i else 9 * GiB)) for i in range(70)])
    assert job is not None
    assert len(job.samples) == MAX_SAMPLES
    assert job.samples[0].global_step == 100
    assert job.peaks["worker-0"].memory == 9 * GiB  # seen only in a sample no longer kept
    assert job.peaks["worker-1"].cpu == 70
    assert job.nodes["worker-0"].status == NodeStatus.RUNNING
    assert job.training == {"local_batch_size": 32, "accumulation_steps": 1}


def test_a_replayed_sample_is_folded_once() -> None:
    event = runtime(1)
    job = fold_all(base(), [event, event])
    assert job is not None
    assert len(job.samples) == 1


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        # (state to fold into, sample): samples 100.. are a history twice the window long,
        # the first half of it out of the window again
        st.tuples(st.integers(0, 7), st.one_of(st.integers(0, 40), st.integers(100, 219))),
        min_size=1,
        max_size=80,
    )
)
def test_the_duplicate_check_is_exact_whatever_states_are_folded_again(
    steps: list[tuple[int, int]],
) -> None:
    """A sample is a duplicate exactly when its event id is among its state's samples,
    also when one state is folded twice (branches) and when samples left the window."""
    events = {i: runtime(i) for i in [*range(41), *range(100, 220)]}
    start = fold_all(base(), [events[i] for i in range(100, 220)])
    assert start is not None
    states = [start]
    for pick, sample in steps:
        state = states[pick % len(states)]
        event = events[sample]
        before = [s.event_id for s in state.samples]
        after = fold(state, event)
        assert after is not None
        if str(event.event_id) in before:
            assert [s.event_id for s in after.samples] == before
        else:
            assert [s.event_id for s in after.samples] == [*before, str(event.event_id)][
                -MAX_SAMPLES:
            ]
        states.append(after)


def test_stages_advance_with_samples() -> None:
    job = fold(base(), JobStarted(env=ENV, job=JOB))
    assert job is not None
    assert job.status == JobStatus.RUNNING
    assert job.stage == Stage.PS_INITIAL
    job = fold_all(job, [runtime(i) for i in range(5)])
    assert job is not None
    assert job.stage == Stage.WORKER_INITIAL
    job = fold_all(job, [runtime(i) for i in range(5, 10)])
    assert job is not None
    assert job.stage == Stage.RUNNING


def test_optimize_request_sets_stage_and_config() -> None:
    request = OptimizeRequest(
        env=ENV, job=JOB, stage="job_stage_running", config={"optimizer": "hot-ps"}
    )
    job = fold(base(), request)
    assert job is not None
    assert job.stage is Stage.RUNNING  # normalized once, in the fold
    assert job.config["optimizer"] == "hot-ps"
    assert job.total_steps == 1000


def test_oom_is_recorded_once_per_event() -> None:
    event = NodeOOM(env=ENV, job=JOB, node=NodeRef(type=WORKER, id=1), kind=OOMKind.HOST_MEMORY)
    job = fold_all(base(), [event, event])
    assert job is not None
    assert [r.event_id for r in job.ooms["worker-1"]] == [str(event.event_id)]
    assert job.nodes["worker-1"].status == NodeStatus.OOM
    assert job.nodes["worker-1"].memory == 8 * GiB  # from the role until told otherwise


def test_node_lifecycle_and_job_end() -> None:
    job = fold_all(
        base(),
        [
            NodeStarted(env=ENV, job=JOB, node=NodeRef(type=WORKER, id=0)),
            NodeFailed(env=ENV, job=JOB, node=NodeRef(type=WORKER, id=1)),
            JobCompleted(env=ENV, job=JOB, occurred_at=T0),
        ],
    )
    assert job is not None
    assert job.nodes["worker-0"].alive
    assert not job.nodes["worker-1"].alive
    assert (job.status, job.completed_at) == (JobStatus.COMPLETED, T0)


def test_events_of_another_job_are_refused() -> None:
    other = JobStarted(env=ENV, job=meta("job-2"))
    with pytest.raises(ValueError, match="job-2"):
        fold(base(), other)


def test_a_state_starts_from_any_job_event() -> None:
    job = fold(None, runtime(0))
    assert job is not None
    assert job.job == JOB
    assert len(job.samples) == 1


def _pending(job: JobState) -> tuple[JobState, ScalePlan]:
    scale = ScalePlan(
        env=ENV,
        job=JOB,
        plan_id="p1",
        node_group_resources={WORKER: NodeGroupResource(count=3)},
        launch_nodes=[Node(type=WORKER, id=2, resource=NodeResource(cpu=4, memory=8 * GiB))],
        migrate_nodes=[
            MigrateNode(node=NodeRef(type=WORKER, id=0), resource=NodeResource(memory=12 * GiB))
        ],
        remove_nodes=[NodeRef(type=WORKER, id=1)],
        training={"local_batch_size": 16},
    )
    plan = OptimizePlan(
        env=ENV,
        job=JOB,
        plan_id="o1",
        stage="running",
        optimizer="host-oom",
        reason="r",
        resource=ResourcePlan(),
    )
    return record_decision(job, plan, scale, ["oom-x"], T0), scale


def test_applied_scale_result_updates_resources() -> None:
    job = fold_all(base(), [runtime(0)])
    assert job is not None
    job, _ = _pending(job)
    assert job.last_plan is not None and job.last_plan.plan_id == "o1"
    done = fold(job, ScaleResult(env=ENV, job=JOB, plan_id="p1", status=ScaleStatus.APPLIED))
    assert done is not None
    assert done.pending_scale_plan is None
    assert done.roles[WORKER].replicas == 3
    assert done.nodes["worker-0"].memory == 12 * GiB
    assert done.nodes["worker-0"].relaunches == 1
    assert done.nodes["worker-1"].status == NodeStatus.REMOVED
    assert done.nodes["worker-2"].status == NodeStatus.PENDING
    # An operator's "applied" does not speak for the training process: the knobs wait
    # for the job's own confirmation (they used to be folded here).
    assert done.training["local_batch_size"] == 32  # what the job's sample said
    assert done.awaiting_training is not None
    assert (done.awaiting_training.plan_id, done.awaiting_training.training) == (
        "p1",
        {"local_batch_size": 16},
    )


def test_rejected_or_unknown_scale_result_changes_no_resources() -> None:
    job, _ = _pending(base())
    other = fold(job, ScaleResult(env=ENV, job=JOB, plan_id="zz", status=ScaleStatus.APPLIED))
    assert other is not None
    assert other.pending_scale_plan is not None
    rejected = fold(job, ScaleResult(env=ENV, job=JOB, plan_id="p1", status=ScaleStatus.REJECTED))
    assert rejected is not None
    assert rejected.pending_scale_plan is None
    assert rejected.roles == job.roles


def test_record_decision_marks_only_the_handled_ooms() -> None:
    events = [
        NodeOOM(env=ENV, job=JOB, node=NodeRef(type=WORKER, id=i), kind=OOMKind.HOST_MEMORY)
        for i in range(2)
    ]
    job = fold_all(base(), events)
    assert job is not None
    plan = OptimizePlan(
        env=ENV,
        job=JOB,
        plan_id="o",
        stage="running",
        optimizer="host-oom",
        reason="r",
        resource=ResourcePlan(),
    )
    job = record_decision(job, plan, None, [str(events[0].event_id)], T0)
    assert list(job.unhandled_ooms(OOMKind.HOST_MEMORY)) == ["worker-1"]
    assert job.pending_scale_plan is None


def test_state_json_round_trips() -> None:
    job = fold_all(base(), [runtime(i) for i in range(3)])
    assert job is not None
    assert JobState.model_validate_json(job.model_dump_json()) == job


def test_state_json_of_earlier_brains_loads() -> None:
    """Checkpoints written before the stage was a Stage and before `config_errors` and
    `last_plan_at` were retired: the stage as the master spelled it, the retired fields
    present (extra fields are refused otherwise)."""
    job = fold_all(base(), [runtime(i) for i in range(3)])
    assert job is not None
    doc = json.loads(job.model_dump_json())
    assert doc["stage"] == "ps-initial" and "config_errors" not in doc
    for spelled, distribution, stage in (
        ("job_stage_running", "ps", Stage.RUNNING),
        ("ps_initial", "ps", Stage.PS_INITIAL),
        ("initial", "ps", Stage.PS_INITIAL),
        ("initial", "allreduce", Stage.WORKER_INITIAL),
        ("warmup", "ps", Stage.CREATE),  # a stage no brain knows: the stages again
    ):
        old = {
            **doc,
            "distribution": distribution,
            "stage": spelled,
            "config_errors": ["config total_steps must be an integer >= 1, got 'x'"],
            "last_plan_at": "2026-01-01T00:00:00Z",
        }
        loaded = JobState.model_validate_json(json.dumps(old))
        assert loaded.stage is stage
        assert loaded == job.model_copy(update={"stage": stage, "distribution": distribution})


def test_stage_and_node_key_spellings() -> None:
    assert normalize_stage("job_stage_ps_initial") == Stage.PS_INITIAL
    assert normalize_stage("Worker_Initial") == Stage.WORKER_INITIAL
    assert normalize_stage("initial", "ps") == Stage.PS_INITIAL
    assert normalize_stage("initial") == Stage.WORKER_INITIAL
    assert normalize_stage("warmup") is None
    assert parse_node_key("chief-worker-3") == ("chief-worker", 3)
    assert parse_node_key("worker") is None
    assert parse_node_key("-3") is None
