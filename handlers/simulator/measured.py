"""A job whose application has no traces, simulated from what it measured in its real env.

A virtual env fed from a real one (`replay`, `ab run --from`) gets each job's submission
and its first-phase runtime samples: what the job did before the real brain's first plan.
A production job is rarely one of the six Pollux models, and failing it as "not simulable"
would leave an A/B test of production with nothing to compare; its own samples say how
fast it stepped, at which worker counts and batches, and that is what it is simulated
from:

- step time: the step-time model the brain's cluster scheduler fits
  (dlrover_events.domain.step_time, the same fit of the same samples), so the simulator and the
  scheduler agree on what a job does at an allocation neither has seen;
- work, in optimizer steps at its initial batch: the job's own word, ``total_steps`` in
  its submission's config (the field the brain reads too); else how far it got in the
  source env, which the replay adds to the submission it copies (``replay_source_steps``:
  the last global step of its samples there). The samples the virtual env holds cannot
  say it: the replay copies the first phase only, which ends where the real brain took
  over, not where the job ended;
- statistical efficiency: 1 at its own batch. A smaller batch makes proportionally less
  progress per step; a larger one makes no more (without gradient statistics nothing says
  a larger batch helps, as the brain assumes). A job that reported ``grad_sqr`` and
  ``grad_var`` gets AdaScale's gain from their means instead, so a scheduler that changes
  its batch is paid or charged for it;
- memory: the most a training pod of the job was seen to use, when its samples say.

Pure: a model is a function of the submission and the samples, and round-trips through a
JSON-able snapshot (the operator's checkpoint keeps the models of jobs that arrived).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from dlrover_events.domain.step_time import TRAINING_ROLES, PerfParams, fit_perf_params, step_sample
from handlers.simulator.job import MemoryModel
from handlers.simulator.throughput import (
    OutOfTraceError,
    StepTime,
    TraceDataError,
    split_batch,
)
from schemas.jobs import JobSubmitted, RuntimeSample

#: The config key whose value is the job's length in optimizer steps (the brain's too).
TOTAL_STEPS = "total_steps"

#: The config key a replay adds to a submission that states no length: the last global
#: step of the job's samples in the source env (streams.replay.core.SOURCE_STEPS).
SOURCE_STEPS = "replay_source_steps"


class NotMeasurable(TraceDataError):
    """The job's samples or submission do not say enough to simulate it; the message says
    what is missing."""


@dataclass(frozen=True, slots=True)
class MeasuredApplication:
    """One job's application, as its own samples describe it (see the module doc)."""

    name: str
    perf: PerfParams
    init_batch_size: int
    total_steps: int
    max_local_bsz: int
    #: Means of the reported (grad_sqr, grad_var), per-sample variance; None: unreported.
    grad: tuple[float, float] | None = None
    #: Host memory a training replica was seen to use; None: unreported.
    memory: MemoryModel | None = None

    def __post_init__(self) -> None:
        for field, value in (
            ("init_batch_size", self.init_batch_size),
            ("total_steps", self.total_steps),
            ("max_local_bsz", self.max_local_bsz),
        ):
            if value < 1:
                raise ValueError(f"{field} must be >= 1, got {value}")

    # -- progress: one "epoch" that ends after total_steps at the initial batch -----------

    @property
    def max_epochs(self) -> int:
        return 1

    @property
    def target_progress(self) -> float:
        return float(self.total_steps)

    def epoch_at(self, progress: float) -> int:
        return 0 if progress < self.total_steps else 1

    def epoch_end_progress(self, epoch: int) -> float:
        if epoch != 0:
            raise IndexError(f"a measured job has one epoch, not {epoch + 1}")
        return float(self.total_steps)

    def gain(self, batch_size: float, epoch: int) -> float:
        scale = batch_size / self.init_batch_size
        if self.grad is None:
            return min(scale, 1.0)
        sqr, var = self.grad
        denominator = var + batch_size * sqr
        if denominator <= 0:
            return min(scale, 1.0)
        # scale x E(B), E(B) = (var + B0 sqr) / (var + B sqr): 1 at B0, up to `scale`
        # while the batch is far below the gradient noise scale var / sqr.
        return scale * (var + self.init_batch_size * sqr) / denominator

    def grad_stats(self, batch_size: float, epoch: int) -> tuple[float, float] | None:
        """What its samples reported, as the traces store it (the variance of a mean over
        the initial batch); None when they reported nothing."""
        if self.grad is None:
            return None
        sqr, var = self.grad
        return sqr, var / self.init_batch_size

    # -- throughput -----------------------------------------------------------------------

    def step_time(self, placement: Sequence[int], local_bsz: int) -> StepTime:
        """One micro-step on `placement` (GPUs per node): the fitted compute plus the
        all-reduce of that many replicas on that many nodes."""
        if local_bsz > self.max_local_bsz:
            raise OutOfTraceError(
                f"{self.name}: local batch {local_bsz} exceeds the largest that fits on a GPU "
                f"({self.max_local_bsz})"
            )
        nodes = sum(1 for gpus in placement if gpus > 0)
        replicas = sum(placement)
        if replicas < 1:
            raise ValueError("a placement needs at least one replica")
        step = self.perf.step_time(nodes, replicas, local_bsz, 1)
        return StepTime(step, step - self.perf.compute_time(local_bsz))

    def split_batch(self, batch_size: int, num_replicas: int) -> tuple[int, int]:
        return split_batch(batch_size, num_replicas, self.max_local_bsz)

    # -- snapshots ------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "perf": asdict(self.perf),
            "init_batch_size": self.init_batch_size,
            "total_steps": self.total_steps,
            "max_local_bsz": self.max_local_bsz,
            "grad": None if self.grad is None else list(self.grad),
            "memory": None if self.memory is None else [self.memory.base, self.memory.per_sample],
        }

    @classmethod
    def restore(cls, state: Mapping[str, Any]) -> MeasuredApplication:
        grad, memory = state["grad"], state["memory"]
        return cls(
            name=state["name"],
            perf=PerfParams(**state["perf"]),
            init_batch_size=state["init_batch_size"],
            total_steps=state["total_steps"],
            max_local_bsz=state["max_local_bsz"],
            grad=None if grad is None else (grad[0], grad[1]),
            memory=None if memory is None else MemoryModel(memory[0], memory[1]),
        )


