"""goodput-cluster offline, in the Pollux artifact's 60 s loop with oracle throughput.

The allocator is driven tick by tick over a Pollux workload: each job's step time comes
from the traces (the oracle, through handlers.simulator.throughput), its gradient
statistics from the trace of its current epoch, and the job trains with the GPUs and the
batch the schedule gives it (a placement change costs the artifact's 30 s restart, a
batch-only change nothing). The small run below is part of the suite; the whole of
workload-6 takes minutes on this machine, so it runs only when asked:

    DLROVER_EVENTS_SCHEDULER_WORKLOAD=workload-6 .venv/bin/pytest -q -s \
        tests/unit/brain/core/schedulers/test_scheduler_workload.py

and prints the mean JCT (the issue's reference: ~2,460 s for such an allocator, Pollux
publishes 2,446 s, Tiresias 3,470 s).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from handlers.simulator.artifact import INTERVAL, RESTART_DELAY, SimJob, WorkloadJob, read_workload
from handlers.simulator.throughput import Application, OutOfTraceError, load_application
from handlers.simulator.workload import workload_path
from streams.brain.core.schedulers.api import (
    ClusterCapacity,
    JobInput,
    used_gpus,
)
from streams.brain.core.schedulers.goodput import BatchLimits, GradStats, JobModel
from streams.brain.core.schedulers.goodput_cluster import GoodputClusterParams, schedule


@dataclass(frozen=True, slots=True)
class OracleStepTime:
    """The traces' step time: replicas spread evenly over the nodes, as whole nodes."""

    app: Application

    def step_time(self, nodes: int, replicas: int, local_batch: int, accumulation: int) -> float:
        per_node, rest = divmod(replicas, nodes)
        placement = [per_node + (1 if i < rest else 0) for i in range(nodes)]
        try:
            return self.app.step_time(placement, local_batch).iteration_time(accumulation)
        except OutOfTraceError:
            return math.inf


def limits(app: Application) -> BatchLimits:
    if app.name == "ncf":  # as the artifact runs ncf under Pollux: one GPU, batch 32768
        return BatchLimits(
            32768, 32768, app.min_local_bsz, app.max_local_bsz, adaptive=False, max_replicas=1
        )
    return BatchLimits(
        app.init_batch_size,
        app.max_batch_size,
        app.min_local_bsz,
        app.max_local_bsz,
        max_replicas=min(64, app.max_batch_size // app.min_local_bsz),
    )


@dataclass
class Run:
    sim: SimJob
    restarts: int = 0


def run(
    workload: Sequence[WorkloadJob],
    *,
    nodes: int = 16,
    gpus_per_node: int = 4,
    params: GoodputClusterParams | None = None,
    max_rounds: int = 5_000,
) -> tuple[dict[str, int], int]:
    """Per-job JCT and the number of changes made, to the last completion."""
    cluster = ClusterCapacity.uniform(nodes, gpus_per_node)
    index = {n.name: i for i, n in enumerate(cluster.nodes)}
    runs = {w.name: Run(SimJob(w, load_application(w.application))) for w in workload}
    held: dict[str, tuple[tuple[str, int], ...]] = {}
    changes = 0
    now = 0
    for _ in range(max_rounds):
        if all(r.sim.completed_at is not None for r in runs.values()):
            break
        for r in runs.values():
            r.sim.step(INTERVAL)
        now += INTERVAL
        inputs = []
        for name, r in runs.items():
            sim = r.sim
            if sim.spec.time > now or sim.completed_at is not None:
                continue
            app = sim.app
            batch = sum(sim.placement) * sim.atomic_bsz * (sim.accum + 1) or app.init_batch_size
            sqr, var = app.grad_stats(batch, sim.epoch)
            inputs.append(
                JobInput(
                    name,
                    sim.spec.time,
                    JobModel(OracleStepTime(app), GradStats(sqr, var), limits(app)),
                    held.get(name, ()),
                    local_batch=sim.atomic_bsz or None,
                    accumulation=sim.accum + 1,
                    restarts=r.restarts,
                )
            )
        if not inputs:
            continue
        s = schedule(now, cluster, inputs, params)
        assert all(used <= gpus_per_node for used in used_gpus(s.holdings).values()), (
            "more GPUs than a node has"
        )
        changes += len(s.changes)
        for a in s.holdings:
            sim = runs[a.job_id].sim
            if a.placement != held.get(a.job_id, ()):
                if held.get(a.job_id):
                    runs[a.job_id].restarts += 1
                ordered = sorted(a.placement, key=lambda p: index[p[0]])
                sim.placement = tuple(g for _, g in ordered)
                sim.rescale = RESTART_DELAY if a.placement else 0
                held[a.job_id] = a.placement
            if a.batch is not None:
                sim.atomic_bsz = a.batch.local_batch
                sim.accum = a.batch.accumulation - 1
            elif not a.placement:
                sim.atomic_bsz, sim.accum = 0, 0
        for name in [k for k in held if runs[k].sim.completed_at is not None]:
            del held[name]
    else:
        raise AssertionError(f"the workload did not finish within {max_rounds} rounds")
    jct = {}
    for name, r in runs.items():
        assert r.sim.completed_at is not None
        jct[name] = r.sim.completed_at - r.sim.spec.time
    return jct, changes


def test_a_small_workload_finishes_and_a_second_run_gives_the_same_jcts() -> None:
    """Eight jobs of workload-6, all submitted at once on 2 x 4 GPUs: every one
    finishes, and the schedule is the same the second time (deterministic)."""
    rows = read_workload(workload_path("workload-6").read_text())
    picked = [r for r in rows if r.application in ("cifar10", "ncf", "deepspeech2")][:8]
    small = [WorkloadJob(r.name, 0, r.application, r.num_replicas, r.batch_size) for r in picked]
    first, changes = run(small, nodes=2)
    assert set(first) == {r.name for r in small}
    assert run(small, nodes=2) == (first, changes)


def report(name: str) -> None:
    """A whole workload's mean JCT (minutes, so not a test): `.venv/bin/python -m
    tests.unit.brain.core.schedulers.test_scheduler_workload workload-6`."""
    workload = read_workload(workload_path(name).read_text())
    started = time.perf_counter()
    jct, changes = run(workload)
    wall = time.perf_counter() - started
    mean = sum(jct.values()) / len(jct)
    print(f"{name}: {len(jct)} jobs, mean JCT {mean:.1f} s, {changes} decisions, {wall:.1f} s wall")


if __name__ == "__main__":
    import sys

    report(sys.argv[1] if len(sys.argv) > 1 else "workload-6")
