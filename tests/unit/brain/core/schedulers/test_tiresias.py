"""The tiresias scheduler on small clusters (issue 18): arrived jobs only, whole gangs or
nothing, a new queue-0 job preempts a queue-1 one, the artifact's placement, and the same
schedule whatever the order of its inputs."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from streams.brain.core.schedulers.api import (
    ChangeKind,
    ClusterCapacity,
    JobInput,
    NodeCapacity,
    Placement,
    Schedule,
    used_gpus,
)
from streams.brain.core.schedulers.goodput import BatchLimits, JobModel
from streams.brain.core.schedulers.registry import SCHEDULERS, get_scheduler
from streams.brain.core.schedulers.tiresias import (
    QUEUE_THRESHOLD_GPU_S,
    TiresiasParams,
    queue_order,
    tiresias,
)

#: A small threshold so that a few minutes on a few GPUs demote a job.
SMALL = TiresiasParams(queue_threshold_gpu_s=1000.0)


class NoStepTime:
    """Tiresias never reads the goodput model: one that fails if it did."""

    def step_time(self, nodes: int, replicas: int, local_batch: int, accumulation: int) -> float:
        raise AssertionError("tiresias read a job's step time")


MODEL = JobModel(NoStepTime(), None, BatchLimits(init_batch=64, max_batch=64))


def job(
    job_id: str,
    replicas: int,
    placement: Placement = (),
    *,
    at: float = 0.0,
    attained: float = 0.0,
    preemptible: bool = True,
) -> JobInput:
    return JobInput(
        job_id,
        at,
        MODEL,
        placement,
        preemptible=preemptible,
        requested_replicas=replicas,
        attained_gpu_s=attained,
    )


def actions(s: Schedule) -> list[tuple[str, ChangeKind, int]]:
    return [(d.job_id, d.kind, d.replicas) for d in s.changes]


def held(s: Schedule) -> dict[str, Placement]:
    return {a.job_id: a.placement for a in s.holdings if a.replicas}


def test_only_arrived_jobs_take_gpus_or_appear() -> None:
    cluster = ClusterCapacity.uniform(2, 4)
    s = tiresias(100.0, cluster, [job("early", 4, at=100.0), job("late", 4, at=100.5)])
    assert actions(s) == [("early", ChangeKind.ADMIT, 4)]
    assert [a.job_id for a in s.holdings] == ["early"]
    assert tiresias(50.0, cluster, [job("late", 4, at=100.0)]) == Schedule((), (), 0.0, 0.0)


def test_a_new_queue_0_job_preempts_a_queue_1_job_and_the_suspend_comes_first() -> None:
    cluster = ClusterCapacity.uniform(2, 4)
    old = job("old", 8, (("node-0", 4), ("node-1", 4)), attained=1000.0)
    s = tiresias(300.0, cluster, [old, job("new", 4, at=290.0)], SMALL)
    assert actions(s) == [("old", ChangeKind.SUSPEND, 0), ("new", ChangeKind.ADMIT, 4)]
    assert held(s) == {"new": (("node-0", 4),)}
    # just below the threshold the old job is still in queue 0, ahead of the newcomer
    below = job("old", 8, (("node-0", 4), ("node-1", 4)), attained=999.0)
    assert tiresias(300.0, cluster, [below, job("new", 4, at=290.0)], SMALL).changes == ()


def test_a_suspended_job_resumes_when_its_gang_fits_again() -> None:
    cluster = ClusterCapacity.uniform(2, 4)
    s = tiresias(600.0, cluster, [job("old", 8, attained=5000.0)], SMALL)
    assert actions(s) == [("old", ChangeKind.ADMIT, 8)]
    assert held(s) == {"old": (("node-0", 4), ("node-1", 4))}


def test_whole_gang_or_nothing_and_smaller_jobs_go_past() -> None:
    cluster = ClusterCapacity.uniform(2, 4)
    jobs = [
        job("a", 3, at=1.0),
        job("big", 6, at=2.0),  # 5 GPUs left after a: waits, whole or not at all
        job("b", 2, at=3.0),
        job("c", 1, at=4.0),
        job("d", 4, at=5.0),  # 2 left after b and c: waits too
    ]
    s = tiresias(10.0, cluster, jobs)
    assert actions(s) == [
        ("a", ChangeKind.ADMIT, 3),
        ("b", ChangeKind.ADMIT, 2),
        ("c", ChangeKind.ADMIT, 1),
    ]
    assert held(s) == {"a": (("node-0", 3),), "b": (("node-1", 2),), "c": (("node-1", 1),)}
    assert {a.job_id: a.replicas for a in s.holdings} == {
        "a": 3,
        "b": 2,
        "big": 0,
        "c": 1,
        "d": 0,
    }


def test_a_running_job_keeps_its_gpus_and_a_started_one_takes_the_fullest_nodes() -> None:
    cluster = ClusterCapacity.uniform(3, 4)
    running = job("run", 2, (("node-1", 2),), at=0.0, attained=10.0)
    s = tiresias(10.0, cluster, [running, job("new", 6, at=5.0)])
    # node-0 and node-2 have 4 free, node-1 2: node-0 first (first on ties), then node-2
    assert actions(s) == [("new", ChangeKind.ADMIT, 6)]
    assert held(s) == {"run": (("node-1", 2),), "new": (("node-0", 4), ("node-2", 2))}
    assert s.objective == pytest.approx(8 / 12) and s.objective_before == pytest.approx(2 / 12)


def test_queue_0_is_arrival_order_and_queue_1_the_earliest_crossing() -> None:
    """In queue 1 the job that could have crossed first goes first, whether it runs or was
    suspended since: a 4-GPU job that arrived at 0 crosses 1000 GPU-s at 250 at the
    earliest, an 8-GPU one that arrived at 100 at 225."""
    jobs = [
        job("q1-small", 4, at=0.0, attained=2000.0),
        job("q1-wide", 8, (("n", 8),), at=100.0, attained=1500.0),
        job("q0-b", 1, at=50.0, attained=10.0),
        job("q0-a", 1, at=50.0),
        job("q0-first", 2, at=20.0, attained=999.0),
        job("future", 1, at=10_000.0),
    ]
    order = queue_order(1000.0, jobs, 1000.0)
    assert [(q.job.job_id, q.queue) for q in order] == [
        ("q0-first", 0),
        ("q0-a", 0),
        ("q0-b", 0),
        ("q1-wide", 1),
        ("q1-small", 1),
    ]
    assert [q.since for q in order][-2:] == [225.0, 250.0]
    assert [q.job.job_id for q in queue_order(5000.0, jobs, 1000.0)] == [
        q.job.job_id for q in order
    ], "a queue-1 place does not move with time"


def test_a_non_preemptible_running_job_is_never_suspended() -> None:
    cluster = ClusterCapacity.uniform(1, 4)
    pinned = job("pinned", 4, (("node-0", 4),), attained=9000.0, preemptible=False)
    s = tiresias(100.0, cluster, [pinned, job("new", 2, at=90.0)], SMALL)
    assert s.changes == ()
    assert held(s) == {"pinned": (("node-0", 4),)}


def test_a_placement_that_no_longer_fits_is_placed_again() -> None:
    cluster = ClusterCapacity((NodeCapacity("node-0", 4), NodeCapacity("node-1", 2)), 4)
    s = tiresias(
        10.0, cluster, [job("gone", 2, (("node-9", 2),)), job("resized", 2, (("node-1", 1),))]
    )
    assert actions(s) == [("gone", ChangeKind.MOVE, 2), ("resized", ChangeKind.GROW, 2)]
    assert held(s) == {"gone": (("node-0", 2),), "resized": (("node-0", 2),)}


def test_the_batch_is_never_touched_and_every_change_restarts() -> None:
    cluster = ClusterCapacity.uniform(2, 4)
    old = job("old", 4, (("node-0", 4),), attained=5000.0)
    s = tiresias(10.0, cluster, [old, job("a", 4, at=1.0), job("b", 2, at=2.0)], SMALL)
    assert {d.kind for d in s.changes} == {ChangeKind.SUSPEND, ChangeKind.ADMIT}
    for d in s.changes:
        assert (d.local_batch, d.accumulation, d.global_batch) == (None, None, None)
        assert d.restart and d.reason
    assert all(a.batch is None for a in s.holdings)


def test_a_job_listed_twice_or_asking_for_no_gpus_is_refused() -> None:
    cluster = ClusterCapacity.uniform(1, 4)
    with pytest.raises(ValueError, match="listed twice"):
        tiresias(0.0, cluster, [job("a", 1), job("a", 1)])
    with pytest.raises(ValueError, match="requests 0 replicas"):
        tiresias(0.0, cluster, [job("a", 0)])


def test_the_registry_names_it_with_the_artifacts_threshold() -> None:
    spec = get_scheduler("tiresias")
    assert spec is SCHEDULERS["tiresias"] and spec.run is tiresias and spec.description
    default = spec.parse(None)
    assert isinstance(default, TiresiasParams)
    assert default.queue_threshold_gpu_s == QUEUE_THRESHOLD_GPU_S == 16 * 3600
    with pytest.raises(ValidationError):
        spec.parse({"queue_threshold_gpu_s": -1})
    with pytest.raises(ValidationError):
        spec.parse({"starvation": 0})


Tick = tuple[float, ClusterCapacity, list[JobInput]]


@st.composite
def ticks(draw: st.DrawFn) -> Tick:
    per_node = draw(st.sampled_from([1, 2, 4, 8]))
    count = draw(st.integers(1, 5))
    free = draw(st.lists(st.integers(0, per_node), min_size=count, max_size=count))
    cluster = ClusterCapacity(tuple(NodeCapacity(f"n{i}", g) for i, g in enumerate(free)), per_node)
    left = dict(enumerate(free))
    jobs: list[JobInput] = []
    for i in range(draw(st.integers(0, 8))):
        replicas = draw(st.integers(1, per_node * 2))
        placement: Placement = ()
        node = draw(st.integers(-1, count - 1))
        if node >= 0 and left[node] > 0:
            take = draw(st.integers(1, left[node]))
            left[node] -= take
            placement = ((f"n{node}", take),)
        jobs.append(
            job(
                f"j{i}",
                replicas,
                placement,
                at=draw(st.sampled_from([0.0, 100.0, 5000.0])),
                attained=draw(st.sampled_from([0.0, 500.0, 1000.0, 4000.0])),
                preemptible=draw(st.booleans()) or not placement,
            )
        )
    return draw(st.sampled_from([50.0, 3000.0, 10_000.0])), cluster, jobs


@settings(max_examples=200, deadline=None)
@given(ticks(), st.randoms(use_true_random=False))
def test_same_inputs_in_any_order_give_the_same_schedule(tick: Tick, rnd: random.Random) -> None:
    now, cluster, jobs = tick
    first = tiresias(now, cluster, jobs, SMALL)
    assert tiresias(now, cluster, jobs, SMALL) == first
    shuffled = list(jobs)
    rnd.shuffle(shuffled)
    assert tiresias(now, cluster, shuffled, SMALL) == first


@settings(max_examples=200, deadline=None)
@given(ticks())
def test_every_gang_whole_within_the_cluster_and_frees_first(tick: Tick) -> None:
    now, cluster, jobs = tick
    s = tiresias(now, cluster, jobs, SMALL)
    gpus = {n.name: n.gpus for n in cluster.nodes}
    for name, used in used_gpus(s.holdings).items():
        assert used <= gpus[name], f"{name}: {used} GPUs used of {gpus[name]}"
    by_id = {j.job_id: j for j in jobs}
    for a in s.holdings:
        assert a.replicas in (0, by_id[a.job_id].requested_replicas), "whole gang or nothing"
        assert a.replicas == sum(g for _, g in a.placement)
        assert [n for n, _ in a.placement] == sorted(
            (n for n, _ in a.placement), key=lambda n: int(n[1:])
        ), "listed in node order"
    order = [d.kind for d in s.changes]
    frees = [i for i, a in enumerate(order) if a is ChangeKind.SUSPEND]
    takes = [i for i, a in enumerate(order) if a is not ChangeKind.SUSPEND]
    assert not frees or not takes or max(frees) < min(takes)
    arrived = {j.job_id for j in jobs if j.submitted_at <= now}
    assert {a.job_id for a in s.holdings} == arrived
    # a waiting job is left out only when its gang is more than the GPUs left
    left = sum(gpus.values()) - sum(a.replicas for a in s.holdings)
    for a in s.holdings:
        if not a.replicas:
            assert by_id[a.job_id].requested_replicas > left
