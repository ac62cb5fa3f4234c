"""Points of a search space: a random one with Optuna's sampler, and the grid.

A trial's point is a pure function of the space, the experiment's seed and the trial's
index, so a searcher restarted from its checkpoint creates the trial it would have created
anyway, and two searchers given the same seed (random and ASHA) try the same points in the
same order, which makes an A/B of searchers fair. Parameters are taken in the order of
their names, never of the document: the state is checkpointed as Postgres ``jsonb``, which
does not keep a document's key order.

Random points are Optuna's (``optuna.samplers.RandomSampler``), asked once per trial of a
fresh in-memory study through ask-and-tell (``Study.ask`` with the space's distributions),
the sampler seeded from ``(seed, index)``, so no draw depends on another trial's. Determined's
``log`` bounds are exponents of ``base``: the distribution is
``FloatDistribution(base**minval, base**maxval, log=True)``, log-uniform as Determined's is.
An in-memory study logs its creation at INFO; Optuna's verbosity is raised to WARNING only
while the study is made and put back at once, so the process's logging is as it was.

The grid is Determined's (``master/pkg/searcher/grid.go``): ``count`` points of each
numeric parameter, evenly spaced between its bounds (for ``log``, evenly spaced exponents;
one point is the middle), an int's ``count`` clamped to the integers in its range, every
value of a categorical, a const's value; their cartesian product, the first name (in name
order) varying slowest. Point i is computed from i alone (mixed radix), so a grid of 10^20
points costs nothing to index.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import numpy as np
import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.samplers import RandomSampler
from optuna.storages import InMemoryStorage
from optuna.study import Study, StudyDirection

from schemas.experiments import (
    CategoricalParam,
    ConstParam,
    DoubleParam,
    HyperParameter,
    IntParam,
    LogParam,
    ParamValue,
)

Space = Mapping[str, HyperParameter]
#: One axis of a grid: a parameter's name and its values, in order.
Axis = tuple[str, tuple[ParamValue, ...]]


def refusal(space: Space) -> str | None:
    """Why a space cannot be sampled, naming the field; None if it can. The schema bounds
    every parameter; what it lets through and a double cannot hold is a ``log`` whose
    smallest value underflows (``base ** minval`` is 0 or subnormal)."""
    for name in sorted(space):
        param = space[name]
        if isinstance(param, LogParam) and _power(param.base, param.minval) < sys.float_info.min:
            return (
                f"spec.hyperparameters.{name}.minval: {param.base:g} ** {param.minval:g} is "
                "below the smallest normal double; raise minval"
            )
    return None


def _power(base: float, exponent: float) -> float:
    try:
        return float(base**exponent)
    except OverflowError:
        return math.inf


def distribution(param: HyperParameter) -> BaseDistribution | None:
    """The Optuna distribution of a parameter; None for a const (never sampled)."""
    if isinstance(param, ConstParam):
        return None
    if isinstance(param, IntParam):
        return IntDistribution(param.minval, param.maxval)
    if isinstance(param, DoubleParam):
        return FloatDistribution(param.minval, param.maxval)
    if isinstance(param, LogParam):
        low, high = _power(param.base, param.minval), _power(param.base, param.maxval)
        return FloatDistribution(low, high, log=True)
    return CategoricalDistribution(list(param.vals))


def trial_seed(seed: int, index: int) -> int:
    """The seed of trial ``index``'s draw: numpy's ``SeedSequence`` of the two, whose
    output numpy keeps stable across versions, so neighbouring seeds and indices give
    unrelated streams."""
    return int(np.random.SeedSequence((seed, index)).generate_state(1)[0])


@contextmanager
def _quiet_optuna() -> Iterator[None]:
    before = optuna.logging.get_verbosity()
    if before >= logging.WARNING:
        yield
        return
    optuna.logging.set_verbosity(logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(before)


def sample(space: Space, seed: int, index: int) -> dict[str, ParamValue]:
    """Trial ``index``'s random point of ``space``: Optuna's ``RandomSampler``, seeded from
    ``(seed, index)``, asked once (see the module's docstring); a const is its value."""
    names = sorted(space)
    dists = {n: d for n in names if (d := distribution(space[n])) is not None}
    drawn: dict[str, object] = {}
    if dists:
        with _quiet_optuna():
            storage = InMemoryStorage()
            storage.create_new_study([StudyDirection.MINIMIZE], study_name="point")
        study = Study("point", storage, sampler=RandomSampler(seed=trial_seed(seed, index)))
        drawn = dict(study.ask(dists).params)
    point: dict[str, ParamValue] = {}
    for name in names:
        param = space[name]
        if isinstance(param, ConstParam):
            point[name] = param.val
        else:
            point[name] = _plain(param, drawn[name])
    return point


def _plain(param: HyperParameter, value: object) -> ParamValue:
    """A drawn value as the contract's scalar (a numpy scalar never leaks into JSON)."""
    if isinstance(param, IntParam):
        return int(value)  # type: ignore[call-overload]
    if isinstance(param, DoubleParam | LogParam):
        return float(value)  # type: ignore[arg-type]
    assert isinstance(value, bool | int | float | str)
    return value


def grid_refusal(space: Space) -> str | None:
    """Why a space has no grid, naming the field: every numeric parameter needs ``count``."""
    for name in sorted(space):
        param = space[name]
        if isinstance(param, IntParam | DoubleParam | LogParam) and param.count is None:
            return (
                f"spec.hyperparameters.{name}.count: grid search needs a count for every int, "
                "double and log hyperparameter"
            )
    return None


def grid_axes(space: Space) -> list[Axis]:
    """The grid's axes, in name order (``grid_refusal`` must have passed)."""
    return [(name, _axis(space[name])) for name in sorted(space)]


def _round_half_away(x: float) -> int:
    """Go's ``math.Round``, which Determined's grid uses (Python's ``round`` is to even)."""
    return math.floor(x + 0.5) if x >= 0 else -math.floor(-x + 0.5)


def _axis(param: HyperParameter) -> tuple[ParamValue, ...]:
    if isinstance(param, ConstParam):
        return (param.val,)
    if isinstance(param, CategoricalParam):
        return tuple(param.vals)
    assert param.count is not None
    if isinstance(param, IntParam):
        count = min(param.count, param.maxval - param.minval + 1)
        if count == 1:
            return (_round_half_away((param.minval + param.maxval) / 2),)
        span = param.maxval - param.minval
        return tuple(_round_half_away(param.minval + i * span / (count - 1)) for i in range(count))
    count = param.count
    if count == 1:
        exponents = [(param.minval + param.maxval) / 2]
    else:
        step = (param.maxval - param.minval) / (count - 1)
        exponents = [param.minval + i * step for i in range(count)]
    if isinstance(param, LogParam):
        return tuple(_power(param.base, e) for e in exponents)
    return tuple(float(e) for e in exponents)


def grid_size(axes: Sequence[Axis]) -> int:
    return math.prod(len(values) for _, values in axes)


def space_grid_size(space: Space) -> int:
    """The number of grid points of ``space``, without building its axes."""
    return math.prod(_axis_length(param) for param in space.values())


def _axis_length(param: HyperParameter) -> int:
    if isinstance(param, ConstParam):
        return 1
    if isinstance(param, CategoricalParam):
        return len(param.vals)
    assert param.count is not None
    if isinstance(param, IntParam):
        return min(param.count, param.maxval - param.minval + 1)
    return param.count


def grid_point(axes: Sequence[Axis], index: int) -> dict[str, ParamValue]:
    """Point ``index`` of the grid (0 <= index < grid_size): the last axis varies fastest."""
    point: dict[str, ParamValue] = {}
    rest = index
    for name, values in reversed(axes):
        rest, at = divmod(rest, len(values))
        point[name] = values[at]
    return dict(sorted(point.items()))


__all__ = [
    "Axis",
    "Space",
    "distribution",
    "grid_axes",
    "grid_point",
    "grid_refusal",
    "grid_size",
    "refusal",
    "sample",
    "space_grid_size",
    "trial_seed",
]
