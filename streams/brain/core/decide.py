"""One decision of the brain for one job: router -> optimizers -> planner, as a pure
function, shared by the stream processor and the dry run so both decide alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from pydantic import ValidationError

from schemas.cluster import PlatformCapabilities
from schemas.env_settings import LimitSettings
from schemas.plans import NodeGroupResource, NodeResource, OptimizePlan, ResourcePlan, ScalePlan
from streams.brain.core.memo import SampleMemo
from streams.brain.core.optimizers import REGISTRY, OptimizeContext, Proposal, Registry
from streams.brain.core.planner import DEFAULT_LIMITS, plan_envelope, plan_id, plan_scale
from streams.brain.core.router import Route, RouteError, route
from streams.brain.core.state import JobState


@dataclass(frozen=True)
class JobDecision:
    """What the optimizers of one job decided, and the ScalePlan the planner made of it
    (None: held back, `notes` say why)."""

    optimize_plan: OptimizePlan
    scale_plan: ScalePlan | None
    handled_ooms: tuple[str, ...]
    #: the optimizers whose proposals the plan merges, in order (the plan's `optimizer`
    #: label is them joined with "+", for people: the brain never reads it back)
    optimizers: tuple[str, ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class NoDecision:
    """The optimizers ran and none of them wants a change."""

    stage: str
    optimizers: tuple[str, ...]
    reason: str


#: What a role or node has before any proposal sets something; only ever copied.
_UNSET = NodeResource()


def _overlay(base: NodeResource, more: NodeResource) -> NodeResource:
    # `__dict__` is `model_dump()` of a flat model, without the serializer's cost; the
    # copy keeps values as the optimizer gave them (validating would make ints floats)
    update = {k: v for k, v in more.__dict__.items() if v not in (0, "")}
    if not update and base is _UNSET:
        return NodeResource()  # what copying the defaults gives, fields set none
    return base.model_copy(update=update)


@dataclass(frozen=True)
class Merged:
    """The proposals of a route's steps as one: what an OptimizePlan says, and which
    optimizers said it."""

    reason: str
    resource: ResourcePlan
    handled_ooms: tuple[str, ...]
    optimizers: tuple[str, ...]

    @property
    def label(self) -> str:
        """The plan's `optimizer`: the names joined with "+" (for people and tools)."""
        return "+".join(self.optimizers)


def merge(proposals: Sequence[Proposal]) -> Merged:
    """One plan from the proposals of several steps (create: workers and PS); a later
    step's non-zero values win where two set the same thing."""
    groups: dict[str, NodeGroupResource] = {}
    nodes: dict[str, NodeResource] = {}
    training: dict[str, object] = {}
    for proposal in proposals:
        for role, group in proposal.resource.node_group_resources.items():
            old = groups.get(role)
            groups[role] = NodeGroupResource(
                count=group.count or (0 if old is None else old.count),
                node_resource=_overlay(
                    _UNSET if old is None else old.node_resource, group.node_resource
                ),
            )
        for key, res in proposal.resource.node_resources.items():
            nodes[key] = _overlay(nodes.get(key, _UNSET), res)
        training.update(proposal.resource.training)
    return Merged(
        reason="; ".join(f"{p.optimizer}: {p.reason}" for p in proposals),
        resource=ResourcePlan(node_group_resources=groups, node_resources=nodes, training=training),
        handled_ooms=tuple(dict.fromkeys(i for p in proposals for i in p.handled_ooms)),
        optimizers=tuple(p.optimizer for p in proposals),
    )


def one_line(exc: Exception) -> str:
    """An exception as one line (a pydantic error lists every field on lines of its own):
    what a dead letter and the dry run's `error:` line can show."""
    first = str(exc).strip().splitlines()
    text = first[0] if first else ""
    if isinstance(exc, ValidationError) and exc.errors():
        err = exc.errors()[0]
        where = ".".join(str(part) for part in err["loc"]) or exc.title
        text = f"{exc.title}.{where}: {err['msg']}"
    return f"{type(exc).__name__}: {text}"


def run_route(
    ctx: OptimizeContext, chosen: Route, registry: Registry
) -> list[Proposal] | RouteError:
    proposals: list[Proposal] = []
    for step in chosen.steps:
        for name in step:
            spec = registry.get(name)
            if spec is None:
                return RouteError("unknown_optimizer", f"unknown optimizer {name!r}")
            try:
                params = spec.parse_params(chosen.params.get(name))
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(part) for part in first["loc"]) or "params"
                return RouteError(
                    "invalid_params", f"optimizer {name!r} parameter {where}: {first['msg']}"
                )
            try:
                proposal = spec.run(ctx, params)
            except Exception as exc:  # one faulty optimizer must not stop the brain
                return RouteError("optimizer_failed", f"optimizer {name!r} failed: {one_line(exc)}")
            if proposal is not None:
                proposals.append(proposal)
                break
    return proposals


def decide(
    state: JobState,
    now: datetime,
    *,
    caused_by: str | None = None,
    optimizer: str | None = None,
    history: Sequence[JobState] = (),
    free_gpus: int | None = None,
    registry: Registry = REGISTRY,
    limits: LimitSettings = DEFAULT_LIMITS,
    memo: SampleMemo | None = None,
    platform: PlatformCapabilities | None = None,
) -> JobDecision | NoDecision | RouteError:
    """What the brain does about `state` now, caused by the input event `caused_by`
    (default: the last event folded into the state); `memo` is the job's, if it has one
    (`streams.brain.core.memo`); `platform`: what the env's platform can apply (None:
    not said), which the ScalePlan keeps to."""
    chosen = route(state, optimizer, registry, memo)
    if isinstance(chosen, RouteError):
        return chosen
    ctx = OptimizeContext(state=state, now=now, history=history, free_gpus=free_gpus, memo=memo)
    proposals = run_route(ctx, chosen, registry)
    if isinstance(proposals, RouteError):
        return proposals
    if not proposals:
        return NoDecision(
            stage=chosen.stage.value,
            optimizers=tuple(chosen.optimizers),
            reason=f"{', '.join(chosen.optimizers)} proposed no change",
        )
    merged = merge(proposals)
    cause = caused_by or state.last_event_id
    optimize_id = plan_id(state.job.uuid, cause or "initial", "optimize")
    plan = OptimizePlan(
        **plan_envelope(state, optimize_id, now),
        stage=chosen.stage.value,
        optimizer=merged.label,
        reason=merged.reason,
        resource=merged.resource,
        caused_by=cause,
    )
    try:
        planned = plan_scale(
            state, plan, now, limits, optimizers=merged.optimizers, platform=platform
        )
    except Exception as exc:  # a state no plan can be made of must not stop the brain
        return RouteError("planner_failed", f"planning {merged.label} failed: {one_line(exc)}")
    return JobDecision(
        optimize_plan=plan,
        scale_plan=planned.scale_plan,
        handled_ooms=merged.handled_ooms,
        optimizers=merged.optimizers,
        notes=planned.notes,
    )
