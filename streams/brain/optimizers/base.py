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
from operator import is_
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


class SampleWindow(Generic[K, V]):
    """`derive(sample, args)` for each of a job's samples, made once per sample: goodput
    reads all 60 samples of a job at every decision, and a sample never changes.

    Kept per job and `args`: the job's samples at its last call and what was derived of
    them. Folds append a job's samples and drop its oldest, so the next window is the
    last one less a few at the front and plus a few at the end, by identity: only those
    are derived, and the rest is a slice of the last values, with no sample looked up
    (a table of samples by id costs a lookup per sample at every decision, mostly out of
    the CPU's caches: 60 lookups took 7 us in a table of 6,000 samples, 39 us in one of
    200,000). A window that does not continue the last one takes what it shares with it
    by identity. `derive` must be pure and depend on nothing but the sample and `args`.
    """

    def __init__(self, derive: Callable[[Sample, K], V], limit: int = 4096) -> None:
        self._derive = derive
        self._limit = limit
        #: least recently used first; the samples held, so their ids stay theirs
        self._last: dict[tuple[str, K], tuple[tuple[Sample, ...], list[V]]] = {}

    def values(self, job: str, samples: Sequence[Sample], args: K) -> list[V]:
        """What `derive` makes of each of the job's `samples`, in their order."""
        key = (job, args)
        last = self._last.pop(key, None)
        now = tuple(samples)
        found = None if last is None else _continued(last, now)
        if found is None:
            found = self._anew(last, now, args)
        elif len(found) < len(now):
            derive = self._derive
            found.extend([derive(s, args) for s in now[len(found) :]])
        if len(self._last) >= self._limit:
            del self._last[next(iter(self._last))]
        self._last[key] = (now, found)
        return list(found)  # the caller's own

    def _anew(
        self, last: tuple[tuple[Sample, ...], list[V]] | None, now: tuple[Sample, ...], args: K
    ) -> list[V]:
        known = {} if last is None else {id(s): v for s, v in zip(*last, strict=True)}
        derive = self._derive
        found: list[V] = []
        for s in now:
            value = known.get(id(s), _NONE)
            found.append(derive(s, args) if value is _NONE else value)  # type: ignore[arg-type]
        return found

    def clear(self) -> None:
        self._last.clear()

    def __len__(self) -> int:
        return len(self._last)


_NONE = object()


def _continued(last: tuple[tuple[Sample, ...], list[V]], now: tuple[Sample, ...]) -> list[V] | None:
    """The values of `now`'s first samples when `now` continues the `last` window: its
    samples from where `now` starts, in the same order, then only new ones."""
    old, values = last
    if not now:
        return []
    first = now[0]
    start = next((i for i, sample in enumerate(old) if sample is first), None)
    if start is None:
        return None
    kept = len(old) - start
    if kept > len(now) or not all(map(is_, old[start:], now[:kept])):
        return None
    return values[start:]


class PerSample(Generic[K, V]):
    """`derive(sample, args)` made once per sample and `args`, for readers of a few of a
    job's samples at every decision (the straggler detector reads the last three).

    One small table per job and `args`, keyed by the sample's id with the sample held (so
    that its id is not reused while in here), cut back to the job's current samples when
    it holds twice as many (see SampleWindow for why tables stay small).
    `derive` must be pure and depend on nothing but the sample and `args`.
    """

    def __init__(self, derive: Callable[[Sample, K], V], limit: int = 200_000) -> None:
        self._derive = derive
        self._limit = limit
        self._tables: dict[tuple[str, K], dict[int, tuple[Sample, V]]] = {}
        self._size = 0

    def of(self, job: str, sample: Sample, args: K, live: Sequence[Sample]) -> V:
        """What `derive` makes of one of the job's samples; `live` are the job's samples
        now, what its table is cut back to."""
        key = (job, args)
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = {}
        hit = table.get(id(sample))
        if hit is not None:
            return hit[1]
        if self._size >= self._limit:  # jobs come and go; a miss costs microseconds
            table.clear()
            self._tables = {key: table}
            self._size = 0
        value = self._derive(sample, args)
        table[id(sample)] = (sample, value)
        self._size += 1
        if len(table) > 2 * len(live) + 16:
            kept = {id(s): hit for s in live if (hit := table.get(id(s))) is not None}
            self._tables[key] = kept
            self._size += len(kept) - len(table)
        return value

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
        if proposal.__class__ is Proposal:  # what `replace` makes, without its field walk
            return Proposal(proposal.reason, proposal.resource, proposal.handled_ooms, self.name)
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
