"""An A/B run's GPU accounting on the real broker and Postgres (issue 26, item 8): no arm's
GPU-use chart, nor its exact ledger, ever holds more GPUs than the arm's cluster has, and
its gpu_hours are what the same arm's simulated cluster was busy for, run in one process
(tests/unit/ab/test_gpu_accounting.py reads that cluster's nodes after every move)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from dlrover_events.domain.workloads import read_trace
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.settings import Settings
from handlers.simulator.workload import workload_path
from schemas.jobs import JobSubmitted
from streams.ab.arms import PRESETS, Arm
from streams.ab.runner import ABTest, ArmCluster
from streams.evaluators.ledger import gpus_held
from streams.evaluators.service import ledger_of
from tests.unit.ab.test_gpu_accounting import GPUS, NODES, run_arm, scheduler_of

pytestmark = pytest.mark.integration

JOBS = 20  # the first jobs of workload-3: on 16 GPUs, Tiresias preempts some


def first_jobs(folder: Path) -> Path:
    """The workload's first JOBS jobs by arrival, as a trace of their own."""
    header, *rows = workload_path("workload-3").read_text().splitlines()
    rows.sort(key=lambda row: float(row.split(",")[1]))
    trace = folder / "workload-3-start.csv"
    trace.write_text("\n".join([header, *rows[:JOBS]]) + "\n")
    return trace


@pytest.mark.timeout(900)
async def test_no_arm_of_an_ab_run_holds_more_gpus_than_its_cluster(
    settings: Settings, pg_dsn: str, tmp_path: Path
) -> None:
    trace = first_jobs(tmp_path)
    arms = [Arm(name, PRESETS[name]) for name in ("tiresias", "goodput-cluster", "static")]
    test = ABTest(
        settings,
        pg_dsn,
        arms,
        trace=trace,
        cluster=ArmCluster(nodes=NODES, gpus_per_node=GPUS),
        timeout_s=600,
        poll_s=0.5,
        keep_envs=True,
    )
    capacity = NODES * GPUS
    subs = [e for _, e in read_trace(trace, "lockstep") if isinstance(e, JobSubmitted)]
    try:
        results = await test.run()
        for arm, result in zip(arms, results, strict=True):
            assert result.unfinished == 0, arm.name
            assert max(gpus for _, gpus in result.gpu_use) <= capacity, arm.name  # the chart
            ledger = await ledger_of(settings, result.env)
            exact = gpus_held(ledger.in_window(None, None))
            assert max(gpus for _, gpus in exact) <= capacity, (arm.name, max(exact))
            fleet, _ = run_arm(subs, scheduler_of(arm.name))
            settled = sorted(dict(fleet.held).items())
            busy = sum(h * (nxt - t) for (t, h), (nxt, _) in itertools.pairwise(settled))
            assert result.metrics["gpu_hours"] == pytest.approx(busy / 3600, rel=1e-9), arm.name
    finally:
        registry = EnvRegistry(settings, pg_dsn)
        for arm in arms:
            await registry.delete(arm.env(test.run_id))
