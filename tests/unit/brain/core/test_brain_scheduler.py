"""The cluster scheduler inside the brain: only arrived jobs exist, one round per tick (or
per interval of event time), decisions become ordinary plans, and the same input gives
the same plans."""

from __future__ import annotations

from datetime import timedelta

import pytest

from schemas import encode
from schemas.envelope import Event
from schemas.jobs import (
    JobCompleted,
    JobMeta,
    JobSubmitted,
    NodeOOM,
    NodeRef,
    NodeUsage,
    OOMKind,
    RoleSpec,
    RuntimeSample,
)
from schemas.lockstep import Barrier
from schemas.plans import OptimizePlan, ScalePlan, ScaleResult, ScaleStatus
from streams.brain.core.cluster_round import (
    cluster_capacity,
    job_input,
    job_model,
    memory_for,
    run_round,
)
from streams.brain.core.folds import fold
from streams.brain.core.optimizers.numeric import GiB
from streams.brain.core.planner import DEFAULT_LIMITS
from streams.brain.core.policy import Policy
from streams.brain.core.processor import BrainProcessor
from streams.brain.core.schedulers.api import ClusterCapacity, GroupQuota, NodeCapacity
from streams.brain.core.state import PROFILE_SAMPLES, JobState
from tests.unit.brain.builders import ENV, T0, Rec

EVENTS = f"{ENV}.job.events"
METRICS = f"{ENV}.job.metrics"
INPUTS = [(EVENTS, 0), (METRICS, 0)]
SCHEDULER = {"name": "goodput-cluster", "nodes": 2, "gpus_per_node": 4}


def submitted(name: str, at_s: float, replicas: int = 2, batch: int = 64) -> JobSubmitted:
    return JobSubmitted(
        env=ENV,
        job=JobMeta(uuid=name, name=name),
        occurred_at=T0 + timedelta(seconds=at_s),
        application="cifar10",
        batch_size=batch,
        max_batch_size=batch * 8,
        min_local_batch_size=8,
        max_local_batch_size=128,
        adaptive_batch_size=True,
        roles={"worker": RoleSpec(replicas=replicas, gpu_num=1, memory=4 * GiB)},
    )


def sample(
    name: str, at_s: float, replicas: int, local: int, step_s: float, memory: int = 3 * GiB
) -> RuntimeSample:
    return RuntimeSample(
        env=ENV,
        job=JobMeta(uuid=name, name=name),
        occurred_at=T0 + timedelta(seconds=at_s),
        global_step=int(at_s),
        speed=1 / step_s,
        batch_size=replicas * local,
        local_batch_size=local,
        world_size=replicas,
        num_nodes=1,
        allreduce_s=step_s / 4 if replicas > 1 else 0.0,
        grad_sqr=1.0,
        grad_var=64.0,
        nodes=[NodeUsage(type="worker", id=i, memory=memory) for i in range(replicas)],
    )


def barrier(tick: int, at_s: float) -> Barrier:
    return Barrier(env=ENV, tick=tick, sim_at=T0 + timedelta(seconds=at_s))


def feed(events_per_tp: dict[tuple[str, int], list[Event]]) -> list[Rec]:
    return [
        Rec(tp[0], tp[1], i, None, encode(e))
        for tp, events in events_per_tp.items()
        for i, e in enumerate(events)
    ]


def processor(**policy: object) -> BrainProcessor:
    settings = {"lockstep": True, "cluster_gpus": 8, **policy}
    p = BrainProcessor(ENV, f"{ENV}.brain", Policy.from_settings(settings))
    p.inputs = set(INPUTS)
    return p


def scale_plans(plans: list[OptimizePlan | ScalePlan]) -> list[ScalePlan]:
    return [p for p in plans if isinstance(p, ScalePlan)]


