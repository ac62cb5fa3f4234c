"""Where the hosts platform runs pods (handlers.operator.hosts.placement): gangs all or
nothing, spread over hosts, oldest first, never a slot twice."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from handlers.operator.hosts.placement import Room, Wanted, free_slots, place


def room(host: str, slots: int, used: tuple[int, ...] = ()) -> Room:
    return Room(host, slots, tuple(i for i in range(slots) if i not in used))


def test_a_two_node_job_spreads_over_two_hosts() -> None:
    placed = place(
        [Wanted("j-w-0", "j", 1, "1"), Wanted("j-w-1", "j", 1, "1")],
        [room("a", 4), room("b", 4)],
    )
    assert {p.host for p in placed.values()} == {"a", "b"}


def test_a_gang_that_does_not_fit_takes_nothing_and_holds_up_later_jobs() -> None:
    pending = [
        Wanted("big-0", "big", 2, "1"),
        Wanted("big-1", "big", 2, "1"),
        Wanted("small-0", "small", 1, "2"),
    ]
    assert place(pending, [room("a", 2), room("b", 2, used=(0,))]) == {}


def test_a_job_that_could_never_fit_holds_up_no_one() -> None:
    pending = [Wanted("huge-0", "huge", 8, "1"), Wanted("small-0", "small", 1, "2")]
    placed = place(pending, [room("a", 4)])
    assert set(placed) == {"small-0"}


def test_free_slots_are_those_no_pod_holds() -> None:
    free = free_slots([("a", [0, 2]), ("b", [1])], {"a": [0, 1, 2, 3], "b": [0, 1]})
    assert free == {"a": (1, 3), "b": (0,)}


@st.composite
def cluster(draw: st.DrawFn) -> tuple[list[Wanted], list[Room]]:
    hosts = draw(st.lists(st.integers(0, 8), min_size=0, max_size=5))
    rooms = []
    for n, size in enumerate(hosts):
        used = draw(st.sets(st.integers(0, max(size - 1, 0)), max_size=size)) if size else set()
        rooms.append(room(f"h{n}", size, tuple(used)))
    jobs = draw(st.lists(st.integers(1, 4), max_size=6))
    pending = [
        Wanted(f"j{j}-{k}", f"j{j}", draw(st.integers(1, 4)), f"{j:03}")
        for j, count in enumerate(jobs)
        for k in range(count)
    ]
    return pending, rooms


@given(cluster())
def test_placements_keep_the_rules(given_cluster: tuple[list[Wanted], list[Room]]) -> None:
    pending, rooms = given_cluster
    placed = place(pending, rooms)
    by_host = {r.host: r for r in rooms}
    taken: dict[str, list[int]] = {}
    for want in pending:
        if want.pod in placed:
            got = placed[want.pod]
            assert len(got.slots) == want.slots
            assert set(got.slots) <= set(by_host[got.host].free)
            taken.setdefault(got.host, []).extend(got.slots)
    for host, slots in taken.items():
        assert len(slots) == len(set(slots)), f"a slot of {host} given twice"
    jobs: dict[str, list[bool]] = {}
    for want in pending:
        jobs.setdefault(want.job, []).append(want.pod in placed)
    for job, flags in jobs.items():
        assert all(flags) or not any(flags), f"job {job} placed in part"
    assert place(pending, rooms) == placed
