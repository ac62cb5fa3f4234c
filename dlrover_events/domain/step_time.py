"""A data-parallel job's step time, fitted from what the job measured.

One model serves two places that must agree: the brain's cluster scheduler predicts a
job's throughput at allocations it has not seen (streams/brain/core/schedulers/goodput.py),
and the simulator runs a job whose application has no traces from the steps it reported
in its real env (handlers/simulator/measured.py). streams and handlers never import each
other, so the model and its fit live here, pure: the same samples give the same fit in
both.

Pollux's model (OSDI'21): a step splits into compute (per micro-step, linear in the local
batch) and all-reduce (a constant plus a term growing with the replicas past 2, with
other constants once the job spans nodes), combined with an overlap exponent gamma.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from schemas.jobs import RuntimeSample


def finite_non_negative(name: str, value: float) -> None:
    """Refuse a model parameter that would make every prediction meaningless."""
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


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
            finite_non_negative(name, getattr(self, name))
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


#: Roles whose pods are data-parallel replicas (DLRover's names).
TRAINING_ROLES: frozenset[str] = frozenset({"worker", "chief"})


def step_sample(sample: RuntimeSample) -> StepSample | None:
    """What one runtime sample says of a step, or None when it says too little.

    A step lasts 1 / speed. The replicas are the sample's world size, else its global
    batch over its local batch; the local batch is the sample's, else its global batch
    over the replicas; the nodes are `num_nodes`, else the training pods it lists (one
    machine when it lists none); the all-reduce is `allreduce_s` (0 unsaid: the fit then
    counts the whole step as compute, the pessimistic reading for a larger batch).
    """
    if not sample.speed > 0 or not math.isfinite(sample.speed):
        return None
    accumulation = sample.accumulation_steps
    replicas = sample.world_size
    local = sample.local_batch_size
    if replicas is None and sample.batch_size is not None and local is not None:
        replicas = max(1, round(sample.batch_size / (local * accumulation)))
    if replicas is None:
        return None
    if local is None and sample.batch_size is not None:
        local = max(1, round(sample.batch_size / (replicas * accumulation)))
    if local is None:
        return None
    nodes = sample.num_nodes
    if nodes is None:
        pods = sum(1 for n in sample.nodes if n.type in TRAINING_ROLES)
        nodes = min(max(pods, 1), replicas)
    return StepSample(
        nodes=nodes,
        replicas=replicas,
        local_batch=local,
        accumulation=accumulation,
        step_time=1.0 / sample.speed,
        sync_time=sample.allreduce_s or 0.0,
    )


__all__ = [
    "TRAINING_ROLES",
    "PerfParams",
    "StepSample",
    "finite_non_negative",
    "fit_perf_params",
    "step_sample",
]
