"""Curve tables (handlers/simulator/curves.py parse_table): any text parses to points or
fails with one CurveError, and a table written from points reads back as those points."""

from __future__ import annotations

import csv
import io
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from handlers.simulator.curves import CurveError, CurvePoint, TableCurve, parse_table

names = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)
finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)
scalars = st.one_of(
    st.integers(-1000, 1000), finite, st.booleans(), st.from_regex(r"[a-z]{1,6}", fullmatch=True)
)


@settings(max_examples=200)
@given(st.text(max_size=300), st.sampled_from(["csv", "json"]))
def test_any_text_parses_or_says_why(text: str, fmt: str) -> None:
    try:
        points = parse_table(text, fmt=fmt)
    except CurveError as e:
        assert str(e)
        return
    for point in points:
        assert isinstance(point, CurvePoint)


points = st.lists(
    st.builds(
        CurvePoint,
        st.dictionaries(names, scalars, max_size=3),
        st.floats(min_value=0, max_value=1e6, allow_nan=False),
        st.dictionaries(names, finite, min_size=1, max_size=2),
        st.booleans(),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=100)
@given(points)
def test_json_tables_round_trip_and_every_configuration_is_its_own_nearest(
    rows: list[CurvePoint],
) -> None:
    text = json.dumps(
        [
            {
                "hparams": dict(p.hparams),
                "budget": p.budget,
                "metrics": dict(p.metrics),
                "validation": p.validation,
            }
            for p in rows
        ]
    )
    assert parse_table(text, fmt="json") == rows
    curve = TableCurve(rows)
    for row in rows:
        assert curve.nearest(row.hparams) == row.hparams
        assert curve.metrics(row.hparams, row.budget, validation=True) is not None


@settings(max_examples=100)
@given(
    st.lists(
        st.tuples(st.floats(1e-5, 1.0), st.integers(1, 512), st.floats(0, 1e5), finite),
        min_size=1,
        max_size=8,
    )
)
def test_csv_tables_round_trip(rows: list[tuple[float, int, float, float]]) -> None:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["hparams.lr", "hparams.width", "budget", "val_loss"])
    for lr, width, budget, value in rows:
        writer.writerow([repr(lr), width, repr(budget), repr(value)])
    parsed = parse_table(out.getvalue(), fmt="csv")
    assert [(p.hparams, p.budget, p.metrics, p.validation) for p in parsed] == [
        ({"lr": lr, "width": width}, budget, {"val_loss": value}, True)
        for lr, width, budget, value in rows
    ]
