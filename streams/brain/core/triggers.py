"""When the brain decides, and what one input event turns into: fold, maybe decide, record.

This is the whole per-event behaviour of the stream processor as a pure function, so a
replay of the same events from the same state yields the same states and the same plan
ids, whatever the batch boundaries were. That is what makes a restart from a checkpoint
safe: the events after the checkpoint are decided again, identically.

Deciding is the expensive part (an optimizer may fit a model), so it runs only when
something happened: a job was submitted, changed stage, ran out of memory, was asked for a
plan, or every `sample_every` runtime samples of a stage (DLRover's master asked its
Brain every 30 s, about every other sample). Which events trigger is a function of the
event and the state, never of the clock or of how events were batched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from msgspec import Struct
from pydantic import ValidationError

from schemas.env_settings import (
    MAX_TOMBSTONES,
    PRUNE_EVERY_S,
    RETENTION_AFTER_S,
    SETTING,
    TOMBSTONE_S,
    BrainSettings,
    EnvSettings,
    JobDefaults,
    problem,
)
from schemas.envelope import Event, Model
from schemas.jobs import JobEvent, JobMeta, JobSubmitted, NodeOOM, RuntimeSample
from schemas.plans import OptimizePlan, OptimizeRequest, ScalePlan
from streams.brain.core.config_index import effective_config
from streams.brain.core.decide import Decision, NoDecision, decide
from streams.brain.core.folds import fold, read_config, record_decision, with_config
from streams.brain.core.memo import SampleMemo
from streams.brain.core.optimizers import REGISTRY, Registry
from streams.brain.core.planner import Limits
from streams.brain.core.router import RouteError
from streams.brain.core.samples import SampleRead
from streams.brain.core.schedulers import get_scheduler
from streams.brain.core.state import JobState, JobStatus, Stage, normalize_stage

#: Jobs that finished are not decided for any more: no plan can help them.
FINISHED = frozenset({JobStatus.COMPLETED, JobStatus.FAILED})


@dataclass(frozen=True)
class Retention:
    """How long a finished job is kept (streams/brain/runtime/retention.py).

    `after_s` after it finished, its state is cut to a tombstone (who it was, when it
    ended) and its sample chunks are deleted; the tombstone keeps its late events ignored
    instead of starting a new job. Tombstones have a bound of their own: deleted
    `tombstone_s` later, and only the newest `max_tombstones` of a brain's partitions are
    kept; an event of a job whose tombstone is gone starts a new state, as any event of
    an unknown job does. The default `after_s` is the history optimizers' 7 days.
    """

    after_s: float = RETENTION_AFTER_S
    tombstone_s: float = TOMBSTONE_S
    max_tombstones: int = MAX_TOMBSTONES
    #: the least time between two prunes of one brain
    every_s: float = PRUNE_EVERY_S


@dataclass(frozen=True)
class SchedulerPolicy:
    """The env's cluster scheduler (streams.brain.core.schedulers): it, not the per-job
    optimizers, decides who holds which GPUs, over every arrived job of the env at once.

    It runs at the end of every lockstep tick, or (a real env, on event time) whenever
    the events' time passes the next multiple of `interval_s`, so a replay of the same
    events decides at the same instants.
    """

    name: str
    params: Model
    nodes: int
    gpus_per_node: int
    interval_s: float = 60.0


@dataclass(frozen=True)
class Policy:
    """How often the brain decides, and the limits its planner applies."""

    #: A decision every this many samples of an initial stage (stage changes always
    #: decide): the initial optimizers should see the job's first speeds soon.
    sample_every: int = 2
    #: ... and of the running stage, whose ScalePlans wait out a cooldown of minutes
    #: anyway (OOMs and requests decide at once, whatever the stage).
    running_every: int = 8
    limits: Limits | None = None
    registry: Registry = field(default_factory=lambda: REGISTRY)
    #: The env's default job config for the router (`optimizer`, `optimizer_params`): a
    #: job's own config wins key by key. This is how two virtual envs of an A/B test
    #: differ in their brains.
    job_config: Mapping[str, Any] = field(default_factory=dict)
    #: GPUs of the cluster, if known: free GPUs = these - what jobs hold or wait for, so
    #: the goodput optimizer never plans a job into GPUs another job holds or needs.
    cluster_gpus: int | None = None
    #: Decide a virtual env's simulated ticks whole (schemas.lockstep): records wait for
    #: the tick's barrier on every input partition, so what a tick's decisions saw does
    #: not depend on how the partitions' records arrived.
    lockstep: bool = False
    #: pruning of finished jobs; None: kept for as long as the env lives
    retention: Retention | None = Retention()
    #: a cluster scheduler owns the env's GPUs (None: per-job optimizers only)
    scheduler: SchedulerPolicy | None = None

    @classmethod
    def from_settings(cls, raw: BrainSettings | Mapping[str, Any] | bool | None) -> Policy:
        """The policy an env's settings (`brain` of `schemas.env_settings.EnvSettings`,
        typed or as stored) ask for. What only the registries here can judge (optimizer
        and scheduler names, their parameters) is checked here too: a ValueError names
        the setting and says why, so a misconfigured brain does not start and a bad
        change is not taken."""
        if raw is None or isinstance(raw, bool):
            return cls()
        try:
            brain = raw if isinstance(raw, BrainSettings) else BrainSettings.model_validate(raw)
        except ValidationError as exc:
            raise ValueError(problem(exc, raw, "brain")) from None
        _check_job_config(brain.job_config, REGISTRY)
        limits = None
        if brain.limits is not None:
            limits = replace(Limits(), **brain.limits.model_dump(exclude_unset=True))
        retention = None
        if brain.retention_s is not None:
            retention = Retention(
                after_s=brain.retention_s,
                tombstone_s=brain.tombstone_s,
                max_tombstones=brain.max_tombstones,
                every_s=brain.prune_every_s,
            )
        scheduler = None
        if brain.scheduler is not None:
            sched = brain.scheduler
            try:
                spec = get_scheduler(sched.name)
            except KeyError as exc:
                raise ValueError(f"{SETTING} brain.scheduler.name: {exc.args[0]}") from None
            try:
                params = spec.parse(sched.params)
            except ValidationError as exc:
                raise ValueError(problem(exc, sched.params, "brain.scheduler.params")) from None
            scheduler = SchedulerPolicy(
                spec.name, params, sched.nodes, sched.gpus_per_node, sched.interval_s
            )
        return cls(
            sample_every=brain.sample_every,
            running_every=brain.running_every,
            limits=limits,
            job_config=brain.job_config.model_dump(mode="json", exclude_unset=True),
            cluster_gpus=brain.cluster_gpus,
            lockstep=brain.lockstep,
            retention=retention,
            scheduler=scheduler,
        )

    def regroups(self, other: Policy) -> bool:
        """Whether going from this policy to `other` changes who decides the env, so a
        running brain cannot swap one for the other between two batches: a cluster
        scheduler is decided by one leader over every partition, other envs by the
        consumer group's members; lockstep holds records back until their tick."""
        return (self.scheduler is None) != (other.scheduler is None) or (
            self.lockstep != other.lockstep
        )


