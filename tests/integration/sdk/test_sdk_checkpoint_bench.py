"""`bench checkpoint` runs end to end on a small state and ends with one JSON line (its
numbers are not asserted: speed is the benchmark's business, not the tests')."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from dlrover_events.sdk.torch.checkpoint_bench import bench_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_bench_checkpoint_runs_and_cleans_up(tmp_path: Path) -> None:
    benches = typer.Typer(no_args_is_help=True)
    benches.callback()(lambda: None)
    benches.command("checkpoint")(bench_checkpoint)
    args = ["checkpoint", "--sizes-mb", "17", "--runs", "1", "--steps", "4", "--every", "2"]
    result = CliRunner().invoke(benches, [*args, "--root", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["bench"] == "checkpoint"
    (size,) = summary["sizes"]
    assert size["state_mb"] == pytest.approx(16.8, abs=0.1)
    for key in ("torch_save_s", "blocking_s", "persist_s", "first_blocking_s"):
        assert size[key] > 0, key
    assert summary["steps_per_s_no_saves"] > 0 and summary["steps_per_s_elastic"] > 0
    assert not list((tmp_path / "b").iterdir())  # every state it wrote removed
