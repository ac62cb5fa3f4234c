"""`dlrover-events bench brain` on the real broker and Postgres: a short run prints, last,
the JSON line the issue asks for, with numbers that come from this run (no timing is
asserted: speed is the benchmark's to report, not a test's to judge)."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from dlrover_events.settings import Settings
from tests.conftest import REPO, cli_environ

pytestmark = pytest.mark.integration


async def test_bench_brain_prints_its_measures_last(settings: Settings, pg_dsn: str) -> None:
    environ = cli_environ(settings, pg_dsn)
    script = "from dlrover_events.cli.app import main; main()"
    args = ["bench", "brain", "--events", "8000", "--jobs", "5", "--rate", "200", "--seconds", "2"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        *args,
        "--no-faust-raw",
        cwd=REPO,
        env=environ,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(240):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()[-3000:]
    result = json.loads(out.decode().strip().splitlines()[-1])
    assert result["events"] == 8000 and result["jobs"] == 5
    assert result["events_per_s"] > 0 and result["baseline_events_per_s"] > 0
    assert result["ratio_to_baseline"] == round(
        result["events_per_s"] / result["baseline_events_per_s"], 4
    )
    # 2 s at 200 events/s; some of them (OOMs, every tenth event of a job) cause ScalePlans
    assert result["latency_events"] == 400
    assert 0 < result["latency_samples"] <= 400
    for name in ("plan_latency", "plan_seen_latency", "bus_latency"):
        assert 0 <= result[f"{name}_p50_ms"] <= result[f"{name}_p99_ms"]
    # a plan is seen after it is published
    assert result["plan_seen_latency_p50_ms"] >= result["plan_latency_p50_ms"]
    assert result["decisions"] > 0 and result["scale_plans"] > 0
    # faust's fetched batches alone, the brain's path through faust
    assert result["faust_sink_events_per_s"] > 0
    # one phase per --rate given, its backlog counted in records
    (phase,) = result["latency_by_rate"]
    assert phase["rate_events_per_s"] == 200 and phase["events"] == 400
    assert 0 <= phase["backlog_end_records"] <= phase["backlog_max_records"] <= 400
    # the decisions alone, without the bus, over the same events
    assert result["decide_only_events_per_s"] > 0
    assert result["ratio_to_decide_only"] == round(
        result["events_per_s"] / result["decide_only_events_per_s"], 4
    )
