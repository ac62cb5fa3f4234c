"""The Pollux artifact's scheduling loop, over this project's throughput model: a fidelity check.

The virtual env is only worth its verdicts if its job model behaves like the one whose
results were published. The Pollux (OSDI'21) artifact (petuum/adaptdl, ``simulator/`` at
the commit named in data/pollux/SOURCE.md) publishes mean JCTs on workload-6 for two
baselines, Tiresias and Optimus+Oracle, each driven by a 60 s scheduling loop. Running the
same loop and the same two policies over ``throughput.Application`` (step times,
gradient statistics, epoch progress) must give the same numbers; if it does not, the model
drifted from the measurements, and every A/B verdict of the virtual env with it.

The loop takes its policy as a parameter (`LoopPolicy`). Optimus+Oracle lives here: only
this check runs it. Tiresias is the brain's own scheduler
(``streams/brain/core/schedulers/tiresias.py``), written once: handlers never import
streams, so tests/unit/brain/core/schedulers/test_tiresias_artifact.py drives it through this loop.

What is reproduced, and how it differs from the virtual env's own operator on purpose:

- Time moves in whole scheduling intervals; every (re)allocation costs a 30 s restart;
  an epoch boundary is reached after a whole number of seconds (the artifact rounds the
  time to the boundary, half to even), and the job completes after its last epoch.
- A job's batch is fixed (the workload's); it is split over its replicas with gradient
  accumulation only when a replica's share does not fit, except that a single replica
  training above the reference batch always accumulates (the artifact's rule).
- Placement takes GPUs from the node with the most free ones, first node on ties, and a
  job keeps the GPUs it holds while its size does not change.

Pure: no I/O (the caller reads the workload text and loads the applications), no clock
but the simulated one, no randomness (both policies are deterministic).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from handlers.simulator.throughput import Application, StepTime

#: The artifact's scheduling interval and restart cost, in seconds.
INTERVAL = 60
RESTART_DELAY = 30


@dataclass(frozen=True, slots=True)
class WorkloadJob:
    """One row of a Pollux workload CSV."""

    name: str
    time: int
    application: str
    num_replicas: int
    batch_size: int


def read_workload(text: str) -> list[WorkloadJob]:
    """The rows of a workload CSV (name,time,application,num_replicas,batch_size), in order."""
    return [
        WorkloadJob(
            row["name"],
            int(row["time"]),
            row["application"],
            int(row["num_replicas"]),
            int(row["batch_size"]),
        )
        for row in csv.DictReader(io.StringIO(text))
    ]


@dataclass(frozen=True, slots=True)
class ActiveJob:
    """What a policy sees of a submitted, unfinished job at a scheduling round."""

    name: str
    app: Application
    epoch: int  # epochs completed
    target_replicas: int
    target_batch: int


#: Job name -> the node index of each GPU it holds (a node repeats once per GPU).
HeldGpus = dict[str, tuple[int, ...]]


class LoopPolicy(Protocol):
    """Who holds which GPUs for the next interval, from the jobs submitted and not done,
    each node's GPUs and what every job held in the last one."""

    def allocate(
        self,
        now: int,
        jobs: Sequence[ActiveJob],
        node_gpus: Sequence[int],
        previous: Mapping[str, tuple[int, ...]],
    ) -> HeldGpus: ...


def _place(count: int, free: dict[int, int], into: list[int] | None = None) -> tuple[int, ...]:
    """Take count GPUs, each run from the node with the most free ones (first on ties)."""
    nodes = into if into is not None else []
    while len(nodes) < count:
        node = max(free, key=lambda n: free[n])
        take = min(free[node], count - len(nodes))
        if take <= 0:
            raise ValueError(f"cannot place {count} GPUs: the cluster is full")
        nodes.extend([node] * take)
        free[node] -= take
    return tuple(nodes)


def _free(node_gpus: Sequence[int], held: Mapping[str, tuple[int, ...]]) -> dict[int, int]:
    """Free GPUs per node, in node order, leaving out nodes with none (as the artifact)."""
    used: dict[int, int] = {}
    for nodes in held.values():
        for n in nodes:
            used[n] = used.get(n, 0) + 1
    return {n: g - used.get(n, 0) for n, g in enumerate(node_gpus) if g - used.get(n, 0) > 0}


def _iterations(app: Application, batch_size: int, epoch: int) -> float:
    """Optimizer steps a fixed-batch run has taken by the end of an epoch, between the
    traced runs around its batch size (the artifact's oracle of remaining work)."""
    sizes = app.batch_sizes
    lower = max((b for b in sizes if b <= batch_size), default=None)
    upper = min((b for b in sizes if b >= batch_size), default=None)
    if lower is None or upper is None:
        raise ValueError(f"{app.name}: batch {batch_size} is outside the traced runs {sizes}")
    lo_it = app.validation[lower][epoch].iteration
    up_it = app.validation[upper][epoch].iteration
    if lower == upper:
        return lo_it
    return ((batch_size - lower) * up_it + (upper - batch_size) * lo_it) / (upper - lower)


