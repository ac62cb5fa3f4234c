"""`JournalGuard.wait_copied` (streams/brain/runtime/journal.py) has one bound: a refill
seen during the wait gives the journal time again, within one bound for the call
(`REFILL_WAITS` waits, at least `REFILL_BOUND_S`). Before, every refill seen started the
wait again, so a journal refilling again and again (or stuck refilling: a refill that
failed leaves its flag up) held a checkpoint, and the brain with it, for ever. The
journal's answers are stubbed here; tests/integration/brain/test_brain_journal.py asks
real ones."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from dlrover_events.runtime.broker_journal import JournalView
from streams.brain.runtime import journal as module
from streams.brain.runtime.journal import JournalBehind, JournalGuard

TP = ("e.job.events", 0)
#: far more than the bound of the calls below: a wait that never ends fails, not hangs
NEVER_S = 60.0


@pytest.mark.parametrize("refilling", [True, False], ids=["stuck-refilling", "refilled-again"])
async def test_a_journal_that_keeps_refilling_does_not_hold_a_checkpoint_for_ever(
    monkeypatch: pytest.MonkeyPatch, refilling: bool
) -> None:
    refills = itertools.count()

    async def journal_view(*_: Any) -> JournalView:
        # behind the checkpoint, and refilling (or refilled again) at every look
        return JournalView(refilling, {TP: 0}, next(refills), {})

    monkeypatch.setattr(module, "journal_view", journal_view)
    monkeypatch.setattr(module, "REFILL_BOUND_S", 1.0)
    guard = JournalGuard(None, "127.0.0.1:9092")  # type: ignore[arg-type]
    with pytest.raises(JournalBehind):
        await asyncio.wait_for(guard.wait_copied({TP: 5}, timeout_s=0.2), NEVER_S)
    assert next(refills) > 1  # (it did look again after the first refill)


async def test_a_journal_that_copies_after_a_refill_is_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    views = iter(
        [JournalView(True, {TP: 0}, 1, {}), JournalView(False, {TP: 2}, 1, {})]
        + [JournalView(False, {TP: 5}, 1, {})] * 100
    )

    async def journal_view(*_: Any) -> JournalView:
        return next(views)

    monkeypatch.setattr(module, "journal_view", journal_view)
    guard = JournalGuard(None, "127.0.0.1:9092")  # type: ignore[arg-type]
    await asyncio.wait_for(guard.wait_copied({TP: 5}, timeout_s=NEVER_S), NEVER_S * 2)
