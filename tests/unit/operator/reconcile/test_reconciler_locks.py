"""The reconciler's per-job locks live only while work on a job is in flight: before, the
map kept a lock for every job name it ever saw (an operator of a busy cluster grew it for
ever). On the local platform, unstarted: reconciling a job that is not there reads files."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dlrover_events.settings import Settings
from handlers.operator.local.cluster import LocalCluster
from handlers.operator.reconcile.reconciler import EnvReconciler


def reconciler(root: Path) -> EnvReconciler:
    cluster = LocalCluster(root)
    return EnvReconciler(Settings(), "prod", "postgresql://127.0.0.1:1/unused", cluster)


async def test_a_job_done_with_leaves_no_lock_behind(tmp_path: Path) -> None:
    r = reconciler(tmp_path)
    await asyncio.gather(*(r.reconcile(f"gone-{i % 50}") for i in range(500)))
    assert r._locks == {}


async def test_one_job_at_a_time_still(tmp_path: Path) -> None:
    r = reconciler(tmp_path)
    inside: list[str] = []
    overlaps = 0

    async def work(job: str) -> None:
        nonlocal overlaps
        async with r._lock(job):
            overlaps += job in inside
            inside.append(job)
            await asyncio.sleep(0)
            inside.remove(job)

    await asyncio.gather(*(work(j) for j in ["a", "b", "a", "a", "b"] * 20))
    assert overlaps == 0
    assert r._locks == {}
