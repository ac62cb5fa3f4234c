"""The pure folds that keep a job's state current, one event at a time.

Folds return a new state and never mutate the one they are given: a processor can keep
the old state when a later step fails, and a replay of the same events gives the same
state. `record_decision` folds in what the brain itself decided.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from datetime import datetime
from typing import Any

from pydantic import TypeAdapter, ValidationError

from schemas.envelope import Event
from schemas.jobs import (
    JobCompleted,
    JobEvent,
    JobFailed,
    JobHeld,
    JobStarted,
    JobSubmitted,
    NodeEvent,
    NodeExited,
    NodeFailed,
    NodeOOM,
    NodeStarted,
    RoleSpec,
    RuntimeSample,
)
from schemas.plans import (
    NodeResource,
    OptimizePlan,
    OptimizeRequest,
    ScalePlan,
    ScaleResult,
    ScaleStatus,
    TrainingApplied,
)
from streams.brain.core.memo import SampleMemo
from streams.brain.core.samples import Sample, SampleRead, job_meta, sample_of
from streams.brain.core.state import (
    INITIAL_STAGE_SAMPLES,
    MAX_PROFILE_POINTS,
    MAX_SAMPLES,
    PROFILE_SAMPLES,
    PS,
    AwaitedTraining,
    BatchBounds,
    Distribution,
    JobState,
    JobStatus,
    NodePeak,
    NodeState,
    NodeStatus,
    OOMRecord,
    Pinned,
    ProfilePoint,
    RejectedPlan,
    RoleResources,
    Stage,
    node_key,
    normalize_stage,
    updated,
)

_PINNED = TypeAdapter(dict[str, Pinned])


def _empty_state(event: JobEvent) -> JobState:
    return JobState(env=event.env, job=event.job)


def read_config(config: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The typed fields the brain reads from a job's config (`total_steps`,
    `recv_op_count`, `restart_count`, `pinned`), and what it could not read: a bad value
    is left out (the field keeps what it had) rather than failing the job's state, and
    the processor reports it."""
    update: dict[str, Any] = {}
    errors: list[str] = []
    for field, minimum in (("total_steps", 1), ("recv_op_count", 0), ("restart_count", 0)):
        value = config.get(field)
        if value is None:
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value >= minimum:
            update[field] = value
        else:
            errors.append(f"config {field} must be an integer >= {minimum}, got {value!r}")
    if "pinned" in config:
        try:
            update["pinned"] = _PINNED.validate_python(config["pinned"])
        except ValidationError as exc:
            errors.append(f"config pinned is invalid: {exc.errors()[0]['msg']}")
    return update, tuple(errors)


def with_config(state: JobState, config: dict[str, Any]) -> tuple[JobState, tuple[str, ...]]:
    """The state with `config` as its config and the typed fields read from it, and what
    could not be read (`read_config`): the one place they are parsed, for the job's own
    config (folds) and for the config a decision is made with (env default and config
    documents merged in), once each."""
    update, problems = read_config(config)
    update["config"] = config
    return state.model_copy(update=update), problems


def _role(spec: RoleSpec) -> RoleResources:
    return RoleResources(
        replicas=spec.replicas,
        min_replicas=spec.min_replicas,
        max_replicas=spec.max_replicas,
        cpu=spec.cpu,
        memory=spec.memory,
        gpu_num=spec.gpu_num,
        rendezvous_host=spec.rendezvous_host,
    )


def _fold_submitted(state: JobState, event: JobSubmitted) -> JobState:
    roles = {name: _role(spec) for name, spec in event.roles.items()}
    update: dict[str, Any] = {
        "job": event.job,
        "distribution": event.distribution,
        "application": event.application,
        "batch_size": event.batch_size,
        "roles": roles,
        "submitted_at": event.occurred_at,
        "priority": event.priority,
        "group": event.group,
        "kueue_queue": event.kueue_queue,
        "batch_bounds": None
        if event.batch_size is None
        else BatchBounds(
            init_batch=event.batch_size,
            min_batch=event.min_batch_size,
            max_batch=event.max_batch_size,
            min_local=event.min_local_batch_size,
            max_local=event.max_local_batch_size,
            adaptive=event.adaptive_batch_size,
        ),
    }
    return with_config(state.model_copy(update=update), dict(event.config))[0]


