"""A job's memo keeps goodput's observations as a series in step with the folds.

The memo numbers the job's samples as the fold appends and drops them, so a decision
derives only the samples folded since the last one and trims those the fold dropped. These
tests hold the kept series to the series made afresh from the job's samples, for any run
of folds (replays of an id, samples out of order, past MAX_SAMPLES, a step the processor
did not keep, the job's GPUs or batch changing between decisions), and check that a
decision reads no sample but the new ones.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.jobs import NodeUsage, RuntimeSample
from streams.brain.core.folds import fold
from streams.brain.core.memo import SERIES_LIMIT, DerivedSeries, SampleMemo, series
from streams.brain.core.optimizers import gpu
from streams.brain.core.optimizers.gpu import StepObservation, observations, observed
from streams.brain.core.samples import Sample
from streams.brain.core.state import MAX_SAMPLES, WORKER, JobState, RoleResources
from tests.unit.brain.builders import ENV, T0, meta, state

# -- DerivedSeries alone: kept by extend and drop == made afresh -------------------------------


def _key(value: int) -> int:
    return value % 3


def _fresh(derived: list[int | None]) -> DerivedSeries[int, int]:
    made: DerivedSeries[int, int] = DerivedSeries(_key)
    made.extend(derived)
    return made


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.lists(st.none() | st.integers(0, 9), max_size=6),  # derived of new samples
            st.integers(0, 8),  # then samples dropped from the front
        ),
        max_size=25,
    )
)
def test_series_kept_by_extend_and_drop_equals_one_made_afresh(
    steps: list[tuple[list[int | None], int]],
) -> None:
    kept: DerivedSeries[int, int] = DerivedSeries(_key)
    covered: list[int | None] = []
    for new, drop in steps:
        kept.extend(new)
        covered.extend(new)
        drop = min(drop, len(covered))
        kept.drop(drop)
        del covered[:drop]
        want = _fresh(covered)
        assert len(kept) == len(covered)
        assert kept.values == want.values == [v for v in covered if v is not None]
        assert kept.counts == want.counts
        assert all(kept.counts.values())  # no key left at zero


def test_series_without_a_key_counts_nothing() -> None:
    kept: DerivedSeries[int, int] = DerivedSeries()
    kept.extend([1, None, 2])
    kept.drop(2)
    assert kept.values == [2] and kept.counts == {} and len(kept) == 1


# -- the memo's series over folded jobs --------------------------------------------------


def _event(n: int, step: int, workers: int, local_batch: int | None) -> RuntimeSample:
    """Sample `n` of a pool (its step time says which): ids repeat across the pool's
    uses (replays), and `step` sets its time, so samples arrive out of order."""
    return RuntimeSample(
        event_id=uuid.UUID(int=n + 1),
        env=ENV,
        job=meta(),
        occurred_at=T0 + timedelta(seconds=15 * step),
        global_step=step,
        local_batch_size=local_batch,
        batch_size=96,
        nodes=[
            NodeUsage(type=WORKER, id=k, step_time=1.0 + 0.1 * workers + 0.001 * n)
            for k in range(workers)
        ],
    )


def _fresh_observed(job: JobState) -> DerivedSeries[StepObservation, int]:
    return observed(job, WORKER)  # no memo: made afresh from the job's samples


def _assert_same(job: JobState, memo: SampleMemo) -> None:
    kept = observed(job, WORKER, memo)
    want = _fresh_observed(job)
    assert kept.values == want.values
    assert kept.counts == want.counts
    assert observations(job, WORKER, memo) == want.values


_OPS = st.one_of(
    st.tuples(
        st.just("fold"),
        st.integers(0, 100),  # which sample: ids below 100 repeat now and then
        st.integers(0, 200),  # its step, in any order
        st.integers(1, 4),  # workers
        st.none() | st.sampled_from([16, 32]),  # says its local batch, or not
    ),
    st.tuples(st.just("decide")),
    st.tuples(st.just("forget"), st.integers(1, 5)),  # the processor keeps an older state
    st.tuples(st.just("older"), st.integers(1, 5)),  # a decision on an older state
    st.tuples(st.just("gpus"), st.integers(0, 3)),  # the job's GPUs per worker change
    st.tuples(st.just("batch"), st.none() | st.integers(1, 64)),  # the local batch told
)


@settings(max_examples=150, deadline=None)
@given(first=st.integers(0, MAX_SAMPLES + 5), ops=st.lists(_OPS, min_size=20, max_size=60))
def test_memo_series_equals_the_series_made_afresh_for_any_folds(
    first: int, ops: list[tuple[Any, ...]]
) -> None:
    """`first` samples folded in order (so that runs go past MAX_SAMPLES), then `ops`."""
    memo = SampleMemo()
    job: JobState = state(roles={WORKER: RoleResources(gpu_num=1)})
    history = [job]
    for n in range(first):
        folded = fold(job, _event(200 + n, n, 1 + n % 3, 32), memo)
        assert folded is not None
        job = folded
        history.append(job)
    for op in ops:
        match op:
            case ("fold", n, step, workers, local_batch):
                folded = fold(job, _event(n, step, workers, local_batch), memo)
                assert folded is not None
                job = folded
                history.append(job)
            case ("decide",):
                _assert_same(job, memo)
            case ("forget", back):
                job = history[max(len(history) - 1 - back, 0)]
                history.append(job)
            case ("older", back):
                _assert_same(history[max(len(history) - 1 - back, 0)], memo)
            case ("gpus", gpu_num):
                job = job.model_copy(update={"roles": {WORKER: RoleResources(gpu_num=gpu_num)}})
                history.append(job)
            case ("batch", local_batch):
                training = {} if local_batch is None else {"local_batch_size": local_batch}
                job = job.model_copy(update={"training": training})
                history.append(job)
    _assert_same(job, memo)
    assert len(job.samples) <= MAX_SAMPLES
    # what the memo holds is bounded by the job's samples, whatever the folds were
    assert len(memo) <= 2 * SERIES_LIMIT * (MAX_SAMPLES + 256)


def _rows(count: int, start: int = 0) -> list[RuntimeSample]:
    return [_event(n, n, 1 + n % 3, 32) for n in range(start, start + count)]


@pytest.fixture
def derived(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The samples goodput derives an observation of, in order."""
    calls: list[str] = []
    derive = gpu._seen

    def counting(sample: Sample, args: gpu.ObserveArgs) -> StepObservation | None:
        calls.append(sample.event_id)
        return derive(sample, args)

    monkeypatch.setattr(gpu, "_seen", counting)
    return calls