def _chunks(replicas: int, per_node: int) -> tuple[int, ...]:
    """Replicas packed on as few nodes as possible: Optimus's model of a placement."""
    full, rest = divmod(replicas, per_node)
    return (per_node,) * full + ((rest,) if rest else ())


@dataclass
class Optimus:
    """Optimus with an oracle: greedy marginal gain of remaining time, one GPU at a time.

    Every job gets one GPU first (in submission order, while any are left); then each
    further GPU goes to the job whose predicted step time drops the most, weighted by the
    optimizer steps it has left (known exactly from the traces: the oracle). A job keeps
    its GPUs while its count does not change; new gangs take the fullest free nodes,
    smallest jobs first.
    """

    gpus_per_node: int = 4
    #: (application, batch, replicas) -> predicted step time: the same few sizes are asked
    #: about every round.
    _predicted: dict[tuple[str, int, int], float] = field(default_factory=dict, init=False)

    def allocate(
        self,
        now: int,
        jobs: Sequence[ActiveJob],
        node_gpus: Sequence[int],
        previous: Mapping[str, tuple[int, ...]],
    ) -> HeldGpus:
        remaining: dict[str, float] = {}
        limit: dict[str, int] = {}
        for job in jobs:
            last = job.app.max_epochs - 1
            remaining[job.name] = (
                1.0
                if last <= job.epoch
                else _iterations(job.app, job.target_batch, last)
                - _iterations(job.app, job.target_batch, job.epoch)
            )
            limit[job.name] = (
                1 if job.app.name == "ncf" else job.target_batch // job.app.min_local_bsz
            )
        gpus = sum(node_gpus)
        replicas: dict[str, int] = {}
        gain: dict[str, float] = {}

        def marginal(job: ActiveJob) -> float:
            n = replicas[job.name]
            if n + 1 > limit[job.name] or gpus < 1:
                return 0.0
            before = self.predict_step_time(job, n)
            return (before - self.predict_step_time(job, n + 1)) * remaining[job.name]

        for job in jobs:
            if gpus < 1:
                replicas[job.name], gain[job.name] = 0, 0.0
                continue
            replicas[job.name] = 1
            gpus -= 1
            gain[job.name] = marginal(job)
        by_name = {j.name: j for j in jobs}
        while gpus > 0 and gain and max(gain.values()) > 0:
            key = max(gain, key=lambda k: gain[k])
            replicas[key] += 1
            gain[key] = marginal(by_name[key])
            gpus -= 1
        allocations = {k: v for k, v in previous.items() if k in replicas and len(v) == replicas[k]}
        free = _free(node_gpus, allocations)
        for job in sorted(jobs, key=lambda j: replicas[j.name]):
            if replicas[job.name] > 0 and not allocations.get(job.name):
                allocations[job.name] = _place(replicas[job.name], free)
        return allocations

    def predict_step_time(self, job: ActiveJob, replicas: int) -> float:
        """Seconds per optimizer step at a size, with the batch split as the job would."""
        key = (job.app.name, job.target_batch, replicas)
        known = self._predicted.get(key)
        if known is None:
            known = self._predicted[key] = self._predict(job, replicas)
        return known

    def _predict(self, job: ActiveJob, replicas: int) -> float:
        app = job.app
        local = math.ceil(job.target_batch / replicas - 1e-8)
        accum = math.ceil(local / app.max_local_bsz - 1e-8) - 1
        if replicas == 1:
            accum = max(1, accum)
        atomic = math.ceil(local / (accum + 1) - 1e-8)
        atomic = min(atomic, int(app.max_batch_size / (replicas * (accum + 1))))
        step = app.step_time(_chunks(replicas, self.gpus_per_node), atomic)
        return step.step_time + step.compute_time * accum


