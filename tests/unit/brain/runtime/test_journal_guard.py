"""`JournalGuard.wait_copied` (streams/brain/runtime/journal.py): a checkpoint is held to what
`up`'s broker journal copied, and none is written while a journal that had an owner has
none (its `up` died, its broker with it). The journal's answer is stubbed here;
tests/integration/brain/test_brain_journal.py asks real ones."""

from __future__ import annotations

from typing import Any

import pytest

from dlrover_events.runtime.broker_journal import JournalView
from streams.brain.runtime import journal as module
from streams.brain.runtime.journal import JournalBehind, JournalGuard

OFFSETS = {("e.job.events", 0): 87}


def _views(monkeypatch: pytest.MonkeyPatch, *views: JournalView | None) -> None:
    answers = list(views)

    async def journal_view(*_: Any) -> JournalView | None:
        return answers.pop(0)

    monkeypatch.setattr(module, "journal_view", journal_view)


async def test_no_journal_holds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker without a journal (a Kafka cluster, memory storage): checkpoints as before."""
    _views(monkeypatch, None, None)
    guard = JournalGuard(None, "127.0.0.1:9092")  # type: ignore[arg-type]
    await guard.wait_copied(OFFSETS)
    await guard.wait_copied(OFFSETS)


async def test_a_journal_whose_up_died_holds_every_checkpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Copied, then no owner (kill -9 of `up`: its advisory lock gone, its broker dead with
    it, the records of its last 0.2 s not copied): not written, though the journal's
    answer is the same as a broker without one; the brain starts again from its last
    checkpoint. Before, that checkpoint covered what the refilled logs lacked and the
    brain rebuilt every partition from offset 0 (the chaos test of the stack, issue 37)."""
    copied = JournalView(False, dict(OFFSETS), 1, {})
    _views(monkeypatch, copied, None, None)
    guard = JournalGuard(None, "127.0.0.1:9092")  # type: ignore[arg-type]
    await guard.wait_copied(OFFSETS)
    for _ in range(2):  # (and the next ones: the brain starts again, with a new guard)
        with pytest.raises(JournalBehind, match="no owner"):
            await guard.wait_copied(OFFSETS, timeout_s=0.0)
