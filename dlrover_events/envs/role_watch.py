"""Whether an env still has the role a process started it in (real, or not), as
dlrover.control says once read to its end: a process that acts as its env's role allows
(the local platform's operator of the real env, the simulator of a virtual one) stops at
the first announcement that changes it, and never starts again by itself (`up`, or a
restart, runs what the new role calls for).

Announcements read while catching up are not trusted: the topic's history passes through
older real envs on its way to now.
"""

from __future__ import annotations

import asyncio
import logging

from dlrover_events.envs.control import RETRY, EnvWatcher, real_env
from dlrover_events.lifecycle import background, wait_for_any, wait_or_stop
from dlrover_events.settings import Settings
from schemas.control import EnvAnnouncement

log = logging.getLogger(__name__)


def role_changed(env: str, was_real: bool, real: str | None) -> bool:
    """Whether ``real`` (the env announced real now; None: none for a moment, between a
    demotion and a promotion) ends the role ``env`` started in (pure)."""
    if real is None:
        return False
    return (real == env) != was_real


class RoleWatch:
    """``changed`` is set once ``env`` is no longer in the role it started in; ``now_real``
    then names the env announced real."""

    def __init__(self, env: str, *, was_real: bool) -> None:
        self.env = env
        self.was_real = was_real
        self.changed = asyncio.Event()
        self.now_real: str | None = None

    def holds(self) -> bool:
        """The fence's question: may the process still act in its role?"""
        return not self.changed.is_set()

    def seen(self, envs: dict[str, EnvAnnouncement]) -> None:
        real = real_env(envs)
        if not self.changed.is_set() and role_changed(self.env, self.was_real, real):
            self.now_real = real
            self.changed.set()

    def _watcher(self, settings: Settings) -> EnvWatcher:
        watcher = EnvWatcher(
            settings, on_change=lambda envs: self.seen(envs) if watcher.caught_up.is_set() else None
        )
        return watcher

    async def follow(self, settings: Settings, stop: asyncio.Event) -> None:
        """Until ``stop`` or the change; a bus away is retried (the role holds meanwhile)."""
        failures = 0
        while not stop.is_set() and not self.changed.is_set():
            watcher = self._watcher(settings)
            watcher_stop = asyncio.Event()
            try:
                async with background(watcher.run(watcher_stop)) as (task,):
                    if await wait_for_any([watcher.caught_up, stop], [task]):
                        self.seen(watcher.envs)
                        await wait_for_any([stop, self.changed], [task])
                    watcher_stop.set()
                    await task
                return
            except Exception as err:  # the bus away
                failures += 1
                delay = RETRY.delay(failures)
                log.warning(
                    "env %s: following which env is real: %s; again in %.1f s", self.env, err, delay
                )
                await wait_or_stop(stop, delay)


__all__ = ["RoleWatch", "role_changed"]
