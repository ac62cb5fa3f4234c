"""The console end to end in headless Chromium (Debian's `chromium`, driven by
playwright-core from npm): a live event arrives, the job filter works, and a screenshot
is saved under test-artifacts/ (not committed).

Needs /usr/bin/chromium (`apt-get install chromium`) and node with npm; the test installs
playwright-core from package.json here when node_modules is missing. The latency from a
published event to its row on the page is measured and written beside the screenshot;
it is not asserted (speed is the benchmark's business).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from schemas.jobs import JobMeta, NodeUsage, RuntimeSample
from tests.conftest import ARTIFACTS
from tests.integration.console.conftest import Console

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def sample(env: str, job: str, step: int) -> RuntimeSample:
    return RuntimeSample(
        env=env,
        job=JobMeta(uuid=job),
        global_step=step,
        speed=4.0,
        samples_per_s=256.0,
        nodes=[NodeUsage(type="worker", id=0, memory=2**31, step_time=0.25)],
    )


@pytest.fixture(scope="module")
def playwright_installed() -> Path:
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: apt-get install chromium"
    node, npm = shutil.which("node"), shutil.which("npm")
    assert node and npm, "node and npm are needed for playwright-core"
    if not (HERE / "node_modules" / "playwright-core").exists():
        subprocess.run(
            [npm, "install", "--no-audit", "--no-fund"], cwd=HERE, check=True, timeout=300
        )
    return Path(node)


class Browser:
    """The node script, one step per line."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def step(self, line: str, timeout_s: float = 30.0) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()
        answer = await asyncio.wait_for(self.proc.stdout.readline(), timeout_s)
        if not answer:
            assert self.proc.stderr is not None
            err = await self.proc.stderr.read()
            raise AssertionError(f"the browser script failed at {line!r}: {err.decode()}")
        return answer.decode().strip()


@pytest.fixture
async def browser(console: Console, playwright_installed: Path) -> AsyncIterator[Browser]:
    proc = await asyncio.create_subprocess_exec(
        str(playwright_installed),
        str(HERE / "browser_check.mjs"),
        console.url,
        console.token,
        cwd=HERE,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    b = Browser(proc)
    yield b
    if proc.returncode is None:
        try:
            await b.step("quit", 10)
            await asyncio.wait_for(proc.wait(), 10)
        except (AssertionError, TimeoutError, BrokenPipeError, ConnectionResetError):
            proc.kill()
            await proc.wait()


async def test_live_event_filter_and_screenshot(console: Console, browser: Browser) -> None:
    env = console.env
    assert await browser.step("open") == "ready"

    await console.producer.publish(sample(env, "job-alpha", 1))
    seen = (await browser.step("expect job-alpha")).split()
    assert seen[:2] == ["seen", "job-alpha"]
    latency_ms = int(seen[2])

    assert await browser.step("filter job-beta") == "filtered job-beta"
    await console.producer.publish_many(
        [sample(env, "job-alpha", 2), sample(env, "job-beta", 1), sample(env, "job-alpha", 3)]
    )
    await console.producer.publish(sample(env, "job-beta", 2))
    assert (await browser.step("expect job-beta 2")).startswith("seen job-beta")
    # job-alpha's samples went out with job-beta's; the filtered feed showed none of them
    # (the table was emptied when the filter changed).
    assert await browser.step("check job-beta job-alpha") == "checked 2 0"
    # The jobs table is not filtered: both jobs, with their last usage.
    assert await browser.step("jobs job-alpha") == "listed job-alpha"
    assert await browser.step("jobs job-beta") == "listed job-beta"

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "console.png"
    assert await browser.step(f"shot {shot}") == f"shot {shot}"
    assert shot.stat().st_size > 10_000
    (ARTIFACTS / "console-browser.json").write_text(
        json.dumps({"env": env, "live_event_latency_ms": latency_ms, "screenshot": str(shot)})
    )
