from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import JobMeta, JobSubmitted, RuntimeSample, ScalePlan
from streams.replay.core import (
    Pacer,
    Recorded,
    Selection,
    TimeMerge,
    merge_in_time,
    retarget,
)


def rec(partition: int, offset: int, ts: int) -> Recorded:
    return Recorded("t", partition, offset, ts, None, None, None)


@given(st.lists(st.lists(st.integers(0, 1000), max_size=15), min_size=1, max_size=5))
def test_merge_keeps_every_record_and_each_stream_in_order(stamps: list[list[int]]) -> None:
    streams = [[rec(p, o, ts) for o, ts in enumerate(s)] for p, s in enumerate(stamps)]
    merged = list(merge_in_time(streams))
    assert sorted((r.partition, r.offset) for r in merged) == sorted(
        (r.partition, r.offset) for s in streams for r in s
    )
    for p in range(len(streams)):
        assert [r.offset for r in merged if r.partition == p] == list(range(len(stamps[p])))


@given(st.lists(st.lists(st.integers(0, 1000), max_size=15).map(sorted), min_size=1, max_size=5))
def test_merge_of_time_ordered_streams_is_time_ordered(stamps: list[list[int]]) -> None:
    streams = [[rec(p, o, ts) for o, ts in enumerate(s)] for p, s in enumerate(stamps)]
    times = [r.timestamp_ms for r in merge_in_time(streams)]
    assert times == sorted(times)


def test_streaming_merge_waits_for_every_open_stream() -> None:
    merge: TimeMerge[str] = TimeMerge(["a", "b"])
    merge.add("a", [rec(0, 0, 5)])
    assert merge.needs() == ["b"]
    assert merge.pop() is None, "b might still have an earlier record"
    merge.add("b", [rec(1, 0, 3)])
    assert merge.pop() == rec(1, 0, 3)
    assert merge.needs() == ["b"]
    merge.close("b")
    assert merge.pop() == rec(0, 0, 5)
    assert merge.needs() == ["a"]
    merge.close("a")
    assert merge.done


def test_pacer_scales_relative_time() -> None:
    assert Pacer(10).due_s(1_000, 21_000) == pytest.approx(2.0)
    assert Pacer(None).due_s(1_000, 21_000) == 0.0
    assert Pacer(1).due_s(5_000, 4_000) == 0.0  # late records are due now, not in the past


def test_selection_copies_a_jobs_first_phase_only() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    job = JobMeta(uuid="j")
    sel = Selection()
    before = RuntimeSample(env="prod", job=job, global_step=1, occurred_at=t0)
    after = RuntimeSample(env="prod", job=job, global_step=2, occurred_at=t0 + timedelta(60))
    assert sel.wants(before) and sel.wants(after)
    sel.observe(ScalePlan(env="prod", job=job, plan_id="p", occurred_at=t0 + timedelta(1)))
    assert sel.wants(before)
    assert not sel.wants(after)
    assert sel.wants(JobSubmitted(env="prod", job=job))
    assert Selection(first_phase_only=False).wants(after)
    assert not Selection(types=("job.submitted",)).wants(before)


def test_retarget_keeps_identity_and_changes_env() -> None:
    event = JobSubmitted(env="prod", job=JobMeta(uuid="j"))
    moved = retarget(event, "shadow-a")
    assert moved.env == "shadow-a"
    assert moved.event_id == event.event_id
    assert moved.key == "j"
