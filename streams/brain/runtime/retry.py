"""How the brain's loops retry: saying why (the caller), backing off, and giving up at
once when the brain stops, so that a stop never waits behind a retry."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from dlrover_events.lifecycle import wait_for_any

T = TypeVar("T")

#: Retry loops (loading a checkpoint, publishing, checkpointing) back off up to this.
MAX_BACKOFF_S = 30.0


class Stopping(Exception):
    """The brain is stopping: what was under way is left for the next start to redo."""


def backoff(attempt: int, first: float = 0.2) -> float:
    """Seconds before retry `attempt` + 1: doubling from `first`, at most MAX_BACKOFF_S."""
    return min(first * 2 ** min(attempt - 1, 20), MAX_BACKOFF_S)


async def sleep_unless(closing: asyncio.Event, seconds: float, what: str) -> None:
    """Sleep, or raise Stopping as soon as `closing` is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(closing.wait(), seconds)
    if closing.is_set():
        raise Stopping(f"{what} is stopping")


async def unless(closing: asyncio.Event, work: Awaitable[T], what: str) -> T:
    """`work`'s result, or Stopping (and `work` cancelled) as soon as `closing` is set."""
    task = asyncio.ensure_future(work)
    await wait_for_any([closing], [task])
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise Stopping(f"{what} is stopping")
    return task.result()
