"""Sizes for people (plan reasons, the console): binary units, three digits."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover_events.domain.units import human_bytes


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
