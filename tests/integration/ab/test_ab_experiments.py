"""`ab run --experiment` end to end on the real broker and Postgres: every arm runs the
experiment in its own virtual env (its searcher, its virtual operator simulating the
trials along the built-in curves), an arm's `experiment:` section changes its searcher,
and the arms' experiment KPIs come out. Each arm decides exactly what the one-process path
of the measurements decides for the same setup (tests/unit/ab/experiments_in_lockstep.py):
the same functions, in the same order."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from dlrover_events.bus.topic_reader import read_topic
from dlrover_events.bus.topics import TRIAL_DECISIONS, topic
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.settings import Settings
from handlers.simulator.workload import workload_path
from schemas import decode
from schemas.experiments import TrialDecision
from streams.ab.arms import PRESETS, Arm
from streams.ab.report import compare
from streams.ab.runner import ABTest, ArmCluster
from streams.ab.summary import build_summary
from tests.unit.ab.experiments_in_lockstep import Setup, experiment_document, run

pytestmark = pytest.mark.integration

#: 8 trials, 4 at a time on one node of 4 GPUs, rungs at 100, 400 and 1,600 steps.
SETUP = Setup(
    nodes=1,
    gpus_per_node=4,
    max_trials=8,
    concurrent=4,
    budget=1600.0,
    max_rungs=3,
    curve_scale=100.0,
)


async def _decisions(
    settings: Settings, env: str
) -> list[tuple[int, str, int | None, float | None]]:
    records = await read_topic(settings, topic(env, TRIAL_DECISIONS))
    return sorted(
        {
            (d.seq, d.decision.value, d.trial, d.budget)
            for d in (decode(r.value) for r in records)
            if isinstance(d, TrialDecision)
        }
    )


@pytest.fixture
async def cleanup(settings: Settings, pg_dsn: str) -> AsyncIterator[list[str]]:
    """The arms' envs (kept by the run to read their topics), deleted at the end."""
    envs: list[str] = []
    yield envs
    registry = EnvRegistry(settings, pg_dsn)
    for env in envs:
        with contextlib.suppress(Exception):
            await registry.delete(env, force=True)


async def test_ab_run_compares_searchers_on_the_same_curves(
    settings: Settings, pg_dsn: str, cleanup: list[str]
) -> None:
    test = ABTest(
        settings,
        pg_dsn,
        [
            Arm("asha", {"brain": False}),
            Arm("random", {"brain": False, "experiment": {"searcher": {"name": "random"}}}),
        ],
        cluster=ArmCluster(nodes=SETUP.nodes, gpus_per_node=SETUP.gpus_per_node),
        timeout_s=300,
        keep_envs=True,
        poll_s=0.5,
        experiment=experiment_document(SETUP),
        target=0.6,
        deadline_s=600.0,
    )
    asha, rand = await test.run()
    cleanup.extend([asha.env, rand.env])
    for arm, searcher in ((asha, "asha"), (rand, "random")):
        expected = run(replace(SETUP, searcher=searcher)).decisions
        assert await _decisions(settings, arm.env) == [
            (d.seq, d.decision.value, d.trial, d.budget) for d in expected
        ], searcher
        assert arm.metrics["trials"] == 8.0
        assert arm.metrics["best_metric"] > 0 and arm.metrics["trial_gpu_hours"] > 0
        assert "time_to_target_s" in arm.metrics and "best_by_deadline" in arm.metrics
        assert arm.jct == {}  # no input jobs: the trials are the experiment's, not compared
    # ASHA stops most trials early: fewer GPU-hours for the same 8 trials
    assert asha.metrics["trial_gpu_hours"] < rand.metrics["trial_gpu_hours"]
    summary = build_summary(compare([asha, rand]), test.run_info())
    assert summary["experiment"] == "sweep" and summary["trace"] is None
    assert summary["arms"][1]["metrics"]["best_metric"] == rand.metrics["best_metric"]


async def test_elastic_trials_beside_jobs_under_goodput_cluster_in_lockstep(
    settings: Settings, pg_dsn: str, tmp_path: Path, cleanup: list[str]
) -> None:
    """A brain arm in lockstep: the trials share the cluster with three Pollux jobs under
    goodput-cluster, elastic up to 4 GPUs in one arm, fixed in the other; each arm decides
    as the one-process path does."""
    setup = replace(
        SETUP,
        scheduler="goodput-cluster",
        nodes=2,
        max_gpus=4,
        jobs=3,
        workload="workloads/workload-6",
    )
    trace = tmp_path / "workload-6-first-3.csv"
    workload = workload_path("workload-6")
    trace.write_text("\n".join(workload.read_text().splitlines()[:4]) + "\n")
    test = ABTest(
        settings,
        pg_dsn,
        [
            Arm("fixed", {**PRESETS["goodput-cluster"], "experiment": {"max_gpus": 1}}),
            Arm("elastic", PRESETS["goodput-cluster"]),
        ],
        trace=trace,
        cluster=ArmCluster(nodes=setup.nodes, gpus_per_node=setup.gpus_per_node),
        timeout_s=600,
        keep_envs=True,
        poll_s=0.5,
        experiment=experiment_document(setup),
        target=0.6,
    )
    fixed, elastic = await test.run()
    cleanup.extend([fixed.env, elastic.env])
    for arm, gpus in ((fixed, 1), (elastic, 4)):
        # (under another env's name: a trial's uid is its request's, the same in both)
        expected = run(replace(setup, max_gpus=gpus)).decisions
        assert await _decisions(settings, arm.env) == [
            (d.seq, d.decision.value, d.trial, d.budget) for d in expected
        ], arm.name
        assert arm.unfinished == 0 and len(arm.jct) == 3
        assert "other_jct_mean_s" in arm.metrics and arm.metrics["trials"] == 8.0
