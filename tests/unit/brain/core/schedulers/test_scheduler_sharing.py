"""Sharing a cluster (issue 26, items 1, 4 and 5, the schedulers' side): the capacity is a
list of nodes, a quota's owner gets its GPUs back from borrowers in the next round,
priority orders admission, and Kueue's jobs are never admitted or suspended by the brain,
only resized within what they hold. Each for goodput-cluster and tiresias, by example and
as properties of any round."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from schemas.codec import decode, encode
from schemas.jobs import JobMeta, JobSubmitted
from streams.brain.core.schedulers.api import (
    ChangeKind,
    ClusterCapacity,
    GroupQuota,
    JobInput,
    NodeCapacity,
    Placement,
    Schedule,
    used_gpus,
)
from streams.brain.core.schedulers.goodput import BatchLimits, GradStats, JobModel, PerfParams
from streams.brain.core.schedulers.goodput_cluster import schedule
from streams.brain.core.schedulers.sharing import guarantee, set_aside
from streams.brain.core.schedulers.tiresias import tiresias

PERF = PerfParams(alpha_c=0.05, beta_c=0.002, alpha_r=0.01, beta_r=0.001, alpha_n=0.1, beta_n=0.01)

Scheduler = Callable[[float, ClusterCapacity, Sequence[JobInput], Any], Schedule]
BOTH: list[Scheduler] = [schedule, tiresias]


def model(max_replicas: int | None = None, min_replicas: int = 1) -> JobModel:
    limits = BatchLimits(
        256, 4096, 8, 256, adaptive=False, min_replicas=min_replicas, max_replicas=max_replicas
    )
    return JobModel(PERF, GradStats(1.0, 50.0), limits)


def job(
    job_id: str,
    placement: Placement = (),
    *,
    at: float = 0.0,
    replicas: int = 1,
    priority: int = 0,
    group: str | None = None,
    kueue: bool = False,
    gpu_type: str | None = None,
    max_replicas: int | None = None,
    fixed: bool = False,
) -> JobInput:
    """A job of `replicas` GPUs: tiresias's gang; goodput-cluster may give it 1 to
    `max_replicas` (default `replicas`), or exactly `replicas` when `fixed`."""
    most = max_replicas if max_replicas is not None else replicas
    return JobInput(
        job_id,
        at,
        model(most, replicas if fixed else 1),
        placement,
        local_batch=64 if placement else None,
        requested_replicas=replicas,
        priority=priority,
        group=group,
        kueue_managed=kueue,
        gpu_type=gpu_type,
    )


def held(s: Schedule) -> dict[str, int]:
    return {h.job_id: h.replicas for h in s.holdings}


def kinds(s: Schedule) -> dict[str, ChangeKind]:
    return {c.job_id: c.kind for c in s.changes}


def nodes(*gpus: int, gpu_type: str | None = None, per_node: int = 0) -> ClusterCapacity:
    return ClusterCapacity(
        tuple(NodeCapacity(f"n{i}", g, gpu_type) for i, g in enumerate(gpus)), per_node
    )


# -- capacity --------------------------------------------------------------------------


def test_capacity_is_a_list_of_nodes_and_the_static_shape_one_way_to_build_it() -> None:
    mixed = ClusterCapacity((NodeCapacity("big", 8, "h100"), NodeCapacity("small", 4, "a10")))
    assert mixed.gpus_per_node == 8, "a whole node is the largest one's GPUs"
    assert mixed.total_gpus == 12
    assert ClusterCapacity.uniform(2, 4) == ClusterCapacity(
        (NodeCapacity("node-0", 4), NodeCapacity("node-1", 4)), 4
    )


@pytest.mark.parametrize("scheduler", BOTH)
def test_a_job_of_a_gpu_type_runs_only_on_nodes_of_that_type(scheduler: Scheduler) -> None:
    cluster = ClusterCapacity((NodeCapacity("a", 4, "a10"), NodeCapacity("h", 4, "h100")))
    s = scheduler(10.0, cluster, [job("x", replicas=2, gpu_type="h100")], None)
    (x,) = s.holdings
    assert x.replicas == 2 and {name for name, _ in x.placement} == {"h"}
    none = scheduler(10.0, cluster, [job("y", replicas=2, gpu_type="v100")], None)
    assert held(none) == {"y": 0}, "no node of its type: it waits"


def test_a_job_of_a_gpu_type_is_moved_off_a_node_of_another_type() -> None:
    cluster = ClusterCapacity((NodeCapacity("a", 4, "a10"), NodeCapacity("h", 4, "h100")))
    s = schedule(10_000.0, cluster, [job("x", (("a", 2),), replicas=2, gpu_type="h100")])
    (x,) = s.holdings
    assert {name for name, _ in x.placement} == {"h"}


# -- quotas ------------------------------------------------------------------------------


def test_a_guarantee_walks_each_group_in_order_and_passes_over_what_does_not_fit() -> None:
    jobs = [
        job("a1", group="a", replicas=3),
        job("a2", group="a", replicas=2),
        job("a3", group="a", replicas=1),
        job("b1", group="b", replicas=1),
        job("x", replicas=1),
    ]
    need = {j.job_id: j.requested_replicas for j in jobs}
    got = guarantee(jobs, need, {"b1": 1}, {"a": 4, "b": 1})
    assert got == {"a1": 3, "a3": 1}, "a2 does not fit what a1 left; b1 keeps its own"


def test_quotas_shrink_alike_when_the_cluster_cannot_hold_them() -> None:
    cluster = nodes(4, 4, per_node=4)
    quotas = (GroupQuota("a", 6), GroupQuota("b", 2))
    assert ClusterCapacity(cluster.nodes, 4, quotas).guaranteed() == {"a": 6, "b": 2}
    assert ClusterCapacity(cluster.nodes, 4, quotas).guaranteed(held_elsewhere=4) == {
        "a": 3,
        "b": 1,
    }


@pytest.mark.parametrize("scheduler", BOTH)
def test_a_quotas_owner_gets_its_gpus_back_from_borrowers_in_the_next_round(
    scheduler: Scheduler,
) -> None:
    cluster = ClusterCapacity(nodes(4, 4).nodes, 4, (GroupQuota("team", 4),))
    # the team was idle: borrowers (no group) hold every GPU
    borrowers = [
        job("b0", (("n0", 4),), replicas=4, max_replicas=4),
        job("b1", (("n1", 4),), replicas=4, max_replicas=4),
    ]
    idle = scheduler(10_000.0, cluster, borrowers, None)
    assert sum(held(idle).values()) == 8, "idle quota is lent"
    asks = [*borrowers, job("mine", at=10_000.0, replicas=2, group="team", max_replicas=2)]
    s = scheduler(10_060.0, cluster, asks, None)
    assert held(s)["mine"] == 2, "the owner's job runs in the round after it asks"
    assert any(kinds(s).get(b) in (ChangeKind.SUSPEND, ChangeKind.SHRINK) for b in ("b0", "b1"))
    assert sum(held(s).values()) <= 8


def test_a_gang_larger_than_its_quota_only_borrows() -> None:
    cluster = ClusterCapacity(nodes(4, 4).nodes, 4, (GroupQuota("team", 2),))
    running = [job("b", (("n0", 4),), replicas=4), job("c", (("n1", 4),), replicas=4)]
    late = job("mine", at=10_000.0, replicas=4, group="team")
    s = tiresias(10_060.0, cluster, [*running, late])
    assert held(s)["mine"] == 0, "4 GPUs is past a quota of 2: it borrows, and none is idle"
    assert held(s)["b"] == 4 and held(s)["c"] == 4


def test_an_elastic_job_gets_its_quota_and_may_borrow_beyond_it() -> None:
    cluster = ClusterCapacity(nodes(4, 4).nodes, 4, (GroupQuota("team", 2),))
    running = [job("b", (("n0", 4),), replicas=4), job("c", (("n1", 4),), replicas=4)]
    late = job("mine", at=10_000.0, replicas=4, group="team")
    s = schedule(10_060.0, cluster, [*running, late])
    assert held(s)["mine"] >= 2, "its quota's 2 GPUs at least, as many as it can use"
    assert "its quota guarantees" not in "".join(c.reason for c in s.changes if c.job_id == "b")
    assert "team's quota guarantees 2" in next(c.reason for c in s.changes if c.job_id == "mine")


# -- priority ----------------------------------------------------------------------------


@pytest.mark.parametrize("scheduler", BOTH)
def test_a_higher_priority_job_is_admitted_first_and_preempts_lower_ones(
    scheduler: Scheduler,
) -> None:
    cluster = nodes(4, per_node=4)
    low = job("low", (("n0", 4),), replicas=4, priority=0, fixed=True)
    high = job("high", at=10_000.0, replicas=4, priority=10, fixed=True)
    s = scheduler(10_060.0, cluster, [low, high], None)
    assert held(s) == {"high": 4, "low": 0}
    assert kinds(s) == {"high": ChangeKind.ADMIT, "low": ChangeKind.SUSPEND}
    # both waiting: the higher one goes first, whatever their ids
    both = [job("a", replicas=4, fixed=True), job("z", replicas=4, priority=1, fixed=True)]
    assert held(scheduler(60.0, cluster, both, None)) == {"a": 0, "z": 4}


def test_goodput_cluster_admits_by_priority_then_shares_by_goodput() -> None:
    """Priority orders who gets GPUs when not everyone can; those admitted share the
    cluster by the objective, as equals."""
    cluster = nodes(2, per_node=2)
    low = job("low", (("n0", 2),), replicas=2, priority=0)
    high = job("high", at=10_000.0, replicas=2, priority=10)
    s = schedule(10_060.0, cluster, [low, high])
    assert held(s) == {"high": 1, "low": 1}
    jobs = [job("a", priority=0), job("b", priority=3), job("c", priority=1)]
    assert held(schedule(60.0, nodes(2, per_node=2), jobs)) == {"a": 0, "b": 1, "c": 1}


def test_equal_priorities_leave_goodput_cluster_as_it_was() -> None:
    """Priority changes nothing among equals: the same jobs at priority 7 each get the
    schedule they get at 0."""
    cluster = nodes(4, 4, per_node=4)
    jobs = [
        job("a", (("n0", 2),), replicas=2, max_replicas=8),
        job("b", replicas=1, max_replicas=8),
        job("c", replicas=1, max_replicas=8),
    ]
    base = schedule(10_000.0, cluster, jobs)
    raised = [replace(j, priority=7) for j in jobs]
    assert schedule(10_000.0, cluster, raised).holdings == base.holdings


# -- Kueue -------------------------------------------------------------------------------


@pytest.mark.parametrize("scheduler", BOTH)
def test_kueues_jobs_are_never_admitted_or_suspended_and_keep_their_gpus(
    scheduler: Scheduler,
) -> None:
    cluster = ClusterCapacity(nodes(4, 4).nodes, 4, (GroupQuota("team", 8),))
    kueue_running = job("k", (("n0", 4),), replicas=4, kueue=True, priority=-5)
    kueue_waiting = job("w", replicas=2, kueue=True, priority=100)
    owner = job("mine", at=10_000.0, replicas=4, group="team", priority=50)
    borrower = job("b", (("n1", 4),), replicas=4)
    s = scheduler(10_060.0, cluster, [kueue_running, kueue_waiting, owner, borrower], None)
    assert "w" not in kinds(s) and held(s)["w"] == 0, "Kueue admits it, not the brain"
    assert "k" not in kinds(s) or kinds(s)["k"] in (ChangeKind.SHRINK, ChangeKind.REBATCH)
    k = next(h for h in s.holdings if h.job_id == "k")
    assert k.replicas >= 1 and all(name == "n0" for name, _ in k.placement)
    assert used_gpus(s.holdings).get("n0", 0) <= 4
    assert held(s)["mine"] == 4, "the quota is honoured from what Kueue does not hold"


def test_set_aside_takes_what_kueues_running_jobs_hold_off_the_capacity() -> None:
    cluster = nodes(4, 4, per_node=4)
    left, kept = set_aside(
        cluster, [job("k", (("n0", 3), ("gone", 2)), kueue=True), job("w", kueue=True)]
    )
    assert kept == {"k": {"n0": 3}}
    assert [n.gpus for n in left.nodes] == [1, 4]


# -- properties of any round -------------------------------------------------------------

Round = tuple[ClusterCapacity, list[JobInput]]


@st.composite
def rounds(draw: st.DrawFn) -> Round:
    """A cluster of 4-GPU nodes, quotas that fit it, and jobs of 1, 2 or 4 GPUs (sizes a
    node divides, so any count that fits can be packed): some running, some Kueue's."""
    count = draw(st.integers(1, 4))
    cluster_nodes = tuple(NodeCapacity(f"n{i}", 4) for i in range(count))
    groups = draw(st.lists(st.sampled_from(["a", "b"]), unique=True, max_size=2))
    total = 4 * count
    quotas: list[GroupQuota] = []
    for g in groups:
        gpus = draw(st.integers(0, total - sum(q.gpus for q in quotas)))
        quotas.append(GroupQuota(g, gpus))
    free = {n.name: 4 for n in cluster_nodes}
    jobs = []
    for i in range(draw(st.integers(0, 9))):
        size = draw(st.sampled_from([1, 2, 4]))
        placement: Placement = ()
        if draw(st.booleans()):
            fits = [name for name, f in free.items() if f >= size]
            if fits:
                name = draw(st.sampled_from(fits))
                free[name] -= size
                placement = ((name, size),)
        jobs.append(
            job(
                f"j{i}",
                placement,
                at=draw(st.sampled_from([0.0, 5_000.0])),
                replicas=size,
                priority=draw(st.sampled_from([0, 0, 1, 5])),
                group=draw(st.sampled_from([None, "a", "b"])),
                kueue=draw(st.booleans()) and draw(st.booleans()),
                max_replicas=size,
            )
        )
    return ClusterCapacity(cluster_nodes, 4, tuple(quotas)), jobs


