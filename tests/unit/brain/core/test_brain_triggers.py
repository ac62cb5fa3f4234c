"""When the brain decides, and what one event turns into (pure, no broker)."""

from __future__ import annotations

from collections.abc import Sequence

from schemas.control import EnvAnnouncement, EnvMode
from schemas.env_settings import BrainSettings
from schemas.envelope import Event
from schemas.jobs import (
    JobCompleted,
    JobMeta,
    JobStarted,
    JobSubmitted,
    NodeOOM,
    NodeRef,
    NodeUsage,
    OOMKind,
    RoleSpec,
    RuntimeSample,
)
from schemas.plans import OptimizeRequest
from streams.brain.core.optimizers.numeric import GiB
from streams.brain.core.planner import plan_id
from streams.brain.core.policy import Policy
from streams.brain.core.state import JobState
from streams.brain.core.triggers import JobContext, StepOutcome, step
from tests.unit.brain.builders import ENV, T0

JOB = JobMeta(uuid="job-t")


def submitted() -> JobSubmitted:
    role = RoleSpec(replicas=2, min_replicas=1, max_replicas=4, cpu=8, memory=16 * GiB)
    return JobSubmitted(env=ENV, job=JOB, occurred_at=T0, roles={"worker": role})


def sample(i: int) -> RuntimeSample:
    nodes = [
        NodeUsage(type="worker", id=k, cpu=4, memory=12 * GiB, step_time=1.0) for k in range(2)
    ]
    return RuntimeSample(env=ENV, job=JOB, occurred_at=T0, global_step=i, speed=1, nodes=nodes)


def oom(node: int) -> NodeOOM:
    return NodeOOM(
        env=ENV,
        job=JOB,
        occurred_at=T0,
        node=NodeRef(type="worker", id=node),
        kind=OOMKind.HOST_MEMORY,
        memory=16 * GiB,
    )


def run(events: Sequence[Event], policy: Policy | None = None) -> list[StepOutcome]:
    state: JobState | None = None
    out: list[StepOutcome] = []
    for event in events:
        outcome = step(state, event, policy or Policy())
        assert outcome is not None
        state = outcome.state
        out.append(outcome)
    return out


def test_submission_and_stage_changes_decide() -> None:
    outcomes = run([submitted(), JobStarted(env=ENV, job=JOB, occurred_at=T0)])
    assert [o.trigger.reason if o.trigger else None for o in outcomes] == [
        "job submitted",
        "stage worker-initial",
    ]


def test_samples_decide_every_few_of_a_stage() -> None:
    policy = Policy(BrainSettings(sample_every=2, running_every=3))
    events: list[Event] = [submitted(), JobStarted(env=ENV, job=JOB, occurred_at=T0)]
    events += [sample(i) for i in range(12)]
    decided = [o.state.stage_samples for o in run(events, policy)[2:] if o.trigger is not None]
    # worker-initial: samples 2 and 4, then the 5th moves the job to running (a stage
    # change decides), then every 3rd sample of the running stage
    stages = [o.state.stage for o in run(events, policy)[2:] if o.trigger is not None]
    assert list(zip(stages, decided, strict=True)) == [
        ("worker-initial", 2),
        ("worker-initial", 4),
        ("running", 0),
        ("running", 3),
        ("running", 6),
    ]


def test_an_oom_decides_once_even_when_replayed() -> None:
    the_oom = oom(1)
    outcomes = run([submitted(), JobStarted(env=ENV, job=JOB, occurred_at=T0), the_oom, the_oom])
    first, replayed = outcomes[2], outcomes[3]
    assert first.optimize_plan is not None and first.scale_plan is not None
    assert first.optimize_plan.optimizer == "host-oom"
    assert first.scale_plan.plan_id == plan_id(JOB.uuid, str(the_oom.event_id), "scale")
    assert replayed.trigger is None and replayed.plans == []


def test_the_same_change_is_not_asked_again_while_pending() -> None:
    events: list[Event] = [submitted(), JobStarted(env=ENV, job=JOB, occurred_at=T0), oom(1)]
    outcomes = run(events)
    pending = outcomes[-1].state.pending_scale_plan
    assert pending is not None
    # an OOM of the same node before the operator answered: the same diff again
    again = step(outcomes[-1].state, oom(1), Policy())
    assert again is not None and again.trigger is not None
    assert again.scale_plan is None
    assert again.state.pending_scale_plan == pending
    assert all(r.handled for r in again.state.ooms["worker-1"])


