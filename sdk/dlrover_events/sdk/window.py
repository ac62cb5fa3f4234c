"""From step records to a sample's numbers: pure arithmetic, no clock and no thread.

Speed comes from the step sequence numbers, not from counting records, so a record the
bounded step deque overwrote costs precision of the samples/s average only, never a step.

Gradient statistics, for Pollux's statistical efficiency. Pollux (OSDI'21) picks each
job's batch size from how noisy its gradient is: training at
global batch M instead of M0 makes (grad_var + M0 * grad_sqr) / (grad_var + M * grad_sqr)
of each sample's progress, where grad_sqr is |E[g]|^2, the true gradient's squared norm,
and grad_var is tr(Cov[g]) of one sample's gradient. Neither can be read off one gradient;
both can be estimated without bias from several gradients of the same step (one per replica
or micro-batch) against their average (AdaScale's estimator, which AdaptDL uses):

    n gradients g_i, each the mean over b samples;
    local = mean_i |g_i|^2          E[local] = |G|^2 + S / b
    total = |mean_i g_i|^2          E[total] = |G|^2 + S / (n b)

    grad_sqr = (n * total - local) / (n - 1)
    grad_var = (local - total) * n / (n - 1) * b

AdaptDL keeps grad_var as the variance at the job's initial batch (S / M0) and an
exponential average of both; here grad_var is per sample (S), so a reader needs no
initial batch, and a sample carries the plain mean of its interval's estimates: they are
unbiased, so their mean is too, and the brain, which keeps many samples, smooths.

Each estimate alone may be negative (grad_sqr when the noise dominates): the mean is
clamped to the contract only when a sample is cut.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from schemas.bounds import MAX_GRAD_STAT, MAX_RATE

#: (sequence number, perf_counter at the end of the step, caller's global step, samples)
StepRecord = tuple[int, float, int | None, int | None]


@dataclass(frozen=True)
class WindowStats:
    steps: int
    elapsed_s: float
    global_step: int
    #: mean samples per step over the window, when the caller gave sample counts.
    samples_per_step: float | None

    @property
    def speed(self) -> float:
        return self.steps / self.elapsed_s

    @property
    def step_time(self) -> float:
        return self.elapsed_s / self.steps


class StepWindow:
    """The steps since the last cut. The first step's end starts the clock: the time
    before it (building the model, loading data) is set-up, not training."""

    def __init__(self) -> None:
        self._seq0: int | None = None
        self._t0 = 0.0
        self._last_seq = 0
        self._last_t = 0.0
        self._offset = 0
        self._samples = 0
        self._sampled = 0
        #: records overwritten in the step deque before they were read.
        self.lost = 0
        self.global_step = 0

    def add(self, record: StepRecord) -> None:
        seq, t, global_step, samples = record
        if global_step is not None:
            # The caller's numbering wins, and later steps without one continue from it.
            self._offset = global_step - seq
        self.global_step = max(seq + self._offset, 0)
        if self._seq0 is None:
            self._seq0, self._t0 = seq, t
            self.lost += seq - 1
        else:
            self.lost += max(seq - self._last_seq - 1, 0)
            if samples is not None:
                self._samples += samples
                self._sampled += 1
        self._last_seq, self._last_t = seq, t

    def cut(self) -> WindowStats | None:
        """The window so far, and a new one from its last step; None if too few steps."""
        if self._seq0 is None:
            return None
        steps = self._last_seq - self._seq0
        elapsed = self._last_t - self._t0
        if steps <= 0 or elapsed <= 0:
            return None
        per_step = self._samples / self._sampled if self._sampled else None
        self._seq0, self._t0 = self._last_seq, self._last_t
        self._samples = self._sampled = 0
        return WindowStats(steps, elapsed, self.global_step, per_step)


# -- gradient statistics and the compute/all-reduce split ---------------------------


@dataclass(frozen=True, slots=True)
class GradEstimate:
    """One step's unbiased estimates (either may be negative)."""

    grad_sqr: float
    grad_var: float


def estimate(
    local_sqr: float, total_sqr: float, count: int, samples_per_grad: float
) -> GradEstimate | None:
    """The estimate from ``count`` gradients, each the mean over ``samples_per_grad``
    samples: ``local_sqr`` the mean of their squared norms, ``total_sqr`` the squared
    norm of their mean. None when they say nothing (fewer than two, or not finite)."""
    if count < 2 or not samples_per_grad > 0:
        return None
    if not (math.isfinite(local_sqr) and math.isfinite(total_sqr)):
        return None
    grad_sqr = (count * total_sqr - local_sqr) / (count - 1)
    grad_var = (local_sqr - total_sqr) * count / (count - 1) * samples_per_grad
    if not (math.isfinite(grad_sqr) and math.isfinite(grad_var)):
        return None
    return GradEstimate(grad_sqr, grad_var)


def clamp_stat(value: float) -> float:
    """A mean estimate as the contract takes it: at least 0, at most ``MAX_GRAD_STAT``."""
    return min(max(value, 0.0), MAX_GRAD_STAT)


class GradStatsWindow:
    """The estimates since the last cut (in the reporter's thread)."""

    def __init__(self) -> None:
        self._sqr = 0.0
        self._var = 0.0
        self._n = 0

    def add(self, grad_sqr: float, grad_var: float) -> None:
        if math.isfinite(grad_sqr) and math.isfinite(grad_var):
            self._sqr += grad_sqr
            self._var += grad_var
            self._n += 1

    def cut(self) -> tuple[float, float] | None:
        """(grad_sqr, grad_var): the means since the last cut, clamped; None without any."""
        if self._n == 0:
            return None
        sqr, var = self._sqr / self._n, self._var / self._n
        self._sqr = self._var = 0.0
        self._n = 0
        if not (math.isfinite(sqr) and math.isfinite(var)):
            return None  # sums of huge estimates overflowed: this interval says nothing
        return clamp_stat(sqr), clamp_stat(var)


class SplitWindow:
    """Seconds per step computing and all-reducing, over the steps timed since the cut."""

    def __init__(self) -> None:
        self._compute = 0.0
        self._allreduce = 0.0
        self._n = 0

    def add(self, compute_s: float, allreduce_s: float) -> None:
        if math.isfinite(compute_s) and math.isfinite(allreduce_s):
            self._compute += max(compute_s, 0.0)
            self._allreduce += max(allreduce_s, 0.0)
            self._n += 1

    def cut(self) -> tuple[float, float] | None:
        if self._n == 0:
            return None
        split = min(self._compute / self._n, MAX_RATE), min(self._allreduce / self._n, MAX_RATE)
        self._compute = self._allreduce = 0.0
        self._n = 0
        return split
