"""The per-sample memos of the GPU optimizers give what a plain computation gives.

goodput's observations and the straggler detector read every sample of a job at every
decision, so what they derive from a sample is made once per sample; these tests hold
them to a straightforward computation from the samples, edge cases included, and check
that nothing a memo keeps leaks from one job's state into another's.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.jobs import NodeUsage, RuntimeSample
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


def _plain_local_batch(job: JobState, sample: Sample, replicas: int) -> int:
    if sample.local_batch_size is not None:
        return sample.local_batch_size
    known = job.training.get("local_batch_size")
    if isinstance(known, int) and known > 0:
        return known
    batch = sample.batch_size or job.batch_size
    per_replica = replicas * sample.accumulation_steps
    if batch is not None and per_replica > 0 and batch % per_replica == 0:
        return batch // per_replica
    return 1


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
                local_batch=_plain_local_batch(job, sample, len(usages)),
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
        for p in (StragglerParams(role=role), StragglerParams(role=role, window=1, k=0.5)):
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


# -- the memo itself ----------------------------------------------------------------------


def test_per_sample_memo_derives_once_per_sample_and_args() -> None:
    calls: list[tuple[str, str]] = []

    def derive(sample: Sample, args: str) -> str:
        calls.append((sample.event_id, args))
        return f"{sample.event_id}/{args}"

    memo: PerSample[str, str] = PerSample(derive)
    rows = _job([{"nodes": []}] * 3).samples
    a, b, c = rows
    found = [v for _, v in memo.hits([a, b, a], "x")]
    assert found == [f"{a.event_id}/x", f"{b.event_id}/x", f"{a.event_id}/x"]
    assert memo.of(c, "x") == f"{c.event_id}/x"
    assert [s for s, _ in memo.hits([c, b, a], "x")] == [c, b, a]
    assert memo.of(a, "y") == f"{a.event_id}/y"
    assert calls == [(a.event_id, "x"), (b.event_id, "x"), (c.event_id, "x"), (a.event_id, "y")]
    assert len(memo) == 4


def test_per_sample_memo_is_bounded() -> None:
    memo: PerSample[int, str] = PerSample(lambda s, n: f"{s.event_id}/{n}", limit=5)
    rows = _job([{"nodes": []}] * 12).samples
    for n in range(3):
        assert [v for _, v in memo.hits(rows, n)] == [f"{s.event_id}/{n}" for s in rows]
        assert len(memo) <= 5
    memo.clear()
    assert len(memo) == 0
    assert memo.of(rows[0], 0) == f"{rows[0].event_id}/0"
