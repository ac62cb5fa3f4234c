"""The CLI: help for every command; user mistakes end in one line, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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


REPO = Path(__file__).resolve().parents[2]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from dlrover_events.cli.app import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
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


# -- each user mistake of issue 28: one line, exit 2 ---------------------------------------


def test_a_bad_settings_value_is_one_line() -> None:
    line = one_line_error(cli("env", "list", env={"DLROVER_EVENTS_PARTITIONS": "abc"}))
    assert "DLROVER_EVENTS_PARTITIONS: Input should be a valid integer" in line


@pytest.mark.parametrize(
    ("command", "variable", "value", "said"),
    [
        (["gateway", "--env", "x"], "DLROVER_EVENTS_GATEWAY_PORT", "abc", "a valid integer"),
        (["console", "--env", "x"], "DLROVER_EVENTS_CONSOLE_PORT", "-5", "greater than or equal"),
    ],
    ids=lambda v: v if isinstance(v, str) and v.startswith("DLROVER") else "",
)
def test_a_bad_value_of_a_services_settings_is_one_line(
    command: list[str], variable: str, value: str, said: str
) -> None:
    """Each service's own settings class (DLROVER_EVENTS_<PART>_*), not only the common one."""
    line = one_line_error(cli(*command, env={variable: value}))
    assert f"invalid settings: {variable}: Input should be" in line and said in line


def test_an_unknown_variable_is_named_with_the_closest_one() -> None:
    line = one_line_error(cli("env", "topics", "x", env={"DLROVER_EVENTS_PARTITONS": "6"}))
    assert (
        "unknown variable DLROVER_EVENTS_PARTITONS (did you mean DLROVER_EVENTS_PARTITIONS?)"
        in line
    )


def test_the_variables_the_sdk_and_the_tests_read_are_no_typos() -> None:
    known = {
        "DLROVER_EVENTS_JOB_ID": "j",  # an SDK pod variable, read outside the settings
        "DLROVER_EVENTS_GATEWAY_URL": "http://127.0.0.1:8470",
        "DLROVER_EVENTS_LOG_LEVEL": "ERROR",
        "DLROVER_EVENTS_TEST_PG_DSN": "postgresql://nobody@127.0.0.1:1/x",  # the tests'
    }
    done = cli("env", "topics", "x", "--json", env=known)
    assert done.returncode == 0, done.stderr


def test_a_config_file_named_but_missing_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    line = one_line_error(cli("env", "topics", "x", env={"DLROVER_EVENTS_CONFIG": str(missing)}))
    assert f"DLROVER_EVENTS_CONFIG={missing}: the config file does not exist" in line
    broken = tmp_path / "broken.toml"
    broken.write_text("partitions = [\n")
    line = one_line_error(cli("env", "topics", "x", env={"DLROVER_EVENTS_CONFIG": str(broken)}))
    assert f"{broken} is not valid TOML" in line


def test_a_config_file_is_read(tmp_path: Path) -> None:
    conf = tmp_path / "conf.toml"
    conf.write_text("partitions = 7\n")
    done = cli(
        "env", "topics", "x", "--json", "--no-control", env={"DLROVER_EVENTS_CONFIG": str(conf)}
    )
    assert done.returncode == 0, done.stderr
    assert {t["partitions"] for t in json.loads(done.stdout)} == {7}


def test_an_unknown_arm_preset_is_refused_with_the_list(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("name,time,application,num_replicas,batch_size\n")
    line = one_line_error(
        cli("ab", "run", "--arm", "tiresais", "--arm", "static", "--trace", str(trace))
    )
    assert "arm 'tiresais': no preset of that name (did you mean tiresias?" in line
    assert "static, goodput, tiresias, goodput-cluster, cluster-inplace" in line


@pytest.mark.parametrize(
    "command",
    [
        [
            "job",
            "submit",
            "examples/elastic/job.yaml",
            "--platform",
            "local",
            "--env",
            "../../escaped",
        ],
        ["tail", "--env", "../x"],
        ["env", "delete", "../x"],
        ["replay", "--to", "Prod", "--trace", "x.csv"],
        ["operator", "--env", "a/b"],
        ["gateway-token", "list", "--env", ".."],
    ],
    ids=lambda c: " ".join(c[:2]),
)
def test_a_bad_env_name_is_refused_before_anything_is_touched(
    command: list[str], tmp_path: Path
) -> None:
    data = tmp_path / "a" / "data"  # `../../escaped` under data/local would be tmp_path/a/..
    line = one_line_error(cli(*command, env={"DLROVER_EVENTS_DATA_DIR": str(data)}))
    assert "must match ^[a-z][a-z0-9-]{0,30}$" in line
    assert list(tmp_path.rglob("*")) == [], "a bad env name wrote something"


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (["operator", "--env", "x", "--speed", "fast"], "'fast' is not a speed-up like 10x"),
        (["operator", "--env", "x", "--speed", "0x"], "'0x' is not a speed-up like 10x"),
        (["replay", "--to", "x", "--trace", "t.csv", "--speed", "2y"], "or 'max'"),
        (
            [
                "ab",
                "run",
                "--arm",
                "static",
                "--arm",
                "goodput",
                "--speed",
                "slow",
                "--trace",
                "README.md",
            ],
            "or 'lockstep' or 'max'",
        ),
        (["operator", "--env", "x", "--tick", "1 minute"], "is not a duration like 30s"),
        (["evaluator", "--env", "x", "--interval", "soon"], "is not a duration like 30s"),
        (
            [
                "ab",
                "run",
                "--arm",
                "static",
                "--arm",
                "goodput",
                "--timeout",
                "1x",
                "--trace",
                "README.md",
            ],
            "is not a duration like 30s",
        ),
    ],
    ids=lambda c: " ".join(c[:3]) if isinstance(c, list) else "",
)
def test_a_bad_speed_or_duration_is_one_line(command: list[str], said: str) -> None:
    assert said in one_line_error(cli(*command))


def test_ab_run_jobs_needs_a_trace() -> None:
    line = one_line_error(
        cli("ab", "run", "--arm", "static", "--arm", "goodput", "--from", "prod", "--jobs", "3")
    )
    assert "--jobs takes the first jobs of --trace" in line


def test_a_relative_data_dir_is_resolved_where_the_process_starts(tmp_path: Path) -> None:
    """Every part then means the same folder (and `up` prints it: tests/integration/test_up.py)."""
    done = subprocess.run(
        [sys.executable, "-c", "from dlrover_events.settings import *; print(Settings().data_dir)"],
        env={**os.environ, "DLROVER_EVENTS_DATA_DIR": "rel/data"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == str(tmp_path.resolve() / "rel" / "data")


@pytest.mark.parametrize("group", [[], ["env"], ["bench"]], ids=lambda g: " ".join(g) or "root")
def test_a_group_without_its_command_shows_its_help(group: list[str]) -> None:
    done = cli(*group)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("Usage: dlrover-events"), done.stderr  # not "error: Usage"
    assert "Commands:" in done.stderr


def test_an_option_the_platform_does_not_take_is_one_line() -> None:
    result = cli("job", "list", "--platform", "local", "--kubeconfig", "/nowhere")
    assert "the local platform takes no --kubeconfig" in one_line_error(result)
