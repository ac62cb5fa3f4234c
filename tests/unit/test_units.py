"""Sizes for people (plan reasons, the console): binary units, three digits; and the one
syntax of durations and speed-ups that every command takes."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover_events.domain.units import human_bytes, parse_duration, parse_speed


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (512, "512 B"),
        (2048, "2 KiB"),
        (419_625_370, "400 MiB"),
        (349_687_808, "333 MiB"),
        (24 * 2**30, "24 GiB"),
        (int(1.5 * 2**30), "1.5 GiB"),
        (2**60, "1 EiB"),
        (1000 * 2**20, "1000 MiB"),
        (1023 * 2**10, "1023 KiB"),
        (2**20 - 1, "1 MiB"),
    ],
)
def test_sizes_read_as_people_write_them(n: int, text: str) -> None:
    assert human_bytes(n) == text


@given(
    st.integers(min_value=0, max_value=2**63)
    | st.builds(lambda m, e: m * 1024**e, st.integers(0, 1023), st.integers(0, 6))
    | st.builds(lambda e: 1024**e - 1, st.integers(1, 6))
)
def test_every_size_has_a_unit_and_no_raw_count(n: int) -> None:
    number, unit = human_bytes(n).split(" ")
    assert unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
    assert "e" not in number and 0 <= float(number) < 1024


# -- the one syntax of durations and speed-ups of every command ---------------------------

SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("10m", 600),
        ("1.5h", 5400),
        ("2d", 172800),
        ("500ms", 0.5),
        ("90", 90),
        (" 1 w ", 604800),
        ("0", 0),
        (".5s", 0.5),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@given(st.decimals(0, 10**6, places=3, allow_nan=False), st.sampled_from(["", *SECONDS]))
def test_a_number_and_a_unit_is_that_many_seconds(amount: Decimal, unit: str) -> None:
    assert parse_duration(f"{amount}{unit}") == pytest.approx(float(amount) * SECONDS[unit or "s"])


@given(st.text(max_size=20))
def test_a_duration_parses_to_seconds_or_says_what_it_wants(text: str) -> None:
    try:
        seconds = parse_duration(text)
    except ValueError as err:
        assert "is not a duration like 30s" in str(err)
    else:
        assert seconds >= 0 and math.isfinite(seconds)


@pytest.mark.parametrize(("text", "speed"), [("100x", 100), ("100", 100), ("0.5x", 0.5), ("2X", 2)])
def test_speeds(text: str, speed: float) -> None:
    assert parse_speed(text) == speed


@pytest.mark.parametrize("text", ["fast", "0x", "0", "-2x", "x", "infx", "nan", "1e3x", "1_0"])
def test_a_bad_speed_says_what_it_wants(text: str) -> None:
    with pytest.raises(ValueError, match="is not a speed-up like 10x"):
        parse_speed(text)


@given(st.decimals(0, 10**6, places=3, allow_nan=False).filter(lambda d: d > 0), st.booleans())
def test_a_factor_with_or_without_x_is_the_same_speed(factor: Decimal, x: bool) -> None:
    assert parse_speed(f"{factor}{'x' if x else ''}") == float(factor)


@given(st.text(max_size=20))
def test_a_speed_parses_to_a_positive_factor_or_says_what_it_wants(text: str) -> None:
    try:
        speed = parse_speed(text)
    except ValueError as err:
        assert "is not a speed-up like 10x" in str(err)
    else:
        assert speed > 0 and math.isfinite(speed)
