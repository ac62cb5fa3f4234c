"""The A/B verdict as data: ``summary.json`` beside the HTML report, for scripts and CI.

The HTML report is for people; a pipeline that gates a rollout on "the new settings are
better" needs the same numbers without scraping a page. The file is built by a pure
function from the comparison (so a test pins its shape) and written atomically, so a
script polling the folder reads the previous summary or the new one, never half of one.

Its shape is versioned (``schema_version``): a key is only ever added within a version;
renaming or removing one bumps it.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streams.ab.report import Comparison
from streams.evaluators.compare import Interval

SCHEMA_VERSION = 1
SUMMARY_FILE = "summary.json"

#: The level of every interval in the file; compare() uses the evaluators' default.
CI_LEVEL = 0.95


@dataclass(frozen=True)
class RunInfo:
    """What the run was, beside what it found: enough to run it again the same way."""

    run_id: str
    trace: str | None  # the workload file the arms were fed, or None
    source: str | None  # the env whose inputs the arms were fed, or None
    speed: str  # lockstep, NNNx or max: how the arms' clocks moved
    nodes: int
    gpus_per_node: int
    wall_s: float
    seed: int = 0  # the bootstrap's seed: the same results give the same intervals
    experiment: str | None = None  # the experiment every arm ran (--experiment), or None


def _number(value: float | None) -> float | None:
    """JSON has no NaN or Infinity; a KPI that is not a number is absent (null)."""
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def _interval(ci: Interval) -> list[float | None]:
    return [_number(ci.low), _number(ci.high)]


def _verdict(diff: Interval | None) -> str:
    """One word a script can branch on (lower JCT is better)."""
    if diff is None:
        return "baseline"
    if diff.n == 0:
        return "no jobs in common"
    if diff.low <= 0.0 <= diff.high:
        return "tie"
    return "better" if diff.estimate < 0 else "worse"


def build_summary(c: Comparison, run: RunInfo) -> dict[str, Any]:
    """The machine-readable verdict of an A/B run; pure, JSON-serialisable, no NaN.

    The first arm is the baseline: every other arm's ``paired_diff_s`` is its mean JCT
    minus the baseline's over the jobs both finished (negative: faster), with its interval
    and a one-word ``verdict``. An arm with no finished job has a null mean.
    """
    baseline = c.arms[0].name
    arms = []
    for arm in c.arms:
        ci = c.jct_ci[arm.name]
        diff = c.jct_diff.get(arm.name)
        arms.append(
            {
                "name": arm.name,
                "env": arm.env,
                "settings": arm.settings_source,
                "mean_jct_s": _number(ci.estimate) if ci.n else None,
                "jct_ci95_s": _interval(ci) if ci.n else [None, None],
                "paired_diff_s": 0.0
                if diff is None
                else (_number(diff.estimate) if diff.n else None),
                "paired_diff_ci95_s": (
                    [0.0, 0.0] if diff is None else (_interval(diff) if diff.n else [None, None])
                ),
                "paired_jobs": len(arm.jct) if diff is None else diff.n,
                "verdict": _verdict(diff),
                "gpu_hours": _number(arm.metrics.get("gpu_hours")),
                "plans_per_job_hour": _number(arm.metrics.get("plans_per_job_hour")),
                "jobs_finished": len(arm.jct),
                "jobs_unfinished": arm.unfinished,
                "jobs_failed": int(arm.metrics.get("failed_jobs", 0.0)),
                "metrics": {k: _number(v) for k, v in sorted(arm.metrics.items())},
                "jobs": {job: float(arm.jct[job]) for job in sorted(arm.jct)},
            }
        )
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": run.run_id,
        "trace": run.trace,
        "source": run.source,
        "experiment": run.experiment,
        "baseline": baseline,
        "speed": run.speed,
        "cluster": {"nodes": run.nodes, "gpus_per_node": run.gpus_per_node},
        "seed": run.seed,
        "ci_level": CI_LEVEL,
        "wall_s": _number(run.wall_s),
        "verdicts": list(c.verdicts),
        "arms": arms,
    }


def write_summary(folder: Path, summary: dict[str, Any]) -> Path:
    """Write ``summary.json`` atomically: a temporary file, fsync, then rename over."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / SUMMARY_FILE
    tmp = folder / f".{SUMMARY_FILE}.{os.getpid()}.tmp"
    data = json.dumps(summary, indent=2, allow_nan=False) + "\n"
    try:
        with tmp.open("w") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
