"""The brain's courier: publishes decided batches, in the order they were decided.

A batch's plans wait for the broker's acks (acks=all): deciding the next batch only after
them left the brain idle a tenth of its time, and made each batch's events wait for the
previous batch's acks. So the brain puts a decided batch in an outbox of at most
`OUTBOX_BATCHES` and goes on deciding; one task publishes them in order, and a full
outbox holds the fetcher (backpressure). A batch is done once the broker acked every
record of it; only then may a checkpoint cover it (`published_all`).

It also remembers where its plans landed (`produced`: where a restarted brain looks for
plans published after its checkpoint) and which plans a crashed brain had published
already (`published`: not published again).

Beside `up`'s journaled broker it keeps what the broker acknowledged until the journal has
it (`unjournaled`), and publishes again, before any new batch and every `LOST_CHECK_S`
while idle, what a broker refilled from its journal lost of it: a lockstep tick's
acknowledgement lost so made its operator wait for good (issue 37). A batch waits while the
journal refills the broker: published then, it landed after the refill at the offset of a
lost acknowledgement the operator had read, the operator skipped it and waited for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from dlrover_events.backoff import Backoff
from dlrover_events.bus.dead_letters import log_dead_letters
from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import DLQ, SCALE_PLANS, topic, topic_of
from dlrover_events.lifecycle import (
    AsyncResource,
    Stopping,
    cancel_and_wait,
    wait_for_any,
    wait_or_stop,
)
from dlrover_events.runtime.metrics import BrainMetrics
from dlrover_events.runtime.unjournaled import Unjournaled
from dlrover_events.settings import Settings
from schemas.codec import encode
from schemas.plans import ScalePlan
from streams.brain.core.processor import Output
from streams.brain.core.snapshot import Offsets

log = logging.getLogger(__name__)

#: Decided batches whose plans wait to be published while the next batch is decided.
OUTBOX_BATCHES = 2
#: A publication that failed is tried again after this.
RETRY = Backoff(initial_s=0.1, max_s=30.0)
#: Seconds between two questions, while idle, whether the broker lost what was published.
LOST_CHECK_S = 1.0
#: Seconds between two questions, while a batch waits for the broker's refill to end.
REFILL_CHECK_S = 0.1

#: send(topic, key, value, partition) -> the broker's ack (topic, partition, offset)
Send = Callable[[str, bytes | None, bytes, int | None], Awaitable[Any]]


@dataclass(frozen=True)
class _Record:
    """One record the brain publishes; `output`: a plan or a lockstep acknowledgement, in
    `produced`: a checkpoint covers it (`up`'s broker journal must have copied it before
    the checkpoint is written) and a restart looks for plans published after it."""

    topic: str
    key: bytes | None
    value: bytes
    partition: int | None = None
    output: bool = False


class Courier(AsyncResource):
    """`publish` is what a batch goes through (the brain's, so that it may be replaced);
    `closing`: set when the brain stops, and a retry gives up."""

    def __init__(
        self,
        settings: Settings,
        env: str,
        send: Send,
        metrics: BrainMetrics,
        closing: asyncio.Event,
        publish: Callable[[Output], Awaitable[None]] | None = None,
    ) -> None:
        self.settings = settings
        self.env = env
        self._send = send
        self._metrics = metrics
        self._closing = closing
        self._publish = publish or self.publish
        self._dlq = topic(env, DLQ)
        #: (and when the oldest record they decided was fetched: the plans' latency)
        self._outbox: asyncio.Queue[tuple[Output, float]] = asyncio.Queue(maxsize=OUTBOX_BATCHES)
        self._task: asyncio.Task[None] | None = None
        #: next offset per output partition after the plans and lockstep acks this
        #: process published
        self.produced: Offsets = {}
        #: plan ids found on the outputs after the checkpoint we resumed from
        self.published: set[str] = set()
        self.republish_skipped = 0
        #: partitions of the topics published to every partition of (lockstep acks)
        self._partitions: dict[str, list[int]] = {}
        #: what the broker acknowledged and the journal of `up`'s broker has not copied
        #: (set by the brain where its env's database may hold that journal)
        self.unjournaled: Unjournaled | None = None
        #: held while publishing: what a refill lost goes out before anything new
        self._sending = asyncio.Lock()
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.unjournaled is not None:
            # whether the broker has a journal, asked now: without one, a batch is then
            # published with no question (asked again every few seconds) and no wait
            with contextlib.suppress(Exception):
                await self.unjournaled.lost()
        self._task = asyncio.create_task(self._loop(), name="brain-courier")
        self._watch = asyncio.create_task(self._watch_lost(), name="brain-courier-lost")

    async def stop(self) -> None:
        await cancel_and_wait(self._watch)
        await cancel_and_wait(self._task)

    async def put(self, out: Output, fetched_at: float) -> None:
        """Hand a decided batch over, waiting while the outbox is full."""
        await self.until_done(self._outbox.put((out, fetched_at)))

    async def published_all(self) -> None:
        """Wait until the outbox is empty: every batch decided so far published and
        acked. Only a caller that keeps batches from being added knows none was since."""
        await self.until_done(self._outbox.join())

    async def until_done(self, work: Awaitable[None]) -> None:
        """`work`, unless the courier stops first: then its error, not a wait for ever."""
        courier = self._task
        assert courier is not None, "the brain is not started"
        task = asyncio.ensure_future(work)
        try:
            await wait_for_any((), [task, courier])
            if courier.done():
                error = None if courier.cancelled() else courier.exception()
                if isinstance(error, Stopping):
                    raise Stopping(f"the brain of {self.env} stopped publishing") from error
                raise RuntimeError(f"the brain of {self.env} stopped publishing") from error
            await task
        finally:  # (done already, unless the courier stopped or we were cancelled)
            await cancel_and_wait(task)

    async def _loop(self) -> None:
        """Publish the decided batches in the order they were decided. A failure here is
        not retried (`deliver` retries sends): it stops the courier, and with it the
        brain (`until_done`), before a checkpoint can cover the batch."""
        while True:
            out, fetched_at = await self._outbox.get()
            try:
                async with self._sending:
                    await self._republish_lost(before=True)
                    await self._publish(out)
                self._count(out, fetched_at)
            finally:
                self._outbox.task_done()

    async def _watch_lost(self) -> None:
        """While no batch comes (a lockstep brain waits for a tick its operator will not
        send before it reads the acknowledgement that was lost), ask now and then."""
        while True:
            await asyncio.sleep(LOST_CHECK_S)
            if self.unjournaled is None or not len(self.unjournaled):
                continue
            async with self._sending:
                with contextlib.suppress(Exception):  # (said; asked again)
                    await self._republish_lost(before=False)

    async def _republish_lost(self, *, before: bool) -> None:
        """Publish again what the broker acknowledged and lost (refilled from `up`'s
        journal without its last records), at the offsets it had: plans and
        acknowledgements go into partitions only the brain writes. ``before``: a batch
        waits for it, so ask until it is answered (the next records would take the lost
        ones' offsets), and while the journal refills the broker (it cannot say yet
        what was lost), or the brain stops."""
        if self.unjournaled is None:
            return
        attempt = waits = 0
        while True:
            attempt += 1
            try:
                lost = await self.unjournaled.lost()
            except Exception as err:  # Postgres, or a broker that died again meanwhile
                log.warning(
                    "brain of %s: could not ask whether the broker lost records (attempt "
                    "%d): %s: %s",
                    self.env,
                    attempt,
                    type(err).__name__,
                    err,
                )
                if not before:
                    raise
                if await wait_or_stop(self._closing, RETRY.delay(attempt)):
                    raise Stopping(f"the brain of {self.env} is stopping") from err
                continue
            if self.unjournaled.answered or not before:
                break
            # the journal is refilling the broker (or its `up` restarts): a batch published
            # now could land after the refill at the offset of a lost record that readers
            # have read, and be skipped (issue 37: the operator waited for good for an ack)
            attempt = 0
            waits += 1
            if waits == 1:
                log.info(
                    "brain of %s: the broker is being refilled from its journal: publishing "
                    "once it is",
                    self.env,
                )
            if await wait_or_stop(self._closing, REFILL_CHECK_S):
                raise Stopping(f"the brain of {self.env} is stopping")
        if not lost:
            return
        await self.deliver([_Record(s.topic, s.key, s.value or b"", s.partition) for s in lost])
        log.warning(
            "brain of %s: the broker lost %d record(s) it had acknowledged (refilled from its "
            "journal without them): published again",
            self.env,
            len(lost),
        )

    def _count(self, out: Output, fetched_at: float) -> None:
        """A published batch in the metrics; `fetched_at`: when the oldest record it
        decided was fetched (a plan's latency runs from there to the broker's ack)."""
        metrics = self._metrics
        latency = time.monotonic() - fetched_at
        now_ms = time.time() * 1000
        scale = optimize = 0
        plan_latency = metrics.plan_latency.observe
        publication_latency = metrics.plan_publication_latency.observe
        for plan, cause in zip(out.plans, out.causes, strict=True):
            if plan.plan_id in self.published:
                continue
            if isinstance(plan, ScalePlan):
                scale += 1
            else:
                optimize += 1
            plan_latency(latency)
            # the cause's record timestamp: its producer's clock (CreateTime), or the
            # broker's (LogAppendTime); -1 or none where the record has none
            published_ms = getattr(cause, "timestamp", None)
            if isinstance(published_ms, int) and published_ms >= 0:
                publication_latency(max(0.0, now_ms - published_ms) / 1000)
        # counted once per batch and kind: a label lookup per plan cost as much as the count
        if scale:
            metrics.plans.labels(self.env, "scale").inc(scale)
        if optimize:
            metrics.plans.labels(self.env, "optimize").inc(optimize)
        for letter in out.letters:
            metrics.dead_letters.labels(self.env, letter.error_kind.value).inc()

    async def publish(self, out: Output) -> None:
        """Plans and dead letters, acked by the broker before the batch counts as done;
        then, in lockstep, the acks of the ticks decided."""
        if not (out.plans or out.letters or out.acks):
            return
        todo: list[_Record] = []
        for plan in out.plans:
            if plan.plan_id in self.published:
                self.republish_skipped += 1
                continue
            key = plan.key.encode() if plan.key is not None else None
            todo.append(_Record(topic_of(plan), key, encode(plan), output=True))
        for letter in out.letters:
            key = letter.key.encode() if letter.key is not None else None
            todo.append(_Record(self._dlq, key, encode(letter)))
        await self.deliver(todo)
        if out.acks:
            # after the tick's plans, on every partition: whoever reads any of them has
            # read that partition's plans of the tick when it meets the ack
            # in `produced` too: a checkpoint past a tick's barrier (the next start does not
            # decide that tick again) must not be written before the journal has the tick's
            # ack, or a crash of `up` loses the ack for good and the operator waits for it
            # (issue 37's chaos test: the brain past barrier 36 on every input, no ack 36)
            plans = topic(self.env, SCALE_PLANS)
            parts = await self._partitions_of(plans)
            await self.deliver(
                [
                    _Record(plans, None, encode(ack), p, output=True)
                    for ack in out.acks
                    for p in parts
                ]
            )
        log_dead_letters(out.letters)

    async def deliver(self, todo: list[_Record]) -> None:
        """The batch is not done (and no checkpoint can cover it) until the broker has
        every record: retry what failed, saying why, until it is done or the brain stops
        (then the batch is left to the next start)."""
        # (nothing to note where the broker was found to have no journal: no call per record)
        unjournaled = self.unjournaled
        note = unjournaled.note if unjournaled is not None and unjournaled.keeps else None
        attempt = 0
        while todo:
            attempt += 1
            results = await asyncio.gather(
                *(self._send(r.topic, r.key, r.value, r.partition) for r in todo),
                return_exceptions=True,
            )
            failed = []
            why: BaseException | None = None
            for record, result in zip(todo, results, strict=True):
                if isinstance(result, BaseException):
                    if isinstance(result, asyncio.CancelledError):
                        raise result
                    failed.append(record)
                    why = result
                else:
                    if note is not None:
                        note(
                            result.topic, result.partition, result.offset, record.key, record.value
                        )
                    if record.output:
                        tp = (result.topic, result.partition)
                        self.produced[tp] = max(self.produced.get(tp, 0), result.offset + 1)
            if failed:
                delay = RETRY.delay(attempt)
                log.warning(
                    "brain of %s: publishing %d records failed (attempt %d; retrying in "
                    "%.1f s): %s: %s",
                    self.env,
                    len(failed),
                    attempt,
                    delay,
                    type(why).__name__,
                    why,
                )
                if await wait_or_stop(self._closing, delay):
                    raise Stopping(f"the brain of {self.env} is stopping")
            todo = failed

    async def _partitions_of(self, name: str) -> list[int]:
        if name not in self._partitions:
            async with Producer(self.settings) as producer:  # once: topics keep their count
                self._partitions[name] = await producer.partitions(name)
        return self._partitions[name]
