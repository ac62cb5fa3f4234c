"""Learning curves (handlers/simulator/curves.py): the built-in family is deterministic
given its seed and has curves that cross; a recorded table interpolates along a
configuration's budgets and sends an unrecorded configuration to the nearest recorded one,
by the documented distance."""

from __future__ import annotations

import random

import pytest

from handlers.simulator.curves import (
    CurveError,
    CurvePoint,
    HParams,
    ParametricCurve,
    TableCurve,
    parse_table,
)


def test_the_parametric_family_is_a_function_of_its_inputs_and_seed() -> None:
    a, b = ParametricCurve(seed=1), ParametricCurve(seed=1)
    hp: HParams = {"lr": 3e-3, "width": 32, "act": "relu"}
    assert a.metrics(hp, 250.0, validation=True) == b.metrics(hp, 250.0, validation=True)
    assert a.metrics(hp, 250.0, validation=True) != ParametricCurve(seed=2).metrics(
        hp, 250.0, validation=True
    )
    # it learns: the loss falls with the budget, and the training loss has no noise
    losses = [a.loss(hp, b) for b in (0, 10, 100, 1000, 10000)]
    assert losses == sorted(losses, reverse=True)
    assert a.metrics(hp, 100.0, validation=False) == {
        "loss": pytest.approx(0.95 * a.loss(hp, 100.0))
    }


def test_curves_cross_yet_a_short_budget_mostly_ranks_as_a_long_one() -> None:
    c = ParametricCurve(seed=0, noise=0.0)
    fast: HParams = {"lr": 1e-1, "width": 128}
    tuned: HParams = {"lr": 7e-3, "width": 128}
    assert c.loss(fast, 10) < c.loss(tuned, 10)  # a too large rate leads at first
    assert c.loss(fast, 5000) > c.loss(tuned, 5000)  # and stalls higher
    # a wider net ends lower at its best rate
    assert c.loss({"lr": 1e-2 * 2, "width": 16}, 10**6) > c.loss(tuned, 10**6)
    # over the measurements' space, 1/64 of the budget ranks as all of it mostly does
    rng = random.Random(0)
    configs: list[HParams] = [
        {"lr": 10 ** rng.uniform(-4, -1), "width": rng.randint(8, 256)} for _ in range(500)
    ]
    early = [c.loss(h, 50) for h in configs]
    late = [c.loss(h, 3200) for h in configs]
    assert 0.75 < _spearman(early, late) < 0.95


def _spearman(a: list[float], b: list[float]) -> float:
    def ranks(xs: list[float]) -> list[int]:
        order = sorted(range(len(xs)), key=xs.__getitem__)
        out = [0] * len(xs)
        for rank, i in enumerate(order):
            out[i] = rank
        return out

    ra, rb = ranks(a), ranks(b)
    n = len(a)
    d2 = sum((x - y) ** 2 for x, y in zip(ra, rb, strict=True))
    return 1 - 6 * d2 / (n * (n * n - 1))


TABLE = """hparams.lr,hparams.act,budget,val_loss,validation
0.001,relu,100,2.0,true
0.001,relu,300,1.0,true
0.1,relu,100,1.5,true
0.1,relu,300,1.4,true
0.001,tanh,100,2.5,
0.001,relu,100,1.9,false
"""


def test_a_table_interpolates_along_budgets_and_holds_its_ends() -> None:
    curve = TableCurve(parse_table(TABLE, fmt="csv"))
    assert curve.configurations == 3
    hp: HParams = {"lr": 0.001, "act": "relu"}
    assert curve.metrics(hp, 200.0, validation=True) == {"val_loss": pytest.approx(1.5)}
    assert curve.metrics(hp, 10.0, validation=True) == {"val_loss": 2.0}
    assert curve.metrics(hp, 900.0, validation=True) == {"val_loss": 1.0}
    assert curve.metrics(hp, 100.0, validation=False) == {"val_loss": 1.9}
    # a configuration without training rows reports its validation curve for both
    assert curve.metrics({"lr": 0.1, "act": "relu"}, 100.0, validation=False) == {"val_loss": 1.5}


def test_an_unrecorded_configuration_follows_the_nearest_on_a_log_scale() -> None:
    curve = TableCurve(parse_table(TABLE, fmt="csv"))
    # lr spans a factor 100: scaled on log10, so 0.005 is nearer 0.001 than 0.1
    assert curve.nearest({"lr": 0.005, "act": "relu"}) == {"lr": 0.001, "act": "relu"}
    assert curve.nearest({"lr": 0.05, "act": "relu"}) == {"lr": 0.1, "act": "relu"}
    # a differing categorical counts 1, as far as the whole lr range
    assert curve.nearest({"lr": 0.001, "act": "gelu"}) in (
        {"lr": 0.001, "act": "relu"},
        {"lr": 0.001, "act": "tanh"},
    )
    assert curve.distance({"lr": 0.001, "act": "relu"}, {"lr": 0.1, "act": "relu"}) == 1.0
    assert curve.distance({"lr": 0.001}, {"lr": 0.001, "act": "relu"}) == 1.0
    # ties go by the configuration's spelling, not by the rows' order
    rows = parse_table(TABLE, fmt="csv")
    assert TableCurve(reversed(rows)).nearest({"lr": 0.001, "act": "gelu"}) == curve.nearest(
        {"lr": 0.001, "act": "gelu"}
    )


def test_json_tables_and_their_errors() -> None:
    rows = parse_table(
        '[{"hparams": {"lr": 0.01}, "budget": 10, "metrics": {"val_loss": 1.0}}]', fmt="json"
    )
    assert rows == [CurvePoint({"lr": 0.01}, 10.0, {"val_loss": 1.0}, True)]
    assert parse_table('{"rows": []}', fmt="json") == []
    bad = {
        "[1]": "row 0: an object",
        '[{"budget": 1, "metrics": {}}]': "row 0: metrics",
        '[{"budget": "x", "metrics": {"m": 1}}]': "row 0, budget",
        '[{"budget": 1, "metrics": {"m": 1}, "validation": "maybe"}]': "validation",
        "{": "not JSON",
    }
    for text, message in bad.items():
        with pytest.raises(CurveError, match=message):
            parse_table(text, fmt="json")
    with pytest.raises(CurveError, match="budget"):
        parse_table("hparams.lr,val_loss\n1,2\n", fmt="csv")
    with pytest.raises(CurveError, match="line 2, val_loss"):
        parse_table("budget,val_loss\n1,nan\n", fmt="csv")
    with pytest.raises(CurveError, match="at least one row"):
        TableCurve([])
    with pytest.raises(CurveError, match="csv or json"):
        parse_table("", fmt="yaml")
