"""Gradient statistics (issue 18): the AdaScale/Pollux estimator against values computed by
hand on small tensors, how the torch helper reads them off real autograd (accumulation
conventions, loss scale, one process alone), and what a sample carries.

Requires torch (CPU).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import pytest
import torch

from dlrover_events.sdk import JobIdentity
from dlrover_events.sdk.probes import Probe
from dlrover_events.sdk.sampling import SampleCutter
from dlrover_events.sdk.torch import GradientStats, StepTimer
from dlrover_events.sdk.window import (
    GradEstimate,
    GradStatsWindow,
    SplitWindow,
    clamp_stat,
    estimate,
)
from schemas.bounds import MAX_GRAD_STAT, MAX_RATE
from schemas.jobs import JobMeta

#: Three micro-batch gradients, each the mean over 2 samples. By hand: their mean is
#: [2, 2] (|.|^2 = 8), the mean of their squared norms (2 + 10 + 20) / 3 = 32/3. Their
#: deviations from the mean, [-1,-1], [1,-1], [0,2], have squared norms 2, 2, 4: the
#: unbiased variance (trace) of one micro-batch gradient is 8 / 2 = 4, so one sample's is
#: 4 * 2 = 8, and |E[g]|^2 = 8 - 4/3 (the mean's variance) = 20/3.
GRADS = [[1.0, 1.0], [3.0, 1.0], [2.0, 4.0]]
SQR, VAR = 20 / 3, 8.0


class Collector:
    """What a reporter is given: the estimates and the splits."""

    def __init__(self, local_batch_size: int | None = 2) -> None:
        self.local_batch_size = local_batch_size
        self.grads: list[tuple[float, float]] = []
        self.splits: list[tuple[float, float]] = []

    def observe_gradients(self, grad_sqr: float, grad_var: float) -> None:
        self.grads.append((grad_sqr, grad_var))

    def observe_split(self, compute_s: float, allreduce_s: float) -> None:
        self.splits.append((compute_s, allreduce_s))


def test_the_estimator_by_hand() -> None:
    local = sum(x * x + y * y for x, y in GRADS) / 3
    est = estimate(local, 8.0, 3, 2)
    assert est is not None
    assert est.grad_sqr == pytest.approx(SQR)
    assert est.grad_var == pytest.approx(VAR)
    # two orthogonal unit gradients of 4 samples each: no signal, all noise
    # local 1, total |[.5,.5]|^2 = .5: grad_sqr = (2*.5 - 1) / 1 = 0, grad_var = .5*2*4 = 4
    assert estimate(1.0, 0.5, 2, 4) == GradEstimate(0.0, 4.0)


def test_the_estimator_refuses_what_says_nothing() -> None:
    assert estimate(1.0, 1.0, 1, 4) is None  # one gradient
    assert estimate(1.0, 0.5, 2, 0) is None  # no samples
    assert estimate(math.inf, 0.5, 2, 4) is None
    assert estimate(math.nan, 0.5, 2, 4) is None
    assert estimate(1e308, -1e308, 2, 1e10) is None  # overflows


def test_a_window_is_the_mean_of_its_estimates_clamped_to_the_contract() -> None:
    w = GradStatsWindow()
    assert w.cut() is None
    w.add(2.0, 10.0)
    w.add(-4.0, 30.0)  # an unbiased estimate may be negative
    w.add(math.nan, 1.0)  # not finite: ignored
    assert w.cut() == (0.0, 20.0)  # mean -1 clamped to 0
    assert w.cut() is None  # a new window
    w.add(1e300, 1.0)
    assert w.cut() == (MAX_GRAD_STAT, 1.0)
    assert clamp_stat(-1.0) == 0.0

    s = SplitWindow()
    assert s.cut() is None
    s.add(0.2, 0.1)
    s.add(0.4, -0.1)  # a clock step backwards counts as 0
    s.add(math.inf, 0.0)
    assert s.cut() == pytest.approx((0.3, 0.05))
    s.add(1e20, 0.0)
    assert s.cut() == (MAX_RATE, 0.0)


def _micro_step(
    w: torch.nn.Parameter, grads: list[list[float]], *, mean: bool, scale: float = 1.0
) -> None:
    """Backward passes whose gradients on ``w`` are exactly ``grads`` (each divided by
    their number when ``mean``, as a loop dividing its loss by the accumulation steps)."""
    k = len(grads)
    for g in grads:
        loss = (w * torch.tensor(g)).sum() * scale
        (loss / k if mean else loss).backward()


@pytest.mark.parametrize("accumulation", ["mean", "sum"])
def test_micro_batches_of_one_process_give_the_hand_values(accumulation: str) -> None:
    w = torch.nn.Parameter(torch.zeros(2))
    out = Collector()
    stats = GradientStats(out, [w], every=1, accumulation=accumulation)  # type: ignore[arg-type]
    assert stats.begin()
    _micro_step(w, GRADS, mean=accumulation == "mean")
    est = stats.end()
    assert est is not None and not stats.armed
    assert est.grad_sqr == pytest.approx(SQR)
    assert est.grad_var == pytest.approx(VAR)
    assert out.grads == [(est.grad_sqr, est.grad_var)]


def test_a_loss_scale_is_taken_out() -> None:
    w = torch.nn.Parameter(torch.zeros(2))
    stats = GradientStats(Collector(), [w], every=1)  # type: ignore[arg-type]
    stats.begin()
    _micro_step(w, GRADS, mean=True, scale=1024.0)
    est = stats.end(loss_scale=1024.0)
    assert est is not None
    assert est.grad_sqr == pytest.approx(SQR) and est.grad_var == pytest.approx(VAR)


def test_only_every_nth_step_is_measured_and_other_steps_register_no_hook() -> None:
    w = torch.nn.Parameter(torch.zeros(2))
    out = Collector()
    stats = GradientStats(out, [w], every=3)  # type: ignore[arg-type]
    measured = []
    for _ in range(7):
        measured.append(stats.begin())
        assert stats.armed == measured[-1]
        assert len(w._backward_hooks or {}) == (1 if measured[-1] else 0)
        _micro_step(w, GRADS, mean=True)
        stats.end()
        w.grad = None
    assert measured == [True, False, False, True, False, False, True]
    assert len(out.grads) == 3


def test_a_process_alone_pairs_two_consecutive_measured_steps() -> None:
    """One gradient a step: the measured step and the next one are the two gradients
    (AdaptDL's difference estimator). Here, gradients [1, 1] then [3, 1], 2 samples each:
    local (2 + 10) / 2 = 6, total |[2, 1]|^2 = 5: grad_sqr 2*5 - 6 = 4, grad_var 1*2*2 = 4."""
    w = torch.nn.Parameter(torch.zeros(2))
    out = Collector()
    stats = GradientStats(out, [w], every=4)  # type: ignore[arg-type]
    grads = [[1.0, 1.0], [3.0, 1.0], [9.0, 9.0], [9.0, 9.0], [2.0, 0.0], [0.0, 2.0]]
    measured = []
    for g in grads:
        measured.append(stats.begin())
        _micro_step(w, [g], mean=True)
        stats.end()
        w.grad = None
    assert measured == [True, True, False, False, True, True]
    assert out.grads[0] == pytest.approx((4.0, 4.0))
    # [2, 0] then [0, 2]: local 4, total 2: grad_sqr 0, grad_var 2*2*2 = 8
    # (norms are taken in float32: exact to 1e-7 of the squared norms, 4 here)
    assert out.grads[1] == pytest.approx((0.0, 8.0), abs=1e-6)
    assert len(out.grads) == 2


def test_without_a_local_batch_size_nothing_is_estimated(caplog: pytest.LogCaptureFixture) -> None:
    w = torch.nn.Parameter(torch.zeros(2))
    out = Collector(local_batch_size=None)
    stats = GradientStats(out, [w], every=1)  # type: ignore[arg-type]
    for _ in range(2):
        stats.begin()
        _micro_step(w, GRADS, mean=True)
        assert stats.end() is None
    assert out.grads == []
    assert [r.message for r in caplog.records].count(
        "gradient statistics need the local batch size: none is known"
    ) == 1
    stats.begin()
    _micro_step(w, GRADS, mean=True)
    assert stats.end(local_batch_size=2) is not None  # given per call


def test_end_without_begin_or_backward_is_nothing() -> None:
    w = torch.nn.Parameter(torch.zeros(2))
    stats = GradientStats(Collector(), [w], every=1)  # type: ignore[arg-type]
    assert stats.end() is None
    stats.begin()
    assert stats.end() is None  # no backward ran
    with pytest.raises(ValueError, match="every"):
        GradientStats(None, [w], every=0)
    with pytest.raises(ValueError, match="accumulation"):
        GradientStats(None, [w], accumulation="avg")


def test_step_timer_reports_every_nth_step() -> None:
    out = Collector()
    timer = StepTimer(out, every=2, synchronize=False)  # type: ignore[arg-type]
    for _ in range(5):
        with timer.compute():
            torch.ones(64, 64) @ torch.ones(64, 64)
        with timer.allreduce():
            pass
        timer.step()
    assert len(out.splits) == 3  # steps 0, 2, 4
    assert all(c >= 0 and a >= 0 for c, a in out.splits)


class NoProbe:
    def __call__(self) -> dict[str, Any]:
        return {}


def test_a_sample_carries_the_means_of_its_interval_and_the_node_count() -> None:
    steps: deque[Any] = deque()
    grads: deque[tuple[float, float]] = deque()
    splits: deque[tuple[float, float]] = deque()
    probes: list[Probe] = [NoProbe()]
    cutter = SampleCutter(steps, probes, grads, splits)
    ident = JobIdentity(job=JobMeta(uuid="j"), env="unit", world_size=4, num_nodes=2)
    steps.extend([(1, 0.0, None, None), (2, 0.5, None, None)])
    grads.extend([(1.0, 10.0), (3.0, 30.0)])
    splits.extend([(0.3, 0.1), (0.5, 0.1)])
    cutter.drain()
    sample = cutter.cut(ident, None, (8, 1))
    assert sample is not None
    assert (sample.grad_sqr, sample.grad_var) == (2.0, 20.0)
    assert sample.compute_s == pytest.approx(0.4) and sample.allreduce_s == pytest.approx(0.1)
    assert (sample.num_nodes, sample.world_size) == (2, 4)
    # the next interval measured nothing: the sample says nothing of it
    steps.append((3, 1.0, None, None))
    cutter.drain()
    sample = cutter.cut(ident, None, (8, 1))
    assert sample is not None
    assert (sample.grad_sqr, sample.grad_var, sample.compute_s) == (None, None, None)


def test_the_node_count_comes_from_torchrun_or_the_launcher() -> None:
    base = {"DLROVER_EVENTS_JOB_ID": "j"}
    assert JobIdentity.from_env(base).num_nodes is None
    assert JobIdentity.from_env({**base, "GROUP_WORLD_SIZE": "3"}).num_nodes == 3
    assert JobIdentity.from_env({**base, "DLROVER_EVENTS_NUM_NODES": "2"}).num_nodes == 2
    with pytest.raises(ValueError, match="must be within"):
        JobIdentity.from_env({**base, "GROUP_WORLD_SIZE": "0"})
    with pytest.raises(ValueError, match="must be an integer"):
        JobIdentity.from_env({**base, "DLROVER_EVENTS_NUM_NODES": "two"})
