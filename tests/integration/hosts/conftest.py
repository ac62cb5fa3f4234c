"""Plain hosts on this machine: agents (handlers.agent) run in the test's process or as
`dlrover-events agent` processes, each with artificial slots and a working directory of
its own, on the session's broker; and the guarantee that no pod process outlives its
test."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from dlrover_events.pods import shim
from dlrover_events.settings import Settings
from handlers.agent.agent import Agent, AgentSettings

DEADLINE_S = 120.0


def shims(under: Path) -> list[psutil.Process]:
    """The pod shims whose directory is below ``under`` (another session's are not ours)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            cmd = p.info.get("cmdline") or []
            if shim.MODULE in cmd and any(c.startswith(f"{under}/") for c in cmd):
                found.append(p)
    return found


def kill_trees(procs: list[psutil.Process]) -> None:
    """SIGKILL to each process and everything below it (a pod's shim, torchrun, workers)."""
    every: list[psutil.Process] = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            every.extend([p, *p.children(recursive=True)])
    for p in every:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(every, timeout=10)


@dataclass
class RunningAgent:
    """An agent in this process: its task, and the event that stops it."""

    agent: Agent
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.stop.clear()
        self.task = asyncio.create_task(self.agent.run(self.stop))
        ready = asyncio.create_task(self.agent.ready.wait())
        await asyncio.wait([self.task, ready], timeout=DEADLINE_S, return_when="FIRST_COMPLETED")
        if self.task.done():
            self.task.result()
        ready.cancel()
        assert self.agent.ready.is_set(), f"agent {self.agent.host} did not report"

    async def halt(self) -> None:
        """Stop the agent (its pods run on, as after a real agent's stop)."""
        self.stop.set()
        if self.task is not None:
            await asyncio.wait_for(self.task, DEADLINE_S)
            self.task = None


def agent_in(settings: Settings, env: str, workdir: Path, host: str, slots: int) -> RunningAgent:
    conf = AgentSettings(
        host=host,
        workdir=workdir,
        artificial_slots=slots,
        address="127.0.0.1",
        heartbeat_s=0.5,
        poll_s=0.1,
    )
    return RunningAgent(Agent(settings, env, conf))


@contextlib.asynccontextmanager
async def agents(
    settings: Settings, env: str, root: Path, slots: dict[str, int]
) -> AsyncIterator[dict[str, RunningAgent]]:
    """One started agent per host named in ``slots``; stopped at the end, and every pod
    process under ``root`` killed."""
    running = {h: agent_in(settings, env, root / h, h, n) for h, n in slots.items()}
    try:
        for one in running.values():
            await one.start()
        yield running
    finally:
        for one in running.values():
            with contextlib.suppress(Exception):
                await one.halt()
        kill_trees(shims(root))


@pytest.fixture(autouse=True)
def no_orphans(tmp_path: Path) -> Iterator[None]:
    """Every pod process a test started is gone when it ends, whatever the test did."""
    yield
    left = shims(tmp_path)
    kill_trees(left)
    assert not left, f"pod processes left behind: {[p.pid for p in left]}"