def test_a_pending_plan_read_back_from_a_checkpoint_is_still_the_same_change() -> None:
    events: list[Event] = [submitted(), JobStarted(env=ENV, job=JOB, occurred_at=T0), oom(1)]
    before = run(events)[-1].state
    # as a restarted brain has it: from the checkpoint's JSON (ints of floats and all)
    restored = JobState.model_validate_json(before.model_dump_json())
    assert restored.pending_scale_plan == before.pending_scale_plan
    again = step(restored, oom(1), Policy())
    assert again is not None and again.trigger is not None and again.scale_plan is None
    # another change (a second node) is asked for although one is pending
    other = step(restored, oom(0), Policy())
    assert other is not None and other.scale_plan is not None
    assert other.scale_plan != restored.pending_scale_plan


def test_finished_jobs_are_not_decided_for() -> None:
    events: list[Event] = [submitted(), JobCompleted(env=ENV, job=JOB, occurred_at=T0), oom(0)]
    assert [o.trigger for o in run(events)[1:]] == [None, None]


def test_a_request_names_its_optimizer_and_errors_are_values() -> None:
    request = OptimizeRequest(
        env=ENV, job=JOB, occurred_at=T0, stage="worker-initial", optimizer="no-such"
    )
    outcome = run([submitted(), request])[1]
    assert outcome.trigger is not None and outcome.trigger.optimizer == "no-such"
    assert outcome.error is not None and outcome.error.code == "unknown_optimizer"
    assert outcome.plans == []


def test_events_without_a_job_are_not_steps() -> None:
    announcement = EnvAnnouncement(env=ENV, name=ENV, mode=EnvMode.VIRTUAL, partitions=3)
    assert step(None, announcement, Policy()) is None


def test_env_settings_make_the_policy() -> None:
    assert Policy.from_settings(None) == Policy()
    assert Policy.from_settings(True) == Policy()
    policy = Policy.from_settings(
        {
            "sample_every": 3,
            "running_every": 20,
            "limits": {"max_memory": 32 * GiB},
            "job_config": {"optimizer": "worker-resource"},
        }
    )
    assert (policy.settings.sample_every, policy.settings.running_every) == (3, 20)
    assert policy.limits is not None and policy.limits.max_memory == 32 * GiB
    assert policy.limits.min_cpu == 4  # what is not set keeps its default
    assert policy.job_config == {"optimizer": "worker-resource"}


def test_bad_env_settings_say_where() -> None:
    for raw, where in (
        ({"running_every": 0}, "brain.running_every"),
        ({"limits": {"max_cpu": "lots"}}, "brain.limits.max_cpu"),
        ({"sample_evry": 2}, "brain.sample_evry"),
    ):
        try:
            Policy.from_settings(raw)
        except ValueError as exc:
            assert str(exc).startswith(f"env setting {where}: "), exc
        else:
            raise AssertionError(f"accepted {raw}")


def test_the_env_default_optimizer_yields_to_the_jobs_own() -> None:
    policy = Policy(BrainSettings(job_config={"optimizer": "no-such"}))
    outcome = run([submitted()], policy)[0]
    assert outcome.error is not None and outcome.error.code == "unknown_optimizer"
    assert outcome.state.config == {}  # decided with the env's default, not stored

    role = RoleSpec(replicas=2, cpu=8, memory=16 * GiB)
    own = JobSubmitted(
        env=ENV, job=JOB, occurred_at=T0, roles={"worker": role}, config={"optimizer": ""}
    )
    outcome = run([own], Policy(BrainSettings(job_config={"optimizer": "no-such", "x": 1})))[0]
    assert outcome.error is None  # the job's own (empty: the stage's route) wins