def _check_job_config(job_config: JobDefaults, registry: Registry) -> None:
    """`brain.job_config`: the optimizers it names exist, for stages that exist, and
    their parameters are what each optimizer takes."""
    named = job_config.optimizer
    by_stage = named if isinstance(named, dict) else {}
    stages = {s.value for s in Stage}
    for stage in by_stage:
        if stage not in stages:
            raise ValueError(
                f"{SETTING} brain.job_config.optimizer.{stage}: unknown stage; known: "
                f"{', '.join(sorted(stages))}"
            )
    chosen = [("", named)] if isinstance(named, str) else list(by_stage.items())
    for where, name in chosen:
        if name and name not in registry:
            at = f".{where}" if where else ""
            raise ValueError(
                f"{SETTING} brain.job_config.optimizer{at}: unknown optimizer {name!r}; known: "
                f"{', '.join(registry.names())}"
            )
    for name, raw in job_config.optimizer_params.items():
        spec = registry.get(name)
        if spec is None:
            raise ValueError(
                f"{SETTING} brain.job_config.optimizer_params.{name}: unknown optimizer; known: "
                f"{', '.join(registry.names())}"
            )
        try:
            spec.parse_params(raw)
        except ValidationError as exc:
            raise ValueError(
                problem(exc, raw, f"brain.job_config.optimizer_params.{name}")
            ) from None


