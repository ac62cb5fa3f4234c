"""The local platform on real parts: the test broker and Postgres, a real env, and nodes
that are real processes on this machine (the shim, torchrun agents, torch workers)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.pods import shim
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from handlers.operator.document.trainingjob import ANN_WORKDIR
from handlers.operator.local.cluster import LocalCluster
from handlers.operator.local.runner import platform_root
from handlers.operator.platform.bodies import JobView, PodView
from handlers.operator.wiring.modes import run_operator
from schemas.control import EnvMode
from tests.conftest import EnvFactory
from tests.integration.tap import DEADLINE_S, OPERATOR_OUTPUTS, Tap


def shims(under: Path) -> list[psutil.Process]:
    """The local-platform node processes whose pod directory is below ``under`` (a test's
    platform root, or this test session's temporary directory): another session's tests on
    the same machine have nodes of their own, which are none of this one's business."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info.get("cmdline") or []
        if shim.MODULE in cmd and any(c.startswith(f"{under}/") for c in cmd):
            found.append(p)
    return found


@dataclass
class Local:
    settings: Settings
    pg_dsn: str
    env: str
    tap: Tap
    producer: Producer
    root: Path

    def cluster(self) -> LocalCluster:
        """The platform as the `job` commands see it (no node agent)."""
        return LocalCluster(self.root)

    async def submit(self, body: dict[str, Any], workdir: Path | None = None) -> JobView:
        if workdir is not None:
            body.setdefault("metadata", {}).setdefault("annotations", {})[ANN_WORKDIR] = str(
                workdir
            )
        return await self.cluster().submit_job(body)

    async def start_operator(self, **options: Any) -> tuple[ServiceContext, asyncio.Task[None]]:
        ctx = ServiceContext(self.settings, self.env, self.pg_dsn)
        task = asyncio.create_task(
            run_operator(ctx, {"platform": "local", "poll_s": 0.1, "api_port": 0, **options})
        )
        ready = asyncio.create_task(ctx.ready.wait())
        await asyncio.wait([task, ready], timeout=DEADLINE_S, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()
        assert ready.done(), "the local operator did not get ready"
        return ctx, task

    async def pods(self, job: str) -> list[PodView]:
        items, _ = await self.cluster().list_pods(job)
        return items


@pytest.fixture
def local_settings(settings: Settings, tmp_path: Path) -> Settings:
    return settings.model_copy(update={"data_dir": tmp_path / "data"})


@pytest.fixture
async def local(
    local_settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> AsyncIterator[Local]:
    env = (await make_env(mode=EnvMode.REAL)).name
    tap = Tap(local_settings, env, (*OPERATOR_OUTPUTS, "scale.plans"))
    await tap.start()
    async with Producer(local_settings) as producer:
        yield Local(local_settings, pg_dsn, env, tap, producer, platform_root(local_settings, env))
    await tap.stop()


@pytest.fixture(autouse=True)
def no_orphans(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every node a test started is gone when it ends, whatever the test did."""
    session = tmp_path_factory.getbasetemp()
    before = {p.pid for p in shims(session)}
    yield
    left = [p for p in shims(session) if p.pid not in before]
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    assert not left, f"node processes left behind: {[p.pid for p in left]}"
