"""The CLI: help for every command; user mistakes end in one line, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dlrover_events.runtime.embedded import free_port

COMMANDS = [
    [],
    ["env"],
    ["env", "create"],
    ["env", "list"],
    ["env", "delete"],
    ["env", "topics"],
    ["tail"],
    ["up"],
    ["schemas"],
    ["schemas", "export"],
    ["schemas", "check"],
]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from dlrover_events.cli.app import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "root")
def test_every_command_has_help(command: list[str]) -> None:
    result = cli(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage:" in result.stdout
    assert len(result.stdout.splitlines()) > 3


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_unknown_option_is_one_line() -> None:
    assert "No such option: --bogus" in one_line_error(cli("tail", "--bogus"))


def test_operator_admission_is_one_of_two() -> None:
    assert "--admission" in cli("operator", "--help").stdout
    line = one_line_error(cli("operator", "--env", "x", "--admission", "anyone"))
    assert "'anyone' is not one of 'cluster', 'brain'" in line


def test_bad_env_name_is_one_line() -> None:
    assert "must match" in one_line_error(cli("env", "create", "Bad_Name"))


def test_bad_since_is_one_line() -> None:
    assert "expected a duration" in one_line_error(cli("tail", "--since", "yesterday"))


def test_unknown_topic_is_one_line() -> None:
    assert "unknown topic" in one_line_error(cli("tail", "job.metricz"))


def test_unreachable_broker_is_one_line() -> None:
    dead = f"127.0.0.1:{free_port()}"
    line = one_line_error(cli("tail", env={"DLROVER_EVENTS_BOOTSTRAP_SERVERS": dead}))
    assert f"cannot reach Kafka at {dead}" in line


def test_unreachable_postgres_is_one_line() -> None:
    dead = f"postgresql://postgres@127.0.0.1:{free_port()}/x"
    line = one_line_error(cli("env", "list", env={"DLROVER_EVENTS_PG_DSN": dead}))
    assert "cannot reach Postgres" in line
