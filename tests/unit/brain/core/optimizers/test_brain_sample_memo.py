"""A job's memo (`streams.brain.core.memo`) gives what a plain computation gives.

goodput's observations and the straggler detector read every sample of a job at every
decision, so what they derive from a sample is made once per sample, in the job's memo;
these tests hold them to a straightforward computation from the samples, edge cases
included, with and without a memo, and check that nothing a memo keeps leaks from one
job's state into another's or outlives the samples the job keeps.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.jobs import NodeUsage, RuntimeSample
from streams.brain.core.folds import fold
from streams.brain.core.memo import TABLE_LIMIT, SampleMemo
from streams.brain.core.optimizers import gpu
from streams.brain.core.optimizers.gpu import (
    StepObservation,
    StragglerParams,
    find_stragglers,
    observations,
)
from streams.brain.core.optimizers.numeric import median
from streams.brain.core.samples import Sample
from streams.brain.core.state import (
    MAX_SAMPLES,
    WORKER,
    JobState,
    NodeStatus,
    RoleResources,
    node_key,
)
from tests.unit.brain.builders import ENV, T0, meta, node, nodes, state

# -- straightforward computations, as the optimizers read samples without memos --------


def _plain_observations(job: JobState, role: str) -> list[StepObservation]:
    per_gpu = max(job.role(role).gpu_num, 1)
    found = []
    for sample in job.samples:
        usages = [u for u in sample.nodes if u.type == role]
        if not usages:
            continue
        times = [u.step_time for u in usages if u.step_time is not None and u.step_time > 0]
        if times:
            step_time = median(times)
        elif sample.speed > 0:
            step_time = 1 / sample.speed
        else:
            continue
        found.append(
            StepObservation(
                replicas=len(usages),
                gpus=len(usages) * per_gpu,
                # what the window leaves out of its memo; not itself under test
                local_batch=gpu._local_batch(job, sample, len(usages)),
                accumulation=sample.accumulation_steps,
                step_time=step_time,
            )
        )
    return found


def _plain_outliers(sample: Sample, p: StragglerParams) -> dict[str, float] | None:
    times = {
        node_key(u.type, u.id): u.step_time
        for u in sample.nodes
        if u.type == p.role and u.step_time is not None
    }
    if len(times) < p.min_nodes:
        return None
    mid = median(times.values())
    mad = median(abs(t - mid) for t in times.values())
    return {
        key: t for key, t in times.items() if t > mid + p.k * mad and t > mid * (1 + p.min_ratio)
    }


def _plain_stragglers(job: JobState, p: StragglerParams) -> dict[str, float]:
    window = [s for s in job.samples if any(u.type == p.role for u in s.nodes)][-p.window :]
    if len(window) < p.window:
        return {}
    common: dict[str, float] | None = None
    for sample in window:
        slow = _plain_outliers(sample, p)
        if slow is None:
            return {}
        common = slow if common is None else {k: slow[k] for k in common if k in slow}
    alive = {
        key: t
        for key, t in (common or {}).items()
        if (n := job.nodes.get(key)) is None or n.status == NodeStatus.RUNNING
    }
    return dict(sorted(alive.items()))


# -- jobs whose samples are folded as the brain folds them -------------------------------


def _usage(role: str, node_id: int, step_time: float | None) -> NodeUsage:
    return NodeUsage(type=role, id=node_id, step_time=step_time)


def _job(rows: list[dict[str, Any]], memo: SampleMemo | None = None, **fields: Any) -> JobState:
    """A job with one folded sample per row (RuntimeSample fields; `nodes` as usages)."""
    job: JobState | None = state(**fields)
    for i, row in enumerate(rows):
        event = RuntimeSample(
            event_id=uuid.UUID(int=i + 1),
            env=ENV,
            job=meta(),
            occurred_at=T0 + timedelta(seconds=15 * (i + 1)),
            global_step=i,
            **row,
        )
        job = fold(job, event, memo)
    assert job is not None
    return job


def _workers(*times: float | None) -> list[NodeUsage]:
    return [_usage(WORKER, i, t) for i, t in enumerate(times)]


EDGE_ROWS: list[dict[str, Any]] = [
    {"nodes": _workers(1.0, 1.2, 1.1), "local_batch_size": 32},
    {"nodes": _workers(None, None), "speed": 2.0},  # no step time: the sample's speed
    {"nodes": _workers(None, 0.0), "speed": 0.0},  # says nothing
    {"nodes": _workers(0.9, 0.0, None, 1.0), "local_batch_size": 16, "accumulation_steps": 2},
    {"nodes": [_usage("ps", 0, 1.0)], "speed": 1.0},  # the role missing
    {"nodes": []},
    {"nodes": _workers(1.5, 1.5), "batch_size": 96},  # local batch from the global one
    {"nodes": _workers(1.5, 1.5, 1.5), "batch_size": 100},  # does not divide
    {"nodes": _workers(1.5), "batch_size": 64, "accumulation_steps": 4},
]


def test_observations_of_a_job_without_samples() -> None:
    assert observations(state(), WORKER) == [] == _plain_observations(state(), WORKER)
    assert observations(state(), WORKER, SampleMemo()) == []


def test_observations_match_a_plain_computation_on_edge_cases() -> None:
    for gpu_num in (0, 1, 2):
        for batch_size in (None, 128):
            job = _job(
                EDGE_ROWS,
                roles={WORKER: RoleResources(replicas=2, gpu_num=gpu_num)},
                batch_size=batch_size,
            )
            want = _plain_observations(job, WORKER)
            memo = SampleMemo()
            assert observations(job, WORKER) == want
            assert observations(job, WORKER, memo) == want
            assert observations(job, WORKER, memo) == want  # and again, from the memo
    assert observations(_job(EDGE_ROWS), "ps") == _plain_observations(_job(EDGE_ROWS), "ps")
    assert observations(_job(EDGE_ROWS), "chief") == []


def test_observations_read_the_state_a_sample_is_decided_in() -> None:
    """The same sample objects in jobs that differ in GPUs per worker and in the known
    local batch: the memo keeps nothing that depends on the job."""
    memo = SampleMemo()
    first = _job(EDGE_ROWS, memo, roles={WORKER: RoleResources(gpu_num=1)})
    assert observations(first, WORKER, memo) == _plain_observations(first, WORKER)
    for update in (
        {"roles": {WORKER: RoleResources(gpu_num=4)}},
        {"training": {"local_batch_size": 8}},
        {"training": {}, "batch_size": 48},
        {"samples": [*first.samples, first.samples[0], first.samples[0]]},
    ):
        other = first.model_copy(update=update)
        assert observations(other, WORKER, memo) == _plain_observations(other, WORKER)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.fixed_dictionaries(
            {
                "nodes": st.lists(
                    st.builds(
                        _usage,
                        st.sampled_from([WORKER, "ps"]),
                        st.integers(0, 5),
                        st.none() | st.floats(0, 5, allow_nan=False),
                    ),
                    max_size=6,
                ),
                "speed": st.sampled_from([0.0, 0.5, 2.0]),
                "local_batch_size": st.none() | st.integers(1, 64),
                "batch_size": st.none() | st.sampled_from([60, 64, 128]),
                "accumulation_steps": st.integers(1, 3),
            }
        ),
        max_size=12,
    ),
    gpu_num=st.integers(0, 3),
)
def test_observations_and_stragglers_match_plain_computations(
    rows: list[dict[str, Any]], gpu_num: int
) -> None:
    memo = SampleMemo()
    job = _job(rows, memo, roles={WORKER: RoleResources(gpu_num=gpu_num)})
    for role in (WORKER, "ps"):
        assert observations(job, role) == _plain_observations(job, role)
        assert observations(job, role, memo) == _plain_observations(job, role)
        for p in (
            StragglerParams(role=role),
            StragglerParams(role=role, window=1, k=0.5),
            StragglerParams(role=role, window=2, k=0.1, min_ratio=0),
            StragglerParams(role=role, window=5, k=0.1, min_ratio=0),
        ):
            assert find_stragglers(job, p) == _plain_stragglers(job, p)
            assert find_stragglers(job, p, memo) == _plain_stragglers(job, p)


def _straggling(slow: list[float | None], others: int = 4) -> list[dict[str, Any]]:
    return [
        {"nodes": [*_workers(*[1.0 + 0.01 * i for i in range(others)]), _usage(WORKER, 9, t)]}
        for t in slow
    ]


def test_stragglers_match_a_plain_computation_on_edge_cases() -> None:
    cases = [
        _straggling([2.0, 2.1, 1.9]),
        _straggling([2.0, 1.0, 2.0]),
        _straggling([2.0, 2.0]),
        _straggling([2.0, None, 2.0], others=2),  # too few step times in one sample
        [*_straggling([2.0, 2.1]), {"nodes": [_usage("ps", 0, 1.0)]}, *_straggling([1.9])],
        [{"nodes": []}] * 4,
    ]
    for rows in cases:
        for status in (NodeStatus.RUNNING, NodeStatus.PENDING):
            memo = SampleMemo()
            job = _job(rows, memo).model_copy(
                update={"nodes": nodes(node(WORKER, 9, status=status))}
            )
            for p in (StragglerParams(), StragglerParams(window=2), StragglerParams(k=50)):
                assert find_stragglers(job, p) == _plain_stragglers(job, p)
                assert find_stragglers(job, p, memo) == _plain_stragglers(job, p)
    assert _plain_stragglers(_job(cases[0]), StragglerParams()) == {"worker-9": 1.9}


# -- the memo itself ---------------------------------------------------------------------


class _Derive:
    """A derivation that says what it was asked for."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def __call__(self, sample: Sample, args: str) -> str:
        self.calls.append((sample.event_id, args))
        return f"{sample.event_id}/{args}"


