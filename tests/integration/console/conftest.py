"""A real console per test (a fresh env on the session's broker and Postgres, port 0), and
a real browser to drive it: Debian's Chromium through playwright-core from npm
(`browser_driver.mjs`; the package is installed from package.json here when missing)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.envs.tokens import Scope
from dlrover_events.settings import Settings
from handlers.console.runtime import ConsoleServer, ConsoleSettings
from tests.conftest import EnvFactory
from tests.integration.gateway.conftest import mint

# the local platform's env, operator and tap, for the actions' tests
from tests.integration.local.conftest import local as local
from tests.integration.local.conftest import local_settings as local_settings

HERE = Path(__file__).resolve().parent
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


@dataclass
class Console:
    server: ConsoleServer
    env: str
    url: str
    token: str
    producer: Producer

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def console_settings(**kw: Any) -> ConsoleSettings:
    return ConsoleSettings(host="127.0.0.1", port=0, token_cache_s=0.5, **kw)


@pytest.fixture
async def console(
    settings: Settings, pg_dsn: str, make_env: EnvFactory, tmp_path: Path
) -> AsyncIterator[Console]:
    env = (await make_env(partitions=2)).name
    token = await mint(pg_dsn, env, Scope.READ)
    conf = console_settings(ab_reports=[tmp_path / "ab-report"])
    async with ConsoleServer(settings, env, pg_dsn, conf) as server, Producer(settings) as prod:
        await server.wait_ready(30)
        yield Console(server, env, server.url, token, prod)


@pytest.fixture(scope="session")
def node() -> Path:
    """node, with playwright-core installed beside the driver."""
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: apt-get install chromium"
    node, npm = shutil.which("node"), shutil.which("npm")
    assert node, "node and npm are needed for playwright-core"
    assert npm, "node and npm are needed for playwright-core"
    if not (HERE / "node_modules" / "playwright-core").exists():
        subprocess.run(
            [npm, "install", "--no-audit", "--no-fund"], cwd=HERE, check=True, timeout=300
        )
    return Path(node)


class Browser:
    """One Chromium page, driven a request at a time (browser_driver.mjs)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def do(self, op: str, timeout_s: float = 60.0, **args: Any) -> Any:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}).encode() + b"\n")
        await self.proc.stdin.drain()
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout_s)
        if not line:
            assert self.proc.stderr is not None
            err = await self.proc.stderr.read()
            raise AssertionError(f"the browser ended at {op} {args}: {err.decode()}")
        answer = json.loads(line)
        if "error" in answer:
            raise AssertionError(f"in the browser: {answer['error']}")
        return answer["ok"]

    async def wait(self, sel: str, state: str = "visible", within_ms: int = 30_000) -> None:
        await self.do("wait", sel=sel, state=state, timeout=within_ms)

    async def until(self, js: str, within_ms: int = 30_000) -> Any:
        return await self.do("until", js=js, timeout=within_ms)

    async def close(self) -> None:
        if self.proc.returncode is None:
            try:
                await self.do("quit", 10)
                await asyncio.wait_for(self.proc.wait(), 10)
            except (AssertionError, TimeoutError, BrokenPipeError, ConnectionResetError):
                self.proc.kill()
                await self.proc.wait()


BrowserFactory = Callable[[], Awaitable[Browser]]


@pytest.fixture
async def open_browser(node: Path) -> AsyncIterator[BrowserFactory]:
    opened: list[Browser] = []

    async def start() -> Browser:
        proc = await asyncio.create_subprocess_exec(
            str(node),
            str(HERE / "browser_driver.mjs"),
            cwd=HERE,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        browser = Browser(proc)
        opened.append(browser)
        return browser

    yield start
    for browser in opened:
        await browser.close()


__all__ = ["Browser", "BrowserFactory", "Console", "console_settings"]
