"""`dlrover-events bench scheduler`: how long one round of a cluster scheduler takes, by
cluster size.

Pollux and Sia decide every 60 s, and Sia schedules 2,000+ GPUs: a round has to fit well
inside its interval at that size, the first round (every job waiting, nothing measured
of where it is) as well as the steady ones. The bench builds synthetic jobs (Pollux's
step-time model, compute linear in the local batch plus an all-reduce that grows with the
replicas and costs more across nodes; adaptive batches; gradient noise scales spread
over three decades, 10^2 to 10^5 samples), runs the first round on an empty cluster,
gives every job what the round gave it, and times the next rounds, each a minute later
with every job's gradient statistics moved a little (as new samples move them), so that
nothing a round computed is valid in the next. The rounds are the registered scheduler
itself, called in this process: no broker, no brain.

The last line printed is one JSON object. The machine may be shared: the JSON carries
its load.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from dataclasses import dataclass, replace

import typer

from dlrover_events.errors import UserError
from streams.brain.core.schedulers.api import (
    ClusterCapacity,
    JobInput,
    SchedulerError,
    SchedulerSpec,
)
from streams.brain.core.schedulers.goodput import BatchLimits, GradStats, JobModel, PerfParams
from streams.brain.core.schedulers.registry import get_scheduler

#: The sizes the issue asks about: GPUs as nodes x GPUs per node, and the jobs on them.
SIZES = ("16x4:160", "64x8:160", "128x8:250", "256x8:500")
#: The interval between rounds (the scheduler presets' tick).
INTERVAL_S = 60.0


@dataclass(frozen=True, slots=True)
class ClusterSize:
    nodes: int
    gpus_per_node: int
    jobs: int

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def parse_size(text: str) -> ClusterSize:
    """`NODESxGPUS:JOBS`, e.g. 256x8:500; a ValueError in one line otherwise."""
    shape, sep, jobs = text.partition(":")
    nodes, x, per = shape.partition("x")
    if not (sep and x and nodes.isdigit() and per.isdigit() and jobs.isdigit()):
        raise ValueError(f"{text!r} is not NODESxGPUS:JOBS (e.g. 256x8:500)")
    size = ClusterSize(int(nodes), int(per), int(jobs))
    if min(size.nodes, size.gpus_per_node, size.jobs) < 1:
        raise ValueError(f"{text!r}: nodes, GPUs per node and jobs must be at least 1")
    return size


def synthetic_jobs(count: int, seed: int) -> list[JobInput]:
    """`count` jobs submitted within the hour before 3600 s, waiting: compute 20-200 ms
    per micro-step plus 0.1-2 ms per sample, an all-reduce of 10-100 ms growing 1-10 %
    per replica past 2 and 1.5-4x dearer across nodes; a tuned batch of 64-1024 that may
    grow 8-64x; a gradient noise scale of 10^2-10^5 samples."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        alpha_c = rng.uniform(0.02, 0.2)
        beta_c = rng.uniform(1e-4, 2e-3)
        alpha_r = rng.uniform(0.01, 0.1)
        beta_r = alpha_r * rng.uniform(0.01, 0.1)
        perf = PerfParams(
            alpha_c,
            beta_c,
            alpha_r,
            beta_r,
            alpha_r * rng.uniform(1.5, 4),
            beta_r * rng.uniform(1.5, 4),
        )
        init = 2 ** rng.randint(6, 10)
        noise = 10 ** rng.uniform(2, 5)
        limits = BatchLimits(init, init * 2 ** rng.randint(3, 6), min_local=8, max_local=512)
        model = JobModel(perf, GradStats.from_noise_scale(noise, init), limits)
        out.append(JobInput(f"job-{i:04d}", rng.uniform(0, 3600), model))
    return out


@dataclass(frozen=True, slots=True)
class RoundTimes:
    size: ClusterSize
    first_s: float
    steady_s: list[float]
    held_gpus: int  # after the last round: a check that the rounds used the cluster

    def row(self) -> dict[str, object]:
        return {
            "gpus": self.size.gpus,
            "nodes": self.size.nodes,
            "gpus_per_node": self.size.gpus_per_node,
            "jobs": self.size.jobs,
            "first_s": round(self.first_s, 6),
            "steady_s": round(statistics.median(self.steady_s), 6),
            "steady_max_s": round(max(self.steady_s), 6),
            "held_gpus": self.held_gpus,
        }


def time_rounds(spec: SchedulerSpec, size: ClusterSize, steady: int, seed: int) -> RoundTimes:
    """The first round on the size's cluster, then `steady` more (see the module
    docstring)."""
    rng = random.Random(seed + 1)
    capacity = ClusterCapacity.uniform(size.nodes, size.gpus_per_node)
    params = spec.parse({})
    jobs = {j.job_id: j for j in synthetic_jobs(size.jobs, seed)}
    now = 3600.0
    times: list[float] = []
    held = 0
    for _ in range(1 + steady):
        started = time.perf_counter()
        schedule = spec.run(now, capacity, list(jobs.values()), params)
        times.append(time.perf_counter() - started)
        held = sum(h.replicas for h in schedule.holdings)
        for h in schedule.holdings:
            job = jobs[h.job_id]
            moved = sorted(h.placement) != sorted(job.placement)
            assert job.model is not None
            assert job.model.grad is not None
            grad = GradStats(job.model.grad.sqr, job.model.grad.var * rng.uniform(0.8, 1.25))
            jobs[h.job_id] = replace(
                job,
                placement=h.placement,
                local_batch=h.batch.local_batch if h.batch else None,
                accumulation=h.batch.accumulation if h.batch else 1,
                restarts=job.restarts + (1 if moved and job.placement else 0),
                model=replace(job.model, grad=grad),
            )
        now += INTERVAL_S
    return RoundTimes(size, times[0], times[1:], held)


def bench_scheduler(
    scheduler: str = typer.Option(
        "goodput-cluster", "--scheduler", metavar="NAME", help="a registered scheduler"
    ),
    size: list[str] = typer.Option(
        list(SIZES),
        "--size",
        metavar="NODESxGPUS:JOBS",
        help="a cluster and its jobs; repeat the option for several",
    ),
    steady: int = typer.Option(
        3, "--steady", min=1, metavar="N", help="rounds timed after the first"
    ),
    seed: int = typer.Option(0, "--seed", metavar="N", help="of the synthetic jobs"),
) -> None:
    """Time the first and the steady rounds of a cluster scheduler at each cluster size;
    the last line is one JSON object."""
    try:
        spec = get_scheduler(scheduler)
        sizes = [parse_size(text) for text in size]
    except (SchedulerError, ValueError) as err:
        raise UserError(str(err)) from None
    rows = []
    for s in sizes:
        got = time_rounds(spec, s, steady, seed)
        row = got.row()
        rows.append(row)
        typer.echo(
            f"{s.gpus} GPUs ({s.nodes} x {s.gpus_per_node}), {s.jobs} jobs: first round "
            f"{row['first_s']} s, steady {row['steady_s']} s (max {row['steady_max_s']} s), "
            f"{got.held_gpus} GPUs held"
        )
    typer.echo(
        json.dumps(
            {
                "bench": "scheduler",
                "scheduler": spec.name,
                "steady_rounds": steady,
                "seed": seed,
                "sizes": rows,
                "load": list(os.getloadavg()),
            }
        )
    )


__all__ = ["RoundTimes", "bench_scheduler", "parse_size", "synthetic_jobs", "time_rounds"]