def _samples(count: int) -> list[Sample]:
    return list(_job([{"nodes": []}] * count).samples)


def _want(samples: list[Sample], args: str) -> list[str]:
    return [f"{s.event_id}/{args}" for s in samples]


def _role_job(rows: list[Sample], gpu_num: int = 1, **fields: Any) -> JobState:
    return state(roles={WORKER: RoleResources(gpu_num=gpu_num)}, samples=rows, **fields)


def _observed_samples(count: int, local_batch: int | None = 32) -> list[Sample]:
    rows = [
        {"nodes": _workers(*[1.0 + 0.1 * i] * (1 + i % 3)), "local_batch_size": local_batch}
        for i in range(count)
    ]
    return list(_job(rows).samples)


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


def test_memo_derives_only_the_samples_folded_since(derived: list[str]) -> None:
    rows = _observed_samples(12)
    memo = SampleMemo()
    for start, end in ((0, 6), (2, 9), (2, 9), (2, 10), (5, 10)):
        job = _role_job(rows[start:end])
        assert observations(job, WORKER, memo) == _plain_observations(job, WORKER)
    assert derived == [s.event_id for s in rows[:10]]  # each sample once
    assert observations(_role_job([]), WORKER, memo) == []


def test_memo_of_windows_that_do_not_continue_the_last(derived: list[str]) -> None:
    rows = _observed_samples(8)
    memo = SampleMemo()
    seen: set[str] = set()
    for window in (
        rows[:5],
        rows[3:4],  # shorter than the last
        [rows[4], rows[0], rows[0], rows[3]],  # reordered, a sample twice
        [rows[3], rows[6], rows[4]],  # continues, then not
        [rows[2], rows[6], rows[7]],  # starts like the last, goes on otherwise
        rows[5:8],
    ):
        derived.clear()
        job = _role_job(window)
        assert observations(job, WORKER, memo) == _plain_observations(job, WORKER)
        # only samples not derived before are derived, each once
        assert set(derived) == {s.event_id for s in window} - seen
        assert len(derived) == len(set(derived))
        seen |= {s.event_id for s in window}


