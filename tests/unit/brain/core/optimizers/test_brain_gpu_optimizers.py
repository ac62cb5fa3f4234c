"""The GPU-job optimizers: goodput, GPU OOM, host OOM, straggler."""

from __future__ import annotations

import math
from itertools import combinations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from schemas.jobs import OOMKind
from schemas.plans import NodeGroupResource, NodeResource
from streams.brain.core.optimizers.fit import _solve, nnls
from streams.brain.core.optimizers.gpu import fit_throughput, observations, smaller_micro_batch
from streams.brain.core.samples import Sample
from streams.brain.core.state import WORKER, JobState, NodeStatus, RoleResources
from tests.unit.brain.builders import GiB, node, nodes, oom, run, sample, state, use

# -- goodput --------------------------------------------------------------------------


def _step_time(n: int, b: int = 32) -> float:
    return 0.1 + 0.002 * b + 0.05 * math.log2(n)


def _scaling_samples(counts: list[int], b: int = 32) -> list[Sample]:
    return [
        sample(
            [use(WORKER, i, step_time=_step_time(n, b)) for i in range(n)],
            j,
            local_batch=b,
        )
        for j, n in enumerate(counts)
    ]


def _gpu_job(counts: list[int], lo: int = 1, hi: int = 16, gpu_num: int = 1) -> JobState:
    return state(
        roles={
            WORKER: RoleResources(
                replicas=counts[-1], min_replicas=lo, max_replicas=hi, gpu_num=gpu_num
            )
        },
        samples=_scaling_samples(counts),
    )


def test_goodput_fits_the_model_from_samples() -> None:
    model = fit_throughput(observations(_gpu_job([1, 2, 4, 8, 4]), WORKER))
    assert model is not None
    for n in (1, 3, 16):
        assert math.isclose(model.step_time(n, 32, 1), _step_time(n), rel_tol=1e-6)


def test_goodput_picks_most_workers_above_the_efficiency_floor() -> None:
    # per-GPU efficiency vs one replica: 9 workers 0.51, 10 workers 0.497 < 0.5
    proposal = run("goodput", _gpu_job([1, 2, 4, 8, 4]))
    assert proposal is not None
    assert proposal.resource.node_group_resources == {WORKER: NodeGroupResource(count=9)}


def test_goodput_stays_within_free_gpus() -> None:
    proposal = run("goodput", _gpu_job([1, 2, 4, 8, 4]), free_gpus=2)
    assert proposal is not None
    assert proposal.resource.node_group_resources[WORKER].count == 6


def test_goodput_counts_gpus_per_worker_against_free_gpus() -> None:
    proposal = run("goodput", _gpu_job([1, 2, 4, 8, 4], gpu_num=2), free_gpus=5)
    assert proposal is not None
    assert proposal.resource.node_group_resources[WORKER].count == 6


def test_goodput_keeps_the_best_count() -> None:
    assert run("goodput", _gpu_job([1, 2, 4, 8, 9])) is None


def test_goodput_with_gradient_noise_scale_prefers_fewer_workers() -> None:
    proposal = run("goodput", _gpu_job([1, 2, 4, 8, 4]), noise_scale=32)
    assert proposal is not None
    assert proposal.resource.node_group_resources[WORKER].count == 2


def test_goodput_explores_when_one_scale_is_known() -> None:
    proposal = run("goodput", _gpu_job([4, 4, 4]))
    assert proposal is not None
    assert proposal.resource.node_group_resources[WORKER].count == 8
    assert run("goodput", _gpu_job([4, 4, 4]), explore=False) is None
    assert run("goodput", _gpu_job([4, 4, 4], hi=4)) is None


def test_goodput_needs_samples_and_workers() -> None:
    assert run("goodput", state()) is None
    assert run("goodput", _gpu_job([1, 2])) is None  # fewer than min_samples
    no_workers = state(samples=[sample([use("ps", 0)], i) for i in range(5)])
    assert run("goodput", no_workers) is None


def test_goodput_min_above_free_gpus_proposes_nothing() -> None:
    assert run("goodput", _gpu_job([1, 2, 4], lo=8), free_gpus=0) is None


def test_nnls_keeps_coefficients_non_negative() -> None:
    # y falls with x: an unconstrained fit would give a negative slope
    coef = nnls([[1, 0], [1, 1], [1, 2]], [3.0, 2.0, 1.0])
    assert coef is not None
    assert all(c >= 0 for c in coef)
    assert nnls([], []) is None


