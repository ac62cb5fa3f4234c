"""What a service run as its own command logs, as a log collector reads it: INFO by
default, one JSON object a line with DLROVER_EVENTS_LOG_FORMAT=json, its env and service
as fields; a level given (flag or variable) is kept."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dlrover_events.runtime.embedded import free_port
from dlrover_events.settings import Settings
from tests.conftest import REPO, EnvFactory, cli_environ

pytestmark = pytest.mark.integration


def _text(path: Path) -> str:
    return path.read_text()


async def _archiver(
    settings: Settings, pg_dsn: str, env: str, log: Path, *options: str, **environ: str
) -> list[str]:
    """Run `archiver --env ENV` until it serves its metrics (an INFO line), then stop it;
    its output lines."""
    with log.open("w") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "from dlrover_events.cli.app import main; main()",
            *options,
            "archiver",
            "--env",
            env,
            cwd=REPO,
            env={
                **cli_environ(settings, pg_dsn),
                "DLROVER_EVENTS_METRICS_PORT": str(free_port()),
                **environ,
            },
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while "ready" not in _text(log):
            assert proc.returncode is None, _text(log)
            assert time.monotonic() < deadline, _text(log)
            await asyncio.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            assert await proc.wait() == 0, _text(log)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return _text(log).splitlines()


async def test_a_service_logs_json_lines_with_its_env_and_service(
    settings: Settings, pg_dsn: str, make_env: EnvFactory, tmp_path: Path
) -> None:
    env = (await make_env()).name
    out = await _archiver(
        settings, pg_dsn, env, tmp_path / "a.log", DLROVER_EVENTS_LOG_FORMAT="json"
    )
    lines: list[dict[str, Any]] = [json.loads(line) for line in out if line.startswith("{")]
    metrics = [line for line in lines if line["message"].startswith("metrics on http://")]
    assert metrics, out  # INFO without a level given: a service
    (line,) = metrics
    assert line["level"] == "INFO" and line["logger"] == "dlrover_events.runtime.metrics"
    assert (line["env"], line["service"]) == (env, "archiver"), line
    assert line["timestamp"].endswith("+00:00"), line
    # every line the process logged is JSON (what it prints to say where it is, is not a log)
    logged = [line for line in out if not line.startswith("{")]
    assert all("INFO" not in line and "WARNING" not in line for line in logged), logged


async def test_a_level_given_is_kept_by_a_service(
    settings: Settings, pg_dsn: str, make_env: EnvFactory, tmp_path: Path
) -> None:
    env = (await make_env()).name
    quiet = await _archiver(
        settings, pg_dsn, env, tmp_path / "w.log", DLROVER_EVENTS_LOG_LEVEL="warning"
    )
    assert not [line for line in quiet if " INFO " in line], quiet
    text = await _archiver(settings, pg_dsn, env, tmp_path / "i.log", "--log-level", "INFO")
    (line,) = [line for line in text if "metrics on http://" in line]
    assert f" INFO dlrover_events.runtime.metrics [env={env} service=archiver]: metrics on" in line
