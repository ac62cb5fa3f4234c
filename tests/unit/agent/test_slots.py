"""A host's slots from nvidia-smi's CSV (handlers.agent.slots.parse_gpus): what it lists
reads back field for field, whatever the names and sizes; what is not its CSV is refused
naming the line."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from handlers.agent.slots import MiB, UnreadableGpus, artificial, parse_gpus
from schemas.hosts import Slot

#: What nvidia-smi prints for one GPU of a DGX (the query of handlers.agent.slots.QUERY).
DGX = """0, NVIDIA H100 80GB HBM3, GPU-4f1c2a9e-6b1d-8d1f-0c3b-1c2a3b4c5d6e, 81559
1, NVIDIA H100 80GB HBM3, GPU-9a8b7c6d-5e4f-3a2b-1c0d-9e8f7a6b5c4d, 81559
"""

names = (
    st.text(
        st.characters(codec="ascii", categories=("L", "N", "Zs"), exclude_characters=","),
        min_size=1,
        max_size=40,
    )
    .map(str.strip)
    .filter(bool)
)
uuids = st.uuids().map(lambda u: f"GPU-{u}")
memories = st.one_of(st.integers(0, 2**20), st.just(None))


@st.composite
def gpus(draw: st.DrawFn) -> list[tuple[int, str, str, int | None]]:
    indexes = draw(st.lists(st.integers(0, 1023), unique=True, max_size=16))
    return [(i, draw(names), draw(uuids), draw(memories)) for i in indexes]


@given(gpus())
def test_what_nvidia_smi_lists_reads_back(listed: list[tuple[int, str, str, int | None]]) -> None:
    text = "\n".join(
        f"{i}, {name}, {uuid}, {'[N/A]' if mib is None else mib}" for i, name, uuid, mib in listed
    )
    slots = parse_gpus(text + "\n")
    assert slots == [
        Slot(index=i, name=name, uuid=uuid, memory=None if mib is None else mib * MiB)
        for i, name, uuid, mib in listed
    ]


def test_a_dgx() -> None:
    slots = parse_gpus(DGX)
    assert [s.index for s in slots] == [0, 1]
    assert {s.name for s in slots} == {"NVIDIA H100 80GB HBM3"}
    assert slots[0].memory == 81559 * MiB


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("0, H100, GPU-1\n", "line 1: 3 fields"),
        ("x, H100, GPU-1, 10\n", "index 'x'"),
        ("0, a, GPU-1, 1\n0, b, GPU-2, 1\n", "twice"),
        ("NVIDIA-SMI has failed because it couldn't communicate with the driver\n", "line 1"),
    ],
)
def test_what_is_not_its_csv_is_refused_naming_the_line(text: str, says: str) -> None:
    with pytest.raises(UnreadableGpus, match=says):
        parse_gpus(text)


def test_no_gpus_and_artificial_slots() -> None:
    assert parse_gpus("") == []
    assert artificial(3) == [Slot(index=0), Slot(index=1), Slot(index=2)]