def _nnls_per_subset(features: list[list[float]], targets: list[float]) -> list[float] | None:
    """nnls as it was written first: each subset sums its own normal equations."""
    if not features or len(features) != len(targets):
        return None
    width = len(features[0])
    best: tuple[float, int, list[float]] | None = None
    for size in range(1, width + 1):
        for free in combinations(range(width), size):
            normal = [[sum(row[i] * row[j] for row in features) for j in free] for i in free]
            rhs = [sum(row[i] * t for row, t in zip(features, targets, strict=True)) for i in free]
            solved = _solve(normal, rhs)
            if solved is None or any(v < 0 for v in solved):
                continue
            coef = [0.0] * width
            for i, v in zip(free, solved, strict=True):
                coef[i] = v
            error = sum(
                (sum(c * x for c, x in zip(coef, row, strict=True)) - t) ** 2
                for row, t in zip(features, targets, strict=True)
            )
            scale = sum(t * t for t in targets) or 1.0
            key = (round(error / scale, 12), size)
            if best is None or key < (best[0], best[1]):
                best = (key[0], key[1], coef)
    return best[2] if best is not None else None


_values = st.floats(min_value=0, max_value=1e4, allow_nan=False, allow_infinity=False)


@given(
    st.integers(1, 3).flatmap(
        lambda width: st.lists(
            st.tuples(st.lists(_values, min_size=width, max_size=width), _values),
            min_size=1,
            max_size=60,
        )
    )
)
def test_nnls_sums_once_and_fits_to_the_last_bit_as_per_subset(
    rows: list[tuple[list[float], float]],
) -> None:
    features = [list(x) for x, _ in rows]
    targets = [t for _, t in rows]
    assert nnls(features, targets) == _nnls_per_subset(features, targets)


# -- GPU OOM --------------------------------------------------------------------------


def _gpu_oom_job(local_batch: int, accumulation: int = 1, gpu_memory: int = 40 * GiB) -> JobState:
    return state(
        roles={WORKER: RoleResources(replicas=2, gpu_num=1, gpu_memory=gpu_memory)},
        training={"local_batch_size": local_batch, "accumulation_steps": accumulation},
        ooms={"worker-1": [oom("g1", OOMKind.GPU_MEMORY)]},
    )


def test_gpu_oom_halves_micro_batch_keeping_global_batch() -> None:
    proposal = run("gpu-oom", _gpu_oom_job(32))
    assert proposal is not None
    assert proposal.resource.training == {"local_batch_size": 16, "accumulation_steps": 2}
    assert proposal.handled_ooms == ("g1",)


def test_gpu_oom_odd_batches_keep_the_global_batch_exactly() -> None:
    assert smaller_micro_batch(6, 2, 1) == (3, 4)
    assert smaller_micro_batch(7, 1, 1) == (1, 7)
    assert smaller_micro_batch(1, 4, 1) is None
    assert smaller_micro_batch(8, 1, 8) is None


