"""The per-job goodput model of the cluster scheduler, against values computed by hand."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.brain.core.schedulers.goodput import (
    BatchChoice,
    BatchLimits,
    GradStats,
    JobModel,
    PerfParams,
    StepSample,
    fit_perf_params,
)
from streams.brain.core.schedulers.goodput_cluster import GoodputClusterParams
from streams.brain.core.schedulers.registry import SCHEDULERS, get_scheduler
from streams.brain.core.schedulers.speedup import (
    Shape,
    fair_share,
    power_mean,
    restart_factor,
    shapes,
    speedup_table,
    utility,
)

PERF = PerfParams(alpha_c=0.1, beta_c=0.01, alpha_r=0.05, beta_r=0.01, alpha_n=0.2, beta_n=0.02)


def test_step_time_splits_compute_and_all_reduce() -> None:
    # one replica: compute only, 0.1 + 0.01 x 10
    assert PERF.step_time(1, 1, 10, 1) == pytest.approx(0.2)
    # 4 replicas on one node: + 0.05 + 0.01 x (4 - 2)
    assert PERF.step_time(1, 4, 10, 1) == pytest.approx(0.27)
    # accumulation: two more micro-steps of compute, one all-reduce
    assert PERF.step_time(1, 4, 10, 3) == pytest.approx(0.67)
    # across 2 nodes: the inter-node terms, 0.2 + 0.02 x 6
    assert PERF.step_time(2, 8, 10, 1) == pytest.approx(0.52)
    # overlap gamma 2: sqrt(0.2^2 + 0.07^2)
    overlapped = PerfParams(0.1, 0.01, 0.05, 0.01, 0.2, 0.02, gamma=2.0)
    assert overlapped.step_time(1, 4, 10, 1) == pytest.approx(math.sqrt(0.04 + 0.0049))


def test_efficiency_from_grad_stats_and_from_the_noise_scale_agree() -> None:
    limits = BatchLimits(init_batch=100, max_batch=1000)
    by_stats = JobModel(PERF, GradStats(sqr=1.0, var=3.0), limits)
    # scale 4: gain (3 + 1) / (3 / 4 + 1) = 2.2857, efficiency gain / 4
    assert by_stats.efficiency(400) == pytest.approx(4 / 1.75 / 4)
    # gns = B0 x var / sqr = 300: (300 + 100) / (300 + 400)
    assert by_stats.efficiency(400) == pytest.approx(400 / 700)
    by_gns = JobModel(PERF, GradStats.from_noise_scale(300, 100), limits)
    assert by_gns.efficiency(400) == pytest.approx(400 / 700)
    assert by_stats.efficiency(100) == pytest.approx(1.0)
    # unknown statistics: no gain assumed from a bigger batch
    assert JobModel(PERF, None, limits).efficiency(400) == pytest.approx(0.25)


def test_goodput_is_throughput_times_efficiency() -> None:
    model = JobModel(PERF, GradStats(1.0, 3.0), BatchLimits(init_batch=40, max_batch=1000))
    got = model.evaluate(1, 4, 10, 1)
    assert got.global_batch == 40
    assert got.throughput == pytest.approx(40 / 0.27)
    assert got.efficiency == pytest.approx(1.0)
    assert got.goodput == pytest.approx(40 / 0.27)
    bigger = model.evaluate(1, 4, 20, 1)  # batch 80: gns 120, (120 + 40) / (120 + 80)
    assert bigger.goodput == pytest.approx(80 / (0.1 + 0.2 + 0.07) * 160 / 200)


def test_best_batch_fixed_batch_is_split_over_replicas_with_accumulation() -> None:
    limits = BatchLimits(init_batch=100, max_batch=100, max_local=16, adaptive=False)
    model = JobModel(PERF, GradStats(1.0, 1.0), limits)
    got = model.best_batch(1, 4)  # 25 per replica, at most 16 a micro-step: 2 x 13
    assert got is not None
    assert (got.local_batch, got.accumulation) == (12, 2)  # 13 x 2 x 4 > 100: clamped
    assert got.global_batch == 96
    no_acc = JobModel(PERF, None, BatchLimits(100, 100, max_local=16, accumulation=False))
    assert no_acc.best_batch(1, 4) is None, "25 samples a replica do not fit without it"
    assert no_acc.best_batch(1, 8) is not None


def test_best_batch_grows_only_while_the_noise_scale_pays_for_it() -> None:
    limits = BatchLimits(init_batch=64, max_batch=4096, max_local=4096)
    overhead = PerfParams(alpha_c=1.0, beta_c=1e-6)  # a step costs the same at any batch
    quiet = JobModel(overhead, GradStats(sqr=1.0, var=1e9), limits)  # huge noise scale
    best = quiet.best_batch(1, 1)
    assert best is not None and best.global_batch == 4096
    noiseless = JobModel(PerfParams(alpha_c=0.0, beta_c=0.01), GradStats(1.0, 0.0), limits)
    best = noiseless.best_batch(1, 1)  # throughput constant, efficiency B0 / B
    assert best is not None and best.global_batch == 64


def test_too_many_replicas_for_the_largest_batch_is_not_a_size() -> None:
    limits = BatchLimits(init_batch=64, max_batch=128, min_local=32)
    model = JobModel(PERF, GradStats(1.0, 1.0), limits)
    assert model.best_batch(1, 4) is not None
    assert model.best_batch(2, 8) is None


def test_fit_recovers_the_parameters_of_exact_samples() -> None:
    true = PerfParams(0.05, 0.002, 0.03, 0.004, 0.1, 0.01)
    samples = [
        StepSample(
            nodes,
            replicas,
            b,
            k,
            true.step_time(nodes, replicas, b, k),
            true.network_time(nodes, replicas),
        )
        for nodes, replicas in [(1, 1), (1, 2), (1, 4), (2, 8), (4, 16)]
        for b, k in [(32, 1), (64, 2)]
    ]
    fitted = fit_perf_params(samples)
    assert fitted is not None
    for name in ("alpha_c", "beta_c", "alpha_r", "beta_r", "alpha_n", "beta_n"):
        assert getattr(fitted, name) == pytest.approx(getattr(true, name), abs=1e-9), name


def test_fit_priors_where_the_samples_say_nothing() -> None:
    one = fit_perf_params([StepSample(1, 2, 50, 1, step_time=1.3, sync_time=0.3)])
    assert one is not None
    # one local batch: compute 1.0 split evenly between constant and per-sample terms
    assert (one.alpha_c, one.beta_c) == pytest.approx((0.5, 0.01))
    # intra-node seen at 2 replicas only; inter-node 1.1x that
    assert (one.alpha_r, one.beta_r) == pytest.approx((0.3, 0.0))
    assert (one.alpha_n, one.beta_n) == pytest.approx((0.33, 0.0))
    assert fit_perf_params([]) is None
    assert fit_perf_params([StepSample(1, 1, 8, 1, step_time=0.0)]) is None


def test_limits_are_checked_with_one_line_errors() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        BatchLimits(init_batch=100, max_batch=10)
    with pytest.raises(ValueError, match="gamma"):
        PerfParams(0.1, 0.1, gamma=0.5)
    with pytest.raises(ValueError, match="grad_var"):
        GradStats(1.0, float("nan"))


def test_restart_factor_power_mean_and_utility() -> None:
    assert restart_factor(300, 2, 30) == pytest.approx(240 / 330)
    assert restart_factor(20, 1, 30) == 0.0
    assert restart_factor(5, 3, 0) == 1.0
    assert power_mean([1.0, 1.0], -1, 0.0) == pytest.approx(1.0)
    assert power_mean([1.0, 0.5], -1, 0.0) == pytest.approx(2 / 3)  # harmonic mean
    assert power_mean([1.0, 4.0], 0, 0.0) == pytest.approx(2.0)
    # the sum of utilities orders allocations as the power mean does
    a, b = [0.2, 0.9], [0.5, 0.5]
    assert (sum(utility(v, -1, 1e-3) for v in a) < sum(utility(v, -1, 1e-3) for v in b)) == (
        power_mean(a, -1, 1e-3) < power_mean(b, -1, 1e-3)
    )


def test_shapes_follow_the_whole_node_rule() -> None:
    got = [(s.replicas, s.nodes) for s in shapes(4, 4, 3)]
    assert got == [(1, 1), (2, 1), (3, 1), (4, 1), (8, 2), (12, 3)]
    assert fair_share(64, 10) == 7
    assert fair_share(4, 0) == 4


def test_speedup_is_relative_to_the_best_within_a_fair_share() -> None:
    model = JobModel(PERF, None, BatchLimits(init_batch=40, max_batch=40, max_replicas=8))
    table = speedup_table(model, shapes(4, 4, 4), fair=2)
    assert table is not None
    assert table.sizes == [1, 2, 3, 4, 8]  # max_replicas 8
    one, two = (model.evaluate(1, r, 40 // r, 1).goodput for r in (1, 2))
    assert table.base_goodput == pytest.approx(max(one, two))
    assert table.speedup(2) == pytest.approx(two / max(one, two))
    assert table.speedup(0) == 0.0
    assert speedup_table(model, [Shape(16, 4)], fair=2) is None


def test_the_registry_names_the_scheduler_and_parses_its_params() -> None:
    spec = get_scheduler("goodput-cluster")
    assert spec is SCHEDULERS["goodput-cluster"]
    params = spec.parse({"hysteresis": 0.1})
    assert isinstance(params, GoodputClusterParams) and params.hysteresis == 0.1
    with pytest.raises(KeyError, match="known: goodput-cluster"):
        get_scheduler("nope")


# -- the written-out batch search --------------------------------------------------------


def by_the_book(m: JobModel, nodes: int, replicas: int) -> BatchChoice | None:
    """best_batch as its docstring says it: split each candidate into a local batch and
    an accumulation within the limits, evaluate it, keep the first best."""
    if replicas < 1 or nodes < 1 or nodes > replicas:
        return None
    lim = m.limits
    best: BatchChoice | None = None
    for per_replica in m.candidates(replicas):
        if lim.accumulation:
            acc = max(1, math.ceil(per_replica / lim.local_cap))
        elif per_replica <= lim.local_cap:
            acc = 1
        else:
            continue
        local = min(math.ceil(per_replica / acc), lim.max_batch // (replicas * acc))
        if local < lim.min_local or local > lim.local_cap:
            continue
        choice = m.evaluate(nodes, replicas, local, acc)
        if best is None or choice.goodput > best.goodput:
            best = choice
    return None if best is None or best.goodput <= 0 else best


@st.composite
def job_models(draw: st.DrawFn) -> JobModel:
    perf = PerfParams(
        draw(st.floats(1e-4, 0.3)),
        draw(st.floats(0, 0.01)),
        draw(st.floats(0, 0.1)),
        draw(st.floats(0, 0.01)),
        draw(st.floats(0, 0.3)),
        draw(st.floats(0, 0.03)),
        draw(st.sampled_from([1.0, 1.0, 2.5])),
    )
    init = draw(st.integers(1, 4096))
    min_local = draw(st.integers(1, 64))
    limits = BatchLimits(
        init_batch=init,
        max_batch=init * draw(st.integers(1, 300)) + draw(st.integers(0, 50)),
        min_local=min_local,
        max_local=draw(st.one_of(st.none(), st.integers(min_local, min_local + 1024))),
        adaptive=draw(st.booleans()),
        accumulation=draw(st.booleans()),
    )
    grad = draw(
        st.one_of(
            st.none(),
            st.builds(GradStats, st.floats(0, 10), st.floats(0, 1e4)),
            st.floats(1, 1e6).map(lambda ns: GradStats.from_noise_scale(ns, init)),
        )
    )
    return JobModel(perf, grad, limits)


@settings(max_examples=300, deadline=None)
@given(job_models(), st.sampled_from([1, 2, 4, 8]), st.integers(2, 40))
def test_the_written_out_batch_search_chooses_what_the_book_does(
    m: JobModel, per_node: int, nodes: int
) -> None:
    """Bit for bit: the search a round runs thousands of times is written out in one loop
    for speed; its choices must be those of split-then-evaluate."""
    for s in shapes(per_node, per_node, nodes):
        assert m.best_batch(s.nodes, s.replicas) == by_the_book(m, s.nodes, s.replicas)
