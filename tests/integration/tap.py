"""A tap on an env's topics for tests: everything published there, decoded, from the start.

Waiting is bounded by generous deadlines only; no assertion depends on how long anything
took, because a loaded 2-core machine slows everything down.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import TypeVar

import pytest
from aiokafka import AIOKafkaConsumer

from dlrover_events.bus.kafka_client import stop_consumer
from dlrover_events.bus.topics import JOB_EVENTS, JOB_METRICS, SCALE_RESULTS, topic
from dlrover_events.settings import Settings
from schemas.codec import decode
from schemas.envelope import Event

T = TypeVar("T")
E = TypeVar("E", bound=Event)

DEADLINE_S = 120.0

#: What an operator says: samples, node and job events, scale results.
OPERATOR_OUTPUTS = (JOB_METRICS, JOB_EVENTS, SCALE_RESULTS)


class Tap:
    def __init__(
        self, settings: Settings, env: str, topics: Sequence[str] = OPERATOR_OUTPUTS
    ) -> None:
        self._consumer = AIOKafkaConsumer(
            *(topic(env, t) for t in topics),
            bootstrap_servers=settings.bootstrap_servers,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        self.events: list[Event] = []
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._consumer.start()
        self._task = asyncio.create_task(self._read())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await stop_consumer(self._consumer)

    async def _read(self) -> None:
        while True:
            batch = await self._consumer.getmany(timeout_ms=200)
            for records in batch.values():
                self.events.extend(decode(r.value) for r in records)

    def of(self, kind: type[E], job: str | None = None) -> list[E]:
        return [
            e
            for e in self.events
            if isinstance(e, kind) and (job is None or getattr(e, "key", None) == job)
        ]

    async def until(self, found: Callable[[], T | None], what: str) -> T:
        """Wait for ``found()`` to give something truthy; fail with ``what`` after the deadline."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE_S
        while loop.time() < deadline:
            if result := found():
                return result
            await asyncio.sleep(0.05)
        kinds = sorted({e.type for e in self.events})
        pytest.fail(f"no {what} within {DEADLINE_S:.0f}s; seen {len(self.events)} events {kinds}")

    async def first(self, kind: type[E], job: str, match: Callable[[E], bool], what: str) -> E:
        """The first event of ``kind`` for ``job`` that ``match`` accepts, once it is there."""
        return await self.until(
            lambda: next((e for e in self.of(kind, job) if match(e)), None), what
        )
