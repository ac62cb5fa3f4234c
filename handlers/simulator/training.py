"""How a simulated job's gang trains: its batch, its rates, its memory, how far it gets in
a stretch of time and when it would finish.

The job (job.py) decides which pods it has and when they run; this is the arithmetic of
what they do while they run, kept apart so that it can be read, and changed, as the model
it is: speed from the measured Pollux traces (throughput.py), usefulness of a step from
their gradient statistics, and memory from a small per-application model
(MEMORY_MODELS). Every function and method here is pure and keeps the order of the
arithmetic the job had, so the same inputs give the same floats to the last bit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from handlers.simulator.cluster import GiB, PodRequest
from handlers.simulator.throughput import OutOfTraceError, SimulatedApplication, StepTime
from schemas.jobs import NodeUsage, OOMKind

MiB = 1024**2

#: Roles whose pods are data-parallel replicas: one replica per GPU of such a pod.
TRAINING_ROLES: frozenset[str] = frozenset({"worker", "chief"})

#: Slack when the clock lands on an epoch boundary computed along another path (float sums).
EPS = 1e-6

Pods = Mapping[tuple[str, int], PodRequest]


@dataclass(frozen=True, slots=True)
class MemoryModel:
    """Host memory one training replica needs: a fixed part (framework, model, optimizer
    state, data-loader workers) and a part that grows with the local batch (prefetched
    samples). These are assumptions of scale, not measurements: the Pollux traces record
    no host memory."""

    base: int
    per_sample: int

    def need(self, local_bsz: int) -> int:
        return self.base + self.per_sample * local_bsz


MEMORY_MODELS: Mapping[str, MemoryModel] = {
    # BERT-base fine-tuning on SQuAD: large model and tokenised dataset in memory.
    "bert": MemoryModel(base=6 * GiB, per_sample=32 * MiB),
    # ResNet-18 on CIFAR-10: the whole dataset (~180 MB) fits in memory.
    "cifar10": MemoryModel(base=2 * GiB, per_sample=1 * MiB),
    # DeepSpeech2 on LibriSpeech: spectrogram batches are large.
    "deepspeech2": MemoryModel(base=4 * GiB, per_sample=32 * MiB),
    # ResNet-50 on ImageNet: JPEG decoding workers and their prefetch queues.
    "imagenet": MemoryModel(base=8 * GiB, per_sample=16 * MiB),
    # NeuMF on MovieLens: rating matrix and embedding tables, tiny samples.
    "ncf": MemoryModel(base=4 * GiB, per_sample=4 * 1024),
    # YOLOv3 on PASCAL VOC: augmentation workers on 416x416 images.
    "yolov3": MemoryModel(base=6 * GiB, per_sample=64 * MiB),
}
DEFAULT_MEMORY_MODEL = MemoryModel(base=4 * GiB, per_sample=8 * MiB)


def memory_model(application: str) -> MemoryModel:
    return MEMORY_MODELS.get(application, DEFAULT_MEMORY_MODEL)


def replicas(pods: Pods) -> int:
    """Data-parallel replicas of a set of pods: one per GPU of a training pod."""
    return sum(p.gpu for p in pods.values() if p.role in TRAINING_ROLES)


@dataclass(frozen=True, slots=True)
class Rates:
    """The running configuration's step time, iteration time, global batch and goodput."""

    step: StepTime
    iteration: float
    batch: int
    goodput: float


@dataclass(frozen=True, slots=True)
class Stretch:
    """Where a stretch of training left the job: its clock, optimizer steps and progress,
    and whether it ended at an epoch's end (``last``: the job's final epoch)."""

    clock: float
    steps: float
    progress: float
    epoch_ended: bool
    last: bool


