"""wait_for_any: ready, or the work ended first; its own waiters never outlive it."""

from __future__ import annotations

import asyncio

import pytest

from dlrover_events.lifecycle import wait_for_any


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
