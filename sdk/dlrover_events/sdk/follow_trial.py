"""Follow an experiment's decisions on ``<env>.trial.decisions``, for a trial's process.

A trial learns its later budgets from the searcher's decisions. A resumed trial starts in
a new process after its ``resume`` decision was published, so the follower reads the
topic from the beginning (the bus's own TopicReader, without a group: a trial moves no
one's offsets), keeps the experiment's records (the topic is keyed by experiment) and
hands each decision to ``on_decision``; the trial folds them, dropping repeats by
``seq``. After a broker outage it goes on from the offsets it reached.

It runs in a daemon thread with its own asyncio loop, as the reporter does, and never
raises into training: with the broker away it retries with the SDK's back-off and says so
once (and again when it reads again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable

from aiokafka import TopicPartition

from dlrover_events.backoff import Backoff
from dlrover_events.bus.topic_reader import TopicReader
from dlrover_events.bus.topics import TRIAL_DECISIONS, topic
from dlrover_events.errors import UserError
from dlrover_events.lifecycle import wait_or_stop
from dlrover_events.settings import Settings
from schemas.codec import CodecError, decode
from schemas.experiments import TrialDecision

log = logging.getLogger("dlrover_events.sdk.trial")

#: Retries of a reader that failed (the broker away, say).
RETRY = Backoff(initial_s=0.5, max_s=10.0, jitter=True)
#: How often a topic that does not exist yet is looked for again.
MISSING_TOPIC_POLL_S = 0.5


class DecisionFollower:
    """Reads ``experiment``'s records of ``<env>.trial.decisions`` until ``close``."""

    def __init__(
        self,
        settings: Settings,
        env: str,
        experiment: str,
        on_decision: Callable[[TrialDecision], None],
        *,
        settings_error: UserError | None = None,
    ) -> None:
        self.topic = topic(env, TRIAL_DECISIONS)
        self.experiment = experiment
        self._key = experiment.encode()
        self._settings = settings
        self._on_decision = on_decision
        self._settings_error = settings_error
        #: set once the topic was read to its end (or found not to exist yet)
        self.caught_up = threading.Event()
        #: decisions handed on; records skipped because they were no decision
        self.decisions = 0
        self.skipped = 0
        self.last_error: str | None = None
        #: where each partition goes on after a reconnection
        self._next: dict[TopicPartition, int] = {}
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._closing = threading.Event()
        self._ready = threading.Event()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._run, name=f"dlrover-events-trial-{self.experiment}", daemon=True
        )
        self._thread.start()
        self._ready.wait(5.0)

    def close(self, timeout_s: float = 5.0) -> None:
        self._closing.set()
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has already closed
                loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception:
            log.exception("the trial's decision follower stopped; the budget stays as it is")
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = stop = asyncio.Event()
        if self._closing.is_set():
            stop.set()
        self._ready.set()
        if self._settings_error is not None:
            self.last_error = str(self._settings_error)
            log.warning(
                "dlrover-events: cannot read %s: %s; the trial keeps the budget it has",
                self.topic,
                self._settings_error,
            )
            return
        failures = 0
        while not stop.is_set():
            try:
                await self._follow(stop)
            except Exception as err:
                failures += 1
                if self.last_error is None:
                    log.warning(
                        "dlrover-events: cannot read %s (%s); retrying, the trial keeps the "
                        "budget it has",
                        self.topic,
                        err,
                    )
                self.last_error = str(err) or type(err).__name__
                await wait_or_stop(stop, RETRY.delay(failures))
            else:
                failures = 0

    async def _follow(self, stop: asyncio.Event) -> None:
        reader = TopicReader(
            self._settings,
            [self.topic],
            client_id="trial",
            begin=dict(self._next),
            require=False,
        )
        async with reader:
            while not reader.partitions:
                self.caught_up.set()  # no decision yet: the variables' budget stands
                if await wait_or_stop(stop, MISSING_TOPIC_POLL_S):
                    return
                if await reader.refresh():
                    await reader.seek(dict(self._next))
            if self.last_error is not None:
                log.warning("dlrover-events: reading %s again", self.topic)
                self.last_error = None
            while not stop.is_set():
                records = await reader.fetch(timeout_ms=300)
                for r in records:
                    self._next[TopicPartition(r.topic, r.partition)] = r.offset + 1
                    if r.key == self._key:
                        self._take(r.value)
                if not records and not self.caught_up.is_set() and await reader.caught_up():
                    self.caught_up.set()

    def _take(self, value: bytes | None) -> None:
        try:
            event = decode(value)
        except CodecError as err:
            self.skipped += 1
            log.debug("skipping a record of %s: %s", self.topic, err)
            return
        if not isinstance(event, TrialDecision) or event.experiment != self.experiment:
            self.skipped += 1
            return
        self.decisions += 1
        try:
            self._on_decision(event)
        except Exception:
            log.exception("a trial decision's handler failed; following goes on")


__all__ = ["DecisionFollower"]
