"""The sender: the buffer's events to the broker with aiokafka, and outages told in two lines.

Runs as a task of the reporter's own loop, apart from the sampling task, so a send that
waits out a dead broker never delays a sample. A batch that is not acknowledged within
``send_timeout_s`` goes back to the front of the buffer and the client is replaced (the old
one may still hold batches it would retry on its own); the next try waits an exponential,
jittered back-off that a flush or close cuts short. Delivery is at least once.

The first failure of an outage is one line ("broker ... unreachable since ..., N events
buffered"), the first success after it another ("reconnected ... after N s"); in between
the sender says nothing, and aiokafka's own lines from this thread are held back
(``quiet``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from datetime import datetime
from typing import Any

from aiokafka import AIOKafkaProducer

from dlrover_events.backoff import Backoff
from dlrover_events.bus.kafka_client import kafka_connection, start_kafka_client
from dlrover_events.bus.topics import topic_of
from dlrover_events.errors import BusUnavailable, UserError
from dlrover_events.sdk import quiet
from dlrover_events.sdk.buffer import DropBuffer
from dlrover_events.settings import Settings
from schemas.codec import encode
from schemas.envelope import Event

log = logging.getLogger("dlrover_events.sdk.reporter")


class Sender:
    """Owned by the reporter's thread; counters are read from any thread."""

    def __init__(
        self,
        settings: Settings,
        buffer: DropBuffer,
        *,
        max_batch: int,
        send_timeout_s: float,
        backoff_max_s: float,
        quiet_kafka: bool,
        settings_error: UserError | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self._settings = settings
        self._buffer = buffer
        self._max_batch = max_batch
        self._send_timeout_s = send_timeout_s
        self.backoff = Backoff(initial_s=min(0.5, backoff_max_s), max_s=backoff_max_s, jitter=True)
        self._quiet_kafka = quiet_kafka
        #: settings that cannot connect (said once, as an outage): nothing is sent
        self._settings_error = settings_error
        self._producer: AIOKafkaProducer | None = None
        self._failures = 0
        #: loop time before which no send is tried (a back-off).
        self.retry_at = 0.0
        self._down_since: float | None = None
        #: aiokafka lines held back before the last successful send (``quiet``).
        self._held_before = 0
        #: events of the batch being sent.
        self.in_flight = 0
        #: acknowledged by the broker.
        self.published = 0
        self.last_error: str | None = None

    @property
    def connected(self) -> bool:
        return self._producer is not None and self._down_since is None

    def retry_now(self) -> None:
        """A flush or close is worth an attempt now, even in the middle of a back-off."""
        self.retry_at = 0.0

    async def run(self, wake: asyncio.Event, flushes: deque[threading.Event]) -> None:
        """Publish the buffer whenever woken; answer the flushes once it is empty."""
        loop = asyncio.get_running_loop()
        while True:
            if not self._buffer:
                while flushes:
                    flushes.popleft().set()
                await wake.wait()
                wake.clear()
                continue
            delay = self.retry_at - loop.time()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await wake.wait()
                wake.clear()
                continue
            await self.send_pending()

    async def send_pending(self) -> None:
        producer = await self._connect()
        while producer is not None and self._buffer:
            batch = self._buffer.take(self._max_batch)
            if not await self._send_batch(producer, batch):
                return

    async def disconnect(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await _stop_quietly(producer)

    async def _connect(self) -> AIOKafkaProducer | None:
        if self._producer is not None:
            return self._producer
        if self._settings_error is not None:
            self._failed(self._settings_error)
            return None
        try:
            # files (a CA, a password) are read at each connection: a Secret mounted or
            # rotated later is picked up by the next try
            producer = AIOKafkaProducer(
                **kafka_connection(self._settings),
                client_id=f"{self._settings.client_id}-sdk",
                enable_idempotence=False,
                linger_ms=5,
                request_timeout_ms=max(int(self._send_timeout_s * 1000), 1000),
                acks=1,
            )
        except UserError as err:
            self._failed(err)
            return None
        try:
            # a refusal (TLS, SASL) is named by start_kafka_client, which also stops the
            # client that failed
            async with asyncio.timeout(self._send_timeout_s):
                await start_kafka_client(producer, self._settings)
        except asyncio.CancelledError:
            await _stop_quietly(producer)
            raise
        except Exception as err:
            await _stop_quietly(producer)
            self._failed(err)
            return None
        self._producer = producer
        return producer

    async def _send_batch(self, producer: AIOKafkaProducer, batch: list[Event]) -> bool:
        sent: list[tuple[Event, asyncio.Future[Any]]] = []
        error: BaseException | None = None
        self.in_flight = len(batch)
        try:
            async with asyncio.timeout(self._send_timeout_s):
                for event in batch:
                    key = event.key.encode() if event.key is not None else None
                    fut = await producer.send(topic_of(event), encode(event), key=key)
                    sent.append((event, fut))
                await asyncio.wait([f for _, f in sent])
        except Exception as err:
            error = err
        finally:
            # Also when cancelled at close: what was not acknowledged goes back to the
            # buffer, to be counted as dropped there.
            retry = self._settle(batch, sent)
            self.in_flight = 0
        if not retry:
            self._recovered()
            return True
        failed = [f.exception() for _, f in sent if f.done() and not f.cancelled()]
        self._failed(error or next((e for e in failed if e), TimeoutError("no acknowledgement")))
        # Start over with a fresh client: the old one may still hold batches it will retry.
        await self.disconnect()
        return False

    def _settle(
        self, batch: list[Event], sent: list[tuple[Event, asyncio.Future[Any]]]
    ) -> list[Event]:
        retry: list[Event] = []
        for event, fut in sent:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.published += 1
                continue
            retry.append(event)
            if not fut.done():
                fut.add_done_callback(_retrieve)
        retry.extend(batch[len(sent) :])
        self._buffer.requeue(retry)
        return retry

    def _failed(self, err: BaseException) -> None:
        now = asyncio.get_running_loop().time()
        # an outage is told by what the client met, without the advice for a laptop's stack
        text = err.reason if isinstance(err, BusUnavailable) else str(err)
        if not text and isinstance(err, TimeoutError):
            text = f"no answer within {self._send_timeout_s:g} s"
        name = type(err).__name__
        plain = isinstance(err, BusUnavailable) or text.startswith(name)
        self.last_error = text if plain else f"{name}: {text}"
        self._failures += 1
        self.retry_at = now + self.backoff.delay(self._failures)
        if self._down_since is None:
            self._down_since = now
            self._buffer.outage_started()
            if isinstance(err, UserError) and not isinstance(err, BusUnavailable):
                # refused (TLS, SASL) or misconfigured: the reason is the whole line
                log.warning(
                    "dlrover-events: cannot publish to Kafka: %s; %d events buffered, "
                    "training goes on (buffer holds %d, the oldest samples go first)",
                    err,
                    len(self._buffer),
                    self._buffer.capacity,
                )
                return
            log.warning(
                "dlrover-events: broker %s unreachable since %s (%s); %d events buffered, "
                "training goes on (buffer holds %d, the oldest samples go first)%s",
                self._settings.bootstrap_servers,
                datetime.now().astimezone().isoformat(timespec="seconds"),
                self.last_error,
                len(self._buffer),
                self._buffer.capacity,
                "; aiokafka's own lines held back" if self._quiet_kafka else "",
            )

    def _recovered(self) -> None:
        self._failures = 0
        held = quiet.KAFKA_FILTER.held(threading.get_ident())
        held, self._held_before = held - self._held_before, held
        if self._down_since is not None:
            log.warning(
                "dlrover-events: reconnected to %s after %.1f s; %d events dropped meanwhile%s",
                self._settings.bootstrap_servers,
                asyncio.get_running_loop().time() - self._down_since,
                self._buffer.dropped_in_outage,
                f", {held} aiokafka log lines held back" if self._quiet_kafka else "",
            )
            self._down_since = None


async def _stop_quietly(producer: AIOKafkaProducer) -> None:
    # With the broker gone, stop() would wait for its batches to expire: give it a second.
    with contextlib.suppress(Exception):
        async with asyncio.timeout(1.0):
            await producer.stop()


def _retrieve(fut: asyncio.Future[Any]) -> None:
    # An abandoned delivery may still fail later; its error was already counted.
    if not fut.cancelled():
        fut.exception()