def test_a_submission_read_before_its_time_exists_for_no_decision_until_it_arrives() -> None:
    """The replay publishes every submission before the first tick: the later ones must
    not hold GPUs nor be decided before the simulated clock reaches them."""
    p = processor()
    events: dict[tuple[str, int], list[Event]] = {
        (EVENTS, 0): [submitted("early", 0), submitted("late", 500), barrier(1, 60)],
        (METRICS, 0): [barrier(1, 60)],
    }
    out = p.process(feed(events))
    assert [a.tick for a in out.acks] == [1]
    assert p.counters.decisions == 1  # the early job's submission, not the late one's
    assert p.states["late"].awaiting_arrival and not p.states["early"].awaiting_arrival
    assert p.free_gpus() == 8 - 2  # only the arrived job's demand
    out = p.process(
        [
            Rec(EVENTS, 0, 3, None, encode(barrier(2, 600))),
            Rec(METRICS, 0, 1, None, encode(barrier(2, 600))),
        ]
    )
    assert not p.states["late"].awaiting_arrival
    assert p.counters.decisions == 2
    assert p.free_gpus() == 8 - 4


def test_a_scheduler_env_plans_placements_for_arrived_jobs_only() -> None:
    p = processor(scheduler=SCHEDULER)
    events: dict[tuple[str, int], list[Event]] = {
        (EVENTS, 0): [submitted("a", 0), submitted("b", 10), submitted("c", 900), barrier(1, 60)],
        (METRICS, 0): [barrier(1, 60)],
    }
    out = p.process(feed(events))
    plans = scale_plans(out.plans)
    assert sorted(plan.job.uuid for plan in plans) == ["a", "b"]
    for plan in plans:
        # never measured: explored at one replica first, placed on a named node
        assert plan.node_group_resources["worker"].count == 1
        assert sum(plan.placement.values()) == 1
        assert set(plan.placement) <= {"node-0", "node-1"}
        assert plan.training["local_batch_size"] * plan.training["accumulation_steps"] >= 64
        assert plan.source_plan is not None and not plan.suspend
    assert all(isinstance(q, OptimizePlan) for q in out.plans if not isinstance(q, ScalePlan))
    assert p.states["a"].share is not None and p.states["a"].share.replicas == 1
    assert p.rounds == 1


def test_the_same_input_gives_the_same_plans_in_any_batching() -> None:
    events: dict[tuple[str, int], list[Event]] = {
        (EVENTS, 0): [submitted("a", 0), submitted("b", 5), barrier(1, 60)],
        (METRICS, 0): [
            sample("a", 40, 1, 64, 0.5),
            sample("b", 45, 1, 64, 0.25),
            barrier(1, 60),
        ],
    }
    events[(EVENTS, 0)] += [barrier(2, 120)]
    events[(METRICS, 0)] += [sample("a", 100, 1, 64, 0.5), barrier(2, 120)]
    recs = feed(events)
    one = processor(scheduler=SCHEDULER).process(recs).plans
    assert len(scale_plans(one)) >= 2
    p = processor(scheduler=SCHEDULER)
    # the metrics partition first, in two batches: each partition's order kept
    metrics = [r for r in recs if r.topic == METRICS]
    job_events = [r for r in recs if r.topic == EVENTS]
    split = [
        *p.process(metrics[:2]).plans,
        *p.process([*metrics[2:], *job_events[:3]]).plans,
        *p.process(job_events[3:]).plans,
    ]
    assert [x.plan_id for x in one] == [x.plan_id for x in split]
    assert [encode(x) for x in one] == [encode(x) for x in split]


def test_event_time_rounds_at_each_interval() -> None:
    """A real env: a round whenever event time passes a multiple of the interval."""
    settings = {"cluster_gpus": 8, "scheduler": {**SCHEDULER, "interval_s": 60}}
    p = BrainProcessor(ENV, f"{ENV}.brain", Policy.from_settings(settings))
    events = [submitted("a", 1), sample("a", 30, 1, 64, 0.5), sample("a", 61, 1, 64, 0.5)]
    out = p.process([Rec(EVENTS, 0, i, None, encode(e)) for i, e in enumerate(events)])
    # one round at the arrival (a quiet env would otherwise wait for the next event),
    # one when event time passed 60 s
    assert p.rounds == 2
    admitted = scale_plans(out.plans)
    assert [(q.job.uuid, q.occurred_at) for q in admitted][:1] == [("a", T0 + timedelta(seconds=1))]
    assert len({q.plan_id for q in out.plans}) == len(out.plans)


