"""Following ``dlrover.control``: which envs exist, and which one is real, live.

Every process that must act on the real env (the Kubernetes operator above all) follows
this instead of reading Postgres once at start, so a promotion reaches it without a
restart. The topic is compacted and keyed by env name: reading it from the beginning
gives the registry as of now, and a tombstone removes an env.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiokafka.errors import KafkaError

from dlrover_events.backoff import Backoff
from dlrover_events.bus.topic_reader import TopicReader
from dlrover_events.bus.topics import CONTROL_TOPIC
from dlrover_events.errors import BusUnavailable
from dlrover_events.lifecycle import wait_or_stop
from dlrover_events.settings import Settings
from schemas.codec import CodecError, decode
from schemas.control import EnvAnnouncement, EnvMode

log = logging.getLogger(__name__)

#: A broker away is tried again after this.
RETRY = Backoff(initial_s=0.5, max_s=10.0)


def fold_control(
    envs: dict[str, EnvAnnouncement], key: bytes | None, value: bytes | None
) -> dict[str, EnvAnnouncement]:
    """One control record folded into the view (pure). Unreadable records change nothing."""
    if key is None:
        return envs
    name = key.decode("utf-8", "replace")
    if value is None:
        return {k: v for k, v in envs.items() if k != name}
    try:
        event = decode(value)
    except CodecError:
        return envs
    if not isinstance(event, EnvAnnouncement) or event.name != name:
        return envs
    if event.deleted:
        return {k: v for k, v in envs.items() if k != name}
    return {**envs, name: event}


def real_env(envs: dict[str, EnvAnnouncement]) -> str | None:
    reals = sorted(n for n, a in envs.items() if a.mode == EnvMode.REAL)
    return reals[0] if len(reals) == 1 else None


class EnvWatcher:
    """The announced registry, kept current; ``on_change`` hears every change."""

    def __init__(
        self,
        settings: Settings,
        on_change: Callable[[dict[str, EnvAnnouncement]], None] | None = None,
    ) -> None:
        self._settings = settings
        self._on_change = on_change
        self.envs: dict[str, EnvAnnouncement] = {}
        self.caught_up = asyncio.Event()
        self._changed = asyncio.Condition()

    @property
    def real(self) -> str | None:
        return real_env(self.envs)

    async def wait_until(self, predicate: Callable[[dict[str, EnvAnnouncement]], bool]) -> None:
        """Return once ``predicate(envs)`` holds; bound it with asyncio.timeout()."""
        async with self._changed:
            await self._changed.wait_for(lambda: predicate(self.envs))

    async def run(self, stop: asyncio.Event) -> None:
        reader = TopicReader(self._settings, [CONTROL_TOPIC], client_id="control", require=False)
        async with reader:
            if not reader.partitions:
                self.caught_up.set()  # no env announced yet; the topic comes with the first
                while not reader.partitions and not await wait_or_stop(stop, 0.5):
                    if await reader.refresh():
                        await reader.seek("earliest")
            while not stop.is_set():
                records = await reader.fetch(timeout_ms=300)
                if records:
                    envs = self.envs
                    for r in records:
                        envs = fold_control(envs, r.key, r.value)
                    await self._publish(envs)
                elif not self.caught_up.is_set() and await reader.caught_up():
                    self.caught_up.set()

    async def _publish(self, envs: dict[str, EnvAnnouncement]) -> None:
        if envs == self.envs:
            return
        self.envs = envs
        if self._on_change is not None:
            self._on_change(envs)
        async with self._changed:
            self._changed.notify_all()


class SettingsFollower:
    """One env's settings as announced on dlrover.control: ``on_change`` hears each
    version newer than the last it heard (starting from ``version``, what the process
    read from the registry when it started), never an older one, so an announcement
    that lags the registry cannot undo a change. A process that runs an env (its brain,
    its operator) runs this beside its work to take a change without a restart.
    """

    def __init__(
        self,
        settings: Settings,
        env: str,
        version: int,
        on_change: Callable[[EnvAnnouncement], None],
    ) -> None:
        self.env = env
        self.version = version
        self._on_change = on_change
        self._watcher = EnvWatcher(settings, on_change=self._seen)

    @property
    def caught_up(self) -> asyncio.Event:
        return self._watcher.caught_up

    def _seen(self, envs: dict[str, EnvAnnouncement]) -> None:
        announced = envs.get(self.env)
        if announced is None or announced.settings_version <= self.version:
            return
        self.version = announced.settings_version
        self._on_change(announced)

    async def run(self, stop: asyncio.Event) -> None:
        """Follow until ``stop``; a broker away is logged and retried, never fatal (the
        process goes on with the settings it has)."""
        failures = 0
        while not stop.is_set():
            try:
                await self._watcher.run(stop)
            except (KafkaError, BusUnavailable) as err:
                failures += 1
                delay = RETRY.delay(failures)
                log.warning(
                    "env %s: following its settings on %s: %s; retrying in %.1f s",
                    self.env,
                    CONTROL_TOPIC,
                    err,
                    delay,
                )
                await wait_or_stop(stop, delay)