def _profiled(state: JobState, sample: Sample) -> list[ProfilePoint] | None:
    """The profile with the sample's step in it; None when the sample does not say which
    configuration it was taken at (or took no time), or when its configuration's point
    already has its `PROFILE_SAMPLES`."""
    replicas, local = sample.world_size, sample.local_batch_size
    if replicas is None or local is None or not sample.speed > 0:
        return None
    nodes = sample.num_nodes or 1
    accumulation = sample.accumulation_steps
    config = (nodes, replicas, local, accumulation)
    points = state.profile
    at = next(
        (
            i
            for i, p in enumerate(points)
            if (p.nodes, p.replicas, p.local_batch, p.accumulation) == config
        ),
        None,
    )
    if at is not None and points[at].count >= PROFILE_SAMPLES:
        return None
    step = 1.0 / sample.speed
    sync = min(sample.allreduce_s or 0.0, step * 0.999)
    memory = max((n.memory for n in sample.nodes), default=0)
    points = list(points)
    if at is not None:
        p = points[at]
        n = p.count + 1
        points[at] = p.model_copy(
            update={
                "count": n,
                "step_time": p.step_time + (step - p.step_time) / n,
                "sync_time": p.sync_time + (sync - p.sync_time) / n,
                "memory": max(p.memory, memory),
            }
        )
        return points
    points.append(
        ProfilePoint(
            nodes=nodes,
            replicas=replicas,
            local_batch=local,
            accumulation=accumulation,
            count=1,
            step_time=step,
            sync_time=sync,
            memory=memory,
        )
    )
    return points[-MAX_PROFILE_POINTS:]


def _start_stage(distribution: Distribution) -> Stage:
    return Stage.PS_INITIAL if distribution == "ps" else Stage.WORKER_INITIAL


def _fold_started(state: JobState, event: JobStarted) -> JobState:
    update: dict[str, Any] = {"status": JobStatus.RUNNING}
    if state.stage == Stage.CREATE:
        update.update(stage=_start_stage(state.distribution), stage_samples=0)
    return state.model_copy(update=update)


def _next_stage(state: JobState) -> tuple[Stage, int]:
    """Move through the initial stages by samples seen, as DLRover's master would."""
    stage, seen = state.stage, state.stage_samples + 1
    if stage == Stage.CREATE:
        return _start_stage(state.distribution), 1
    if seen >= INITIAL_STAGE_SAMPLES:
        if stage == Stage.PS_INITIAL:
            return Stage.WORKER_INITIAL, 0
        if stage == Stage.WORKER_INITIAL:
            return Stage.RUNNING, 0
    return stage, seen


def _fold_sample(state: JobState, sample: Sample, memo: SampleMemo | None) -> JobState:
    """The hottest fold (every sample of every job): it sets `last_event_id` itself so the
    state is copied once, and rebuilds a node's peak only when it rises. The job's memo
    keeps its samples' ids for the duplicate check (looked for sample by sample, 60
    strings spread over memory cost a fifth of the processor's time with 100 jobs)."""
    event_id = sample.event_id
    ids = memo.ids_of(state.samples) if memo is not None else {s.event_id for s in state.samples}
    if event_id in ids:  # read again: a retry, a replay
        if memo is not None:
            memo.keep(state.samples, ids, ())
        return updated(state, {"last_event_id": event_id})
    samples = [*state.samples, sample]
    dropped: list[Sample] = []
    if len(samples) > MAX_SAMPLES:
        dropped = samples[:-MAX_SAMPLES]
        for gone in dropped:
            ids.discard(gone.event_id)
        samples = samples[-MAX_SAMPLES:]
    ids.add(event_id)
    if memo is not None:
        memo.keep(samples, ids, dropped)
    # Peaks and nodes rarely change once a job runs: copy them only when they do (the
    # state's own dicts are never mutated, so older states stay as they were).
    peaks, nodes = state.peaks, state.nodes
    for usage in sample.nodes:
        key = node_key(usage.type, usage.id)
        old = peaks.get(key)
        gpu_memory = usage.gpu_memory or 0
        if old is None or (
            usage.cpu > old.cpu or usage.memory > old.memory or gpu_memory > old.gpu_memory
        ):
            if peaks is state.peaks:
                peaks = dict(peaks)
            peaks[key] = NodePeak(
                type=usage.type,
                id=usage.id,
                cpu=usage.cpu if old is None else max(old.cpu, usage.cpu),
                memory=usage.memory if old is None else max(old.memory, usage.memory),
                gpu_memory=gpu_memory if old is None else max(old.gpu_memory, gpu_memory),
            )
        node = nodes.get(key)
        if node is None or node.status == NodeStatus.PENDING:
            if nodes is state.nodes:
                nodes = dict(nodes)
            nodes[key] = (
                node_from_role(state, usage.type, usage.id, NodeStatus.RUNNING)
                if node is None
                else node.model_copy(update={"status": NodeStatus.RUNNING})
            )
    training = state.training
    local_batch = sample.local_batch_size
    if (local_batch is not None and training.get("local_batch_size") != local_batch) or (
        training.get("accumulation_steps") != sample.accumulation_steps
    ):
        training = dict(training)
        if local_batch is not None:
            training["local_batch_size"] = local_batch
        training["accumulation_steps"] = sample.accumulation_steps
    stage, seen = _next_stage(state)
    update: dict[str, Any] = {"samples": samples, "stage_samples": seen, "last_event_id": event_id}
    # only what changed: model_copy's cost grows with the keys it is given
    if peaks is not state.peaks:
        update["peaks"] = peaks
    if nodes is not state.nodes:
        update["nodes"] = nodes
    if training is not state.training:
        update["training"] = training
    if stage != state.stage:
        update["stage"] = stage
    if state.status == JobStatus.SUBMITTED:
        update["status"] = JobStatus.RUNNING
    if sample.batch_size and sample.batch_size != state.batch_size:
        update["batch_size"] = sample.batch_size
    if sample.world_size is not None:  # (a sample that says its size may profile the job)
        profile = _profiled(state, sample)
        if profile is not None:
            update["profile"] = profile
    if sample.grad_sqr is not None and sample.grad_var is not None:
        update["grad_stats"] = (sample.grad_sqr, sample.grad_var)
    return updated(state, update)


