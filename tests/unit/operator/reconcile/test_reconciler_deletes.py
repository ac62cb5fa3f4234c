"""A plan's pods are deleted together, not one API call after another: the leavers of an
in-place job then get their SIGTERMs at once and leave in one re-form. On the local
platform, unstarted, its delete wrapped to see the calls overlap."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dlrover_events.settings import Settings
from handlers.operator.local.cluster import LocalCluster
from handlers.operator.platform.errors import PlatformError
from handlers.operator.reconcile.reconciler import EnvReconciler


class Overlapping(LocalCluster):
    """A delete returns only once ``together`` deletes are in flight (never, for the
    last ones, if they come one after another); ``refuse`` fails with a platform error."""

    def __init__(self, root: Path, together: int, refuse: str = "") -> None:
        super().__init__(root)
        self.together = asyncio.Barrier(together)
        self.refuse = refuse
        self.asked: list[tuple[str, int | None]] = []

    async def delete_pod(self, name: str, grace_s: int | None = None) -> bool:
        self.asked.append((name, grace_s))
        await self.together.wait()
        if name == self.refuse:
            raise PlatformError(f"{name}: refused")
        return True


def reconciler(platform: LocalCluster) -> EnvReconciler:
    return EnvReconciler(Settings(), "prod", "postgresql://127.0.0.1:1/unused", platform)


async def test_a_plans_deletes_are_in_flight_together(tmp_path: Path) -> None:
    platform = Overlapping(tmp_path, together=3)
    pods = [("j-worker-1", 30), ("j-worker-2", 30), ("j-ps-0", None)]
    await asyncio.wait_for(reconciler(platform)._delete_pods(pods), 10)
    assert platform.asked == pods


async def test_every_delete_is_tried_and_the_first_error_raised(tmp_path: Path) -> None:
    platform = Overlapping(tmp_path, together=3, refuse="j-worker-2")
    pods = [("j-worker-1", 30), ("j-worker-2", 30), ("j-worker-3", 30)]
    with pytest.raises(PlatformError, match="j-worker-2: refused"):
        await asyncio.wait_for(reconciler(platform)._delete_pods(pods), 10)
    assert platform.asked == pods
