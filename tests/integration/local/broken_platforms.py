"""Local platforms broken on purpose, each run through the conformance suite: the suite's
checks must fail on them (tests/integration/local/test_broken_platforms.py runs this file
in a pytest session of its own and reads which checks failed).

Not collected by the suite's own run (no ``test_`` prefix): only a session given this file
runs it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import tests.contract.platform as conformance
from handlers.operator.local.cluster import LocalCluster, host_name
from handlers.operator.platform.api import WatchEvent, WatchKind
from handlers.operator.platform.bodies import JobSpecChange, JobView
from tests.contract.platform import Hosts, PlatformConformance
from tests.integration.local.test_local_conformance import SLOTS, started

#: A check waits this long for what a broken platform never does (the suite's own
#: deadline is for loaded machines; here every event a sound platform gives comes in
#: well under a second).
BROKEN_DEADLINE_S = 10.0


class KeepsDeletedJobs(LocalCluster):
    """Its delete_job says it deleted a job that stays."""

    async def delete_job(self, name: str) -> bool:
        return await self.get_job(name) is not None


class LosesDeletions(LocalCluster):
    """Its watch never says that anything went: DELETED events are lost."""

    async def watch(
        self, kind: WatchKind, resource_version: str, timeout_s: int
    ) -> AsyncIterator[WatchEvent]:
        async for typ, obj in super().watch(kind, resource_version, timeout_s):
            if typ != "DELETED":
                yield typ, obj


class IgnoresVersions(LocalCluster):
    """Its change_job writes on whatever the job is now, not on the version the change
    was decided on."""

    async def change_job(self, job: JobView, change: JobSpecChange) -> JobView:
        return await super().change_job(job, dataclasses.replace(change, resource_version=""))


class _Broken(PlatformConformance):
    watch_resumes = False
    expires = frozenset()
    broken: type[LocalCluster] = LocalCluster

    @pytest.fixture(autouse=True)
    def short_deadline(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(conformance, "DEADLINE_S", BROKEN_DEADLINE_S)

    @pytest.fixture
    async def platform(self, tmp_path: Path) -> AsyncIterator[LocalCluster]:
        platform = await started(tmp_path / "local", self.broken)
        try:
            yield platform
        finally:
            await platform.stop(end_pods=True)

    @pytest.fixture
    def hosts(self) -> Hosts:
        return Hosts({host_name(): SLOTS})


class TestKeepsDeletedJobs(_Broken):
    broken = KeepsDeletedJobs


class TestLosesDeletions(_Broken):
    broken = LosesDeletions


class TestIgnoresVersions(_Broken):
    broken = IgnoresVersions