def check_env_settings(settings: EnvSettings) -> None:
    """The brain's check of an env's settings, found through the entry point group
    `dlrover_events.envs.env_settings` (the CLI and the registry check with it before they
    store anything)."""
    Policy.from_settings(settings.brain)


@dataclass(frozen=True)
class Trigger:
    reason: str
    optimizer: str | None = None


class StepOutcome(Struct, frozen=True):
    """What one event made of its job: the job's new state and what to publish; `error`
    (no decision: unknown optimizer or stage, invalid parameters) and `config_errors`
    (config values the decision went on without) are the user's to fix, never a reason
    to stop.

    A struct: every event makes one, and a frozen dataclass cost ten times as much to
    make (0.76 against 0.08 us)."""

    state: JobState
    trigger: Trigger | None = None
    optimize_plan: OptimizePlan | None = None
    scale_plan: ScalePlan | None = None
    error: RouteError | None = None
    #: what could not be read of the config the decision was made with (`read_config`):
    #: told whenever a config is given (submission, request) or merged for a decision
    config_errors: tuple[str, ...] = ()
    #: the event came after its job finished: the state is the finished one, unchanged
    late: bool = False

    @property
    def plans(self) -> list[OptimizePlan | ScalePlan]:
        out: list[OptimizePlan | ScalePlan] = []
        if self.optimize_plan is not None:
            out.append(self.optimize_plan)
        if self.scale_plan is not None:
            out.append(self.scale_plan)
        return out


def _oom_count(state: JobState | None) -> int:
    return 0 if state is None else sum(len(records) for records in state.ooms.values())


def trigger(
    before: JobState | None, after: JobState, event: Event | SampleRead, policy: Policy
) -> Trigger | None:
    """Whether `event`, folded from `before` into `after`, calls for a decision."""
    if after.status in FINISHED:
        return None
    if isinstance(event, OptimizeRequest):
        return Trigger("optimize request", event.optimizer)
    if isinstance(event, JobSubmitted):
        return Trigger("job submitted")
    if isinstance(event, NodeOOM):
        # a replayed OOM folds to the same records: it must not be decided twice
        return Trigger("node out of memory") if _oom_count(after) > _oom_count(before) else None
    if before is None or before.stage != after.stage:
        return Trigger(f"stage {after.stage}")
    if isinstance(event, SampleRead | RuntimeSample) and after.stage_samples > 0:
        running = after.stage == Stage.RUNNING
        every = policy.running_every if running else policy.sample_every
        if after.stage_samples % max(every, 1) == 0:
            return Trigger(f"{after.stage_samples} samples in stage {after.stage}")
    return None


def _worth_publishing(before: JobState, decision: Decision) -> bool:
    """An OptimizePlan is news when it leads to a ScalePlan, answers an OOM, or wants
    something else than the last one; the same wish every few samples (held back by a
    cooldown) would only flood the topic."""
    if decision.scale_plan is not None or decision.handled_ooms:
        return True
    last = before.last_plan
    return last is None or last.resource != decision.optimize_plan.resource


