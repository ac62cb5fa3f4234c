"""A virtual env's simulator stops once its env is promoted (issue 38): its simulated
answers would tell the new real env's brain that real jobs were rescaled, and it shares
the env's operator group with the operator that follows the real env. The process stays
up, idle, until stopped."""

from __future__ import annotations

import asyncio
import logging

import pytest

from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from handlers.operator.wiring.modes import run_operator
from schemas.control import EnvMode
from tests.conftest import EnvFactory

pytestmark = pytest.mark.integration


async def test_the_simulator_of_a_promoted_env_stops_and_the_process_idles(
    settings: Settings, pg_dsn: str, make_env: EnvFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="handlers.operator.wiring.modes")
    registry = EnvRegistry(settings, pg_dsn)
    real = await registry.real() or await make_env(mode=EnvMode.REAL)
    standby = await make_env()
    ctx = ServiceContext(settings, standby.name, pg_dsn)
    task = asyncio.create_task(run_operator(ctx, {"fast": True}))
    try:
        async with asyncio.timeout(60):
            await ctx.ready.wait()
        await registry.promote(standby.name, reason="drill: the simulator stops")
        stopped = f"stopped: {standby.name} is the real env now"
        async with asyncio.timeout(60):
            while ctx.endpoints.get("operator", "") != stopped:
                assert not task.done(), task.exception()
                await asyncio.sleep(0.05)
        said = [r.getMessage() for r in caplog.records]
        assert any("its simulated cluster stopped" in m for m in said), said
        assert not task.done(), "it idles until stopped (a Deployment's pod stays up)"
        ctx.stop.set()
        await asyncio.wait_for(task, 30)
    finally:
        ctx.stop.set()
        if not task.done():
            task.cancel()
        current = await registry.real()
        if current is not None and current.name != real.name:
            await registry.promote(real.name, reason="test cleanup")