def node_from_role(state: JobState, role: str, node_id: int, status: NodeStatus) -> NodeState:
    """A node the brain has not seen yet, as its role's spec launches it."""
    spec = state.role(role)
    return NodeState(
        type=role,
        id=node_id,
        status=status,
        cpu=spec.cpu,
        memory=spec.memory,
        gpu_num=spec.gpu_num,
        gpu_memory=spec.gpu_memory,
    )


def _with_node_status(state: JobState, role: str, node_id: int, status: NodeStatus) -> JobState:
    key = node_key(role, node_id)
    nodes = dict(state.nodes)
    node = nodes.get(key)
    nodes[key] = (
        node_from_role(state, role, node_id, status)
        if node is None
        else node.model_copy(update={"status": status})
    )
    return state.model_copy(update={"nodes": nodes})


def _fold_oom(state: JobState, event: NodeOOM) -> JobState:
    key = node_key(event.node.type, event.node.id)
    event_id = str(event.event_id)
    records = state.ooms.get(key, [])
    if any(r.event_id == event_id for r in records):
        return state  # a replayed OOM is the same OOM: it must not be acted on twice
    record = OOMRecord(
        event_id=event_id,
        kind=event.kind,
        at=event.occurred_at,
        memory=event.memory,
        gpu_memory=event.gpu_memory,
    )
    ooms = dict(state.ooms)
    ooms[key] = [*records, record]
    state = _with_node_status(state, event.node.type, event.node.id, NodeStatus.OOM)
    return state.model_copy(update={"ooms": ooms})


def _fold_request(state: JobState, event: OptimizeRequest) -> JobState:
    """The request's config over the job's, and its stage when the brain knows it (the
    request itself is then answered with `unknown_stage`, see `triggers.step`)."""
    stage = normalize_stage(event.stage, state.distribution)
    if stage is not None and stage != state.stage:
        state = state.model_copy(update={"stage": stage, "stage_samples": 0})
    return with_config(state, {**state.config, **event.config})[0]


#: A ScaleResult that says the operator took the plan on (some or all of it).
ACCEPTED = frozenset({ScaleStatus.APPLIED, ScaleStatus.PARTIAL})


