"""Start/stop resources, usable as ``async with`` (the aiokafka and aiohttp idiom), and
the one way to wait for "ready, or the work ended first, or stop"."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Iterable
from types import TracebackType
from typing import Any, Self


class AsyncResource(ABC):
    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def stop(self) -> None: ...

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


async def wait_for_any(
    events: Iterable[asyncio.Event],
    tasks: Iterable[asyncio.Future[Any]] = (),
) -> bool:
    """Until one of ``events`` is set or one of ``tasks`` ends; True if an event is set
    (bound it with ``asyncio.timeout``). The waiters made here are cancelled; the tasks
    keep running (their owner decides what their end means)."""
    events = list(events)
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait([*waiters, *tasks], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    return any(e.is_set() for e in events)
