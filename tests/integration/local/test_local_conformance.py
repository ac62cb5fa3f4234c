"""The local platform keeps the platform contract: the conformance suite
(tests/contract/platform.py) over a LocalCluster that runs its pods as processes on this
machine, in a root of each test's own.

What the local platform declares: its watch does not resume from a version (its lists
answer "0"; a watch starts with every current object, then what its poller sees) and lets
no version go, so the suite checks that a watch from any version shows every object
instead of Expired; its capacity is this machine's slots, a setting that does not change
while it runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from handlers.operator.local.cluster import LocalCluster, host_name
from tests.contract.platform import Hosts, PlatformConformance

SLOTS = 64


async def started(root: Path, cluster: type[LocalCluster] = LocalCluster) -> LocalCluster:
    """A local platform that is its own node agent (it starts and follows its pods)."""
    platform = cluster(root, runs_pods=True, poll_s=0.05, slots=SLOTS)
    await platform.start()
    return platform


class TestLocalPlatform(PlatformConformance):
    watch_resumes = False
    expires = frozenset()

    @pytest.fixture
    async def platform(self, tmp_path: Path) -> AsyncIterator[LocalCluster]:
        platform = await started(tmp_path / "local")
        try:
            yield platform
        finally:
            await platform.stop(end_pods=True)

    @pytest.fixture
    def hosts(self) -> Hosts:
        return Hosts({host_name(): SLOTS})
