"""Promotion: one transaction swaps the real env, announced so followers switch live."""

from __future__ import annotations

import asyncio

import pytest

from dlrover_events.envs.control import EnvWatcher, fold_control, real_env
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.errors import EnvError
from dlrover_events.settings import Settings
from schemas import EnvAnnouncement, EnvMode, encode
from tests.conftest import EnvFactory

pytestmark = pytest.mark.integration


async def test_promote_swaps_modes_records_the_reason_and_reaches_a_watcher(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    registry = EnvRegistry(settings, pg_dsn)
    old = await registry.real() or await make_env(mode=EnvMode.REAL)
    standby = await make_env()

    stop = asyncio.Event()
    seen: list[str | None] = []
    watcher = EnvWatcher(settings, on_change=lambda envs: seen.append(real_env(envs)))
    task = asyncio.create_task(watcher.run(stop))
    try:
        async with asyncio.timeout(20):
            await watcher.caught_up.wait()
            await watcher.wait_until(lambda envs: real_env(envs) == old.name)
        new, demoted = await registry.promote(standby.name, reason="failover drill")
        assert (new.name, new.mode) == (standby.name, EnvMode.REAL)
        assert demoted is not None
        assert (demoted.name, demoted.mode) == (old.name, EnvMode.VIRTUAL)
        async with asyncio.timeout(20):
            await watcher.wait_until(lambda envs: real_env(envs) == standby.name)
        assert watcher.real == standby.name
        assert watcher.envs[old.name].mode == EnvMode.VIRTUAL
        assert watcher.envs[standby.name].reason == "failover drill"
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    assert (await registry.real()).name == standby.name  # type: ignore[union-attr]
    changes = [(c["name"], c["change"], c["reason"]) for c in await registry.changes()]
    assert (old.name, "demote", "failover drill") in changes
    assert (standby.name, "promote", "failover drill") in changes
    # Never two real envs, at most a moment with none.
    assert all(r in (old.name, standby.name, None) for r in seen)
    await registry.promote(old.name, reason="back")  # leave the session's real env as found


async def test_promote_refuses_unknown_and_already_real(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    registry = EnvRegistry(settings, pg_dsn)
    real = await registry.real() or await make_env(mode=EnvMode.REAL)
    with pytest.raises(EnvError, match="no env named"):
        await registry.promote("nosuchenv")
    with pytest.raises(EnvError, match="already the real env"):
        await registry.promote(real.name)


def test_fold_control_handles_tombstones_deletes_and_garbage() -> None:
    a = EnvAnnouncement(env="a", name="a", mode=EnvMode.REAL, partitions=1)
    b = EnvAnnouncement(env="b", name="b", mode=EnvMode.VIRTUAL, partitions=1)
    envs = fold_control(fold_control({}, b"a", encode(a)), b"b", encode(b))
    assert real_env(envs) == "a"
    assert fold_control(envs, b"x", b"junk") == envs
    assert fold_control(envs, b"b", encode(a)) == envs  # key and name disagree: ignored
    assert set(fold_control(envs, b"a", None)) == {"b"}
    assert real_env(fold_control(envs, b"a", None)) is None
