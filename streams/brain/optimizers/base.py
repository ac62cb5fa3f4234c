"""The optimizer contract and the registry that names optimizers.

An optimizer is a pure function of what the brain knows (the job's state, the history of
completed jobs, the cluster's free GPUs, the time) and its typed parameters, returning a
Proposal (the content of an OptimizePlan) or None when it has nothing to change. The
registry is explicit, not discovered by import side effects alone, so that a user adds an
optimizer with one decorator and `names()`/`describe()` tell what is available.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from schemas.envelope import Model
from schemas.plans import ResourcePlan
from streams.brain.state import JobState, JobStatus, Sample


@dataclass(frozen=True)
class OptimizeContext:
    """Inputs of every optimizer; history and free GPUs are optional knowledge."""

    state: JobState
    now: datetime
    history: Sequence[JobState] = ()
    free_gpus: int | None = None

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


class NoParams(Model):
    """For optimizers without parameters: any given parameter is a mistake."""


P = TypeVar("P", bound=BaseModel)
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class PerSample(Generic[K, V]):
    """`derive(sample, args)` made once per sample and `args`, for optimizers that read
    every sample of a job at every decision: a job's samples never change once folded,
    and from one decision to its next only the few samples folded in between are new.

    Keyed by the sample's id, one table per `args`, with the sample held so that its id
    is not reused while in here (`state.sample_memo` does the same; one table per `args`
    looks a job's samples up in one pass at C speed instead of one call per sample).
    `derive` must be pure and depend on nothing but the sample and `args`.
    """

    def __init__(self, derive: Callable[[Sample, K], V], limit: int = 200_000) -> None:
        self._derive = derive
        self._limit = limit
        self._tables: dict[K, dict[int, tuple[Sample, V]]] = {}
        self._size = 0

    def hits(self, samples: Sequence[Sample], args: K) -> list[tuple[Sample, V]]:
        """Each sample with what `derive` makes of it, in the order of `samples`."""
        table = self._tables.get(args)
        if table is None:
            table = self._tables[args] = {}
        found: list[tuple[Sample, V] | None] = list(map(table.get, map(id, samples)))
        if None in found:
            for i, hit in enumerate(found):
                if hit is None:
                    found[i] = self._add(table, samples[i], args)
        return found  # type: ignore[return-value]  # no None left

    def of(self, sample: Sample, args: K) -> V:
        """What `derive` makes of one sample, for readers of a few samples only."""
        table = self._tables.get(args)
        if table is None:
            table = self._tables[args] = {}
        hit = table.get(id(sample))
        return (hit if hit is not None else self._add(table, sample, args))[1]

    def _add(self, table: dict[int, tuple[Sample, V]], sample: Sample, args: K) -> tuple[Sample, V]:
        hit = table.get(id(sample))  # the same sample twice in one list
        if hit is not None:
            return hit
        if self._size >= self._limit:  # jobs come and go; a miss costs microseconds
            table.clear()
            self._tables = {args: table}
            self._size = 0
        hit = table[id(sample)] = (sample, self._derive(sample, args))
        self._size += 1
        return hit

    def clear(self) -> None:
        self._tables.clear()
        self._size = 0

    def __len__(self) -> int:
        return self._size


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
        return replace(proposal, optimizer=self.name)


@dataclass
class Registry:
    """Optimizers by name. `copy()` gives a registry a user may extend without changing
    the brain's default one."""

    specs: dict[str, OptimizerSpec] = field(default_factory=dict)

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

    def add(self, spec: OptimizerSpec) -> None:
        if not spec.name or spec.name != spec.name.strip():
            raise ValueError(f"optimizer name {spec.name!r} must be non-empty, no padding")
        if spec.name in self.specs:
            raise ValueError(f"optimizer {spec.name!r} is already registered")
        self.specs[spec.name] = spec

    def get(self, name: str) -> OptimizerSpec | None:
        return self.specs.get(name)

    def names(self) -> list[str]:
        return sorted(self.specs)

    def describe(self) -> list[tuple[str, str]]:
        return [(name, self.specs[name].description) for name in self.names()]

    def copy(self) -> Registry:
        return Registry(dict(self.specs))

    def __contains__(self, name: object) -> bool:
        return name in self.specs

    def __iter__(self) -> Iterator[OptimizerSpec]:
        return iter(self.specs[name] for name in self.names())


#: The brain's registry: the built-in optimizers, and any a user registers on it.
REGISTRY = Registry()
register = REGISTRY.register
