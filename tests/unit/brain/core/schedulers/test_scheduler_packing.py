"""Where goodput-cluster's counts go on the nodes (streams/brain/core/schedulers/packing.py):
a search step grows one job in place or onto the tightest node, a repack keeps jobs that
keep their count where they are, and no node ever holds more than it has."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from streams.brain.core.schedulers.api import ClusterCapacity, NodeCapacity
from streams.brain.core.schedulers.packing import PackedJob, Packer, Packing


def test_a_job_grows_in_place_while_its_node_has_room() -> None:
    p = Packing([4, 4], 4)
    assert p.grow("a", 1)
    assert p.grow("b", 1)
    assert p.where == {"a": ((0, 1),), "b": ((0, 1),)}, "the tightest node that fits, the first"
    assert p.grow("a", 2)
    assert p.where["a"] == ((0, 2),) and p.free == [1, 4]


def test_a_job_whose_node_is_full_moves_to_the_tightest_node_that_fits() -> None:
    p = Packing([4, 4, 4], 4)
    p.take("x", ((0, 3),))
    p.take("y", ((1, 1),))
    assert p.grow("a", 1)
    assert p.where["a"] == ((0, 1),)
    assert p.grow("a", 2), "node 0 is full: node 1 has 3 free, node 2 has 4"
    assert p.where["a"] == ((1, 2),)
    assert p.free == [1, 1, 4]


def test_past_a_node_a_job_takes_whole_free_nodes_its_own_first() -> None:
    p = Packing([4, 4, 4, 2], 4)
    assert p.grow("a", 4)
    assert p.where["a"] == ((0, 4),)
    assert p.grow("a", 8)
    assert p.where["a"] == ((0, 4), (1, 4))
    p.take("x", ((2, 1),))
    assert not p.grow("a", 12), "node 2 is not whole, node 3 is not a whole node"
    assert p.where["a"] == ((0, 4), (1, 4)), "a refused step changes nothing"
    assert p.free == [0, 0, 3, 2]


def test_a_repack_keeps_the_jobs_that_keep_their_count_where_they_are() -> None:
    cluster = ClusterCapacity((NodeCapacity("n0", 4), NodeCapacity("n1", 4)), 4)
    jobs = {
        "a": PackedJob((("n1", 2),), 2),
        "b": PackedJob((("n0", 1),), 1),
        "new": PackedJob((), 0),
    }
    packer = Packer(cluster, jobs)
    got = packer.pack({"a": 2, "b": 2, "new": 3})
    assert got == {"a": (("n1", 2),), "b": (("n1", 2),), "new": (("n0", 3),)}
    assert packer.pack({"a": 2, "b": 1, "new": 8}) is None, "8 GPUs need both nodes whole"
    # no room beside the stayer: everyone is placed again, the largest first
    moved = packer.pack({"a": 1, "b": 4, "new": 3})
    assert moved == {"b": (("n0", 4),), "new": (("n1", 3),), "a": (("n1", 1),)}


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([1, 2, 4, 8]).flatmap(
        lambda per: st.tuples(
            st.just(per),
            st.lists(st.integers(0, per), min_size=1, max_size=6),
            st.lists(st.tuples(st.integers(0, 5), st.integers(1, 3 * per)), max_size=30),
        )
    )
)
def test_steps_never_overfill_a_node_and_gangs_past_a_node_take_whole_ones(
    case: tuple[int, list[int], list[tuple[int, int]]],
) -> None:
    per_node, sizes, steps = case
    p = Packing(sizes, per_node)
    held: dict[str, int] = {}
    for job, r in steps:
        key = f"j{job}"
        if r <= held.get(key, 0) or (r > per_node and r % per_node):
            continue
        before = (list(p.free), dict(p.where))
        if p.grow(key, r):
            held[key] = r
        else:
            assert (p.free, p.where) == before
        used = [0] * len(sizes)
        for k, slots in p.where.items():
            assert sum(g for _, g in slots) == held[k]
            if len(slots) > 1:
                assert all(g == per_node == sizes[i] for i, g in slots)
            for i, g in slots:
                used[i] += g
        assert [s - u for s, u in zip(sizes, used, strict=True)] == p.free
        assert all(f >= 0 for f in p.free)
        for f, bucket in enumerate(p.buckets[None]):
            assert bucket == sorted(i for i, free in enumerate(p.free) if free == f)