def total_steps(submitted: JobSubmitted) -> int | None:
    """The job's length: as its submission states it (config ``total_steps``), else as
    far as it got in the env it was replayed from."""
    for key in (TOTAL_STEPS, SOURCE_STEPS):
        value = submitted.config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
    return None


def own_samples(samples: Iterable[RuntimeSample], job_uuid: str) -> list[RuntimeSample]:
    """The job's samples in the order they were taken (ties by id): the fit sums them in
    this order, so the same samples read in any order give the same model."""
    return sorted(
        (s for s in samples if s.job.uuid == job_uuid),
        key=lambda s: (s.occurred_at, str(s.event_id)),
    )


def measure(submitted: JobSubmitted, samples: Iterable[RuntimeSample]) -> MeasuredApplication:
    """The job's application from its submission and its measured samples; NotMeasurable
    says what is missing."""
    mine = own_samples(samples, submitted.job.uuid)
    if not mine:
        raise NotMeasurable("no measured samples")
    steps = [(s, st) for s in mine if (st := step_sample(s)) is not None]
    perf = fit_perf_params([st for _, st in steps])
    if perf is None:
        raise NotMeasurable(
            f"none of its {len(mine)} measured sample(s) says a step time "
            "(speed > 0 with world_size or batch sizes)"
        )
    work = total_steps(submitted)
    if work is None:
        raise NotMeasurable(
            f"its submission does not say how long it trains (config {TOTAL_STEPS}: an "
            f"integer >= 1), nor does a replay ({SOURCE_STEPS}: no sample in its source)"
        )
    first, first_step = steps[0]
    init_batch = submitted.batch_size or first.batch_size
    if init_batch is None:
        init_batch = first_step.replicas * first_step.local_batch * first_step.accumulation
    max_local = submitted.max_local_batch_size or max(st.local_batch for _, st in steps)
    grads = [
        (s.grad_sqr, s.grad_var) for s in mine if s.grad_sqr is not None and s.grad_var is not None
    ]
    grad = None
    if grads:
        grad = (
            math.fsum(sqr for sqr, _ in grads) / len(grads),
            math.fsum(var for _, var in grads) / len(grads),
        )
    peak = max(
        (n.memory for s in mine for n in s.nodes if n.type in TRAINING_ROLES and n.memory > 0),
        default=0,
    )
    return MeasuredApplication(
        name=submitted.application or submitted.job.app,
        perf=perf,
        init_batch_size=init_batch,
        total_steps=work,
        max_local_bsz=max_local,
        grad=grad,
        memory=MemoryModel(base=peak, per_sample=0) if peak else None,
    )


__all__ = [
    "SOURCE_STEPS",
    "TOTAL_STEPS",
    "MeasuredApplication",
    "NotMeasurable",
    "measure",
    "own_samples",
    "total_steps",
]
