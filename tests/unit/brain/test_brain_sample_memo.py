"""The per-sample memos of the GPU optimizers give what a plain computation gives.

goodput's observations and the straggler detector read every sample of a job at every
decision, so what they derive from a sample is made once per sample; these tests hold
them to a straightforward computation from the samples, edge cases included, and check
that nothing a memo keeps leaks from one job's state into another's.
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.jobs import NodeUsage, RuntimeSample
from streams.brain.optimizers import gpu
from streams.brain.optimizers.base import PerSample
from streams.brain.optimizers.gpu import (
    StepObservation,
    StragglerParams,
    find_stragglers,
    observations,
)
from streams.brain.state import (
    WORKER,
    JobState,
    NodeStatus,
    RoleResources,
    Sample,
    fold,
    median,
    node_key,
)

from .builders import ENV, T0, meta, node, nodes, state

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


def _job(rows: list[dict[str, Any]], **fields: Any) -> JobState:
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
        job = fold(job, event)
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


def test_observations_match_a_plain_computation_on_edge_cases() -> None:
    for gpu_num in (0, 1, 2):
        for batch_size in (None, 128):
            job = _job(
                EDGE_ROWS,
                roles={WORKER: RoleResources(replicas=2, gpu_num=gpu_num)},
                batch_size=batch_size,
            )
            want = _plain_observations(job, WORKER)
            assert observations(job, WORKER) == want
            assert observations(job, WORKER) == want  # and again, from the memo
    assert observations(_job(EDGE_ROWS), "ps") == _plain_observations(_job(EDGE_ROWS), "ps")
    assert observations(_job(EDGE_ROWS), "chief") == []


def test_observations_read_the_state_a_sample_is_decided_in() -> None:
    """The same sample objects in jobs that differ in GPUs per worker and in the known
    local batch: the memo keeps nothing that depends on the job."""
    first = _job(EDGE_ROWS, roles={WORKER: RoleResources(gpu_num=1)})
    assert observations(first, WORKER) == _plain_observations(first, WORKER)
    for update in (
        {"roles": {WORKER: RoleResources(gpu_num=4)}},
        {"training": {"local_batch_size": 8}},
        {"training": {}, "batch_size": 48},
        {"samples": [*first.samples, first.samples[0], first.samples[0]]},
    ):
        other = first.model_copy(update=update)
        assert observations(other, WORKER) == _plain_observations(other, WORKER)


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
    job = _job(rows, roles={WORKER: RoleResources(gpu_num=gpu_num)})
    for role in (WORKER, "ps"):
        assert observations(job, role) == _plain_observations(job, role)
        for p in (
            StragglerParams(role=role),
            StragglerParams(role=role, window=1, k=0.5),
            StragglerParams(role=role, window=2, k=0.1, min_ratio=0),
            StragglerParams(role=role, window=5, k=0.1, min_ratio=0),
        ):
            assert find_stragglers(job, p) == _plain_stragglers(job, p)


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
            job = _job(rows).model_copy(update={"nodes": nodes(node(WORKER, 9, status=status))})
            for p in (StragglerParams(), StragglerParams(window=2), StragglerParams(k=50)):
                assert find_stragglers(job, p) == _plain_stragglers(job, p)
    assert _plain_stragglers(_job(cases[0]), StragglerParams()) == {"worker-9": 1.9}


# -- the memos themselves --------------------------------------------------------------


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
    """The samples goodput derives an observation of, in order, with no window kept."""
    calls: list[str] = []
    derive = gpu._seen

    def counting(sample: Sample, args: tuple[str, int]) -> gpu.Seen:
        calls.append(sample.event_id)
        return derive(sample, args)

    monkeypatch.setattr(gpu, "_seen", counting)
    monkeypatch.setattr(gpu, "_WINDOWS", {})
    return calls


def test_observation_window_derives_only_the_samples_folded_since(derived: list[str]) -> None:
    rows = _observed_samples(12)
    for start, end in ((0, 6), (2, 9), (2, 9), (2, 10), (5, 10)):
        job = _role_job(rows[start:end])
        assert observations(job, WORKER) == _plain_observations(job, WORKER)
    assert derived == [s.event_id for s in rows[:10]]  # each sample once
    assert observations(_role_job([]), WORKER) == []


def test_observation_window_of_windows_that_do_not_continue_the_last(derived: list[str]) -> None:
    rows = _observed_samples(8)
    last = rows[:5]
    observations(_role_job(last), WORKER)
    for window in (
        rows[3:4],  # shorter than what the last window kept
        [rows[4], rows[0], rows[0], rows[3]],  # reordered, a sample twice
        [rows[3], rows[6], rows[4]],  # continues, then not
        [rows[2], rows[6], rows[7]],  # starts like the last, goes on otherwise
        rows[5:8],
    ):
        derived.clear()
        job = _role_job(window)
        assert observations(job, WORKER) == _plain_observations(job, WORKER)
        # what the last window had and this one keeps in place, or takes anew, is kept
        new = {s.event_id for s in window if not any(s is k for k in last)}
        assert new <= set(derived) <= {s.event_id for s in window}
        assert len(derived) == len(set(derived))
        last = window


def test_observation_window_holds_equal_samples_apart() -> None:
    """A sample equal to another is still another sample: the window follows identity,
    and what it keeps of an equal sample is what that sample gives too."""
    rows = _observed_samples(3)
    twin = _observed_samples(3)[0]
    assert twin == rows[0] and twin is not rows[0]
    for window in (rows, [twin, *rows[1:]], [twin, rows[0]], rows):
        job = _role_job(window)
        assert observations(job, WORKER) == _plain_observations(job, WORKER)


def test_observation_windows_per_job_role_and_gpus(derived: list[str]) -> None:
    rows = _observed_samples(4)
    for gpu_num in (1, 2, 1):
        job = _role_job(rows, gpu_num=gpu_num)
        assert observations(job, WORKER) == _plain_observations(job, WORKER)
    other = _role_job(rows).model_copy(update={"job": meta("job-2")})
    assert observations(other, WORKER) == _plain_observations(other, WORKER)
    assert observations(other, "ps") == []
    assert len(derived) == 4 * 3 + 4  # windows of gpu 1, gpu 2, job-2, and ps


def test_observation_windows_are_bounded(
    derived: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpu, "WINDOW_LIMIT", 2)
    rows = _observed_samples(2)
    for uuid_ in ("a", "b", "c", "a"):
        job = _role_job(rows).model_copy(update={"job": meta(uuid_)})
        assert observations(job, WORKER) == _plain_observations(job, WORKER)
        assert len(gpu._WINDOWS) <= 2
    assert len(derived) == 2 * 4  # "a" again after "c" pushed it out


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
def test_observation_window_gives_what_each_window_gives(
    calls: list[tuple[str, list[int], int]],
) -> None:
    """Any order of windows, continuing or not, of two jobs sharing samples, some of
    which need the job's state for their local batch: the observations, and the number
    of scales goodput reads off the window, are those of the window's samples."""
    pool = _POOL_OBSERVED
    for uuid_, picks, gpu_num in calls:
        job = _role_job([pool[i] for i in picks], gpu_num=gpu_num, batch_size=96).model_copy(
            update={"job": meta(uuid_)}
        )
        want = _plain_observations(job, WORKER)
        assert observations(job, WORKER) == want
        window = gpu._window(job, WORKER, max(gpu_num, 1))
        obs = window.observations(job, max(gpu_num, 1))
        assert obs == want
        if not window.pending:
            assert len(window.gpus) == _scales(want)