@dataclass
class SimJob:
    """One job in the artifact's loop: fixed batch, progress in scale-invariant iterations."""

    spec: WorkloadJob
    app: Application
    time: int = 0
    completed_at: int | None = None
    placement: tuple[int, ...] = ()
    atomic_bsz: int = 0
    accum: int = 0  # extra micro-steps per optimizer step (0: no accumulation)
    rescale: int = 0
    progress: float = 0.0
    epoch: int = 0
    restarts: int = -1
    _step: tuple[tuple[int, ...], int, StepTime] | None = field(default=None, init=False)

    def _step_time(self) -> StepTime:
        """The step time of the current configuration, looked up once per configuration."""
        if self._step is None or self._step[:2] != (self.placement, self.atomic_bsz):
            step = self.app.step_time(self.placement, self.atomic_bsz)
            self._step = (self.placement, self.atomic_bsz, step)
        return self._step[2]

    def split(self) -> None:
        """Local batch and accumulation for the fixed batch over the current placement."""
        app, batch = self.app, self.spec.batch_size
        replicas = sum(self.placement)
        local = math.ceil(batch / replicas - 1e-8)
        self.accum = math.ceil(local / app.max_local_bsz - 1e-8) - 1
        if replicas == 1 and batch > app.init_batch_size:
            self.accum = max(1, self.accum)
        self.atomic_bsz = math.ceil(local / (self.accum + 1) - 1e-8)
        count = replicas * (self.accum + 1)
        self.atomic_bsz = min(self.atomic_bsz, int(app.max_batch_size / count))

    def reallocate(self, placement: tuple[int, ...]) -> None:
        self.placement = placement
        if placement:
            self.split()
            self.rescale = RESTART_DELAY
            self.restarts += 1
        else:
            self.atomic_bsz = 0

    def step(self, seconds: int) -> None:
        """Train for one interval (or sit in it, without GPUs or once done)."""
        if not self.placement:
            self.time += seconds
            return
        delay = min(self.rescale, seconds)
        self.time += delay
        self.rescale -= delay
        seconds -= delay
        app = self.app
        while seconds > 0 and self.completed_at is None:
            replicas = sum(self.placement)
            batch = replicas * self.atomic_bsz * (self.accum + 1)
            step = self._step_time()
            goodput = app.gain(batch, self.epoch) / step.iteration_time(self.accum + 1)
            boundary = app.epoch_end_progress(self.epoch)
            if self.progress + goodput * seconds < boundary:
                self.progress += goodput * seconds
                self.time += seconds
                seconds = 0
            else:
                self.epoch += 1
                delta = round(float((boundary - self.progress) / goodput))
                if self.epoch >= app.max_epochs:
                    self.completed_at = self.time + delta
                self.progress = boundary
                self.time += delta
                seconds -= delta
        self.time += seconds


def _placement(nodes: tuple[int, ...]) -> tuple[int, ...]:
    """GPUs per node, in the order the allocation lists its nodes."""
    out: list[int] = []
    for i, n in enumerate(nodes):
        if i and n == nodes[i - 1]:
            out[-1] += 1
        else:
            out.append(1)
    return tuple(out)


@dataclass(frozen=True)
class Result:
    jct: dict[str, int]  # job -> completion minus submission, seconds
    makespan: int
    restarts: dict[str, int]

    @property
    def mean_jct(self) -> float:
        return sum(self.jct.values()) / len(self.jct)


def simulate(
    workload: Sequence[WorkloadJob],
    policy: LoopPolicy,
    applications: Callable[[str], Application],
    *,
    nodes: int = 16,
    gpus_per_node: int = 4,
    interval: int = INTERVAL,
    max_rounds: int = 100_000,
) -> Result:
    """Run the workload to the last completion: every interval, each job trains, then the
    policy re-allocates among the jobs submitted and not yet done."""
    jobs = [SimJob(w, applications(w.application)) for w in workload]
    node_gpus = [gpus_per_node] * nodes
    allocations: HeldGpus = {}
    now = 0
    for _ in range(max_rounds):
        if all(j.completed_at is not None for j in jobs):
            break
        for job in jobs:
            job.step(interval)
        now += interval
        active = [
            ActiveJob(j.spec.name, j.app, j.epoch, j.spec.num_replicas, j.spec.batch_size)
            for j in jobs
            if j.spec.time <= now and j.completed_at is None
        ]
        if not active:
            continue
        names = {a.name for a in active}
        allocations = {k: v for k, v in allocations.items() if k in names}
        chosen = policy.allocate(now, active, node_gpus, allocations)
        for job in jobs:
            key = job.spec.name
            if chosen.get(key) != allocations.get(key):
                job.reallocate(_placement(chosen.get(key, ())))
        allocations = chosen
    else:
        raise RuntimeError(f"the workload did not finish within {max_rounds} rounds")
    jct: dict[str, int] = {}
    for job in jobs:
        assert job.completed_at is not None
        jct[job.spec.name] = job.completed_at - job.spec.time
    return Result(
        jct=jct,
        makespan=now,
        restarts={j.spec.name: max(j.restarts, 0) for j in jobs},
    )


__all__ = [
    "INTERVAL",
    "RESTART_DELAY",
    "ActiveJob",
    "HeldGpus",
    "LoopPolicy",
    "Optimus",
    "Result",
    "SimJob",
    "WorkloadJob",
    "read_workload",
    "simulate",
]
