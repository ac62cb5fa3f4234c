"""Retention's pure part: which finished jobs become tombstones and which tombstones go,
the settings that say when, and what the processor does with pruned jobs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import encode
from schemas.env_settings import BrainSettings
from schemas.jobs import JobMeta, JobStarted
from streams.brain.core.policy import Policy
from streams.brain.core.processor import BrainProcessor
from streams.brain.core.retention import Finished, Pruning, select
from streams.brain.core.snapshot import Loaded
from streams.brain.core.state import JobState, JobStatus
from tests.unit.brain.builders import ENV, T0, Rec

DAY = timedelta(days=1)
RULES = BrainSettings(retention_s=7 * 86400, tombstone_s=30 * 86400, max_tombstones=3)
NOW = T0 + 100 * DAY


def ended(uuid: str, days_ago: float, pruned: bool = False) -> Finished:
    return Finished(uuid, NOW - days_ago * DAY, pruned)


def test_a_job_is_kept_until_the_retention_has_passed() -> None:
    assert select([ended("a", 6.9), ended("b", 0)], NOW, RULES) == Pruning()


def test_a_job_past_the_retention_becomes_a_tombstone() -> None:
    chosen = select([ended("b", 7), ended("a", 8), ended("c", 1)], NOW, RULES)
    assert chosen == Pruning(tombstone=("a", "b"))


def test_a_tombstone_is_not_made_again_and_goes_after_its_own_time() -> None:
    jobs = [ended("t1", 20, pruned=True), ended("t2", 37, pruned=True), ended("t3", 36.9, True)]
    assert select(jobs, NOW, RULES) == Pruning(delete=("t2",))


def test_a_job_past_both_times_is_deleted_without_a_tombstone_first() -> None:
    assert select([ended("old", 40)], NOW, RULES) == Pruning(delete=("old",))


def test_only_the_newest_tombstones_are_kept() -> None:
    jobs = [
        ended("t-old", 20, pruned=True),
        ended("t-new", 8, pruned=True),
        ended("j-9", 9),
        ended("j-10", 10),
        ended("j-10b", 10),  # same end as j-10: the id decides, the same at every prune
    ]
    chosen = select(jobs, NOW, RULES)
    assert chosen == Pruning(tombstone=("j-10b", "j-9"), delete=("j-10", "t-old"))


def test_no_tombstones_at_all() -> None:
    rules = BrainSettings(retention_s=86400, tombstone_s=0, max_tombstones=0)
    chosen = select([ended("a", 2), ended("t", 1.5, pruned=True), ended("b", 0.5)], NOW, rules)
    assert chosen == Pruning(delete=("a", "t"))


@given(
    st.lists(st.tuples(st.floats(0, 60), st.booleans()), max_size=30, unique_by=lambda x: x[0]),
    st.integers(0, 10),
)
def test_select_keeps_its_bounds(ends: list[tuple[float, bool]], most: int) -> None:
    rules = BrainSettings(retention_s=7 * 86400, tombstone_s=20 * 86400, max_tombstones=most)
    jobs = [ended(f"j{i}", days, pruned) for i, (days, pruned) in enumerate(ends)]
    chosen = select(jobs, NOW, rules)
    by_id = {j.job_uuid: j for j in jobs}
    assert not set(chosen.tombstone) & set(chosen.delete)
    for uuid in chosen.tombstone:  # only jobs past the retention, not yet tombstones
        assert not by_id[uuid].pruned and by_id[uuid].finished_at <= NOW - 7 * DAY
    for uuid in chosen.delete:  # only tombstones or jobs past the retention
        assert by_id[uuid].pruned or by_id[uuid].finished_at <= NOW - 7 * DAY
    left = [j for j in jobs if j.pruned and j.job_uuid not in chosen.delete]
    assert len(left) + len(chosen.tombstone) <= most
    kept_recent = [j for j in jobs if not j.pruned and j.finished_at > NOW - 7 * DAY]
    assert not {j.job_uuid for j in kept_recent} & {*chosen.tombstone, *chosen.delete}
    # pruning again at the same time changes nothing more
    after = [
        Finished(j.job_uuid, j.finished_at, j.pruned or j.job_uuid in chosen.tombstone)
        for j in jobs
        if j.job_uuid not in chosen.delete
    ]
    assert select(after, NOW, rules) == Pruning()


def test_retention_settings() -> None:
    assert Policy().settings.retention_s == 7 * 86400  # the history optimizers' 7 days
    assert Policy.from_settings({}) == Policy()
    kept = Policy.from_settings({"retention_s": None}).settings
    assert select([ended("a", 400)], NOW, kept) == Pruning()  # finished jobs kept
    custom = Policy.from_settings(
        {"retention_s": 3600, "tombstone_s": 60, "max_tombstones": 5, "prune_every_s": 10}
    ).settings
    assert (custom.retention_s, custom.tombstone_s, custom.max_tombstones) == (3600, 60, 5)
    assert custom.prune_every_s == 10
    for bad in ({"retention_s": 0}, {"max_tombstones": -1}, {"tombstone_s": "x"}):
        with pytest.raises(ValueError, match="env setting brain"):
            Policy.from_settings(bad)


JOB = JobMeta(uuid="job-r", scenario="s")
TOPIC = f"{ENV}.job.events"


def test_a_pruned_job_is_finished_for_the_processor_and_teaches_no_history() -> None:
    tombstone = JobState(
        env=ENV, job=JOB, status=JobStatus.COMPLETED, completed_at=T0, pruned_at=T0 + 7 * DAY
    )
    p = BrainProcessor(ENV, f"{ENV}.brain")
    p.install([1], Loaded({JOB.uuid: (1, tombstone)}, {}, {JOB.uuid: 1}))
    assert p.finished == {JOB.uuid: 1} and p.states == {}
    assert p._history_for(None, JobStarted(env=ENV, job=JOB)) == ()

    late = JobStarted(env=ENV, job=JOB, occurred_at=T0 + 8 * DAY)
    p.process([Rec(TOPIC, 1, 0, JOB.uuid.encode(), encode(late))])
    assert p.states == {} and p.counters.late == 1  # ignored, not a new job
    assert p.event_time == T0 + 8 * DAY

    p.forget([JOB.uuid])  # its tombstone deleted: now a job like any unknown one
    p.process([Rec(TOPIC, 1, 1, JOB.uuid.encode(), encode(late))])
    assert JOB.uuid in p.states and p.counters.late == 1