def test_an_event_time_round_never_goes_back_in_time() -> None:
    """A completion stamped before submissions the brain already decided (a replay fed at
    once) is decided at the scheduler's clock, with every job that arrived by then."""
    settings = {"cluster_gpus": 8, "scheduler": {**SCHEDULER, "interval_s": 60}}
    p = BrainProcessor(ENV, f"{ENV}.brain", Policy.from_settings(settings))
    done = JobCompleted(
        env=ENV, job=JobMeta(uuid="a", name="a"), occurred_at=T0 + timedelta(seconds=400)
    )
    events = [submitted("a", 0), submitted("b", 30), submitted("c", 1200), done]
    out = p.process([Rec(EVENTS, 0, i, None, encode(e)) for i, e in enumerate(events)])
    assert p.rounds == 5 and p.last_round == T0 + timedelta(seconds=1200)
    assert all(q.occurred_at <= T0 + timedelta(seconds=1200) for q in out.plans)
    assert {q.job.uuid for q in scale_plans(out.plans)} == {"a", "b", "c"}


def test_a_refused_plan_gives_the_job_back_the_share_it_held() -> None:
    """The share is what the platform took on: a refusal leaves the job where it was, so
    the next round does not count GPUs it never got (nor a restart it never made)."""
    policy = processor(scheduler=SCHEDULER).policy
    state = profiled(sample("a", 30, 1, 32, 0.5))
    result = run_round({"a": state}, T0 + timedelta(seconds=60), policy)
    planned = result.states["a"]
    (plan,) = scale_plans(list(result.plans))
    assert planned.share is not None and planned.share.placement and planned.share.plan_id

    def answer(status: ScaleStatus) -> JobState:
        answered = fold(
            planned,
            ScaleResult(
                env=ENV,
                job=planned.job,
                occurred_at=T0 + timedelta(seconds=61),
                plan_id=plan.plan_id,
                status=status,
                reason="test",
            ),
        )
        assert answered is not None and answered.share is not None
        return answered

    refused = answer(ScaleStatus.REJECTED).share
    assert refused is not None and refused.placement == {} and refused.plan_id is None
    taken = answer(ScaleStatus.APPLIED).share
    assert taken is not None and taken.placement == planned.share.placement
    assert taken.plan_id is None and taken.before is None


def profiled(*samples: RuntimeSample) -> JobState:
    state = fold(None, submitted("a", 0))
    for s in samples:
        state = fold(state, s)
    assert state is not None
    return state


def test_a_job_is_explored_up_to_twice_what_it_was_measured_at() -> None:
    assert job_model(profiled()).limits.max_replicas == 1
    state = profiled(sample("a", 30, 2, 32, 0.5), sample("a", 60, 2, 32, 0.5))
    model = job_model(state)
    assert model.limits.max_replicas == 4
    assert model.grad is not None and model.grad.var == 64.0 / 64  # per sample -> at B0
    assert len(state.profile) == 1 and state.profile[0].count == 2


def test_an_adaptive_job_trains_from_the_smallest_batch_it_converges_at() -> None:
    """The submitted batch may be a baseline's large fixed one (Pollux's workloads): an
    adaptive job's batch is chosen from its smallest, and its efficiency measured there."""
    event = submitted("a", 0, batch=512).model_copy(update={"min_batch_size": 64})
    state = fold(fold(None, event), sample("a", 30, 2, 32, 0.5))
    assert state is not None
    model = job_model(state)
    assert model.limits.init_batch == 64 and model.limits.max_batch == 512 * 8
    assert model.grad is not None and model.grad.var == 64.0 / 64  # per sample -> at 64
    fixed = event.model_copy(update={"adaptive_batch_size": False})
    assert job_model(fold(None, fixed)).limits.init_batch == 512  # type: ignore[arg-type]


