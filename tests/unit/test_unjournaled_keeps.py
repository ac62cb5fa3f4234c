"""`Unjournaled.keeps` (dlrover_events/runtime/unjournaled.py): a producer skips noting a
batch only once no journal of its broker was found, and notes again once one is. The
journal's answer is stubbed here; tests/integration/test_unjournaled.py asks real ones."""

from __future__ import annotations

from typing import Any

import pytest

from dlrover_events.runtime import unjournaled as module
from dlrover_events.runtime.broker_journal import JournalView
from dlrover_events.runtime.unjournaled import Unjournaled
from dlrover_events.settings import Settings


async def test_keeps_follows_whether_the_broker_has_a_journal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    views: list[JournalView | None] = [None, JournalView(False, {}, 0, {})]

    async def journal_view(*_: Any) -> JournalView | None:
        return views.pop(0)

    monkeypatch.setattr(module, "journal_view", journal_view)
    monkeypatch.setattr(module, "REASK_S", 0.0)
    unjournaled = Unjournaled(None, Settings())  # type: ignore[arg-type]
    assert unjournaled.keeps  # not asked yet: kept, to be judged at the next ask
    unjournaled.note("t", 0, 0, None, b"a")
    assert len(unjournaled) == 1

    assert await unjournaled.lost() == []  # no journal
    assert not unjournaled.keeps
    assert len(unjournaled) == 0
    unjournaled.note("t", 0, 1, None, b"b")
    assert len(unjournaled) == 0

    assert await unjournaled.lost() == []  # a journal now (an `up` that came back)
    assert unjournaled.keeps
    unjournaled.note("t", 0, 2, None, b"c")
    assert len(unjournaled) == 1


async def test_lost_is_not_answered_while_the_journal_refills_or_its_up_is_away(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`answered` (a producer publishes nothing new until it is True): False while the
    journal refills the broker, and while a journal owned before has no owner, for at most
    `OWNER_BACK_S` (an `up` that does not come back must not hold its producers)."""
    views: list[JournalView | None] = [
        JournalView(False, {}, 1, {}),
        JournalView(True, {}, 2, {}),
        None,
        None,
        JournalView(False, {}, 2, {}),
        None,
    ]

    async def journal_view(*_: Any) -> JournalView | None:
        return views.pop(0)

    monkeypatch.setattr(module, "journal_view", journal_view)
    unjournaled = Unjournaled(None, Settings())  # type: ignore[arg-type]
    assert await unjournaled.lost() == [] and unjournaled.answered  # journaled, not refilling
    assert await unjournaled.lost() == [] and not unjournaled.answered  # refilling
    assert await unjournaled.lost() == [] and not unjournaled.answered  # its `up` away
    monkeypatch.setattr(module, "OWNER_BACK_S", 0.0)
    assert await unjournaled.lost() == [] and unjournaled.answered  # away too long
    assert await unjournaled.lost() == [] and unjournaled.answered  # back, refilled
    monkeypatch.setattr(module, "OWNER_BACK_S", 3600.0)
    assert await unjournaled.lost() == [] and not unjournaled.answered  # away again
