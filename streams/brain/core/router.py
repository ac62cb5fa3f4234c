"""Which optimizers answer a job, from its stage, its condition and its config.

Routing never raises: a stage or an optimizer name it cannot route is answered with a
RouteError the processor publishes as an error event, because one job's bad config must
not stop the brain of every other job.

Precedence: an optimizer named for this request (dry run, OptimizeRequest) > an open OOM
(host memory, then GPU memory) > a straggler > the optimizer named by the job's config >
the stage's default route. OOMs come before the job's config on purpose: a job that names
`goodput` still needs its OOMs answered.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from schemas.jobs import OOMKind
from streams.brain.core.memo import SampleMemo
from streams.brain.core.optimizers import REGISTRY, Registry
from streams.brain.core.optimizers.gpu import StragglerParams, find_stragglers
from streams.brain.core.state import PS, JobState, Stage, parse_node_key

#: Steps run in order and their proposals are merged; within a step, the first optimizer
#: that proposes something wins (the others are its fallbacks).
RouteSteps = tuple[tuple[str, ...], ...]


class Condition(StrEnum):
    HOST_OOM = "host-oom"
    GPU_OOM = "gpu-oom"
    STRAGGLER = "straggler"
    HEALTHY = "healthy"


ErrorCode = Literal[
    "unknown_stage",
    "unknown_optimizer",
    "invalid_config",
    "invalid_params",
    "optimizer_failed",
    "planner_failed",
]


@dataclass(frozen=True)
class RouteError:
    code: ErrorCode
    message: str


@dataclass(frozen=True)
class Route:
    stage: Stage
    condition: Condition
    steps: RouteSteps
    params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def optimizers(self) -> list[str]:
        return [name for step in self.steps for name in step]


def is_ps_job(state: JobState) -> bool:
    return state.distribution == "ps" or PS in state.roles


def stage_route(stage: Stage, ps_job: bool) -> RouteSteps:
    """DLRover's routing table; all-reduce jobs get the GPU-aware optimizers instead of the
    PS-centred ones."""
    match stage:
        case Stage.CREATE:
            return (
                (("worker-create",), ("ps-create", "ps-cold-create"))
                if ps_job
                else (("worker-create",),)
            )
        case Stage.PS_INITIAL:
            return (("ps-init-adjust",),)
        case Stage.WORKER_INITIAL:
            return (("worker-resource",),) if ps_job else (("goodput", "worker-resource"),)
        case Stage.RUNNING:
            return (("hot-ps", "ps-util"),) if ps_job else (("goodput", "worker-resource"),)


def oom_route(state: JobState, stage: Stage) -> RouteSteps:
    """The OOM variant of the stage's optimizers, by the roles that ran out of memory."""
    steps: list[tuple[str, ...]] = []
    roles = {
        parsed[0]
        for key in state.unhandled_ooms(OOMKind.HOST_MEMORY)
        if (parsed := parse_node_key(key)) is not None
    }
    ps_job = is_ps_job(state)
    if PS in roles and ps_job:
        steps.append(("ps-oom",))
    others = roles - {PS} if ps_job else roles
    if others:
        steps.append(("worker-create-oom",) if stage == Stage.CREATE else ("host-oom",))
    if state.unhandled_ooms(OOMKind.GPU_MEMORY):
        steps.append(("gpu-oom",))
    return tuple(steps)


#: The straggler detector's defaults, validated once rather than at every decision.
_STRAGGLER = StragglerParams()


def condition(state: JobState, stage: Stage, memo: SampleMemo | None = None) -> Condition:
    # the kinds of OOM not answered yet, in one pass over the job's OOM records
    open_ = {r.kind for records in state.ooms.values() for r in records if not r.handled}
    if OOMKind.HOST_MEMORY in open_:
        return Condition.HOST_OOM
    if OOMKind.GPU_MEMORY in open_:
        return Condition.GPU_OOM
    if stage == Stage.RUNNING and find_stragglers(state, _STRAGGLER, memo):
        return Condition.STRAGGLER
    return Condition.HEALTHY


def _config_optimizer(config: Mapping[str, Any], stage: Stage) -> str | RouteError | None:
    """The optimizer the job's config names: one name, or one per stage."""
    named = config.get("optimizer")
    if named is None or isinstance(named, str):
        return named or None
    if isinstance(named, Mapping):
        chosen = named.get(stage.value)
        if chosen is None or isinstance(chosen, str):
            return chosen or None
    return RouteError(
        "invalid_config",
        f"config optimizer must be a name or a mapping of stage to name, got {named!r}",
    )


def _config_params(config: Mapping[str, Any]) -> Mapping[str, Mapping[str, Any]] | RouteError:
    params = config.get("optimizer_params", {})
    if isinstance(params, Mapping) and all(
        isinstance(k, str) and isinstance(v, Mapping) for k, v in params.items()
    ):
        return params
    return RouteError(
        "invalid_config",
        f"config optimizer_params must map optimizer names to parameter objects, got {params!r}",
    )


def _unknown(name: str, registry: Registry) -> RouteError:
    return RouteError(
        "unknown_optimizer",
        f"unknown optimizer {name!r}; known: {', '.join(registry.names())}",
    )


def route(
    state: JobState,
    optimizer: str | None = None,
    registry: Registry = REGISTRY,
    memo: SampleMemo | None = None,
) -> Route | RouteError:
    """The optimizers to run for this job now, or why there are none to run; `memo` is
    the job's (`streams.brain.core.memo`), if it has one."""
    try:
        return _route(state, optimizer, registry, memo)
    except Exception as exc:  # a user-registered detector must not take the brain down
        return RouteError("invalid_config", f"routing failed: {type(exc).__name__}: {exc}")


def _route(
    state: JobState, optimizer: str | None, registry: Registry, memo: SampleMemo | None
) -> Route | RouteError:
    stage = state.stage
    params = _config_params(state.config)
    if isinstance(params, RouteError):
        return params
    now = condition(state, stage, memo)
    if optimizer is not None:
        if optimizer not in registry:
            return _unknown(optimizer, registry)
        return Route(stage, now, ((optimizer,),), params)
    if now in (Condition.HOST_OOM, Condition.GPU_OOM):
        steps = oom_route(state, stage)
    elif now == Condition.STRAGGLER:
        steps = (("straggler",),)
    else:
        named = _config_optimizer(state.config, stage)
        if isinstance(named, RouteError):
            return named
        steps = ((named,),) if named is not None else stage_route(stage, is_ps_job(state))
    for step in steps:
        for name in step:
            if name not in registry:
                return _unknown(name, registry)
    return Route(stage, now, steps, params)