def test_a_job_gets_the_memory_of_the_largest_batch_it_may_be_rebatched_to() -> None:
    """A batch-only change applies in place, on the pods the job has: they are sized at
    admission for the largest local batch a later round may give at that size."""
    state = profiled(
        sample("a", 30, 1, 32, 0.5, memory=2 * GiB), sample("a", 60, 1, 64, 0.9, memory=3 * GiB)
    )
    policy = processor(scheduler=SCHEDULER).policy
    result = run_round({"a": state}, T0 + timedelta(seconds=60), policy)
    (plan,) = scale_plans(list(result.plans))
    group = plan.node_group_resources["worker"]
    assert group.count >= 1 and plan.training["local_batch_size"] <= 128
    largest = min(128, 64 * 8 // group.count)  # max_local_batch_size, max_batch / replicas
    assert group.node_resource.memory == memory_for(state, largest, DEFAULT_LIMITS) > 4 * GiB


def test_a_profile_point_is_the_mean_of_its_configurations_first_samples() -> None:
    """Later samples of a configuration cost no copy of the profile: its step is steady."""
    first = [sample("a", 30 * (i + 1), 2, 32, 0.5 + 0.01 * i) for i in range(PROFILE_SAMPLES)]
    state = profiled(*first)
    (point,) = state.profile
    assert point.count == PROFILE_SAMPLES
    assert point.step_time == pytest.approx(sum(0.5 + 0.01 * i for i in range(8)) / 8)
    later = fold(state, sample("a", 30 * (PROFILE_SAMPLES + 1), 2, 32, 9.0))
    assert later is not None and later.profile is state.profile
    other = fold(state, sample("a", 30 * (PROFILE_SAMPLES + 2), 4, 16, 0.4))
    assert other is not None and len(other.profile) == 2


def test_memory_for_a_larger_local_batch_follows_the_measured_line() -> None:
    state = profiled(
        sample("a", 30, 1, 32, 0.5, memory=2 * GiB), sample("a", 60, 1, 64, 0.9, memory=3 * GiB)
    )
    # line through (32, 2 GiB) and (64, 3 GiB): 128 -> 5 GiB, above the 4 GiB it has
    assert memory_for(state, 128, DEFAULT_LIMITS) == 5 * GiB
    assert memory_for(state, 16, DEFAULT_LIMITS) == 0  # it has enough: unchanged


def test_a_round_counts_attained_service_of_jobs_holding_gpus() -> None:
    p = processor(scheduler=SCHEDULER)
    p.process(
        feed(
            {
                (EVENTS, 0): [submitted("a", 0), barrier(1, 60)],
                (METRICS, 0): [barrier(1, 60)],
            }
        )
    )
    result = run_round(p.states, T0 + timedelta(seconds=180), p.policy)
    share = result.states["a"].share
    assert share is not None and share.attained_gpu_s == 120.0


def test_a_job_out_of_host_memory_gets_the_memory_it_needs_on_the_same_gpus() -> None:
    """Per-job optimizers decide nothing under a scheduler: the round itself answers a
    host OOM, or the job would stay stalled on its GPUs."""
    p = processor(scheduler=SCHEDULER)
    p.process(
        feed({(EVENTS, 0): [submitted("a", 0), barrier(1, 60)], (METRICS, 0): [barrier(1, 60)]})
    )
    share = p.states["a"].share
    assert share is not None and share.replicas == 1
    oom = NodeOOM(
        env=ENV,
        job=JobMeta(uuid="a", name="a"),
        occurred_at=T0 + timedelta(seconds=90),
        node=NodeRef(type="worker", id=0),
        kind=OOMKind.HOST_MEMORY,
        memory=5 * GiB,
        exit_code=137,
    )
    out = p.process(
        [
            Rec(EVENTS, 0, 3, None, encode(oom)),
            Rec(EVENTS, 0, 4, None, encode(barrier(2, 120))),
            Rec(METRICS, 0, 1, None, encode(barrier(2, 120))),
        ]
    )
    (plan,) = scale_plans(out.plans)
    assert plan.node_group_resources["worker"].node_resource.memory == 5 * GiB
    assert plan.placement == share.placement
    assert plan.node_group_resources["worker"].count == 1
    assert all(r.handled for rs in p.states["a"].ooms.values() for r in rs)
    out = p.process(
        [
            Rec(EVENTS, 0, 5, None, encode(barrier(3, 180))),
            Rec(METRICS, 0, 2, None, encode(barrier(3, 180))),
        ]
    )
    assert scale_plans(out.plans) == []  # answered once


def tick(p: BrainProcessor, n: int, at_s: float, *events: Event) -> list[ScalePlan]:
    """One tick on a single job-events partition (and the metrics partition's barrier)."""
    base = p.offsets.get((EVENTS, 0), 0)
    mbase = p.offsets.get((METRICS, 0), 0)
    recs = [Rec(EVENTS, 0, base + i, None, encode(e)) for i, e in enumerate(events)]
    recs.append(Rec(EVENTS, 0, base + len(events), None, encode(barrier(n, at_s))))
    recs.append(Rec(METRICS, 0, mbase, None, encode(barrier(n, at_s))))
    return scale_plans(p.process(recs).plans)


def completed(name: str, at_s: float) -> JobCompleted:
    return JobCompleted(
        env=ENV, job=JobMeta(uuid=name, name=name), occurred_at=T0 + timedelta(seconds=at_s)
    )


def test_a_small_trace_where_the_scheduler_must_preempt_and_resume() -> None:
    """Fidelity check 7c: one node of 4 GPUs under tiresias with a 100 GPU-s threshold.
    A 4-GPU job runs past the threshold; a 2-GPU job arrives in the first queue and
    preempts it; when that one completes the first resumes on its GPUs."""
    sched = {**SCHEDULER, "name": "tiresias", "nodes": 1, "params": {"queue_threshold_gpu_s": 100}}
    p = processor(scheduler=sched, cluster_gpus=4)
    (admit,) = tick(p, 1, 60, submitted("big", 0, replicas=4))
    assert admit.node_group_resources["worker"].count == 4 and admit.placement == {"node-0": 4}
    assert tick(p, 2, 120) == []  # 4 GPUs x 60 s = 240 GPU-s: past the threshold, alone
    plans = tick(p, 3, 180, submitted("small", 150, replicas=2))
    assert [(q.job.uuid, q.suspend) for q in plans] == [("big", True), ("small", False)]
    assert plans[1].placement == {"node-0": 2} and not plans[0].placement
    (resume,) = tick(p, 4, 240, completed("small", 200))
    assert resume.job.uuid == "big" and resume.placement == {"node-0": 4}
    share = p.states["big"].share
    assert share is not None and share.restarts == 1  # the suspend


def test_a_submissions_priority_group_and_kueue_queue_reach_the_scheduler() -> None:
    base = submitted("a", 0)
    sharing = base.model_copy(update={"priority": 7, "group": "team-a", "kueue_queue": "lq"})
    state = fold(None, sharing)
    assert state is not None
    got = job_input(state)
    assert (got.priority, got.group, got.kueue_managed) == (7, "team-a", True)
    plain = fold(None, base)
    assert plain is not None
    assert (job_input(plain).priority, job_input(plain).group) == (0, None)
    assert not job_input(plain).kueue_managed


def test_the_settings_cluster_and_quotas_or_the_platforms_nodes_are_what_a_round_hands_out() -> (
    None
):
    policy = processor(scheduler={**SCHEDULER, "quotas": {"team-a": 4}}).policy
    assert policy.scheduler is not None
    static = cluster_capacity(policy.scheduler)
    assert static == ClusterCapacity.uniform(2, 4, (GroupQuota("team-a", 4),))
    reported = ClusterCapacity((NodeCapacity("gpu-1", 8, "h100"), NodeCapacity("gpu-2", 2)))
    assert cluster_capacity(policy.scheduler, reported) == ClusterCapacity(
        reported.nodes, 8, (GroupQuota("team-a", 4),)
    )


def test_a_round_on_the_platforms_nodes_places_jobs_there() -> None:
    policy = processor(scheduler=SCHEDULER).policy
    state = profiled(sample("a", 30, 1, 32, 0.5))
    reported = ClusterCapacity((NodeCapacity("gpu-7", 2),))
    result = run_round({"a": state}, T0 + timedelta(seconds=60), policy, nodes=reported)
    (plan,) = scale_plans(list(result.plans))
    assert set(plan.placement) == {"gpu-7"}


def test_quotas_past_the_cluster_are_a_one_line_settings_error() -> None:
    with pytest.raises(ValueError, match="quotas promise 9 GPUs, more than the 8 of the cluster"):
        Policy.from_settings({"scheduler": {**SCHEDULER, "quotas": {"a": 5, "b": 4}}})


def test_a_rounds_knobs_count_for_the_job_only_once_it_confirms_them() -> None:
    """A round's batch reaches the job as training knobs; the job's own training.applied
    makes them its batch (issue 26, item 6): before it the planned knobs count (so the next
    round does not ask again), after it the job's word, even where it differs."""
    from schemas.jobs import NodeRef
    from schemas.plans import NotApplied, TrainingApplied
    from streams.brain.core.cluster_round import batch_in_force

    policy = processor(scheduler=SCHEDULER).policy
    state = profiled(sample("a", 30, 1, 32, 0.5))
    result = run_round({"a": state}, T0 + timedelta(seconds=60), policy)
    (plan,) = scale_plans(list(result.plans))
    assert plan.training  # the round chose the job's batch
    asked = (plan.training["local_batch_size"], plan.training.get("accumulation_steps", 1))
    # the job runs another batch than the one asked for (its samples say so)
    running = {"local_batch_size": asked[0] * 2, "accumulation_steps": 1}
    planned = result.states["a"].model_copy(update={"training": running})
    assert batch_in_force(planned) == asked  # unanswered: as planned
    partial = fold(
        planned,
        ScaleResult(
            env=ENV,
            job=planned.job,
            occurred_at=T0 + timedelta(seconds=61),
            plan_id=plan.plan_id,
            status=ScaleStatus.PARTIAL,
            reason="knobs await the job",
            not_applied=[
                NotApplied(part=f"training.{knob}", reason="awaiting the job's confirmation")
                for knob in plan.training
            ],
        ),
    )
    assert partial is not None and partial.awaiting_training is not None
    assert partial.training == running  # nothing folded before the job's word
    assert batch_in_force(partial) == asked  # awaited: as planned, not asked again

    def confirmed(local: int) -> JobState:
        out = fold(
            partial,
            TrainingApplied(
                env=ENV,
                job=planned.job,
                occurred_at=T0 + timedelta(seconds=62),
                plan_id=plan.plan_id,
                node=NodeRef(type="worker", id=0),
                training={"local_batch_size": local, "accumulation_steps": 1},
                global_step=31,
            ),
        )
        assert out is not None
        return out

    assert batch_in_force(confirmed(asked[0])) == (asked[0], 1)
    # A job that trains with another batch than asked (it clamped it) is scheduled at
    # the batch it runs, not the planned one.
    other = asked[0] // 2
    assert batch_in_force(confirmed(other)) == (other, 1)
    assert job_input(confirmed(other)).local_batch == other


@pytest.mark.parametrize("name", ["goodput-cluster", "tiresias"])
def test_a_job_that_did_not_say_its_batch_runs_as_the_gang_it_asked_for(name: str) -> None:
    """A TrainingJob without `spec.batch` is still scheduled (a queued job would wait for
    ever otherwise): its requested workers or none, never a batch of the brain's choice."""
    policy = processor(scheduler={**SCHEDULER, "name": name, "nodes": 1}).policy

    def no_batch(uuid: str, at_s: float) -> JobState:
        event = submitted(uuid, at_s, replicas=2).model_copy(
            update={
                "batch_size": None,
                "max_batch_size": None,
                "min_local_batch_size": None,
                "max_local_batch_size": None,
                "adaptive_batch_size": False,
            }
        )
        state = fold(None, event)
        assert state is not None and state.batch_bounds is None
        return state

    jobs = {u: no_batch(u, i) for i, u in enumerate(("a", "b", "c"))}
    result = run_round(jobs, T0 + timedelta(seconds=60), policy)
    plans = scale_plans(list(result.plans))
    assert {p.job.uuid for p in plans} == {"a", "b"}  # 4 GPUs: two gangs of 2, c waits
    for plan in plans:
        assert plan.node_group_resources["worker"].count == 2
        assert plan.training == {}  # its batch is its own
        assert not plan.suspend
