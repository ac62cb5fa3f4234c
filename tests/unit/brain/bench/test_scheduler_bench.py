"""`dlrover-events bench scheduler`: round times by cluster size, the last line one JSON
object; bad sizes are a one-line error. (What it measures is in docs/schedulers.md; a
test never asserts a time.)"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile

import pytest

from streams.brain.bench.scheduler import ClusterSize, parse_size, synthetic_jobs


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "from dlrover_events.cli.app import main; main()",
            "bench",
            "scheduler",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        # (not the repository: a build's stale egg-info there would hide new entry points)
        cwd=tempfile.gettempdir(),
    )


@pytest.mark.parametrize("scheduler", ["goodput-cluster", "tiresias"])
def test_it_times_each_size_and_ends_with_one_json_line(scheduler: str) -> None:
    done = bench("--scheduler", scheduler, "--size", "2x4:6", "--size", "4x8:20", "--steady", "2")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("8 GPUs (2 x 4), 6 jobs: first round ")
    result = json.loads(lines[-1])
    assert result["scheduler"] == scheduler
    assert [(r["gpus"], r["jobs"]) for r in result["sizes"]] == [(8, 6), (32, 20)]
    for row in result["sizes"]:
        assert row["first_s"] > 0 and row["steady_s"] >= 0
        assert row["steady_max_s"] >= row["steady_s"]
        assert 0 < row["held_gpus"] <= row["gpus"]


@pytest.mark.parametrize("size", ["16x4", "16x4:0", "x4:10", "16*4:10"])
def test_a_size_it_cannot_read_is_a_one_line_error(size: str) -> None:
    done = bench("--size", size, "--steady", "1")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: ") and size in line


def test_sizes_read_as_nodes_gpus_and_jobs() -> None:
    assert parse_size("256x8:500") == ClusterSize(256, 8, 500)
    assert parse_size("256x8:500").gpus == 2048


def test_the_synthetic_jobs_are_the_same_for_a_seed_and_span_three_decades_of_noise() -> None:
    jobs = synthetic_jobs(200, seed=0)
    assert jobs == synthetic_jobs(200, seed=0)
    assert jobs != synthetic_jobs(200, seed=1)
    scales = []
    for j in jobs:
        assert j.model is not None and j.model.grad is not None
        scales.append(j.model.grad.var / j.model.grad.sqr * j.model.limits.init_batch)
    assert min(scales) < 200 and max(scales) > 50_000
