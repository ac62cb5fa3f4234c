"""Reading a compacted topic whole, from the beginning, then following it live.

A compacted topic holds the current state of something keyed (config documents, the env
registry), so every reader needs all of it: no consumer group, every partition assigned,
none moving another's offsets. A reader is caught up once it reaches the end offsets
captured at start, so its owner can refuse to answer from half a state.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiokafka import ConsumerRecord
from aiokafka.errors import KafkaError

from dlrover_events.backoff import Backoff
from dlrover_events.bus.topic_reader import TopicReader
from dlrover_events.lifecycle import AsyncResource, wait_or_stop
from dlrover_events.settings import Settings

log = logging.getLogger(__name__)

#: A broker away is tried again after this.
RETRY = Backoff(initial_s=0.2, max_s=5.0)

#: Takes one fetch's records; runs on the event loop, so it must not block.
Handle = Callable[[list[ConsumerRecord]], None]


class CompactedFollower(AsyncResource):
    """``start`` assigns every partition from the beginning; ``run`` (or ``poll``) hands
    each fetch to ``handle``; ``caught_up`` is set after the fetch that reached the end
    offsets of the start, once ``handle`` has taken it.

    ``missing`` says, when the topic does not exist, what the user should check; with
    ``require`` off a missing topic is no error (``exists`` is then false: nothing to follow).
    """

    def __init__(
        self,
        settings: Settings,
        topic_name: str,
        handle: Handle,
        *,
        client_id: str,
        poll_ms: int = 100,
        missing: str = "",
        caught_up: asyncio.Event | None = None,
        require: bool = True,
    ) -> None:
        self.topic = topic_name
        self.caught_up = caught_up if caught_up is not None else asyncio.Event()
        self._handle = handle
        self._poll_ms = poll_ms
        self._reader = TopicReader(
            settings,
            [topic_name],
            client_id=client_id,
            missing=missing,
            require=require,
            # A change should reach its readers in well under a second.
            fetch_max_wait_ms=poll_ms,
        )

    async def start(self) -> None:
        await self._reader.start()
        try:
            await self._check_caught_up()
        except BaseException:
            await self._reader.stop()
            raise

    async def stop(self) -> None:
        await self._reader.stop()

    @property
    def exists(self) -> bool:
        """Whether the topic had partitions when the follower started."""
        return bool(self._reader.partitions)

    async def poll(self) -> int:
        """Hand one fetch to ``handle``; returns how many records it held."""
        records = await self._reader.fetch(timeout_ms=self._poll_ms)
        if records:
            self._handle(records)
        if not self.caught_up.is_set():
            await self._check_caught_up()
        return len(records)

    async def run(self, stop: asyncio.Event) -> None:
        """Follow until ``stop``; a broker outage is logged and retried, never fatal."""
        failures = 0
        while not stop.is_set():
            try:
                await self.poll()
                failures = 0
            except KafkaError as err:
                failures += 1
                delay = RETRY.delay(failures)
                log.warning("%s: %s; retrying in %.1fs", self.topic, err, delay)
                await wait_or_stop(stop, delay)

    async def _check_caught_up(self) -> None:
        # the position passes the end captured at start only once the fetch that held
        # the last batch was handed on
        if await self._reader.caught_up():
            self.caught_up.set()