class TrainingModel:
    """The application a job trains and the batch it trains with: the batch it was
    submitted with (split by the application's rule over its replicas) unless a plan set
    the local batch and accumulation (``override``)."""

    def __init__(
        self,
        app: SimulatedApplication,
        memory: MemoryModel,
        target_batch: int,
        override: tuple[int, int] | None = None,
    ) -> None:
        self.app = app
        self.memory = memory
        self.target_batch = target_batch
        self.override = override

    def batch(self, replicas: int) -> tuple[int, int]:
        """(local_bsz, accumulation_steps) at a replica count: the plan's, else the rule's."""
        if self.override is not None:
            return self.override
        return self.app.split_batch(self.target_batch, max(replicas, 1))

    def rates(self, pods: Pods, placement: tuple[int, ...], progress: float) -> Rates:
        """The rates of ``pods`` placed so, at ``progress`` (its epoch sets the gain);
        OutOfTraceError beyond what was measured."""
        count = replicas(pods)
        local_bsz, accumulation = self.batch(count)
        step = self.app.step_time(placement, local_bsz)
        iteration = step.iteration_time(accumulation)
        batch = count * local_bsz * accumulation
        epoch = min(self.app.epoch_at(progress), self.app.max_epochs - 1)
        return Rates(step, iteration, batch, self.app.gain(batch, epoch) / iteration)

    def out_of_memory(self, pods: Pods) -> tuple[OOMKind, int | None, list[PodRequest]]:
        """The training replicas that run out of memory at their first step with the
        batch, and which memory: the GPU's (a micro-batch beyond the largest traced), or
        the pod's (with what a replica needs); no pods when it fits."""
        local_bsz, _ = self.batch(replicas(pods))
        training = [p for p in pods.values() if p.role in TRAINING_ROLES]
        if local_bsz > self.app.max_local_bsz:
            return OOMKind.GPU_MEMORY, None, training
        need = self.memory.need(local_bsz)
        return OOMKind.HOST_MEMORY, need, [p for p in training if p.memory and p.memory < need]

    def starves(self, pods: Pods) -> bool:
        """Whether a gang about to start would run out of memory (GPU or host) at once."""
        local_bsz, _ = self.batch(replicas(pods))
        if local_bsz > self.app.max_local_bsz:
            return True
        need = self.memory.need(local_bsz)
        return any(p.memory and p.memory < need for p in pods.values() if p.role in TRAINING_ROLES)

    def memory_used(self, pod: PodRequest, local_bsz: int) -> int:
        if pod.role not in TRAINING_ROLES:
            return 0
        need = self.memory.need(local_bsz)
        return min(need, pod.memory) if pod.memory else need

    def train(
        self,
        pods: Pods,
        placement: tuple[int, ...],
        clock: float,
        steps: float,
        progress: float,
        horizon: float,
    ) -> Stretch:
        """Train from ``clock`` to the first of ``horizon`` and the end of the current
        epoch."""
        rates = self.rates(pods, placement, progress)
        iteration, goodput = rates.iteration, rates.goodput
        epoch = self.app.epoch_at(progress)
        boundary = self.app.epoch_end_progress(epoch)
        to_boundary = (boundary - progress) / goodput
        if clock + to_boundary <= horizon + EPS:
            clock += to_boundary
            steps += to_boundary / iteration
            return Stretch(clock, steps, boundary, True, epoch + 1 >= self.app.max_epochs)
        # An epoch end reached within EPS past the horizon may leave the clock just beyond it.
        elapsed = max(0.0, horizon - clock)
        clock += elapsed
        steps += elapsed / iteration
        progress += goodput * elapsed
        return Stretch(clock, steps, progress, False, False)

    def finish_at(
        self, pods: Pods, placement: tuple[int, ...], t: float, progress: float
    ) -> float | None:
        """Clock at which training from ``progress`` at ``t`` completes if nothing
        changes; None beyond what was measured."""
        try:
            self.rates(pods, placement, progress)
        except OutOfTraceError:
            return None
        for epoch in range(self.app.epoch_at(progress), self.app.max_epochs):
            goodput = self.rates(pods, placement, progress).goodput
            boundary = self.app.epoch_end_progress(epoch)
            t += (boundary - progress) / goodput
            progress = boundary
        return t

    def measured(
        self, pods: Pods, placement: tuple[int, ...], progress: float, steps: float
    ) -> dict[str, Any]:
        """What the replicas measure at a sample: the fields of a RuntimeSample but its
        envelope."""
        rates = self.rates(pods, placement, progress)
        step, iteration, batch = rates.step, rates.iteration, rates.batch
        local_bsz, accumulation = self.batch(replicas(pods))
        nodes = [
            NodeUsage(
                type=pod.role,
                id=pod.index,
                cpu=pod.cpu,
                memory=self.memory_used(pod, local_bsz),
                gpu_util=(step.compute_time / step.step_time) if pod.gpu else None,
                step_time=iteration,
            )
            for pod in pods.values()
        ]
        epoch = min(self.app.epoch_at(progress), self.app.max_epochs - 1)
        stats = self.app.grad_stats(batch, epoch)  # None: the application has none
        world_size = replicas(pods)
        # Per optimizer step: the all-reduce the compute did not hide happens once, after
        # the last micro-step; the rest is compute (k micro-steps). One replica reduces
        # with no one: what its trace calls sync is step overhead, i.e. compute.
        allreduce = step.sync_time if world_size > 1 else 0.0
        return {
            "global_step": int(steps + EPS),
            "speed": 1 / iteration,
            "samples_per_s": batch / iteration,
            "batch_size": batch,
            "local_batch_size": local_bsz,
            "accumulation_steps": accumulation,
            "world_size": world_size,
            "nodes": nodes,
            "num_nodes": len(placement),
            "grad_sqr": None if stats is None else stats[0],
            # The traces' variance is that of a mean over the initial batch; the sample's
            # is that of one sample's gradient (schemas.jobs.RuntimeSample.grad_var).
            "grad_var": None if stats is None else stats[1] * self.app.init_batch_size,
            "compute_s": iteration - allreduce,
            "allreduce_s": allreduce,
        }


__all__ = [
    "DEFAULT_MEMORY_MODEL",
    "EPS",
    "MEMORY_MODELS",
    "TRAINING_ROLES",
    "MemoryModel",
    "Rates",
    "Stretch",
    "TrainingModel",
    "memory_model",
    "replicas",
]
