"""An env's brain settings as the core decides with them.

The settings are `schemas.env_settings.BrainSettings` (with `LimitSettings` and
`SchedulerSettings` in it): one declaration, read by the CLI, the registry and the brain.
A `Policy` is those settings checked against what only the registries here can judge
(optimizer and scheduler names, their parameters), with what is parsed of them made once
per settings version instead of once per decision: the planner's limits with their
defaults filled in, the env's default job config as a plain mapping, the scheduler's
typed parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from schemas.env_settings import (
    SETTING,
    BrainSettings,
    EnvSettings,
    JobDefaults,
    LimitSettings,
    SchedulerSettings,
    problem,
)
from schemas.envelope import Model
from streams.brain.core.optimizers import REGISTRY, Registry
from streams.brain.core.planner import DEFAULT_LIMITS
from streams.brain.core.schedulers.api import SchedulerSpec
from streams.brain.core.schedulers.registry import get_scheduler
from streams.brain.core.state import Stage


@dataclass(frozen=True, slots=True)
class Policy:
    """How the brain of one env decides: its settings, and what is derived from them.

    Make one with `from_settings` (checks the names and parameters the settings give);
    `Policy(settings)` trusts them to be checked already."""

    settings: BrainSettings = field(default_factory=BrainSettings)
    registry: Registry = field(default_factory=lambda: REGISTRY, compare=False)
    #: `settings.limits`, or the defaults of every limit
    limits: LimitSettings = field(init=False)
    #: The env's default job config for the router (`optimizer`, `optimizer_params`): a
    #: job's own config wins key by key. This is how two virtual envs of an A/B test
    #: differ in their brains.
    job_config: Mapping[str, Any] = field(init=False)
    #: a cluster scheduler owns the env's GPUs (None: per-job optimizers only)
    scheduler: SchedulerSettings | None = field(init=False)
    #: ... the registered scheduler it names, and its parameters as that one reads them
    scheduler_spec: SchedulerSpec | None = field(init=False, compare=False)
    scheduler_params: Model | None = field(init=False)

    def __post_init__(self) -> None:
        brain = self.settings
        set_ = object.__setattr__  # (frozen: derived once, here)
        set_(self, "limits", brain.limits if brain.limits is not None else DEFAULT_LIMITS)
        set_(self, "job_config", brain.job_config.model_dump(mode="json", exclude_unset=True))
        set_(self, "scheduler", brain.scheduler)
        spec = params = None
        if brain.scheduler is not None:
            spec = get_scheduler(brain.scheduler.name)
            params = spec.parse(brain.scheduler.params)
        set_(self, "scheduler_spec", spec)
        set_(self, "scheduler_params", params)

    @classmethod
    def from_settings(
        cls, raw: BrainSettings | Mapping[str, Any] | bool | None, registry: Registry = REGISTRY
    ) -> Policy:
        """The policy an env's settings (`brain` of `schemas.env_settings.EnvSettings`,
        typed or as stored) ask for. A ValueError names the setting and says why, so a
        misconfigured brain does not start and a bad change is not taken."""
        if raw is None or isinstance(raw, bool):
            return cls(registry=registry)
        try:
            brain = raw if isinstance(raw, BrainSettings) else BrainSettings.model_validate(raw)
        except ValidationError as exc:
            raise ValueError(problem(exc, raw, "brain")) from None
        _check_job_config(brain.job_config, registry)
        if brain.scheduler is not None:
            sched = brain.scheduler
            try:
                spec = get_scheduler(sched.name)
            except KeyError as exc:
                raise ValueError(f"{SETTING} brain.scheduler.name: {exc.args[0]}") from None
            try:
                spec.parse(sched.params)
            except ValidationError as exc:
                raise ValueError(problem(exc, sched.params, "brain.scheduler.params")) from None
        return cls(brain, registry)

    def regroups(self, other: Policy) -> bool:
        """Whether going from this policy to `other` changes who decides the env, so a
        running brain cannot swap one for the other between two batches: a cluster
        scheduler is decided by one leader over every partition, other envs by the
        consumer group's members; lockstep holds records back until their tick."""
        return (self.scheduler is None) != (other.scheduler is None) or (
            self.settings.lockstep != other.settings.lockstep
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
    `dlrover_events.env_settings` (the CLI and the registry check with it before they
    store anything)."""
    Policy.from_settings(settings.brain)


__all__ = ["Policy", "check_env_settings"]