@given(st.integers(1, 512), st.integers(1, 16), st.integers(1, 8))
def test_gpu_oom_micro_batch_property(batch: int, accumulation: int, floor: int) -> None:
    smaller = smaller_micro_batch(batch, accumulation, floor)
    if smaller is None:
        # no micro-batch between the floor and half the current one keeps the global batch
        assert all((batch * accumulation) % size for size in range(floor, batch // 2 + 1))
        return
    size, steps = smaller
    assert size * steps == batch * accumulation
    assert floor <= size <= batch // 2


def test_gpu_oom_at_smallest_micro_batch_asks_for_more_gpu_memory() -> None:
    proposal = run("gpu-oom", _gpu_oom_job(1))
    assert proposal is not None
    assert proposal.resource.node_group_resources == {
        WORKER: NodeGroupResource(node_resource=NodeResource(gpu_memory=60 * GiB))
    }
    assert run("gpu-oom", _gpu_oom_job(1, gpu_memory=80 * GiB)) is None


def test_gpu_oom_only_for_open_gpu_ooms() -> None:
    job = _gpu_oom_job(32)
    handled = {"worker-1": [oom("g1", OOMKind.GPU_MEMORY).model_copy(update={"handled": True})]}
    assert run("gpu-oom", job.model_copy(update={"ooms": handled})) is None
    host = {"worker-1": [oom("h1", OOMKind.HOST_MEMORY)]}
    assert run("gpu-oom", job.model_copy(update={"ooms": host})) is None


# -- host OOM -------------------------------------------------------------------------


def _host_oom_job(memory: int, relaunches: int = 0, restart_count: int = 3) -> JobState:
    return state(
        restart_count=restart_count,
        nodes=nodes(
            node(WORKER, 0, memory=memory),
            node(WORKER, 1, memory=memory, status=NodeStatus.OOM, relaunches=relaunches),
            node(WORKER, 2, memory=memory),
        ),
        ooms={"worker-1": [oom("h1")]},
    )


def test_host_oom_bumps_only_the_node_that_ran_out() -> None:
    proposal = run("host-oom", _host_oom_job(8 * GiB))
    assert proposal is not None
    # the spec: a host OOM outside the create stage doubles the node's memory
    assert proposal.resource.node_resources == {"worker-1": NodeResource(memory=16 * GiB)}
    assert proposal.resource.node_group_resources == {}
    assert proposal.handled_ooms == ("h1",)


def test_host_oom_step_is_between_min_increase_and_8_gib() -> None:
    small = run("host-oom", _host_oom_job(2 * GiB))
    big = run("host-oom", _host_oom_job(40 * GiB))
    near_cap = run("host-oom", _host_oom_job(60 * GiB))
    assert small is not None and big is not None and near_cap is not None
    assert small.resource.node_resources["worker-1"].memory == 4 * GiB
    assert big.resource.node_resources["worker-1"].memory == 48 * GiB
    assert near_cap.resource.node_resources["worker-1"].memory == 64 * GiB


def test_host_oom_not_for_nodes_at_64_gib_or_out_of_relaunches() -> None:
    assert run("host-oom", _host_oom_job(64 * GiB)) is None
    assert run("host-oom", _host_oom_job(8 * GiB, relaunches=3)) is None
    assert run("host-oom", _host_oom_job(8 * GiB, relaunches=5, restart_count=10)) is None
    assert run("host-oom", _host_oom_job(8 * GiB, relaunches=4, restart_count=10)) is not None


def test_host_oom_never_twice_for_one_oom() -> None:
    job = _host_oom_job(8 * GiB)
    handled = {"worker-1": [oom("h1").model_copy(update={"handled": True})]}
    assert run("host-oom", job.model_copy(update={"ooms": handled})) is None
    assert run("host-oom", state()) is None


def test_host_oom_falls_back_to_role_and_event_memory() -> None:
    by_role = state(roles={WORKER: RoleResources(memory=8 * GiB)}, ooms={"worker-0": [oom("h")]})
    by_event = state(ooms={"worker-0": [oom("h", memory=10 * GiB)]})
    unknown = state(ooms={"worker-0": [oom("h")]})
    a, b = run("host-oom", by_role), run("host-oom", by_event)
    assert a is not None and b is not None
    assert a.resource.node_resources["worker-0"].memory == 16 * GiB
    assert b.resource.node_resources["worker-0"].memory == 18 * GiB  # doubled, +8 GiB at most
    assert run("host-oom", unknown) is None


# -- straggler ------------------------------------------------------------------------


def _straggler_job(slow: list[float], status: NodeStatus = NodeStatus.RUNNING) -> JobState:
    rows = [
        sample(
            [use(WORKER, i, step_time=1.0 + 0.01 * i) for i in range(4)]
            + [use(WORKER, 4, step_time=t)],
            j,
        )
        for j, t in enumerate(slow)
    ]
    return state(
        samples=rows,
        nodes=nodes(*(node(WORKER, i) for i in range(4)), node(WORKER, 4, status=status)),
    )


def test_straggler_replaces_a_node_slow_in_every_recent_sample() -> None:
    proposal = run("straggler", _straggler_job([2.0, 2.1, 1.9]))
    assert proposal is not None
    assert proposal.resource.node_resources == {"worker-4": NodeResource()}


def test_straggler_ignores_a_node_slow_only_once() -> None:
    assert run("straggler", _straggler_job([2.0, 1.0, 2.0])) is None


def test_straggler_ignores_a_node_just_relaunched() -> None:
    assert run("straggler", _straggler_job([2.0, 2.1, 1.9], NodeStatus.PENDING)) is None


def test_straggler_needs_three_nodes_and_enough_samples() -> None:
    two = state(
        samples=[
            sample([use(WORKER, 0, step_time=1), use(WORKER, 1, step_time=5)], j) for j in range(3)
        ]
    )
    assert run("straggler", two) is None
    assert run("straggler", _straggler_job([2.0, 2.0])) is None
    assert run("straggler", state()) is None


def test_straggler_equal_times_are_not_outliers() -> None:
    rows = [sample([use(WORKER, i, step_time=1.0) for i in range(5)], j) for j in range(3)]
    assert run("straggler", state(samples=rows)) is None


def test_goodput_counts_an_elastic_process_sample_at_its_world_size() -> None:
    """Each process of an elastic job reports only its own node, with the world size it
    trained in: the fit must see that scale, not one worker per sample."""
    rows = [
        msgspec.structs.replace(
            sample([use(WORKER, 0, step_time=_step_time(n))], j, local_batch=32),
            world_size=n,
        )
        for j, n in enumerate([1, 2, 4, 8, 4])
    ]
    job = state(
        roles={WORKER: RoleResources(replicas=4, min_replicas=1, max_replicas=16)},
        samples=rows,
    )
    assert [o.replicas for o in observations(job, WORKER)] == [1, 2, 4, 8, 4]
    proposal = run("goodput", job)
    assert proposal is not None
    assert proposal.resource.node_group_resources == {WORKER: NodeGroupResource(count=9)}
