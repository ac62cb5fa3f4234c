"""summary.json: the A/B verdict a script reads, built purely from the comparison."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from dlrover_events.settings import Settings
from streams.ab.report import ArmResult, compare
from streams.ab.runner import ABTest, ArmCluster
from streams.ab.summary import (
    SCHEMA_VERSION,
    SUMMARY_FILE,
    RunInfo,
    build_summary,
    write_summary,
)

RUN = RunInfo(
    run_id="abc123",
    trace="workload-6.csv",
    source=None,
    speed="lockstep",
    nodes=16,
    gpus_per_node=4,
    wall_s=123.5,
)


def results() -> list[ArmResult]:
    jobs = [f"j{i}" for i in range(40)]
    static = ArmResult(
        "static",
        "ab-x-static",
        "defaults",
        {j: 3000.0 + 10 * i for i, j in enumerate(jobs)},
        {"gpu_hours": 100.0, "plans_per_job_hour": 0.0, "failed_jobs": 0.0},
    )
    goodput = ArmResult(
        "goodput",
        "ab-x-goodput",
        "gp.yaml",
        {j: 2000.0 + 10 * i for i, j in enumerate(jobs)},
        {"gpu_hours": 90.0, "plans_per_job_hour": 1.5, "failed_jobs": 1.0},
        unfinished=2,
    )
    same = ArmResult(
        "same", "ab-x-same", "defaults", {j: 3000.0 + 10 * i for i, j in enumerate(jobs)}, {}
    )
    return [static, goodput, same]


def test_the_summary_says_per_arm_what_the_report_says() -> None:
    c = compare(results())
    s = build_summary(c, RUN)
    assert s["schema_version"] == SCHEMA_VERSION
    assert (s["trace"], s["source"], s["baseline"], s["speed"]) == (
        "workload-6.csv",
        None,
        "static",
        "lockstep",
    )
    assert s["cluster"] == {"nodes": 16, "gpus_per_node": 4}
    assert (s["wall_s"], s["seed"], s["run_id"]) == (123.5, 0, "abc123")
    assert [a["name"] for a in s["arms"]] == ["static", "goodput", "same"]
    base, goodput, same = s["arms"]
    assert base["mean_jct_s"] == pytest.approx(3195)
    lo, hi = base["jct_ci95_s"]
    assert lo < 3195 < hi
    assert (base["paired_diff_s"], base["paired_diff_ci95_s"], base["verdict"]) == (
        0.0,
        [0.0, 0.0],
        "baseline",
    )
    assert goodput["paired_diff_s"] == pytest.approx(-1000)
    assert goodput["paired_diff_ci95_s"][1] < 0
    assert goodput["verdict"] == "better"
    assert goodput["paired_jobs"] == 40
    assert (goodput["gpu_hours"], goodput["plans_per_job_hour"]) == (90.0, 1.5)
    assert (goodput["jobs_finished"], goodput["jobs_unfinished"], goodput["jobs_failed"]) == (
        40,
        2,
        1,
    )
    assert goodput["jobs"]["j3"] == 2030.0
    assert len(goodput["jobs"]) == 40
    assert same["verdict"] == "tie" and same["paired_diff_s"] == 0.0
    assert same["gpu_hours"] is None, "a KPI the arm lacks is null, not a made-up 0"
    assert s["verdicts"] == c.verdicts
    json.dumps(s, allow_nan=False)  # plain JSON: no NaN, no objects


def test_an_arm_that_finished_nothing_has_null_means_not_zero() -> None:
    arms = results()[:2]
    arms[1] = ArmResult("stuck", "ab-x-stuck", "s.yaml", {}, {"jct_mean_s": math.nan})
    s = build_summary(compare(arms), RUN)
    stuck = s["arms"][1]
    assert stuck["mean_jct_s"] is None
    assert stuck["jct_ci95_s"] == [None, None]
    assert stuck["paired_diff_s"] is None
    assert stuck["verdict"] == "no jobs in common"
    assert stuck["metrics"] == {"jct_mean_s": None}
    json.dumps(s, allow_nan=False)


def test_the_file_is_written_whole_and_replaces_the_last(tmp_path: Path) -> None:
    s = build_summary(compare(results()), RUN)
    path = write_summary(tmp_path / "out", s)
    assert path == tmp_path / "out" / SUMMARY_FILE
    assert json.loads(path.read_text()) == s
    again = build_summary(compare(results()[:2]), RUN)
    write_summary(tmp_path / "out", again)
    assert json.loads(path.read_text()) == again
    assert os.listdir(tmp_path / "out") == [SUMMARY_FILE], "no temporary file is left behind"


@pytest.mark.parametrize(
    ("cluster", "label"),
    [
        (ArmCluster(2, 4, lockstep=True), "lockstep"),
        (ArmCluster(2, 4, 200.0, lockstep=False), "200x"),
        (ArmCluster(2, 4, 1.5, lockstep=False), "1.5x"),
        (ArmCluster(2, 4, None, lockstep=False), "max"),
    ],
)
def test_the_run_says_how_its_clocks_moved(cluster: ArmCluster, label: str) -> None:
    info = ABTest(Settings(), "", [], trace=Path("w.csv"), cluster=cluster).run_info()
    assert (info.speed, info.trace, info.source, info.nodes) == (label, "w.csv", None, 2)
    assert info.wall_s == 0.0, "no run yet"
