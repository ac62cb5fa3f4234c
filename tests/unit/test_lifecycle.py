"""The lifecycle helpers: waits that a stop cuts short, and tasks that never outlive
their owner."""

from __future__ import annotations

import asyncio

import pytest

from dlrover_events.lifecycle import (
    Stopping,
    background,
    cancel_and_wait,
    close_quietly,
    end_within,
    unless,
    wait_for_any,
    wait_or_stop,
)


@pytest.mark.asyncio
async def test_an_event_set_first_says_true_and_leaves_the_task_running() -> None:
    ready, never = asyncio.Event(), asyncio.Event()
    work = asyncio.create_task(never.wait())
    asyncio.get_running_loop().call_soon(ready.set)
    assert await wait_for_any([ready], [work]) is True
    assert not work.done()
    work.cancel()


@pytest.mark.asyncio
async def test_a_task_that_ends_first_says_false() -> None:
    ready = asyncio.Event()

    async def dies() -> None:
        raise RuntimeError("boom")

    work = asyncio.create_task(dies())
    assert await wait_for_any([ready], [work]) is False
    assert isinstance(work.exception(), RuntimeError)
    before = len(asyncio.all_tasks())
    await asyncio.sleep(0)  # the cancelled waiter is gone once the loop turns
    assert len(asyncio.all_tasks()) <= before


@pytest.mark.asyncio
async def test_bounded_by_asyncio_timeout() -> None:
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await wait_for_any([asyncio.Event()])


@pytest.mark.asyncio
async def test_wait_or_stop_sleeps_or_ends_at_the_stop() -> None:
    stop = asyncio.Event()
    assert await wait_or_stop(stop, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, stop.set)
    async with asyncio.timeout(5):  # not the hour it was asked to sleep
        assert await wait_or_stop([asyncio.Event(), stop], 3600) is True


@pytest.mark.asyncio
async def test_unless_returns_the_work_or_cancels_it_at_the_stop() -> None:
    stop = asyncio.Event()

    async def answer() -> int:
        return 42

    assert await unless(stop, answer(), "test") == 42
    cancelled = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    asyncio.get_running_loop().call_later(0.01, stop.set)
    with pytest.raises(Stopping, match="test is stopping"):
        await unless(stop, forever(), "test")
    assert cancelled.is_set()  # the work ended before unless returned


@pytest.mark.asyncio
async def test_unless_passes_the_works_error_on() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await unless(asyncio.Event(), fails(), "test")


@pytest.mark.asyncio
async def test_a_cancelled_caller_takes_its_work_with_it() -> None:
    ended = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            ended.set()

    caller = asyncio.create_task(unless(asyncio.Event(), forever(), "test"))
    await asyncio.sleep(0.01)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert ended.is_set()


@pytest.mark.asyncio
async def test_background_tasks_end_with_the_block() -> None:
    started = asyncio.Event()

    async def beside() -> None:
        started.set()
        await asyncio.Event().wait()

    seen: list[asyncio.Task[object]] = []

    async def block() -> None:
        async with background(beside()) as tasks:
            seen.extend(tasks)
            await started.wait()
            raise RuntimeError("the block fails")

    with pytest.raises(RuntimeError, match="the block fails"):
        await block()
    assert seen[0].cancelled()


@pytest.mark.asyncio
async def test_tasks_started_in_the_block_end_with_it_named() -> None:
    async def forever() -> None:
        await asyncio.Event().wait()

    async with background(forever(), name="first") as tasks:
        later = tasks.start(forever(), name="later")
        assert [t.get_name() for t in tasks] == ["first", "later"]
    assert later.cancelled() and tasks[0].cancelled()


@pytest.mark.asyncio
async def test_raise_failure_raises_the_first_failed_in_start_order() -> None:
    async def returns() -> None:
        return None

    async def fails(why: str) -> None:
        raise RuntimeError(why)

    async def forever() -> None:
        await asyncio.Event().wait()

    async with background() as tasks:
        cancelled = tasks.start(forever())
        tasks.start(returns())
        running = tasks.start(forever())
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.wait([cancelled])
        tasks.raise_failure()  # returned, cancelled and running: none failed
        second, third = tasks.start(fails("second")), tasks.start(fails("third"))
        assert await wait_for_any([], [running, third]) is False
        await asyncio.wait([second, third])
        with pytest.raises(RuntimeError, match="second"):
            tasks.raise_failure()
        assert not running.done()


@pytest.mark.asyncio
async def test_wait_or_stop_ends_when_a_watched_task_ends() -> None:
    async def dies() -> None:
        raise RuntimeError("the watch failed")

    watch = asyncio.create_task(dies())
    async with asyncio.timeout(5):  # not the hour of its pause
        assert await wait_or_stop(asyncio.Event(), 3600, [watch]) is False
    assert isinstance(watch.exception(), RuntimeError)


@pytest.mark.asyncio
async def test_end_within_cancels_only_the_late() -> None:
    stop = asyncio.Event()

    async def obeys() -> None:
        await stop.wait()

    async def ignores() -> None:
        await asyncio.Event().wait()

    tasks = [asyncio.create_task(obeys()), asyncio.create_task(ignores())]
    stop.set()
    late = await end_within(tasks, 0.05)
    assert late == [tasks[1]] and tasks[1].cancelled() and not tasks[0].cancelled()
    await cancel_and_wait(None, *tasks)  # ended and None ones are skipped


async def _close_like_aiokafka() -> None:
    """A consumer's stop as aiokafka's does it: cancel its own fetch task, then await it
    (the task's cancellation is raised into the caller)."""
    fetch = asyncio.create_task(asyncio.sleep(10))
    await asyncio.sleep(0)
    fetch.cancel()
    await fetch


async def _failing_close() -> None:
    raise ConnectionError("the broker is gone")


@pytest.mark.asyncio
async def test_close_quietly_drops_the_clients_failure_and_its_own_cancellation() -> None:
    with pytest.raises(asyncio.CancelledError):
        await _close_like_aiokafka()  # (what the caller would get without it)
    await close_quietly(_close_like_aiokafka())
    await close_quietly(_failing_close())


@pytest.mark.asyncio
async def test_close_quietly_lets_the_callers_own_cancellation_through() -> None:
    entered = asyncio.Event()

    async def slow_close() -> None:
        entered.set()
        await asyncio.sleep(10)

    caller = asyncio.create_task(close_quietly(slow_close()))
    await entered.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert caller.cancelled()
