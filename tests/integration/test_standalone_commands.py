"""Every service's own command, run as a Deployment runs it: a process bound to all
interfaces (the bind variables a cluster sets), whose /healthz and /readyz answer on its
metrics port and which stops cleanly on SIGTERM.

The probes are asked on 127.0.0.2: a listener on the default 127.0.0.1 does not answer
there, one on 0.0.0.0 does, so each bind variable is shown to take effect.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.runtime.embedded import free_port
from dlrover_events.settings import Settings
from schemas.control import EnvMode
from tests.conftest import REPO, cli_environ, unique_env

pytestmark = pytest.mark.integration

#: not loopback's first address: reached only by a listener on every interface
ELSEWHERE = "127.0.0.2"


def _get(port: int, path: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://{ELSEWHERE}:{port}{path}", timeout=5) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")
    except OSError:
        return 0, {}


#: command -> (the env it runs: real or the virtual standby, extra arguments)
COMMANDS: dict[str, tuple[str, list[str]]] = {
    "brain": ("real", []),
    "operator": ("standby", []),  # a virtual env's operator: the simulated cluster
    "gateway": ("real", []),
    "console": ("real", []),
    "archiver": ("real", []),
    "evaluator": ("real", ["--interval", "1"]),
    "watchdog": ("real", []),  # standby from DLROVER_EVENTS_WATCHDOG_STANDBY
    "searcher": ("real", []),
    "experiments-recorder": ("real", []),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
async def test_a_command_serves_its_probes_on_every_interface(
    command: str, own_settings: Settings, own_pg: str, tmp_path: Path
) -> None:
    conf = own_settings  # its real env is announced to no other test's operator
    registry = EnvRegistry(conf, own_pg)
    real, standby = unique_env("r"), unique_env("s")
    await registry.create(real, EnvMode.REAL)
    await registry.create(standby, EnvMode.VIRTUAL)
    which, extra = COMMANDS[command]
    env = real if which == "real" else standby
    ports = {name: free_port() for name in ("metrics", "gateway", "console")}
    environ = {
        **cli_environ(conf, own_pg),
        "DLROVER_EVENTS_METRICS_HOST": "0.0.0.0",
        "DLROVER_EVENTS_METRICS_PORT": str(ports["metrics"]),
        "DLROVER_EVENTS_GATEWAY_HOST": "0.0.0.0",
        "DLROVER_EVENTS_GATEWAY_PORT": str(ports["gateway"]),
        "DLROVER_EVENTS_CONSOLE_HOST": "0.0.0.0",
        "DLROVER_EVENTS_CONSOLE_PORT": str(ports["console"]),
        "DLROVER_EVENTS_WATCHDOG_STANDBY": standby,
        "DLROVER_EVENTS_BUS_PROBE_S": "0.3",
    }
    log = tmp_path / f"{command}.log"
    with log.open("w") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "from dlrover_events.cli.app import main; main()",
            command,
            "--env",
            env,
            *extra,
            cwd=REPO,
            env=environ,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 90
        status, body = 0, {}
        while status != 200:
            assert proc.returncode is None, f"{command} ended: {log.read_text()}"
            assert time.monotonic() < deadline, f"not ready: {body}\n{log.read_text()}"
            await asyncio.sleep(0.2)
            status, body = await asyncio.to_thread(_get, ports["metrics"], "/readyz")
        assert body["services"] == {command: "ready"}, body
        assert body["bus"] is True and body["postgres"] is True
        assert (await asyncio.to_thread(_get, ports["metrics"], "/healthz"))[0] == 200
        own = {"gateway": ("gateway", "/readyz"), "console": ("console", "/healthz")}
        if command in own:
            port, path = own[command]
            assert (await asyncio.to_thread(_get, ports[port], path))[0] == 200
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            code = await proc.wait()
        assert code == 0, log.read_text()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