def test_the_config_service_sits_between_the_env_default_and_the_jobs_own() -> None:
    asked: list[JobMeta] = []

    def service(job: JobMeta) -> dict[str, object]:
        asked.append(job)
        return {"optimizer": "from-service"}

    policy = Policy(BrainSettings(job_config={"optimizer": "from-env"}))
    outcome = step(None, submitted(), policy, JobContext(service=service))
    assert outcome is not None and outcome.error is not None
    assert "'from-service'" in outcome.error.message  # the service over the env default
    assert asked == [JOB] and outcome.state.config == {}  # asked when deciding, not stored

    role = RoleSpec(replicas=2, cpu=8, memory=16 * GiB)
    own = JobSubmitted(
        env=ENV, job=JOB, occurred_at=T0, roles={"worker": role}, config={"optimizer": ""}
    )
    outcome = step(None, own, policy, JobContext(service=service))
    assert outcome is not None and outcome.error is None  # the job's own over the service
    quiet = Policy(BrainSettings(job_config={"optimizer": "from-env"}, sample_every=5))
    outcome = step(
        outcome.state, sample(0), quiet, JobContext(service=service)
    )  # a new stage: decides
    assert outcome is not None and outcome.trigger is not None and len(asked) == 3
    outcome = step(outcome.state, sample(1), quiet, JobContext(service=service))
    assert outcome is not None and outcome.trigger is None
    assert len(asked) == 3  # a sample that decides nothing asks nothing


def test_a_finished_jobs_state_is_final_whatever_comes_after() -> None:
    policy = Policy()
    state = None
    for event in (submitted(), JobStarted(env=ENV, job=JOB, occurred_at=T0)):
        out = step(state, event, policy)
        assert out is not None
        state = out.state
    done = step(state, JobCompleted(env=ENV, job=JOB, occurred_at=T0), policy)
    assert done is not None and not done.late
    final = done.state
    oom = NodeOOM(
        env=ENV,
        job=JOB,
        occurred_at=T0,
        node=NodeRef(type="worker", id=0),
        kind=OOMKind.HOST_MEMORY,
    )
    request = OptimizeRequest(
        env=ENV, job=JOB, occurred_at=T0, stage="running", optimizer="host-oom"
    )
    for late in (sample(1), oom, request, submitted()):
        out = step(final, late, policy)
        assert out is not None
        assert out.late and out.state is final and out.plans == [] and out.trigger is None


def test_a_request_for_an_unknown_stage_is_answered_with_unknown_stage() -> None:
    """The request's config is taken, its stage is not: the job decides on in the stage
    it is in (an earlier brain kept the unknown stage and failed every decision after)."""
    events: list[Event] = [submitted(), JobStarted(env=ENV, job=JOB, occurred_at=T0)]
    request = OptimizeRequest(env=ENV, job=JOB, stage="warmup", config={"total_steps": 7})
    outcomes = run([*events, request, sample(0), sample(1)])
    answer = outcomes[2]
    assert answer.error is not None and answer.error.code == "unknown_stage"
    assert "'warmup'; known: create, ps-initial, worker-initial, running" in answer.error.message
    assert answer.state.stage == "worker-initial" and answer.state.total_steps == 7
    assert [o.error for o in outcomes[3:]] == [None, None]
    assert outcomes[4].trigger is not None  # the second sample of the stage decides


def test_a_request_in_another_spelling_of_the_stage_keeps_its_count() -> None:
    events: list[Event] = [submitted(), JobStarted(env=ENV, job=JOB, occurred_at=T0), sample(0)]
    request = OptimizeRequest(env=ENV, job=JOB, stage="job_stage_worker_initial")
    outcomes = run([*events, request])
    assert outcomes[-1].state.stage == "worker-initial"
    assert outcomes[-1].state.stage_samples == outcomes[-2].state.stage_samples == 1


def test_config_errors_are_told_with_the_decision_that_went_on_without_them() -> None:
    bad = submitted().model_copy(update={"config": {"total_steps": "many", "restart_count": 2}})
    first = run([bad])[0]
    assert first.trigger is not None and first.error is None  # decided anyway
    assert first.config_errors == ("config total_steps must be an integer >= 1, got 'many'",)
    assert first.state.restart_count == 2 and first.state.total_steps is None
    policy = Policy(BrainSettings(job_config={"pinned": {"worker": {"replicas": -1}}}))
    merged = run([submitted()], policy)[0]
    assert merged.config_errors and "config pinned is invalid" in merged.config_errors[0]
    assert merged.state.pinned == {}  # (the env's default is decided with, not kept)
