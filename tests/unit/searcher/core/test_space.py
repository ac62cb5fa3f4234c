"""Points of a search space: Optuna's random ones, reproducible per (space, seed, index),
and Determined's grid."""

from __future__ import annotations

import logging
import math

import optuna
import pytest
from pydantic import TypeAdapter

from schemas.experiments import HyperParameter
from streams.searcher.core.space import (
    grid_axes,
    grid_point,
    grid_refusal,
    grid_size,
    refusal,
    sample,
    space_grid_size,
    trial_seed,
)

_PARAM = TypeAdapter(HyperParameter)


def space(**params: dict[str, object]) -> dict[str, HyperParameter]:
    return {name: _PARAM.validate_python(raw) for name, raw in params.items()}


SPACE = space(
    lr={"type": "log", "base": 10, "minval": -4, "maxval": -1, "count": 4},
    width={"type": "int", "minval": 8, "maxval": 128, "count": 4},
    dropout={"type": "double", "minval": 0.0, "maxval": 0.5, "count": 3},
    act={"type": "categorical", "vals": ["relu", "tanh", 3, 2.5, True]},
    epochs={"type": "const", "val": 1},
)


def test_a_trials_point_depends_on_the_space_the_seed_and_its_index_only() -> None:
    first = [sample(SPACE, 7, i) for i in range(20)]
    assert [sample(SPACE, 7, i) for i in range(20)] == first
    assert [sample(SPACE, 7, i) for i in reversed(range(20))][::-1] == first
    # the document's key order is not the point's (jsonb does not keep it)
    assert sample(dict(reversed(list(SPACE.items()))), 7, 3) == first[3]
    assert [sample(SPACE, 8, i) for i in range(20)] != first
    assert len({repr(p) for p in first}) == 20  # every trial its own point


class _Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_sampling_says_nothing_and_leaves_optunas_logging_as_it_was() -> None:
    """An in-memory study logs its creation at INFO: not while a point is drawn, and
    Optuna's verbosity is what it was after."""
    recorder = _Recorder()
    logger = logging.getLogger("optuna")
    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(logging.INFO)
    logger.addHandler(recorder)
    try:
        sample(SPACE, 0, 0)
        assert optuna.logging.get_verbosity() == logging.INFO
        logging.getLogger("optuna.study").info("the recorder hears optuna at INFO")
    finally:
        logger.removeHandler(recorder)
        optuna.logging.set_verbosity(before)
    assert [r.getMessage() for r in recorder.records] == ["the recorder hears optuna at INFO"]


def test_random_points_lie_in_the_space_with_their_types() -> None:
    exponents = []
    for i in range(300):
        point = sample(SPACE, 1, i)
        assert list(point) == sorted(SPACE)
        lr, width, dropout = point["lr"], point["width"], point["dropout"]
        assert isinstance(lr, float) and 1e-4 <= lr <= 1e-1
        assert type(width) is int and 8 <= width <= 128
        assert isinstance(dropout, float) and 0.0 <= dropout <= 0.5
        assert point["act"] in ["relu", "tanh", 3, 2.5, True]
        assert point["epochs"] == 1
        exponents.append(math.log10(lr))
    # log: the exponent is uniform over [-4, -1], so each third of it gets about a third
    thirds = [sum(1 for e in exponents if -4 + k <= e < -3 + k) for k in range(3)]
    assert all(60 <= n <= 140 for n in thirds), thirds


def test_a_log_parameter_with_another_base_samples_its_exponents() -> None:
    two = space(batch={"type": "log", "base": 2, "minval": 4, "maxval": 8})
    values = [sample(two, 0, i)["batch"] for i in range(100)]
    assert all(16 <= float(v) <= 256 for v in values)
    assert min(values) < 32 and max(values) > 128  # type: ignore[operator]


def test_a_seed_is_spread_per_trial() -> None:
    seeds = {trial_seed(s, i) for s in range(10) for i in range(10)}
    assert len(seeds) == 100 and all(0 <= s < 2**32 for s in seeds)


def test_the_grid_is_determineds() -> None:
    axes = dict(grid_axes(SPACE))
    assert axes["lr"] == pytest.approx((1e-4, 1e-3, 1e-2, 1e-1))
    assert axes["width"] == (8, 48, 88, 128)
    assert axes["dropout"] == (0.0, 0.25, 0.5)
    assert axes["act"] == ("relu", "tanh", 3, 2.5, True)
    assert axes["epochs"] == (1,)
    one = space(
        a={"type": "int", "minval": 1, "maxval": 4, "count": 1},
        b={"type": "double", "minval": 1, "maxval": 2, "count": 1},
        c={"type": "log", "minval": -3, "maxval": -1, "count": 1},
        d={"type": "int", "minval": 0, "maxval": 2, "count": 10},
        e={"type": "int", "minval": -3, "maxval": 0, "count": 3},
    )
    axes = dict(grid_axes(one))
    # count 1: the middle (Go's rounding: half away from zero); an int's count at most its range
    assert axes["a"] == (3,) and axes["b"] == (1.5,) and axes["c"] == pytest.approx((1e-2,))
    assert axes["d"] == (0, 1, 2) and axes["e"] == (-3, -2, 0)
    assert space_grid_size(one) == grid_size(grid_axes(one)) == 9


def test_grid_points_are_the_cartesian_product_first_name_slowest() -> None:
    small = space(
        b={"type": "categorical", "vals": ["x", "y", "z"]},
        a={"type": "int", "minval": 0, "maxval": 1, "count": 2},
    )
    axes = grid_axes(small)
    points = [grid_point(axes, i) for i in range(grid_size(axes))]
    assert points == [
        {"a": 0, "b": "x"},
        {"a": 0, "b": "y"},
        {"a": 0, "b": "z"},
        {"a": 1, "b": "x"},
        {"a": 1, "b": "y"},
        {"a": 1, "b": "z"},
    ]
    assert (
        space_grid_size(SPACE)
        == 4 * 4 * 3 * 5
        == len({repr(grid_point(grid_axes(SPACE), i)) for i in range(240)})
    )


def test_a_huge_grid_is_indexed_without_being_built() -> None:
    huge = space(
        **{f"p{i}": {"type": "int", "minval": 0, "maxval": 999, "count": 1000} for i in range(8)}
    )
    assert space_grid_size(huge) == 10**24
    last = grid_point(grid_axes(huge), 10**24 - 1)
    assert set(last.values()) == {999}


def test_a_grid_needs_a_count_for_every_numeric_parameter() -> None:
    assert grid_refusal(SPACE) is None
    missing = space(
        z={"type": "int", "minval": 0, "maxval": 3, "count": 2},
        lr={"type": "log", "minval": -4, "maxval": -1},
        act={"type": "categorical", "vals": ["relu"]},
    )
    why = grid_refusal(missing)
    assert why is not None and why.startswith("spec.hyperparameters.lr.count: ")


def test_a_log_whose_smallest_value_underflows_is_refused() -> None:
    assert refusal(SPACE) is None
    tiny = space(eps={"type": "log", "base": 1000, "minval": -200, "maxval": -1})
    why = refusal(tiny)
    assert why is not None and why.startswith("spec.hyperparameters.eps.minval: ")
