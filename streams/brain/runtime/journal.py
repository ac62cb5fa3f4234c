"""The brain beside `up`'s broker journal: its checkpoint held to what the journal copied.

`up`'s embedded broker keeps its records in memory and a journal copies them to Postgres
every 0.2 s (`dlrover_events.runtime.broker_journal`); after a crash of `up`, the broker is
refilled from the journal, without the records of the last moments. A checkpoint that
covered one of those (the brain checkpoints every 2 s from what it consumed) was ahead of
the refilled log: the brain took the partition for restarted, read it again from offset 0
with its states kept, folded records a second time and kept records no topic holds (issue
37). So, where the broker is journaled:

- a checkpoint is written only once the journal copied every offset it covers (inputs and
  the plans published), else not at all (`JournalBehind`: the next one tries again). What
  a checkpoint covers then survives any crash: its log never ends before it. A journal
  whose `up` died has no owner until `up` is back: no checkpoint then either (it took the
  journal for none, and wrote checkpoints ahead of every refilled log);
- a log that ends before a checkpoint while the journal is refilling the broker (or holds
  the records it lacks) is not restarted but coming back: the load waits for it
  (`BrokerRefilling`), and a running brain does not read it again from 0;
- should a journaled log end before a checkpoint after all (a checkpoint written before
  the journal held them), its partitions are rebuilt from the log, states dropped.

Without a journal of this broker in the env's database (a Kafka cluster, memory storage,
another database) nothing changes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

import asyncpg

from dlrover_events.runtime.broker_journal import JournalView, journal_view
from streams.brain.core.snapshot import Offsets

TP = tuple[str, int]

#: how long a checkpoint waits for the journal to copy what it covers (it copies every
#: 0.2 s; longer means the journal is stuck, and the checkpoint is skipped)
JOURNAL_WAIT_S = 5.0
#: a refill seen during the wait gives the journal its wait again from the refill, within
#: one bound for the whole call: this many waits, and at least `REFILL_BOUND_S` (a refill
#: takes 0.5-2 s; a held checkpoint waits 0.5 s). A journal refilling again and again (or
#: stuck refilling) must not hold a checkpoint for ever
REFILL_WAITS = 3
REFILL_BOUND_S = 10.0


class JournalBehind(RuntimeError):
    """The journal has not copied what a checkpoint would cover: not checkpointed."""


class BrokerRefilling(RuntimeError):
    """The broker's logs are coming back from its journal: load again shortly."""


class JournalGuard:
    """Asks the journal of the brain's broker, in the env's database, how far it copied."""

    def __init__(self, pool: asyncpg.Pool, bootstrap_servers: str) -> None:
        self._pool = pool
        self._bootstrap_servers = bootstrap_servers
        #: whether the broker was journaled when last asked (a running brain then never
        #: takes a short log for a restarted one: it is being refilled)
        self.journaled = False
        #: a checkpoint found the journal owned once: from then on, one that finds no
        #: owner is not written (this brain starts again instead: `JournalBehind`)
        self._owned = False

    async def view(self, topics: Offsets | Mapping[TP, object]) -> JournalView | None:
        view = await journal_view(self._pool, self._bootstrap_servers, {t for t, _ in topics})
        self.journaled = view is not None
        return view

    async def wait_copied(self, offsets: Offsets, timeout_s: float = JOURNAL_WAIT_S) -> None:
        """Return once the journal holds every record below ``offsets`` (at once without a
        journal); `JournalBehind` if it does not within ``timeout_s`` (from the last refill
        seen, within `REFILL_WAITS` times ``timeout_s`` or `REFILL_BOUND_S` in all), or if a
        journal this guard found owned before has no owner now (its `up` gone: not "no
        journal")."""
        started = time.monotonic()
        deadline = started + timeout_s
        last = started + max(REFILL_WAITS * timeout_s, REFILL_BOUND_S)
        refills: int | None = None
        while True:
            view = await self.view(offsets)
            if view is not None:
                self._owned = True
            elif self._owned:
                # the journal of this broker had an owner and has none now: `up` died (its
                # broker with it) or stopped. What the broker acknowledged since the last
                # copy is lost, and a checkpoint that covered it would be ahead of the
                # refilled logs (seen after kills of `up` in the chaos test of issue 37:
                # every input 1 record ahead, its partitions rebuilt from offset 0)
                raise JournalBehind(
                    "the broker journal has no owner any more (`up` gone): what it had not "
                    "copied is lost"
                )
            if view is None:
                return
            if view.refilling or (refills is not None and view.refills != refills):
                # a broker refilled meanwhile: its producers publish again what it lost
                # (dlrover_events.runtime.unjournaled), and the journal copies it; the
                # wait starts again from the refill, within the one bound of the call
                deadline = min(time.monotonic() + timeout_s, last)
            refills = view.refills
            behind = {
                tp: (o, view.copied.get(tp, 0))
                for tp, o in offsets.items()
                if o > view.copied.get(tp, 0)
            }
            if not behind:
                return
            if time.monotonic() >= deadline:
                if view.refilling:
                    raise JournalBehind(
                        f"the broker journal was still refilling the broker after "
                        f"{time.monotonic() - started:.1f} s"
                    )
                (name, part), (offset, copied) = min(behind.items())
                raise JournalBehind(
                    f"the broker journal copied {name}[{part}] to {copied}, the checkpoint "
                    f"would cover {offset} ({len(behind)} partition(s) behind)"
                )
            await asyncio.sleep(0.1)

    async def coming_back(self, stale: Mapping[TP, tuple[int, int]]) -> bool:
        """Whether logs that end before their checkpoint are being refilled (or the journal
        holds what they lack): then they are not restarted."""
        if not stale:
            return False
        view = await self.view(stale)
        if view is None:
            return False
        return view.refilling or any(
            view.copied.get(tp, 0) >= offset for tp, (offset, _) in stale.items()
        )