def test_a_decision_derives_the_samples_folded_since_the_last(derived: list[str]) -> None:
    memo = SampleMemo()
    job: JobState | None = state(roles={WORKER: RoleResources(gpu_num=1)})
    events = _rows(MAX_SAMPLES + 30)
    for i, event in enumerate(events):
        job = fold(job, event, memo)
        assert job is not None
        if i % 7 == 6:
            derived.clear()
            _assert_same(job, memo)
            # the kept series derived the (up to) 7 samples folded since; afresh: all
            assert derived[: len(derived) - len(job.samples)] == [
                s.event_id for s in job.samples[-7:]
            ]


class _Watched(list[Sample]):
    """The job's sample list, saying which of its samples were read."""

    reads: list[Any]

    def __iter__(self) -> Any:
        self.reads.append("all")
        return super().__iter__()

    def __getitem__(self, index: Any) -> Any:
        self.reads.append(index)
        return super().__getitem__(index)


def test_a_decision_reads_no_sample_but_the_new_ones() -> None:
    """Reading a sample kept for 60 decisions costs a cache miss at each: the kept
    series reads the samples folded since its last read, never the others."""
    pool = [s for s in fold_all(_rows(12)).samples]
    memo = SampleMemo()
    args = (WORKER, 1, (None, None))
    first = _Watched(pool[:8])
    first.reads = []
    memo.keep(first, memo.ids_of(first), ())  # a fold made `first`
    assert series(memo, "goodput", args, first, gpu._seen).values == (
        series(None, "goodput", args, list(first), gpu._seen).values
    )
    ids = memo.ids_of(first)
    second = _Watched([*pool[3:8], *pool[8:11]])  # a fold dropped 3 and appended 3
    second.reads = []
    memo.keep(second, ids, pool[:3])
    kept = series(memo, "goodput", args, second, gpu._seen)
    assert second.reads == [slice(5, None, None)]  # the 3 new ones only
    assert kept.values == series(None, "goodput", args, list(second), gpu._seen).values
    second.reads.clear()
    assert series(memo, "goodput", args, second, gpu._seen) is kept  # nothing new
    assert second.reads == []


def fold_all(events: list[RuntimeSample]) -> JobState:
    job: JobState | None = None
    for event in events:
        job = fold(job, event)
    assert job is not None
    return job


def test_a_memo_holds_few_series_however_often_the_arguments_change() -> None:
    memo = SampleMemo()
    job = fold_all(_rows(10))
    for local_batch in range(1, 3 * SERIES_LIMIT):
        told = job.model_copy(update={"training": {"local_batch_size": local_batch}})
        assert observations(told, WORKER, memo) == list(_fresh_observed(told).values)
    assert len(memo) <= SERIES_LIMIT * len(job.samples)