def test_memo_holds_equal_ids_of_other_samples_apart() -> None:
    """A sample under an id the memo holds for another sample is derived anew: a value
    is only given back for an equal sample."""
    rows = _observed_samples(3)
    twin = _observed_samples(3)[0]
    assert twin == rows[0] and twin is not rows[0]
    other = _observed_samples(3, local_batch=8)[0]
    assert other.event_id == rows[0].event_id and other != rows[0]
    memo = SampleMemo()
    for window in (rows, [twin, *rows[1:]], [twin, rows[0]], [other, rows[1]], rows):
        job = _role_job(window)
        assert observations(job, WORKER, memo) == _plain_observations(job, WORKER)


def test_memo_tables_per_role_and_gpus(derived: list[str]) -> None:
    rows = _observed_samples(4)
    memo = SampleMemo()
    for gpu_num in (1, 2, 1):
        job = _role_job(rows, gpu_num=gpu_num)
        assert observations(job, WORKER, memo) == _plain_observations(job, WORKER)
    assert observations(_role_job(rows), "ps", memo) == []
    assert len(derived) == 4 * 3  # tables of gpu 1, gpu 2, and ps


def _scales(obs: list[StepObservation]) -> int:
    return len({o.gpus for o in obs})


@settings(max_examples=60, deadline=None)
@given(
    calls=st.lists(
        st.tuples(
            st.sampled_from(["j", "k"]),
            st.lists(st.integers(0, 9), max_size=8),
            st.sampled_from([0, 2]),
        ),
        max_size=8,
    )
)
def test_memo_gives_what_each_window_gives(calls: list[tuple[str, list[int], int]]) -> None:
    """Any order of windows, continuing or not, of two jobs sharing samples (each with
    its own memo), some of which need the job's state for their local batch."""
    pool = _POOL_OBSERVED
    memos = {"j": SampleMemo(), "k": SampleMemo()}
    for uuid_, picks, gpu_num in calls:
        job = _role_job([pool[i] for i in picks], gpu_num=gpu_num, batch_size=96).model_copy(
            update={"job": meta(uuid_)}
        )
        want = _plain_observations(job, WORKER)
        assert observations(job, WORKER, memos[uuid_]) == want


