"""A/B tests end to end on the real broker and Postgres, with the virtual operator."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dlrover_events.bus.topic_reader import read_topic
from dlrover_events.bus.topics import ENV_TOPIC_NAMES, SCALE_RESULTS, topic
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.settings import Settings
from schemas import decode
from schemas.plans import ScaleResult, ScaleStatus
from streams.ab.arms import Arm
from streams.ab.report import compare
from streams.ab.runner import ABTest, ArmCluster
from streams.ab.summary import SCHEMA_VERSION, build_summary, write_summary
from tests.conftest import cli_environ

pytestmark = pytest.mark.integration

#: Small jobs of the Pollux applications, arriving over ten minutes (a workload CSV).
TRACE = """name,time,application,num_replicas,batch_size
ncf-0,10,ncf,1,32768
ncf-1,60,ncf,2,32768
cifar10-2,120,cifar10,2,256
ncf-3,300,ncf,4,32768
ncf-4,600,ncf,1,32768
"""


async def test_same_settings_give_the_same_result_and_arms_are_isolated(
    settings: Settings, pg_dsn: str, tmp_path: Path
) -> None:
    trace = tmp_path / "small.csv"
    trace.write_text(TRACE)
    static = {"brain": False}
    test = ABTest(
        settings,
        pg_dsn,
        [Arm("a", static), Arm("b", static)],
        trace=trace,
        cluster=ArmCluster(nodes=2, gpus_per_node=4, speed=None),
        timeout_s=300,
        keep_envs=True,
        poll_s=0.5,
    )
    try:
        a, b = await test.run()
        assert a.unfinished == 0
        assert b.unfinished == 0
        assert len(a.jct) == 5
        assert a.jct == b.jct, "same input and settings: the same completion times"
        assert a.metrics == b.metrics
        # The verdict reads every topic: runtime samples give throughput per GPU.
        assert a.metrics["throughput_per_gpu"] > 0
        assert a.metrics["gpu_hours"] > 0
        c = compare([a, b])
        assert c.jct_diff["b"].estimate == 0
        # The machine-readable verdict, as `ab run` writes it beside the report.
        path = write_summary(tmp_path / "report", build_summary(c, test.run_info()))
        summary = json.loads(path.read_text())
        assert {"schema_version", "trace", "baseline", "speed", "wall_s", "arms"} <= set(summary)
        assert (summary["trace"], summary["baseline"], summary["speed"]) == (
            str(trace),
            "a",
            "lockstep",
        )
        assert summary["wall_s"] > 0
        for arm, result in zip(summary["arms"], (a, b), strict=True):
            assert arm["name"] == result.name
            assert arm["jobs"] == result.jct
            assert arm["mean_jct_s"] == pytest.approx(sum(result.jct.values()) / 5)
            lo, hi = arm["jct_ci95_s"]
            assert lo <= arm["mean_jct_s"] <= hi
            assert arm["gpu_hours"] > 0
            assert arm["plans_per_job_hour"] == 0.0, "no brain, no plans"
            assert arm["jobs_unfinished"] == 0
        assert summary["arms"][1]["paired_diff_s"] == 0.0
        assert summary["arms"][1]["verdict"] == "tie"
        # Isolation: every event in an arm's topics belongs to that arm's env.
        for arm in (a, b):
            for name in ENV_TOPIC_NAMES:
                for record in await read_topic(settings, topic(arm.env, name)):
                    assert decode(record.value).env == arm.env
    finally:
        registry = EnvRegistry(settings, pg_dsn)
        for suffix in ("a", "b"):
            await registry.delete(f"ab-{test.run_id}-{suffix}")


async def test_ab_run_writes_its_verdict_as_json_beside_the_report(
    settings: Settings, pg_dsn: str, tmp_path: Path
) -> None:
    """The command a user (or a CI job) runs: summary.json is there, parses, and names the
    run, so a script can gate on the verdict; the arms' envs are deleted after the run."""
    trace = tmp_path / "one.csv"
    trace.write_text("name,time,application,num_replicas,batch_size\nncf-0,5,ncf,1,32768\n")
    static = tmp_path / "static.yaml"
    static.write_text("brain: false\n")
    out = tmp_path / "report"
    cli = str(Path(sys.executable).parent / "dlrover-events")
    arms = ["--arm", f"x={static}", "--arm", f"y={static}"]
    cluster = ["--nodes", "1", "--gpus", "4", "--speed", "max", "--timeout", "240"]
    done = await asyncio.to_thread(
        subprocess.run,
        [cli, "ab", "run", "--trace", str(trace), *arms, *cluster, "--out", str(out)],
        env=cli_environ(settings, pg_dsn),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert (out / "ab-report.html").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["schema_version"] == SCHEMA_VERSION
    assert (summary["trace"], summary["speed"], summary["baseline"]) == (str(trace), "max", "x")
    assert summary["cluster"] == {"nodes": 1, "gpus_per_node": 4}
    assert summary["wall_s"] > 0
    assert [a["name"] for a in summary["arms"]] == ["x", "y"]
    for arm in summary["arms"]:
        assert set(arm["jobs"]) == {"ncf-0"}
        assert arm["mean_jct_s"] == arm["jobs"]["ncf-0"] > 0
        assert arm["jobs_unfinished"] == 0
        assert arm["env"] == f"ab-{summary['run_id']}-{arm['name']}"
    assert summary["arms"][1]["verdict"] == "tie"
    names = {e.name for e in await EnvRegistry(settings, pg_dsn).list()}
    assert not {a["env"] for a in summary["arms"]} & names


async def test_two_arms_with_the_same_brain_settings_give_the_same_result(
    settings: Settings, pg_dsn: str, tmp_path: Path
) -> None:
    """In lockstep the brain's plans land at the same simulated second in both arms,
    however the machine's load delays either (out of lockstep: about ±2 s per job)."""
    trace = tmp_path / "small.csv"
    trace.write_text(TRACE)
    goodput = {"brain": {"job_config": {"optimizer": "goodput"}}}
    test = ABTest(
        settings,
        pg_dsn,
        [Arm("a", goodput), Arm("b", goodput)],
        trace=trace,
        cluster=ArmCluster(nodes=2, gpus_per_node=4, lockstep=True),
        timeout_s=240,
        keep_envs=True,
        poll_s=0.5,
    )
    try:
        a, b = await test.run()
        assert (a.unfinished, b.unfinished) == (0, 0)
        assert len(a.jct) == 5
        assert a.jct == b.jct, "same input and settings: the same completion times"
        assert a.metrics == b.metrics
        # The brain did decide: the arms are alike because of lockstep, not for want of plans.
        results = [decode(r.value) for r in await read_topic(settings, topic(a.env, SCALE_RESULTS))]
        applied = [
            r for r in results if isinstance(r, ScaleResult) and r.status is ScaleStatus.APPLIED
        ]
        assert applied, "the goodput brain rescaled no job"
    finally:
        registry = EnvRegistry(settings, pg_dsn)
        for suffix in ("a", "b"):
            await registry.delete(f"ab-{test.run_id}-{suffix}")
