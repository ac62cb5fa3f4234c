"""Start/stop resources, and the waits and tasks of code that must stop at once.

One style of lifecycle: a resource is an ``AsyncResource`` (``start``/``stop``, usable as
``async with``: the aiokafka and aiohttp idiom); a loop runs until a stop event
(``run(stop)``). Every wait of such a loop is also a wait on its stop event, and every
task it starts beside its work ends with it, so a stop never waits behind a retry or
leaves a task behind:

- ``wait_for_any``: ready, or the work ended first, or stop;
- ``wait_or_stop``: a pause (a poll, a retry's backoff) that a stop cuts short;
- ``unless``: a piece of work, cancelled as soon as a stop event is set (``Stopping``);
- ``background``: tasks that run beside a block and are cancelled when it ends (the block
  may start more, named each, and ask whether one failed: ``Beside``);
- ``cancel_and_wait``: a task's end, for owners that keep one across calls;
- ``close_quietly``: a client closed whose failure is nobody's business;
- ``end_within``: tasks told to stop, given a grace period, then cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Coroutine, Iterable
from types import TracebackType
from typing import Any, Self, TypeVar

T = TypeVar("T")


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


class Stopping(Exception):
    """Its owner is stopping: what was under way is left for the next start to redo."""


def _events(stop: asyncio.Event | Iterable[asyncio.Event]) -> list[asyncio.Event]:
    return [stop] if isinstance(stop, asyncio.Event) else list(stop)


async def wait_for_any(
    events: Iterable[asyncio.Event],
    tasks: Iterable[asyncio.Future[Any]] = (),
) -> bool:
    """Until one of ``events`` is set or one of ``tasks`` ends; True if an event is set
    (bound it with ``asyncio.timeout``). The waiters made here are cancelled; the tasks
    keep running (their owner decides what their end means)."""
    events = list(events)
    if any(e.is_set() for e in events):
        return True
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait([*waiters, *tasks], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    return any(e.is_set() for e in events)


async def wait_or_stop(
    stop: asyncio.Event | Iterable[asyncio.Event],
    seconds: float,
    tasks: Iterable[asyncio.Future[Any]] = (),
) -> bool:
    """Sleep ``seconds`` unless ``stop`` (one of them) is set first, or one of ``tasks``
    ends (a watch whose failure must not wait out a retry's pause); True if a stop was."""
    events = _events(stop)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(seconds, 0.0)):
            return await wait_for_any(events, tasks)
    return any(e.is_set() for e in events)


async def cancel_and_wait(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel ``tasks`` (None and ended ones are skipped) and wait until they ended; what
    they raise is theirs. A cancellation of the caller itself still propagates."""
    given = [t for t in tasks if t is not None]
    running = [t for t in given if not t.done()]
    for task in running:
        task.cancel()
    if running:
        await asyncio.wait(running)
    for ended in given:  # retrieved, so asyncio does not log it as never retrieved
        if ended.done() and not ended.cancelled():
            ended.exception()


async def close_quietly(close: Awaitable[Any]) -> None:
    """Close a client whose failure is of no use to the caller (a client of a broker that
    died). Its error is dropped, and so is a CancelledError that escapes it while the
    caller is not being cancelled (a client's own task cancelled and awaited unguarded
    inside its close; a consumer is stopped whole by `bus.kafka_client.stop_consumer`). A
    cancellation of the caller itself still propagates."""
    try:
        await close
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
    except Exception:
        pass


async def end_within(
    tasks: Iterable[asyncio.Future[Any]], grace_s: float
) -> list[asyncio.Future[Any]]:
    """Give ``tasks`` (told to stop already) ``grace_s`` to end, then cancel the ones still
    running and wait for them; returns those that had to be cancelled."""
    tasks = list(tasks)
    if not tasks:
        return []
    _, pending = await asyncio.wait(tasks, timeout=grace_s)
    late = [t for t in tasks if t in pending]
    await cancel_and_wait(*tasks)
    return late


async def unless(stop: asyncio.Event | Iterable[asyncio.Event], work: Awaitable[T], what: str) -> T:
    """``work``'s result (or its error), unless ``stop`` (one of them) is set first: then
    ``work`` is cancelled and waited for, and ``Stopping`` raised ("``what`` is
    stopping"). ``work`` never outlives this call."""
    task = asyncio.ensure_future(work)
    try:
        await wait_for_any(_events(stop), [task])
    finally:
        await cancel_and_wait(task)
    if task.cancelled():
        raise Stopping(f"{what} is stopping")
    return task.result()


class Beside(list[asyncio.Task[Any]]):
    """The tasks of a ``background`` block. The block may start more (one a watch or a
    consumer that may begin only once the others caught up), each with its own name, and
    all end with the block."""

    def start(self, work: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
        task = asyncio.create_task(work, name=name)
        self.append(task)
        return task

    def raise_failure(self) -> None:
        """Raise the error of the first of them, in the order started, that ended with one
        (after ``wait_for_any`` said one ended): an owner whose helpers must not fail
        fails with them. One that returned or was cancelled is not a failure."""
        for task in self:
            if task.done() and not task.cancelled() and (err := task.exception()) is not None:
                raise err


@contextlib.asynccontextmanager
async def background(
    *work: Coroutine[Any, Any, Any], name: str | None = None
) -> AsyncIterator[Beside]:
    """Run ``work`` as tasks beside the block; when the block ends (however) they are
    cancelled and waited for, and so are those the block started (``Beside.start``). What
    they raise is theirs: a task whose end matters is watched with ``wait_for_any`` (and
    ``Beside.raise_failure``). Work told to stop by an event, given time to end, is ended
    with ``end_within`` before the block ends. For work that must all succeed, use
    asyncio.TaskGroup."""
    tasks = Beside()
    try:
        for w in work:
            tasks.start(w, name=name)
        yield tasks
    finally:
        await cancel_and_wait(*tasks)


__all__ = [
    "AsyncResource",
    "Beside",
    "Stopping",
    "background",
    "cancel_and_wait",
    "end_within",
    "unless",
    "wait_for_any",
    "wait_or_stop",
]