@settings(max_examples=200, deadline=None)
@given(rounds(), st.sampled_from(BOTH))
def test_any_round_keeps_capacity_quotas_priority_and_kueue(
    round_: Round, scheduler: Scheduler
) -> None:
    cluster, jobs = round_
    s = scheduler(10_000.0, cluster, jobs, None)
    after = {h.job_id: h for h in s.holdings}
    gpus = {n.name: n.gpus for n in cluster.nodes}
    # never more GPUs than a node has
    for name, used in used_gpus(s.holdings).items():
        assert used <= gpus[name], (name, used)
    # Kueue's jobs: never admitted or suspended, never beyond what they hold
    changed = {c.job_id: c for c in s.changes}
    for j in jobs:
        if not j.kueue_managed:
            continue
        if j.job_id in changed:
            assert changed[j.job_id].kind in (ChangeKind.SHRINK, ChangeKind.REBATCH)
        mine = dict(j.placement)
        for name, g in after[j.job_id].placement:
            assert g <= mine.get(name, 0), (j.job_id, after[j.job_id].placement)
        assert bool(after[j.job_id].replicas) == bool(j.placement)
    ours = [j for j in jobs if not j.kueue_managed]
    kueue_gpus = sum(g for j in jobs if j.kueue_managed for _, g in j.placement)
    owed = cluster.guaranteed(kueue_gpus)
    idle = cluster.total_gpus - sum(h.replicas for h in s.holdings)
    for w in ours:
        if after[w.job_id].replicas:
            continue
        need = w.requested_replicas
        # a quota's owner waits only when its quota is full without this job
        if w.group in owed:
            group_holds = sum(after[j.job_id].replicas for j in ours if j.group == w.group)
            assert group_holds + need > owed[w.group], (w.job_id, group_holds, owed)
        # no job waits while jobs of lower priority borrow (no group) GPUs it could have
        lower = sum(
            after[j.job_id].replicas for j in ours if j.group is None and j.priority < w.priority
        )
        assert lower + idle < need, (w.job_id, lower, idle)


# -- what a submission says --------------------------------------------------------------

GROUP = r"[A-Za-z0-9][A-Za-z0-9._@-]{0,40}"
AT = datetime(2026, 1, 1, tzinfo=UTC)


@settings(max_examples=100, deadline=None)
@given(
    st.from_regex(GROUP, fullmatch=True),
    st.integers(-(2**31), 2**31 - 1),
    st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,30}[A-Za-z0-9])?", fullmatch=True),
)
def test_a_submissions_sharing_fields_survive_the_wire(
    group: str, priority: int, queue: str
) -> None:
    event = JobSubmitted(
        env="e",
        job=JobMeta(uuid="j"),
        occurred_at=AT,
        priority=priority,
        group=group,
        kueue_queue=queue,
    )
    assert decode(encode(event)) == event


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=20).filter(lambda t: not re.fullmatch(GROUP, t)))
def test_a_group_name_outside_the_pattern_is_refused_naming_the_field(group: str) -> None:
    with pytest.raises(ValidationError) as err:
        JobSubmitted(
            env="e",
            job=JobMeta(uuid="j"),
            occurred_at=datetime(2026, 1, 1, tzinfo=UTC),
            group=group,
        )
    assert err.value.errors()[0]["loc"][0] == "group"
