"""A running virtual operator follows its env's settings on dlrover.control: a newer
version's pace is taken without a restart, what made the simulated cluster is kept and
said so. Real broker, real Postgres."""

from __future__ import annotations

import asyncio
import logging

import pytest

from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from handlers.operator.virtual import operator as virtual
from tests.conftest import EnvFactory
from tests.integration.brain.workload import wait_for

pytestmark = pytest.mark.integration


async def test_a_running_virtual_operator_takes_a_new_pace(
    settings: Settings, pg_dsn: str, make_env: EnvFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="handlers.operator.virtual.operator")
    env = (await make_env()).name
    ctx = ServiceContext(settings, env, pg_dsn)
    task = asyncio.create_task(virtual.run(ctx, {}))
    try:
        async with asyncio.timeout(60):
            await ctx.ready.wait()
        _, changed = await EnvRegistry(settings, pg_dsn).change_settings(
            env, lambda _: {"operator": {"speed": 50, "nodes": 32}}, reason="faster"
        )
        assert changed
        await wait_for(
            lambda: (
                f"env {env}: settings version 2: the simulated cluster runs at 50x" in caplog.text
            ),
            60,
            "the operator to take the new pace",
        )
        assert "keeps its operator.nodes" in caplog.text
        assert not task.done()
    finally:
        ctx.stop.set()
        async with asyncio.timeout(30):
            await task
