"""`bench sdk` runs end to end and ends with one JSON line (numbers are not asserted:
speed is the benchmark's business, not the tests')."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from dlrover_events.sdk.bench import bench_sdk
from dlrover_events.settings import Settings

pytestmark = pytest.mark.integration


def cli() -> typer.Typer:
    """A `bench` group as the CLI builds it from the dlrover_events.benches entry points."""
    benches = typer.Typer(no_args_is_help=True)
    benches.callback()(lambda: None)
    benches.command("sdk")(bench_sdk)
    return benches


def last_json(output: str) -> dict[str, object]:
    value = json.loads(output.strip().splitlines()[-1])
    assert isinstance(value, dict)
    return value


def test_bench_against_the_broker(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLROVER_EVENTS_BOOTSTRAP_SERVERS", settings.bootstrap_servers)
    result = CliRunner().invoke(cli(), ["sdk", "--steps", "500", "--runs", "3"])
    assert result.exit_code == 0, result.output
    summary = last_json(result.output)
    assert summary["bench"] == "sdk"
    assert summary["broker"] == f"Kafka at {settings.bootstrap_servers}"
    assert isinstance(summary["per_step_overhead_us"], float)
    assert isinstance(summary["samples_published"], int) and summary["samples_published"] >= 1
    assert summary["dropped"] == 0
    runs = summary["overhead_runs_us"]
    assert isinstance(runs, list) and len(runs) == 3


def test_bench_times_the_gradient_statistics(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLROVER_EVENTS_BOOTSTRAP_SERVERS", settings.bootstrap_servers)
    args = ["sdk", "--steps", "200", "--runs", "2", "--grad-stats-every", "5"]
    result = CliRunner().invoke(cli(), [*args, "--torch-steps", "20"])
    assert result.exit_code == 0, result.output
    summary = last_json(result.output)
    assert summary["grad_stats_every"] == 5
    for key in (
        "train_step_us",
        "grad_stats_every_n_overhead_us",
        "grad_stats_every_step_overhead_us",
        "grad_stats_alone_every_step_overhead_us",
    ):
        assert isinstance(summary[key], float), key
    runs = summary["grad_stats_runs_us"]
    assert isinstance(runs, dict) and all(len(v) == 2 for v in runs.values())
    assert "gradient statistics: a training step of" in result.output
    assert summary["dropped"] == 0


def test_bench_without_the_gradient_statistics(settings: Settings) -> None:
    result = CliRunner().invoke(
        cli(), ["sdk", "--steps", "200", "--runs", "1", "--broker-down", "--grad-stats-every", "0"]
    )
    assert result.exit_code == 0, result.output
    assert "train_step_us" not in last_json(result.output)


def test_bench_with_the_broker_down() -> None:
    result = CliRunner().invoke(cli(), ["sdk", "--steps", "500", "--runs", "1", "--broker-down"])
    assert result.exit_code == 0, result.output
    summary = last_json(result.output)
    assert str(summary["broker"]).startswith("nobody at")
    assert summary["samples_published"] == 0
