"""One group-less consumer per console, fanned out to every open page.

A page that reads slower than its env publishes must not slow the others or grow memory
without bound: each subscription has a bounded queue, and what overflows is counted and
told to that page (a ``dropped`` event), never lost silently.

An evaluator's report that repeats its last values is not a new line: the pages are told
it came again (a ``repeat``), so a few evaluators reporting every 10 s do not push every
other event out of the pages and the backlog.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from dlrover_events.bus.tail import Filter, Line
from dlrover_events.bus.tailer import follow
from dlrover_events.bus.topics import ENV_TOPIC_NAMES, split_topic
from dlrover_events.settings import Settings
from handlers.console.board import Board
from schemas.evaluation import EvaluationReport
from schemas.lockstep import Barrier, BarrierAck

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Repeat:
    """An evaluator's report came again with the same values, ``repeats`` times so far."""

    evaluator: str
    repeats: int
    at: str


Item = Line | Repeat | None


@dataclass(eq=False)
class Subscription:
    topics: frozenset[str]
    where: Filter
    #: None is the end of the feed (the console is stopping).
    queue: asyncio.Queue[Item]
    dropped: int = 0

    def wants(self, line: Line) -> bool:
        if split_topic(line.topic)[1] not in self.topics:
            return False
        if line.event is None:
            # An unreadable message belongs to no job and has no type.
            return self.where.job is None and self.where.type_pattern is None
        return self.where.accepts(line.event)

    def offer(self, item: Line | Repeat) -> None:
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            self.dropped += 1


@dataclass
class Hub:
    settings: Settings
    env: str
    backlog_size: int = 500
    queue_size: int = 1000
    board: Board = field(default_factory=Board)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    _subs: set[Subscription] = field(default_factory=set)
    _backlog: deque[Line] = field(init=False)

    def __post_init__(self) -> None:
        self._backlog = deque(maxlen=self.backlog_size)

    def subscribe(self, topics: frozenset[str], where: Filter, backlog: int = 0) -> Subscription:
        """A new page's feed: the last ``backlog`` matching lines, then live ones."""
        sub = Subscription(topics, where, asyncio.Queue(self.queue_size))
        if backlog:
            recent = [line for line in self._backlog if sub.wants(line)][-backlog:]
            for line in recent:
                sub.offer(line)
            shown = {
                line.event.evaluator for line in recent if isinstance(line.event, EvaluationReport)
            }
            for name in sorted(shown):
                row = self.board.reports.get(name)
                if row is not None and row.repeats:
                    sub.offer(Repeat(name, row.repeats, row.last_at))
        self._subs.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subs.discard(sub)

    def close(self) -> None:
        """End every open feed now, so a stopping server does not wait for idle pages."""
        for sub in self._subs:
            if sub.queue.full():
                sub.queue.get_nowait()
                sub.dropped += 1
            sub.queue.put_nowait(None)

    @property
    def subscribers(self) -> int:
        return len(self._subs)

    def recent(self) -> Iterator[Line]:
        return iter(self._backlog)

    def emit(self, line: Line) -> None:
        if line.event is None:
            self.board.unreadable(line.topic, line.partition, line.offset, line.error)
        else:
            news = self.board.apply(line.event)
            if isinstance(line.event, Barrier | BarrierAck):
                # a lockstep env's clock ticks on every partition: plumbing, not news,
                # and it would push what happened out of the pages' backlog
                return
            if not news and isinstance(line.event, EvaluationReport):
                row = self.board.reports[line.event.evaluator]
                repeat = Repeat(line.event.evaluator, row.repeats, row.last_at)
                for sub in self._subs:
                    if sub.wants(line):
                        sub.offer(repeat)
                return
        self._backlog.append(line)
        for sub in self._subs:
            if sub.wants(line):
                sub.offer(line)

    async def run(self, stop: asyncio.Event) -> None:
        """Follow every topic of the env from its beginning (the board needs the history);
        if the bus goes away, follow again from where the topics end then."""
        start: str = "earliest"
        while not stop.is_set():
            caught_up = asyncio.Event()
            waiter = asyncio.create_task(self._mark_ready(caught_up))
            try:
                await follow(
                    self.settings,
                    self.env,
                    list(ENV_TOPIC_NAMES),
                    self.emit,
                    start="earliest" if start == "earliest" else "latest",
                    stop=stop,
                    ready=caught_up,
                )
            except asyncio.CancelledError:
                raise
            except Exception as err:
                log.warning("console of env %s lost the bus (%s); following again", self.env, err)
                start = "latest"
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 2.0)
            finally:
                waiter.cancel()

    async def _mark_ready(self, assigned: asyncio.Event) -> None:
        await assigned.wait()
        self.ready.set()
