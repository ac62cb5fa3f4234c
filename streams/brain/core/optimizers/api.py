"""The per-job optimizer extension point: what an optimizer is given, what it answers,
how a registry names it, and the errors of naming one.

An optimizer is a pure function of what the brain knows (the job's state, the history of
completed jobs, the cluster's free GPUs, the time) and its typed parameters, returning a
Proposal (the content of an OptimizePlan) or None when it has nothing to change. The
optimizers live beside this module (`dlrover.py`, `gpu.py`) and are named in the brain's
registry (`__init__.py`); `names()`/`describe()` tell what a registry holds.

At decision time an optimizer's failures are not exceptions: an unknown name, bad
parameters or an optimizer that raises become the router's `RouteError` (published, the
brain goes on). The errors here are those of building a registry and of looking a name up
where a caller wants to refuse it at once (checking an env's settings).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Self, TypeVar

from pydantic import BaseModel

from dlrover_events.registry import Registry as HouseRegistry
from schemas.bounds import MAX_BYTES, MAX_CPU, MAX_GPUS, MAX_REPLICAS
from schemas.envelope import Model
from schemas.plans import NodeGroupResource, NodeResource, ResourcePlan
from streams.brain.core.memo import SampleMemo
from streams.brain.core.state import JobState, JobStatus


class OptimizerError(Exception):
    """A registry cannot take or find an optimizer: the caller's mistake, in one line."""


class UnknownOptimizer(OptimizerError, KeyError):
    """A name no optimizer is registered under (a KeyError, as a mapping's lookup is)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class OptimizerNameError(OptimizerError, ValueError):
    """A name a registry refuses: empty, padded, taken, or the brain's read-only registry."""


@dataclass(frozen=True)
class OptimizeContext:
    """Inputs of every optimizer; history and free GPUs are optional knowledge. `memo`
    is the job's (`streams.brain.core.memo`): what an optimizer derives from one sample, it
    may derive through it, once per sample (none: afresh)."""

    state: JobState
    now: datetime
    history: Sequence[JobState] = ()
    free_gpus: int | None = None
    memo: SampleMemo | None = None

    def scenario_history(self, days: float) -> list[JobState]:
        """Completed jobs of the same scenario in the last `days`: DLRover's history.

        A job without a scenario has no history: unrelated jobs must not size each other.
        """
        scenario = self.state.job.scenario
        if not scenario:
            return []
        since = self.now - timedelta(days=days)
        return [
            job
            for job in self.history
            if job.job.scenario == scenario
            and job.job.uuid != self.state.job.uuid
            and job.status == JobStatus.COMPLETED
            and job.completed_at is not None
            and since <= job.completed_at <= self.now
        ]


@dataclass(frozen=True)
class Proposal:
    """What one optimizer wants, why, and which OOM events it answers."""

    reason: str
    resource: ResourcePlan
    handled_ooms: tuple[str, ...] = ()
    optimizer: str = ""


def node_resource(
    cpu: float = 0, memory: int = 0, gpu_num: int = 0, gpu_memory: int = 0
) -> NodeResource:
    """A NodeResource within the contract's bounds. An optimizer's arithmetic on bounded
    inputs (x 1.2, + 8 GiB, a user's factor) may step past them, which would fail the
    plan's validation instead of proposing the most a plan may ask; the planner narrows
    it to the cluster's limits anyway."""
    return NodeResource(
        cpu=min(cpu, MAX_CPU),
        memory=min(memory, MAX_BYTES),
        gpu_num=min(gpu_num, MAX_GPUS),
        gpu_memory=min(gpu_memory, MAX_BYTES),
    )


def group_plan(role: str, count: int = 0, cpu: float = 0, memory: int = 0) -> ResourcePlan:
    """One role's group (0: unchanged), within the contract's bounds."""
    resource = node_resource(cpu=cpu, memory=memory)
    return ResourcePlan(
        node_group_resources={
            role: NodeGroupResource(count=min(count, MAX_REPLICAS), node_resource=resource)
        }
    )


class NoParams(Model):
    """For optimizers without parameters: any given parameter is a mistake."""


P = TypeVar("P", bound=BaseModel)
OptimizerFn = Callable[[OptimizeContext, Any], Proposal | None]


@dataclass(frozen=True)
class OptimizerSpec:
    name: str
    description: str
    params: type[BaseModel]
    fn: OptimizerFn

    def parse_params(self, raw: Mapping[str, Any] | None) -> BaseModel:
        """Typed parameters; raises pydantic's ValidationError on a bad value."""
        return self.params.model_validate(dict(raw or {}))

    def run(self, ctx: OptimizeContext, params: BaseModel) -> Proposal | None:
        proposal = self.fn(ctx, params)
        if proposal is None or proposal.resource.is_empty():
            return None
        if proposal.__class__ is Proposal:  # what `replace` makes, without its field walk
            return Proposal(proposal.reason, proposal.resource, proposal.handled_ooms, self.name)
        return replace(proposal, optimizer=self.name)


class Registry(HouseRegistry[OptimizerSpec]):
    """Optimizers by name (the house's registry: dlrover_events.registry). `Registry.of(...)`
    makes a read-only one (the brain's); `copy()` gives a registry a user may extend with
    `register` without changing the brain's."""

    @classmethod
    def of(cls, *specs: OptimizerSpec) -> Self:  # type: ignore[override]
        """A read-only registry of `specs` (an OptimizerNameError on a bad or taken name)."""
        return cls(
            "optimizer", specs, unknown=UnknownOptimizer, taken=OptimizerNameError, read_only=True
        )

    def register(
        self, name: str, description: str, params: type[P]
    ) -> Callable[
        [Callable[[OptimizeContext, P], Proposal | None]],
        Callable[[OptimizeContext, P], Proposal | None],
    ]:
        def decorate(
            fn: Callable[[OptimizeContext, P], Proposal | None],
        ) -> Callable[[OptimizeContext, P], Proposal | None]:
            self.add(OptimizerSpec(name=name, description=description, params=params, fn=fn))
            return fn

        return decorate

    def describe(self) -> list[tuple[str, str]]:
        return [(name, self[name].description) for name in self.names()]
