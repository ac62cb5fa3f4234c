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
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from msgspec import Struct

from schemas.cluster import PlatformCapabilities
from schemas.envelope import Event
from schemas.jobs import JobEvent, JobMeta, JobSubmitted, NodeOOM, RuntimeSample
from schemas.plans import OptimizePlan, OptimizeRequest, ScalePlan
from streams.brain.core.config_index import effective_config
from streams.brain.core.decide import JobDecision, NoDecision, decide
from streams.brain.core.folds import fold, read_config, record_decision, with_config
from streams.brain.core.memo import SampleMemo
from streams.brain.core.policy import Policy
from streams.brain.core.router import RouteError
from streams.brain.core.samples import SampleRead
from streams.brain.core.state import FINISHED, JobState, Stage, normalize_stage


@dataclass(frozen=True)
class Trigger:
    """Why a job is decided now, as of which input, and at what time."""

    reason: str
    #: the decision's time: the input's own (a replay sees the same cooldowns)
    at: datetime
    #: the input that calls for it (plan ids derive from it)
    caused_by: str
    #: the optimizer the input names (an optimize request), before any route
    optimizer: str | None = None
    #: the input gives the job a config (submission, request): its problems are told
    config_given: bool = False


class JobContext(Struct, frozen=True):
    """What the processor knows for deciding a job, besides the job's own events:
    completed jobs of its scenario (DLRover's history), the cluster's free GPUs, the
    config service's documents for it (asked only when deciding), the job's memo
    (`streams.brain.core.memo`: the fold and the decision keep and read what they derive
    from its samples there), a lockstep env's simulated time (its tick: a submission
    stamped later has not arrived yet, and waits for `arrive`), and what the env's
    platform can apply, as it published it with its capacity (None: not said).

    A struct: the processor makes one per event."""

    history: Sequence[JobState] = ()
    free_gpus: int | None = None
    service: Callable[[JobMeta], Mapping[str, Any]] | None = None
    memo: SampleMemo | None = None
    clock: datetime | None = None
    platform: PlatformCapabilities | None = None


#: a decision with nothing known beside the job (tests, the dry run's defaults)
NO_CONTEXT = JobContext()


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
    at = event.occurred_at
    if isinstance(event, SampleRead):  # most events: the same tests as below, for a sample
        if before is None or before.stage != after.stage:
            return Trigger(f"stage {after.stage}", at, event.sample.event_id)
        return _every(after, at, event.sample.event_id, policy)
    if isinstance(event, OptimizeRequest):
        cause = str(event.event_id)
        return Trigger("optimize request", at, cause, event.optimizer, config_given=True)
    if isinstance(event, JobSubmitted):
        return Trigger("job submitted", at, str(event.event_id), config_given=True)
    if isinstance(event, NodeOOM):
        # a replayed OOM folds to the same records: it must not be decided twice
        if _oom_count(after) > _oom_count(before):
            return Trigger("node out of memory", at, str(event.event_id))
        return None
    if before is None or before.stage != after.stage:
        return Trigger(f"stage {after.stage}", at, str(event.event_id))
    if isinstance(event, RuntimeSample):
        return _every(after, at, str(event.event_id), policy)
    return None


def _every(after: JobState, at: datetime, cause: str, policy: Policy) -> Trigger | None:
    """A sample that completes the stage's `sample_every` (`running_every`) samples."""
    seen = after.stage_samples
    if seen > 0:
        brain = policy.settings
        every = brain.running_every if after.stage == Stage.RUNNING else brain.sample_every
        if seen % max(every, 1) == 0:
            return Trigger(f"{seen} samples in stage {after.stage}", at, cause)
    return None


def _worth_publishing(before: JobState, decision: JobDecision) -> bool:
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
    context: JobContext = NO_CONTEXT,
) -> StepOutcome | None:
    """Fold one event of a job and decide if it calls for it; None for events that say
    nothing about a job, and the finished state unchanged (`late`) for events after the
    job's end. Decisions are made as of the event's own time, so a replay
    (restart, virtual env at any speed-up) sees the same cooldowns.
    """
    if not isinstance(event, SampleRead | JobEvent):
        return None
    if state is not None and state.status in FINISHED:
        # A finished job's state is final: a straggling sample, a node's exit or a result
        # after its end must not change what history and checkpoints keep of it, the
        # same before a checkpoint as after one (when the brain no longer holds it).
        return StepOutcome(state, late=True)
    after = fold(state, event, context.memo)
    assert after is not None  # a job event always yields a state
    clock = context.clock
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
    return _decide(after, why, policy, context)


def arrive(state: JobState, policy: Policy, context: JobContext = NO_CONTEXT) -> StepOutcome:
    """A job whose submission was read before its simulated arrival arrives now: decided
    as its submission would have been, at its submission's time (`awaiting_arrival`)."""
    after = state.model_copy(update={"awaiting_arrival": False})
    if after.status in FINISHED or policy.scheduler is not None or after.submitted_at is None:
        return StepOutcome(after)
    cause = after.last_event_id or "arrival"
    why = Trigger("job submitted", after.submitted_at, cause, config_given=True)
    return _decide(after, why, policy, context)


def _decide(after: JobState, why: Trigger, policy: Policy, context: JobContext) -> StepOutcome:
    """Decide `after` with the config it is decided with, read once: the env's default
    and the config service's documents merged under the job's own (kept out of the
    state), or the job's own."""
    seen = after
    service = context.service
    found = service(after.job) if service is not None else {}
    problems: tuple[str, ...] = ()
    if policy.job_config or found:  # decided with them, kept without them
        seen, problems = with_config(
            after, effective_config(policy.job_config, found, after.config)
        )
    elif why.config_given:  # the job's own config, as given
        _, problems = read_config(after.config)
    now = why.at
    result = decide(
        seen,
        now,
        caused_by=why.caused_by,
        optimizer=why.optimizer,
        history=context.history,
        free_gpus=context.free_gpus,
        registry=policy.registry,
        limits=policy.limits,
        memo=context.memo,
        platform=context.platform,
    )
    if isinstance(result, RouteError):
        return StepOutcome(after, why, error=result, config_errors=problems)
    if isinstance(result, NoDecision):
        return StepOutcome(after, why, config_errors=problems)
    scale = result.scale_plan  # (none while the operator has not answered the same one)
    recorded = record_decision(after, result.optimize_plan, scale, result.handled_ooms, now)
    plan = result.optimize_plan if _worth_publishing(after, result) else None
    return StepOutcome(recorded, why, plan, scale, config_errors=problems)