def _fold_result(state: JobState, event: ScaleResult) -> JobState:
    """The pending plan's resources, less the parts the operator says it did not apply.

    Training knobs are never taken from a result: only the training process changes its
    micro-batch, so they wait (``awaiting_training``) for its own TrainingApplied. An
    operator that says it applied them speaks for a process it does not run.
    """
    pending = state.pending_scale_plan
    if pending is None or pending.plan_id != event.plan_id:
        return state
    accepted = event.status in ACCEPTED
    update: dict[str, Any] = {"pending_scale_plan": None}
    if state.share is not None:
        update["share"] = state.share.answered(event.plan_id, accepted)
    if not accepted:
        # a refusal is remembered (the planner does not ask the same again while the job
        # is as it was); a failure to apply is not: it may go through when asked again
        if event.status == ScaleStatus.REJECTED:
            update["rejected"] = RejectedPlan(plan=pending, reason=event.reason)
        return state.model_copy(update=update)
    update["rejected"] = None  # the job changed: what was refused may be asked again
    skipped = [part.part for part in event.not_applied]
    applied = apply_scale_plan(state, pending, not_applied=skipped)
    if pending.training:
        # A later accepted plan's knobs supersede what an earlier one left awaiting. Those
        # the job already said it trains with (its confirmation and the result come on two
        # topics, in either order) await nothing.
        left = {k: v for k, v in pending.training.items() if state.training.get(k) != v}
        update["awaiting_training"] = (
            AwaitedTraining(plan_id=pending.plan_id, training=left) if left else None
        )
    return applied.model_copy(update=update)


def _fold_held(state: JobState, event: JobHeld) -> JobState:
    """Held by its owner: its pods are stopped, so what a cluster scheduler gave it is free
    (its service so far is kept); released: it waits, placed nowhere, for a scheduler to
    admit it."""
    update: dict[str, Any] = {"on_hold": event.held}
    if event.held and state.share is not None:
        update["share"] = state.share.model_copy(
            update={"placement": {}, "plan_id": None, "before": None, "since": None}
        )
    return state.model_copy(update=update)


def _fold_training_applied(state: JobState, event: TrainingApplied) -> JobState:
    """The job's own word on the knobs it trains with: they are in force from now on."""
    update: dict[str, Any] = {"training": {**state.training, **event.training}}
    awaited = state.awaiting_training
    if awaited is not None and awaited.plan_id == event.plan_id:
        update["awaiting_training"] = None
    return state.model_copy(update=update)


#: The resources a plan sets on a role or node that the brain's state keeps.
_NODE_FIELDS = ("cpu", "memory", "gpu_num", "gpu_memory")


def _left_out(not_applied: Collection[str], field: str, *names: str) -> bool:
    """Whether a part the operator did not apply covers ``field`` of the first of
    ``names``: that field of it or of the others (a node's role: a part named for a role
    covers its nodes in the same plan), or all of it (``worker``, ``worker-2``)."""
    return names[0] in not_applied or any(f"{name}.{field}" in not_applied for name in names)


def _fields(
    not_applied: Collection[str], res: NodeResource, current: Any, *names: str
) -> dict[str, Any]:
    """``res`` over ``current`` (a plan's 0 meaning unchanged), less the fields not applied."""
    return {
        field: getattr(current, field)
        if _left_out(not_applied, field, *names)
        else getattr(res, field) or getattr(current, field)
        for field in _NODE_FIELDS
    }


def apply_scale_plan(
    state: JobState, plan: ScalePlan, not_applied: Collection[str] = ()
) -> JobState:
    """The job's resources once the operator applied `plan`: what the next plan diffs
    against. Parts named in `not_applied` (as a ScaleResult names them) stay as they
    were; the plan's training knobs are left to the job's confirmation."""
    skip = frozenset(not_applied)
    roles = dict(state.roles)
    for role, group in plan.node_group_resources.items():
        if role in skip:
            continue
        current = roles.get(role, RoleResources())
        res = group.node_resource
        update = _fields(skip, res, current, role)
        if not _left_out(skip, "count", role):
            update["replicas"] = group.count or current.replicas
        roles[role] = current.model_copy(update=update)
    nodes = dict(state.nodes)
    for ref in plan.remove_nodes:
        key = node_key(ref.type, ref.id)
        if key in nodes and key not in skip and ref.type not in skip:
            nodes[key] = nodes[key].model_copy(update={"status": NodeStatus.REMOVED})
    for launched in plan.launch_nodes:
        key = node_key(launched.type, launched.id)
        if key in skip or launched.type in skip:
            continue
        res = launched.resource
        # a field not applied is what the role launches with, not what the plan asked
        spec = node_from_role(state, launched.type, launched.id, NodeStatus.PENDING)
        nodes[key] = spec.model_copy(
            update={
                name: getattr(spec if _left_out(skip, name, key, launched.type) else res, name)
                for name in _NODE_FIELDS
            }
        )
    for migrated in plan.migrate_nodes:
        key = node_key(migrated.node.type, migrated.node.id)
        if key in skip or migrated.node.type in skip:
            continue
        old = nodes.get(key) or node_from_role(
            state, migrated.node.type, migrated.node.id, NodeStatus.PENDING
        )
        res = migrated.resource
        update = _fields(skip, res, old, key, migrated.node.type)
        update.update(status=NodeStatus.PENDING, relaunches=old.relaunches + 1)
        nodes[key] = old.model_copy(update=update)
    return state.model_copy(update={"roles": roles, "nodes": nodes})


