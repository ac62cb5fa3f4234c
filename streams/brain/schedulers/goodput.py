"""One job's goodput: how many useful samples per second it makes at an allocation.

A cluster scheduler compares allocations across jobs, so it needs, per job, more than a
step time: a larger batch trains faster in samples per second but each sample is worth
less once the batch passes the gradient noise scale. Goodput = throughput x statistical
efficiency (Pollux, OSDI'21), both from what the job reported:

- throughput from a fitted step-time model that splits a step into compute (per
  micro-step, linear in the local batch) and all-reduce (a constant plus a term growing
  with the replicas past 2, with other constants once the job spans nodes), combined with
  an overlap exponent gamma (1: none, large: the slower of the two);
- efficiency from the gradient statistics (`grad_sqr`, `grad_var`, or the gradient noise
  scale): relative to the job's initial batch, E(B) = (gns + B0) / (gns + B).

Everything is a pure function of frozen inputs, so a scheduling tick can be replayed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

#: Candidate global batches tried per allocation when the batch may adapt: a geometric
#: grid, as Pollux samples it; the grid is over whole samples per replica, deduplicated.
BATCH_GRID = 50


def _finite_non_negative(name: str, value: float) -> None:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


class StepTimeModel(Protocol):
    """Seconds per optimizer step of a data-parallel job."""

    def step_time(self, nodes: int, replicas: int, local_batch: int, accumulation: int) -> float:
        """`accumulation` micro-steps of `local_batch` samples per replica, then one
        all-reduce across `replicas` on `nodes` nodes."""
        ...


@dataclass(frozen=True, slots=True)
class PerfParams:
    """Pollux's step-time model, fitted per job.

    compute(b) = alpha_c + beta_c * b (one micro-step's forward and backward);
    network(n, r) = 0 for one replica, alpha_r + beta_r * max(r - 2, 0) inside one node,
    alpha_n + beta_n * max(r - 2, 0) across nodes;
    step = (k - 1) * compute + (compute^gamma + network^gamma)^(1/gamma): accumulation
    micro-steps skip the all-reduce, and the last one overlaps with it as gamma says.
    """

    alpha_c: float
    beta_c: float
    alpha_r: float = 0.0
    beta_r: float = 0.0
    alpha_n: float = 0.0
    beta_n: float = 0.0
    gamma: float = 1.0

    def __post_init__(self) -> None:
        for name in ("alpha_c", "beta_c", "alpha_r", "beta_r", "alpha_n", "beta_n"):
            _finite_non_negative(name, getattr(self, name))
        if not 1.0 <= self.gamma <= 10.0:
            raise ValueError(f"gamma must be within [1, 10], got {self.gamma!r}")
        if self.alpha_c + self.beta_c <= 0:
            raise ValueError("a micro-step must take some time: alpha_c + beta_c > 0")

    def compute_time(self, local_batch: int) -> float:
        return self.alpha_c + self.beta_c * local_batch

    def network_time(self, nodes: int, replicas: int) -> float:
        if replicas <= 1:
            return 0.0
        extra = max(replicas - 2, 0)
        if nodes > 1:
            return self.alpha_n + self.beta_n * extra
        return self.alpha_r + self.beta_r * extra

    def step_time(self, nodes: int, replicas: int, local_batch: int, accumulation: int) -> float:
        compute = self.compute_time(local_batch)
        network = self.network_time(nodes, replicas)
        if network <= 0:
            last = compute
        elif self.gamma == 1.0:
            last = compute + network
        else:
            g = self.gamma
            last = (compute**g + network**g) ** (1 / g)
        return (accumulation - 1) * compute + last


@dataclass(frozen=True, slots=True)
class StepSample:
    """One measured configuration: what a runtime sample says of a step.

    `sync_time` is the part of a step spent in the all-reduce that compute did not hide
    (0 for one replica); the compute of one micro-step is then (step - sync) / k.
    """

    nodes: int
    replicas: int
    local_batch: int
    accumulation: int
    step_time: float
    sync_time: float = 0.0


def _line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least squares y ~ a + b x with a, b >= 0: the unconstrained fit, else the better
    of the two one-term fits (for two coefficients that is exact)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx > 0:
        b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
        a = my - b * mx
        if a >= 0 and b >= 0:
            return a, b
    const = (max(my, 0.0), 0.0)
    sq = sum(x * x for x in xs)
    slope = (0.0, max(sum(x * y for x, y in zip(xs, ys, strict=True)) / sq, 0.0) if sq else 0.0)

    def error(c: tuple[float, float]) -> float:
        return sum((c[0] + c[1] * x - y) ** 2 for x, y in zip(xs, ys, strict=True))

    return const if error(const) <= error(slope) else slope


def fit_perf_params(samples: Sequence[StepSample]) -> PerfParams | None:
    """The step-time model of a job from its measured steps, overlap assumed none
    (gamma 1: every second of all-reduce reported is a second of the step).

    Priors where the samples say nothing, as Pollux's: one local batch seen splits the
    compute time evenly between its constant and per-sample terms (neither optimistic
    nor pessimistic about a bigger batch); never seen across nodes, the inter-node terms
    are 1.1x the intra-node ones (crossing nodes is never free); never seen with several
    replicas, all-reduce is free (the caller bounds how far it lets a job explore).
    None without any usable sample.
    """
    usable = [
        s
        for s in samples
        if s.step_time > 0
        and math.isfinite(s.step_time)
        and s.replicas >= 1
        and s.local_batch >= 1
        and s.accumulation >= 1
        and 0 <= s.sync_time < s.step_time
    ]
    if not usable:
        return None
    batches = [float(s.local_batch) for s in usable]
    computes = [(s.step_time - s.sync_time) / s.accumulation for s in usable]
    if len(set(batches)) == 1:
        mean = sum(computes) / len(computes)
        alpha_c, beta_c = mean / 2, mean / 2 / batches[0]
    else:
        alpha_c, beta_c = _line(batches, computes)
    if alpha_c + beta_c <= 0:
        return None

    def network(inter: bool) -> tuple[float, float] | None:
        rows = [s for s in usable if s.replicas > 1 and (s.nodes > 1) == inter]
        if not rows:
            return None
        return _line([float(max(s.replicas - 2, 0)) for s in rows], [s.sync_time for s in rows])

    intra, inter = network(False), network(True)
    if inter is None:
        inter = (intra[0] * 1.1, intra[1] * 1.1) if intra is not None else (0.0, 0.0)
    if intra is None:
        intra = (0.0, 0.0) if inter == (0.0, 0.0) else (inter[0] / 1.1, inter[1] / 1.1)
    return PerfParams(alpha_c, beta_c, intra[0], intra[1], inter[0], inter[1])


@dataclass(frozen=True, slots=True)
class GradStats:
    """The gradient's squared norm and variance at the initial batch (AdaScale's
    statistics); their ratio is the gradient noise scale: gns = B0 * var / sqr."""

    sqr: float
    var: float

    def __post_init__(self) -> None:
        _finite_non_negative("grad_sqr", self.sqr)
        _finite_non_negative("grad_var", self.var)

    @classmethod
    def from_noise_scale(cls, noise_scale: float, init_batch: int) -> GradStats:
        """The same efficiency from a gradient noise scale in samples."""
        _finite_non_negative("gradient noise scale", noise_scale)
        return cls(sqr=1.0, var=noise_scale / init_batch)


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """What a job allows of its batch and its size, as its submission says.

    `init_batch` is the global batch the job was tuned at (efficiency 1); an adaptive job
    may grow it up to `max_batch`. A local batch stays within [min_local, max_local] (what
    fits on a GPU); past max_local, `accumulation` lets a replica take several
    micro-steps per optimizer step.
    """

    init_batch: int
    max_batch: int
    min_local: int = 1
    max_local: int | None = None
    adaptive: bool = True
    accumulation: bool = True
    min_replicas: int = 1
    max_replicas: int | None = None

    def __post_init__(self) -> None:
        if self.init_batch < 1:
            raise ValueError(f"init_batch must be >= 1, got {self.init_batch}")
        if self.max_batch < self.init_batch:
            raise ValueError(
                f"max_batch ({self.max_batch}) must be >= init_batch ({self.init_batch})"
            )
        if self.min_local < 1:
            raise ValueError(f"min_local must be >= 1, got {self.min_local}")
        if self.max_local is not None and self.max_local < self.min_local:
            raise ValueError(
                f"max_local ({self.max_local}) must be >= min_local ({self.min_local})"
            )
        if self.min_replicas < 1:
            raise ValueError(f"min_replicas must be >= 1, got {self.min_replicas}")
        if self.max_replicas is not None and self.max_replicas < self.min_replicas:
            raise ValueError(
                f"max_replicas ({self.max_replicas}) must be >= min_replicas ({self.min_replicas})"
            )

    @property
    def local_cap(self) -> int:
        return self.max_local if self.max_local is not None else self.max_batch


@dataclass(frozen=True, slots=True)
class BatchChoice:
    """The best batch of a job at one allocation, and what it is worth."""

    local_batch: int
    accumulation: int
    global_batch: int
    throughput: float  # samples per second
    efficiency: float  # statistical efficiency of the global batch, 1 at init_batch
    goodput: float  # throughput x efficiency: init-batch-equivalent samples per second


@dataclass(frozen=True, slots=True)
class JobModel:
    """What the scheduler knows of one job: its step-time model, its gradient statistics
    (None: unknown, so its batch stays the initial one), its limits."""

    perf: StepTimeModel
    grad: GradStats | None
    limits: BatchLimits

    def efficiency(self, global_batch: int) -> float:
        """E(B) = gain / scale with scale = B / B0 and AdaScale's gain
        (var + sqr) / (var / scale + sqr): 1 at B0, falling towards B0 / B as the batch
        outgrows the noise scale. Without statistics, 1 at B0 and B0 / B beyond (no gain
        is assumed from a bigger batch)."""
        scale = global_batch / self.limits.init_batch
        if self.grad is None:
            return 1.0 / scale if scale > 1 else 1.0
        denom = self.grad.var / scale + self.grad.sqr
        gain = (self.grad.var + self.grad.sqr) / denom if denom > 0 else 1.0
        return gain / scale

    def throughput(self, nodes: int, replicas: int, local_batch: int, accumulation: int) -> float:
        t = self.perf.step_time(nodes, replicas, local_batch, accumulation)
        if not t > 0 or not math.isfinite(t):
            return 0.0
        return replicas * local_batch * accumulation / t

    def evaluate(
        self, nodes: int, replicas: int, local_batch: int, accumulation: int
    ) -> BatchChoice:
        global_batch = replicas * local_batch * accumulation
        throughput = self.throughput(nodes, replicas, local_batch, accumulation)
        efficiency = self.efficiency(global_batch)
        return BatchChoice(
            local_batch, accumulation, global_batch, throughput, efficiency, throughput * efficiency
        )

    def _split(self, per_replica: int, replicas: int) -> tuple[int, int] | None:
        """(local batch, accumulation) for `per_replica` samples per replica per step,
        within the limits; None when they cannot hold it."""
        lim = self.limits
        cap = lim.local_cap
        if lim.accumulation:
            accumulation = max(1, math.ceil(per_replica / cap))
        elif per_replica <= cap:
            accumulation = 1
        else:
            return None
        local = math.ceil(per_replica / accumulation)
        # never past the largest batch the job allows, even by rounding up
        local = min(local, lim.max_batch // (replicas * accumulation))
        if local < lim.min_local or local > cap:
            return None
        return local, accumulation

    def candidates(self, replicas: int) -> list[int]:
        """Samples per replica per step worth trying at `replicas`, ascending."""
        lim = self.limits
        if not lim.adaptive or self.grad is None:
            return [max(math.ceil(lim.init_batch / replicas), lim.min_local)]
        lo = max(math.ceil(lim.init_batch / replicas), lim.min_local)
        hi = lim.max_batch // replicas
        if hi < lo:
            return [lo]
        if hi == lo:
            return [lo]
        ratio = hi / lo
        grid = {lo, hi}
        for i in range(1, BATCH_GRID - 1):
            grid.add(round(lo * ratio ** (i / (BATCH_GRID - 1))))
        return sorted(grid)

    def best_batch(self, nodes: int, replicas: int) -> BatchChoice | None:
        """The batch with the most goodput at this allocation (ties: the smaller batch);
        None when no batch within the limits fits it (e.g. more replicas than the
        largest batch has samples for its smallest local batch)."""
        if replicas < 1 or nodes < 1 or nodes > replicas:
            return None
        best: BatchChoice | None = None
        for per_replica in self.candidates(replicas):
            split = self._split(per_replica, replicas)
            if split is None:
                continue
            choice = self.evaluate(nodes, replicas, *split)
            if best is None or choice.goodput > best.goodput:
                best = choice
        if best is None or best.goodput <= 0:
            return None
        return best


__all__ = [
    "BATCH_GRID",
    "BatchChoice",
    "BatchLimits",
    "GradStats",
    "JobModel",
    "PerfParams",
    "StepSample",
    "StepTimeModel",
    "fit_perf_params",
]