_POOL_OBSERVED = _observed_samples(5) + _observed_samples(5, local_batch=None)
_SCALING = [
    {"nodes": _workers(*[1.0] * n), "local_batch_size": 32}
    for n in (1, 1, 2, 2, 2, 4, 1, 3, 3, 4, 4, 4, 2, 1, 1, 1, 5, 5, 2, 2)
]


def test_memo_follows_the_folds_and_keeps_only_the_jobs_samples() -> None:
    """Folded with the job's memo, past MAX_SAMPLES: the observations and stragglers are
    those of the job's samples, and the memo holds values of those samples only."""
    memo = SampleMemo()
    rows = _SCALING * 4  # 80 samples
    job: JobState | None = state(roles={WORKER: RoleResources(gpu_num=1)})
    for i, row in enumerate(rows):
        event = RuntimeSample(
            event_id=uuid.UUID(int=i + 1),
            env=ENV,
            job=meta(),
            occurred_at=T0 + timedelta(seconds=15 * (i + 1)),
            global_step=i,
            **row,
        )
        job = fold(job, event, memo)
        assert job is not None
        if i % 7 == 0:
            assert observations(job, WORKER, memo) == _plain_observations(job, WORKER)
            assert _scales(observations(job, WORKER, memo)) == _scales(
                _plain_observations(job, WORKER)
            )
            p = StragglerParams(window=1, k=0.1, min_ratio=0)
            assert find_stragglers(job, p, memo) == _plain_stragglers(job, p)
    assert job is not None and len(job.samples) == MAX_SAMPLES
    assert len(memo) <= 2 * MAX_SAMPLES  # two tables, of the job's samples only


def test_fold_with_a_memo_skips_a_replayed_sample_as_without() -> None:
    """The memo's ids of a job's samples serve the fold's duplicate check; a state that
    is not the one the memo last followed (a step the processor did not keep) is
    counted afresh."""
    memo = SampleMemo()
    events = [
        RuntimeSample(
            event_id=uuid.UUID(int=i + 1),
            env=ENV,
            job=meta(),
            occurred_at=T0 + timedelta(seconds=15 * (i + 1)),
            global_step=i,
        )
        for i in range(MAX_SAMPLES + 5)
    ]
    job: JobState | None = state()
    plain: JobState | None = state()
    for event in events:
        job, plain = fold(job, event, memo), fold(plain, event)
    kept = job
    assert kept is not None
    fork = fold(kept, events[0].model_copy(update={"event_id": uuid.UUID(int=999)}), memo)
    assert fork is not None and fork.samples[-1].event_id == str(uuid.UUID(int=999))
    # the processor kept `kept`: the fork's sample is not one of its samples
    again = fold(kept, events[0].model_copy(update={"event_id": uuid.UUID(int=999)}), memo)
    assert again is not None and again.samples == fork.samples
    for event in events[-3:]:  # replays
        job, plain = fold(job, event, memo), fold(plain, event)
        assert job is not None and plain is not None
        assert [s.event_id for s in job.samples] == [s.event_id for s in plain.samples]


def test_memo_derives_once_per_sample_and_args() -> None:
    derive = _Derive()
    memo = SampleMemo()
    rows = _samples(3)
    a, b, c = rows
    assert [memo.derived("t", "x", s, derive) for s in (a, b, a, c)] == _want([a, b, a, c], "x")
    assert memo.derived("t", "y", a, derive) == f"{a.event_id}/y"
    assert memo.derived_all("t", "x", rows, derive) == _want(rows, "x")
    assert derive.calls == [
        (a.event_id, "x"),
        (b.event_id, "x"),
        (c.event_id, "x"),
        (a.event_id, "y"),
    ]
    assert len(memo) == 4


def test_memo_tables_are_bounded() -> None:
    derive = _Derive()
    memo = SampleMemo()
    rows = _samples(MAX_SAMPLES)
    many = [_renamed(s, n) for n in range(5) for s in rows]
    for sample in many:  # samples of steps never kept: no fold drops them
        memo.derived("t", "x", sample, derive)
        assert len(memo) <= TABLE_LIMIT
    assert len(derive.calls) == len(many)


def _renamed(sample: Sample, n: int) -> Sample:
    return msgspec.structs.replace(sample, event_id=f"{sample.event_id}/{n}")
