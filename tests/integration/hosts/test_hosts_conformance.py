"""The hosts platform keeps the platform contract: the conformance suite
(tests/contract/platform.py) over a HostsCluster whose pods run under a real agent
(handlers.agent, in this process) on the session's broker.

What it declares: as the local platform, its watch does not resume from a version (a
watch starts with every current object) and lets none go. Its capacity is its agents'
slots; a host is made unschedulable as it happens in life, by its agent going quiet: the
operator declares it lost after ``LOST_AFTER_S``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dlrover_events.settings import Settings
from handlers.operator.hosts.cluster import HostsCluster
from tests.conftest import EnvFactory
from tests.contract.platform import Hosts, PlatformConformance
from tests.integration.hosts.conftest import RunningAgent, agents

SLOTS = 64
HOST = "host-a"
LOST_AFTER_S = 2.0


class TestHostsPlatform(PlatformConformance):
    watch_resumes = False
    expires = frozenset()

    @pytest.fixture
    async def agent(
        self, settings: Settings, make_env: EnvFactory, tmp_path: Path
    ) -> AsyncIterator[tuple[str, RunningAgent]]:
        env = (await make_env(partitions=1)).name
        async with agents(settings, env, tmp_path / "agents", {HOST: SLOTS}) as running:
            yield env, running[HOST]

    @pytest.fixture
    async def platform(
        self, settings: Settings, tmp_path: Path, agent: tuple[str, RunningAgent]
    ) -> AsyncIterator[HostsCluster]:
        env, _ = agent
        platform = HostsCluster(
            tmp_path / "hosts",
            settings=settings,
            env=env,
            runs_pods=True,
            poll_s=0.05,
            lost_after_s=LOST_AFTER_S,
        )
        await platform.start()
        assert platform.alive(HOST), "the operator did not see the agent's reports"
        try:
            yield platform
        finally:
            await platform.stop(end_pods=True)

    @pytest.fixture
    def hosts(self, agent: tuple[str, RunningAgent]) -> Hosts:
        _, running = agent

        async def cordon() -> str:
            await running.halt()  # its reports stop: the operator declares it lost
            return HOST

        return Hosts({HOST: SLOTS}, cordon=cordon)