#: Events that say the job is no longer as it was when the platform rejected a plan (its
#: nodes came or went, it started again, it has another config): the planner may ask for
#: the refused change again. Samples, and results of other plans, change nothing of it.
CHANGES_THE_JOB = (JobSubmitted, JobStarted, NodeEvent, OptimizeRequest)


def fold(
    state: JobState | None, event: Event | SampleRead, memo: SampleMemo | None = None
) -> JobState | None:
    """Fold one event of a job into its state. Events that say nothing about a job leave
    the state as it is; a job-keyed event for a job not seen yet starts its state (a replay
    may begin after the job's submission). `memo` is the job's (see `streams.brain.core.memo`),
    kept in step with the samples folded; without it the fold counts afresh."""
    if isinstance(event, SampleRead):  # most events: runtime samples read off the bus
        if state is None:
            state = JobState(env=event.env, job=job_meta(event.job))
        elif state.job.uuid != event.job.uuid:
            raise ValueError(
                f"event for job {event.job.uuid!r} folded into the state of {state.job.uuid!r}"
            )
        return _fold_sample(state, event.sample, memo)
    if not isinstance(event, JobEvent):
        return state
    if state is None:
        state = _empty_state(event)
    elif state.job.uuid != event.job.uuid:
        raise ValueError(
            f"event for job {event.job.uuid!r} folded into the state of {state.job.uuid!r}"
        )
    match event:
        case JobSubmitted():
            state = _fold_submitted(state, event)
        case JobStarted():
            state = _fold_started(state, event)
        case RuntimeSample():
            return _fold_sample(state, sample_of(event), memo)  # sets last_event_id itself
        case NodeStarted():
            state = _with_node_status(state, event.node.type, event.node.id, NodeStatus.RUNNING)
        case NodeExited():
            state = _with_node_status(state, event.node.type, event.node.id, NodeStatus.EXITED)
        case NodeFailed():
            state = _with_node_status(state, event.node.type, event.node.id, NodeStatus.FAILED)
        case NodeOOM():
            state = _fold_oom(state, event)
        case OptimizeRequest():
            state = _fold_request(state, event)
        case ScaleResult():
            state = _fold_result(state, event)
        case TrainingApplied():
            state = _fold_training_applied(state, event)
        case JobHeld():
            state = _fold_held(state, event)
        case JobCompleted():
            state = state.model_copy(
                update={"status": JobStatus.COMPLETED, "completed_at": event.occurred_at}
            )
        case JobFailed():
            state = state.model_copy(
                update={"status": JobStatus.FAILED, "completed_at": event.occurred_at}
            )
        case _:
            pass
    update: dict[str, Any] = {"last_event_id": str(event.event_id)}
    if state.rejected is not None and isinstance(event, CHANGES_THE_JOB):
        update["rejected"] = None
    return updated(state, update)


def fold_all(state: JobState | None, events: Iterable[Event | SampleRead]) -> JobState | None:
    for event in events:
        state = fold(state, event)
    return state


def record_decision(
    state: JobState,
    plan: OptimizePlan,
    scale_plan: ScalePlan | None,
    handled_ooms: Iterable[str],
    now: datetime,
) -> JobState:
    """Remember what the brain decided: the OOMs it addressed (never again), the plan (a
    wish repeated is not published again), when a running-stage or PS change was planned
    (cooldowns), and the ScalePlan whose result will update the resources."""
    update: dict[str, Any] = {"last_plan": plan}
    handled = set(handled_ooms)
    if handled:  # most decisions answer no OOM: the records stay as they are
        update["ooms"] = {
            key: [
                r.model_copy(update={"handled": True}) if r.event_id in handled else r for r in rs
            ]
            for key, rs in state.ooms.items()
        }
    if scale_plan is not None:
        update["pending_scale_plan"] = scale_plan
        if state.stage == Stage.RUNNING:
            update["last_running_plan_at"] = now
        if touches_role(scale_plan, PS):
            update["last_ps_change_at"] = now
    return updated(state, update)


def touches_role(plan: ScalePlan, role: str) -> bool:
    return (
        role in plan.node_group_resources
        or any(n.type == role for n in plan.launch_nodes)
        or any(n.type == role for n in plan.remove_nodes)
        or any(m.node.type == role for m in plan.migrate_nodes)
    )