_POOL_OBSERVED = _observed_samples(5) + _observed_samples(5, local_batch=None)
_SCALING = list(
    _job(
        [
            {"nodes": _workers(*[1.0] * n), "local_batch_size": 32}
            for n in (1, 1, 2, 2, 2, 4, 1, 3, 3, 4, 4, 4, 2, 1, 1, 1, 5, 5, 2, 2)
        ]
    ).samples
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), max_size=12))
def test_observation_window_sliding_as_folds_slide_it(steps: list[tuple[int, int]]) -> None:
    """Windows as folds make them (the oldest dropped, new ones appended) over samples
    whose scales come and go: the scales counted in step are those of the window."""
    start = end = 0
    for drop, add in steps:
        end = min(end + add, len(_SCALING))
        start = min(start + drop, end)
        job = _role_job(_SCALING[start:end])
        want = _plain_observations(job, WORKER)
        assert observations(job, WORKER) == want
        window = gpu._window(job, WORKER, 1)
        assert len(window.gpus) == _scales(want)
        assert sorted(window.gpus.items()) == sorted(Counter(o.gpus for o in want).items())


def test_per_sample_memo_derives_once_per_sample_and_args() -> None:
    derive = _Derive()
    memo: PerSample[str, str] = PerSample(derive)
    rows = _samples(3)
    a, b, c = rows
    assert [memo.of("j", s, "x", rows) for s in (a, b, a, c)] == _want([a, b, a, c], "x")
    assert memo.of("j", a, "y", rows) == f"{a.event_id}/y"
    assert memo.of("k", a, "x", rows) == f"{a.event_id}/x"
    assert derive.calls == [
        (a.event_id, "x"),
        (b.event_id, "x"),
        (c.event_id, "x"),
        (a.event_id, "y"),
        (a.event_id, "x"),
    ]
    assert len(memo) == 5


def test_per_sample_memo_keeps_a_jobs_live_samples_and_is_bounded() -> None:
    derive = _Derive()
    memo: PerSample[str, str] = PerSample(derive)
    rows = _samples(60)
    for end in range(3, 61):  # a window of three sliding over the job's samples
        live = rows[end - 3 : end]
        assert [memo.of("j", s, "x", live) for s in live] == _want(live, "x")
        assert len(memo) <= 2 * len(live) + 17
    assert len(derive.calls) == 60
    small: PerSample[int, str] = PerSample(lambda s, n: f"{s.event_id}/{n}", limit=5)
    for n in range(3):
        assert [small.of("j", s, n, rows) for s in rows[:12]] == [
            f"{s.event_id}/{n}" for s in rows[:12]
        ]
        assert len(small) <= 5
    small.clear()
    assert len(small) == 0