def step(
    state: JobState | None,
    event: Event | SampleRead,
    policy: Policy,
    history: Sequence[JobState] = (),
    free_gpus: int | None = None,
    service: Callable[[JobMeta], Mapping[str, Any]] | None = None,
    memo: SampleMemo | None = None,
    clock: datetime | None = None,
) -> StepOutcome | None:
    """Fold one event of a job and decide if it calls for it; None for events that say
    nothing about a job, and the finished state unchanged (`late`) for events after the
    job's end. Decisions are made as of the event's own time, so a replay
    (restart, virtual env at any speed-up) sees the same cooldowns.

    `service` gives the config service's documents for a job; asked only when deciding.
    `memo` is the job's (`streams.brain.core.memo`), if it has one: the fold and the decision
    keep and read what they derive from the job's samples there. `clock` is a lockstep
    env's simulated time (its tick): a submission stamped later has not arrived yet, and
    waits for `arrive` instead of being decided now.
    """
    if not isinstance(event, SampleRead | JobEvent):
        return None
    if state is not None and state.status in FINISHED:
        # A finished job's state is final: a straggling sample, a node's exit or a result
        # after its end must not change what history and checkpoints keep of it, the
        # same before a checkpoint as after one (when the brain no longer holds it).
        return StepOutcome(state, late=True)
    after = fold(state, event, memo)
    assert after is not None  # a job event always yields a state
    if clock is not None and isinstance(event, JobSubmitted) and event.occurred_at > clock:
        after = after.model_copy(update={"awaiting_arrival": True})
    if after.awaiting_arrival:
        # (a lockstep env's submission read before its tick: `arrive` decides it then)
        return StepOutcome(after)
    why = trigger(state, after, event, policy)
    if why is None or policy.scheduler is not None:
        # a cluster scheduler owns the env's GPUs: per-job optimizers decide nothing there
        return StepOutcome(after)
    if isinstance(event, OptimizeRequest) and normalize_stage(event.stage) is None:
        known = ", ".join(s.value for s in Stage)
        unknown = f"unknown stage {event.stage!r}; known: {known}"  # (the stage stays)
        return StepOutcome(after, why, error=RouteError("unknown_stage", unknown))
    config_given = isinstance(event, JobSubmitted | OptimizeRequest)
    return _decide(
        after,
        why,
        policy,
        event.occurred_at,
        str(event.event_id),
        config_given,
        history,
        free_gpus,
        service,
        memo,
    )


def arrive(
    state: JobState,
    policy: Policy,
    history: Sequence[JobState] = (),
    free_gpus: int | None = None,
    service: Callable[[JobMeta], Mapping[str, Any]] | None = None,
    memo: SampleMemo | None = None,
) -> StepOutcome:
    """A job whose submission was read before its simulated arrival arrives now: decided
    as its submission would have been, at its submission's time (`awaiting_arrival`)."""
    after = state.model_copy(update={"awaiting_arrival": False})
    if after.status in FINISHED or policy.scheduler is not None or after.submitted_at is None:
        return StepOutcome(after)
    cause = after.last_event_id or "arrival"
    why = Trigger("job submitted")
    return _decide(
        after, why, policy, after.submitted_at, cause, True, history, free_gpus, service, memo
    )


def _decide(
    after: JobState,
    why: Trigger,
    policy: Policy,
    now: datetime,
    caused_by: str,
    config_given: bool,
    history: Sequence[JobState],
    free_gpus: int | None,
    service: Callable[[JobMeta], Mapping[str, Any]] | None,
    memo: SampleMemo | None,
) -> StepOutcome:
    seen = after
    found = service(after.job) if service is not None else {}
    problems: tuple[str, ...] = ()
    if policy.job_config or found:  # decided with them, kept without them
        seen = with_config(after, effective_config(policy.job_config, found, after.config))
        _, problems = read_config(seen.config)
    elif config_given:  # a config given
        _, problems = read_config(after.config)
    result = decide(
        seen,
        now,
        caused_by=caused_by,
        optimizer=why.optimizer,
        history=history,
        free_gpus=free_gpus,
        registry=policy.registry,
        limits=policy.limits,
        memo=memo,
    )
    if isinstance(result, RouteError):
        return StepOutcome(after, why, error=result, config_errors=problems)
    if isinstance(result, NoDecision):
        return StepOutcome(after, why, config_errors=problems)
    scale = result.scale_plan  # (none while the operator has not answered the same one)
    recorded = record_decision(after, result.optimize_plan, scale, result.handled_ooms, now)
    plan = result.optimize_plan if _worth_publishing(after, result) else None
    return StepOutcome(recorded, why, plan, scale, config_errors=problems)
