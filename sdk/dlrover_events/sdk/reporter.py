"""The training-side reporter: runtime samples to ``<env>.job.metrics``, never at training's cost.

A training step must not wait for Kafka, and a broker outage must not kill a job that has
run for days. So the step only appends a tuple to a deque; a daemon thread with its own
asyncio loop does the rest, split by role as aiokafka splits its producer:

- ``sampling.SampleCutter`` turns the step records of an interval into one ``RuntimeSample``;
- ``buffer.DropBuffer`` holds what is not published yet, bounded, dropping the oldest
  sample first and counting every drop;
- ``sender.Sender`` publishes it with aiokafka, backs off, and tells an outage in two lines
  (aiokafka's own lines from this thread are held back meanwhile, see ``quiet``);
- ``Reporter``, here, is the facade: the training thread's calls, the thread, flush and
  close, and following the real env through ``env promote`` (see ``follow``): each event
  goes to the env it was made for, so an event made before a switch is sent (and, at least
  once, resent) to the old env only, never to both.

Delivery is at least once: a batch whose acknowledgement times out is sent again, so a
consumer may see an event twice with the same ``event_id`` (the brain's folds dedupe).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from time import perf_counter
from types import TracebackType
from typing import Any, Self, TypeVar

from dlrover_events.config.client import TOKEN_ENV, URL_ENV, ConfigSnapshot, SyncConfigClient
from dlrover_events.envs.control import EnvWatcher, real_env
from dlrover_events.errors import UserError
from dlrover_events.lifecycle import cancel_and_wait
from dlrover_events.sdk import quiet
from dlrover_events.sdk.buffer import DROP_LOG_EVERY_S, DropBuffer
from dlrover_events.sdk.follow_real import Following, FollowReal, follow_real_from_env
from dlrover_events.sdk.identity import JobIdentity
from dlrover_events.sdk.probes import HostProbe, Probe
from dlrover_events.sdk.sampling import SampleCutter
from dlrover_events.sdk.sender import Sender
from dlrover_events.sdk.window import StepRecord
from dlrover_events.settings import Settings, load_settings
from schemas.envelope import Event
from schemas.jobs import RuntimeSample

log = logging.getLogger(__name__)

#: Seconds between runtime samples (one per process); the operator may tune it per job.
INTERVAL_ENV = "DLROVER_EVENTS_REPORT_INTERVAL_S"
DEFAULT_INTERVAL_S = 5.0
DEFAULT_BUFFER = 10_000
__all__ = ["DEFAULT_BUFFER", "DROP_LOG_EVERY_S", "INTERVAL_ENV", "Reporter", "ReporterStats"]

T = TypeVar("T")


@dataclass(frozen=True)
class ReporterStats:
    """What the reporter did; ``queued == published + dropped + pending`` once it is idle."""

    steps: int
    #: runtime samples made from the steps.
    samples: int
    #: events handed to the bus: the samples plus those given to ``publish``.
    queued: int
    #: acknowledged by the broker.
    published: int
    #: never reached the broker: pushed out of the full buffer, or still unsent at close.
    dropped: int
    pending: int
    #: step records overwritten before the thread read them: costs precision, not samples.
    step_records_lost: int
    connected: bool
    last_error: str | None
    #: the env the reporter publishes new events to now (it changes when it follows the
    #: real env through a promotion).
    env: str = ""


class Reporter:
    """Reports one training process (one rank of one role of one job) to the bus.

    Call ``step()`` once per optimizer step, or iterate ``track(loader)``; ``start()``
    before, ``close()`` after (or use ``with``). ``step`` may only be called from one
    thread; ``publish`` and ``flush`` from any.
    """

    def __init__(
        self,
        identity: JobIdentity,
        *,
        settings: Settings | None = None,
        interval_s: float | None = None,
        buffer_size: int = DEFAULT_BUFFER,
        max_batch: int = 500,
        batch_size: int | None = None,
        local_batch_size: int | None = None,
        accumulation_steps: int = 1,
        probes: Sequence[Probe] | None = None,
        step_buffer: int = 16_384,
        send_timeout_s: float = 5.0,
        retry_backoff_max_s: float = 30.0,
        gateway_url: str | None = None,
        gateway_token: str | None = None,
        config_timeout_s: float = 5.0,
        follow_real: FollowReal | None = None,
        quiet_kafka: bool | None = None,
    ) -> None:
        if buffer_size < 1 or max_batch < 1 or step_buffer < 2:
            raise ValueError("buffer_size and max_batch must be >= 1, step_buffer >= 2")
        self.identity = identity
        settings_error: UserError | None = None
        if settings is None:
            settings, settings_error = _settings_from_env()
        self._settings = settings
        self.interval_s = interval_s if interval_s is not None else _interval_from_env()
        if self.interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {self.interval_s}")
        self.batch_size = batch_size
        #: (local_batch_size, accumulation_steps): one tuple, so the reporter thread never
        #: reads one knob of a switch without the other.
        self._batch: tuple[int | None, int] = (local_batch_size, accumulation_steps)
        probe_list: list[Probe] = list(probes) if probes is not None else [HostProbe()]
        self._gateway_url = gateway_url or os.environ.get(URL_ENV)
        self._gateway_token = gateway_token or os.environ.get(TOKEN_ENV)
        self._config_timeout_s = config_timeout_s
        policy = follow_real if follow_real is not None else follow_real_from_env()
        #: which env new events go to; written by the reporter thread only.
        self._following = Following.start(identity.env, FollowReal(policy))
        self._quiet_kafka = quiet_kafka if quiet_kafka is not None else quiet.kafka_logs_quiet()
        #: the job's config from the gateway (None when no gateway is configured).
        self.config: ConfigSnapshot | None = None

        # Training thread -> reporter thread. Appends and poplefts are atomic in CPython.
        self._steps: deque[StepRecord] = deque(maxlen=step_buffer)
        self._append = self._steps.append
        #: gradient estimates and step splits, rarer than steps: the newest 1,024 of each
        #: while the thread is away.
        self._grads: deque[tuple[float, float]] = deque(maxlen=1024)
        self._splits: deque[tuple[float, float]] = deque(maxlen=1024)
        self._seq = 0
        self._outbox: deque[Event] = deque()
        self._flush_waiters: deque[threading.Event] = deque()
        #: flushes whose events are in the buffer: answered once it is empty.
        self._flushes: deque[threading.Event] = deque()
        self._closing = threading.Event()
        self._publish_lock = threading.Lock()
        #: events ``publish`` turned away (outbox full, or closed): dropped, counted apart
        #: because only the reporter thread may write the buffer's counters.
        self._refused = 0
        self._close_timeout_s = 0.0

        # Owned by the reporter thread; their counters are read by anyone.
        self._cutter = SampleCutter(self._steps, probe_list, self._grads, self._splits)
        self._buffer = DropBuffer(buffer_size, identity.job.uuid, lambda: self._sender.last_error)
        self._sender = Sender(
            self._settings,
            self._buffer,
            max_batch=max_batch,
            send_timeout_s=send_timeout_s,
            backoff_max_s=retry_backoff_max_s,
            quiet_kafka=self._quiet_kafka,
            settings_error=settings_error,
        )
        self._settings_error = settings_error

        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._send_wake: asyncio.Event | None = None
        self._ready = threading.Event()
        self._closed = False
        self._final: ReporterStats | None = None

    @classmethod
    def from_env(cls, **kwargs: Any) -> Reporter:
        """The reporter for this pod, as the operator described it in the environment."""
        return cls(JobIdentity.from_env(), **kwargs)

    # -- the training thread's side ------------------------------------------------------

    def step(self, global_step: int | None = None, samples: int | None = None) -> None:
        """Mark the end of one step: a counter and an append, nothing that can block."""
        self._seq = seq = self._seq + 1
        self._append((seq, perf_counter(), global_step, samples))

    def track(self, iterable: Iterable[T], samples: int | None = None) -> Iterator[T]:
        """Wrap a loop: each item is a step, marked when the loop body has run."""
        for item in iterable:
            yield item
            self.step(samples=samples)

    def observe_gradients(self, grad_sqr: float, grad_var: float) -> None:
        """One step's unbiased estimates of |E[g]|^2 and of one sample's tr(Cov[g]) (either
        may be negative); the next sample carries the mean of those since the last one.
        ``dlrover_events.sdk.torch.GradientStats`` computes them from torch gradients."""
        self._grads.append((grad_sqr, grad_var))

    def observe_split(self, compute_s: float, allreduce_s: float) -> None:
        """Seconds one step spent computing and synchronising gradients (the caller's
        measure, or ``dlrover_events.sdk.torch.StepTimer``'s); samples carry the mean."""
        self._splits.append((compute_s, allreduce_s))

    def publish(self, event: Event) -> None:
        """Queue any event (an OOM, a lifecycle mark) for the reporter thread to send."""
        with self._publish_lock:
            if len(self._outbox) >= self._buffer.capacity or self._closed:
                self._refused += 1
                return
            self._outbox.append(event)
        self._kick()

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Cut a sample of the steps so far and wait until all is published or ``timeout_s``.

        True when everything queued got to the broker. Never raises: a training process
        flushing before it dies must die of its own error, not of ours.
        """
        if self._thread is None or not self._thread.is_alive():
            return False
        dropped = self.dropped
        done = threading.Event()
        self._flush_waiters.append(done)
        self._kick()
        return done.wait(timeout_s) and self.dropped == dropped

    @property
    def local_batch_size(self) -> int | None:
        return self._batch[0]

    @local_batch_size.setter
    def local_batch_size(self, value: int | None) -> None:
        self._batch = (value, self._batch[1])

    @property
    def accumulation_steps(self) -> int:
        return self._batch[1]

    @accumulation_steps.setter
    def accumulation_steps(self, value: int) -> None:
        self._batch = (self._batch[0], value)

    def set_training(self, local_batch_size: int | None, accumulation_steps: int) -> None:
        """Switch both knobs at once (a step boundary): the next samples report them."""
        self._batch = (local_batch_size, accumulation_steps)

    def set_world(self, world_size: int, process_rank: int) -> None:
        """This process is now ``process_rank`` of ``world_size`` (an in-place re-form,
        where the process outlives its world): the next samples say so."""
        self.identity = replace(self.identity, world_size=world_size, process_rank=process_rank)

    def add_probe(self, probe: Probe) -> None:
        """Measure more per sample (the torch hook adds GPU memory); read in our thread."""
        self._cutter.probes.append(probe)

    @property
    def dropped(self) -> int:
        """Events that never reached the broker, so far."""
        return self._buffer.dropped + self._refused

    def stats(self) -> ReporterStats:
        if self._final is not None:
            return self._final
        return self._snapshot()

    def _snapshot(self) -> ReporterStats:
        sender = self._sender
        return ReporterStats(
            steps=self._seq,
            samples=self._cutter.made,
            queued=self._buffer.queued + len(self._outbox) + self._refused,
            published=sender.published,
            dropped=self.dropped,
            pending=len(self._buffer) + len(self._outbox) + sender.in_flight,
            step_records_lost=self._cutter.window.lost,
            connected=sender.connected,
            last_error=sender.last_error,
            env=self.identity.env,
        )

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> Self:
        """Fetch the job's config (if a gateway is configured) and start the thread."""
        if self._thread is not None or self._closed:
            return self
        if self._gateway_url:
            self.config = self._fetch_config(self._gateway_url)
        self._thread = threading.Thread(
            target=self._run, name=f"dlrover-events-reporter-{self.identity.rank}", daemon=True
        )
        self._thread.start()
        self._ready.wait(5.0)
        atexit.register(self._at_exit)
        return self

    def close(self, timeout_s: float = 5.0) -> ReporterStats:
        """Send what is left for up to ``timeout_s``, drop (and count) the rest, stop."""
        if self._closed:
            return self.stats()
        self._closed = True
        atexit.unregister(self._at_exit)
        thread = self._thread
        if thread is not None:
            self._close_timeout_s = timeout_s
            self._closing.set()
            self._kick()
            thread.join(timeout_s + 2.0)
            if thread.is_alive():
                log.warning("dlrover-events reporter thread did not stop within %.1fs", timeout_s)
        else:
            # Never started: the queued events can never be sent.
            with self._publish_lock:
                self._refused += len(self._outbox)
                self._outbox.clear()
        self._final = stats = self._snapshot()
        level = logging.WARNING if stats.dropped else logging.INFO
        log.log(
            level,
            "dlrover-events reporter closed (job %s, %s %d): %d steps, %d samples, "
            "%d events published, %d dropped",
            self.identity.job.uuid,
            self.identity.role,
            self.identity.rank,
            stats.steps,
            stats.samples,
            stats.published,
            stats.dropped,
        )
        return stats

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _at_exit(self) -> None:
        # A script that forgot close() still gets its last samples out, and its summary.
        self.close(timeout_s=2.0)

    def _kick(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop has already closed
                loop.call_soon_threadsafe(wake.set)

    def _fetch_config(self, url: str) -> ConfigSnapshot:
        client = SyncConfigClient(
            url, self._gateway_token, self.identity.attributes(), timeout_s=self._config_timeout_s
        )
        snap = client.fetch()
        if snap.stale:
            log.warning("training with the default config: %s", snap.error)
        return snap

    # -- the reporter thread -------------------------------------------------------------

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception:
            log.exception("dlrover-events reporter stopped; training goes on without it")
        finally:
            self._ready.set()
            for waiters in (self._flush_waiters, self._flushes):
                while waiters:
                    waiters.popleft().set()

    async def _main(self) -> None:
        loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._send_wake = asyncio.Event()
        self._loop = loop
        if self._quiet_kafka:
            quiet.install()
            quiet.KAFKA_FILTER.register(threading.get_ident())
        self._ready.set()
        # Two tasks, so a send that waits out a dead broker never delays the samples.
        sender = asyncio.create_task(self._sender.run(self._send_wake, self._flushes))
        follower = (
            None
            if self._following.settled or self._settings_error is not None
            else asyncio.create_task(self._follow())
        )
        try:
            await self._sampler(loop)
            close_by = loop.time() + self._close_timeout_s
            self._sender.retry_now()  # one last try, even in the middle of a back-off
            self._send_wake.set()
            while (self._buffer or self._sender.in_flight) and not sender.done():
                if loop.time() >= close_by:
                    break
                await asyncio.sleep(0.01)
        finally:
            await cancel_and_wait(sender, follower)
            if self._buffer:
                last = self._sender.last_error
                self._sender.last_error = last or "no acknowledgement before close"
                self._buffer.discard("still unsent at close")
            await self._sender.disconnect()
            self._loop = None
            quiet.KAFKA_FILTER.unregister(threading.get_ident())

    async def _sampler(self, loop: asyncio.AbstractEventLoop) -> None:
        """Turn step records into one sample per interval; returns when closing."""
        assert self._send_wake is not None
        next_cut = loop.time() + self.interval_s
        while True:
            closing = self._closing.is_set()
            waiters = [self._flush_waiters.popleft() for _ in range(len(self._flush_waiters))]
            self._drain_steps()
            if loop.time() >= next_cut or waiters or closing:
                if sample := self._cut_sample():
                    self._buffer.add(sample)
                next_cut = loop.time() + self.interval_s
            while self._outbox:
                self._buffer.add(self._outbox.popleft())
            if waiters:
                self._flushes.extend(waiters)
                self._sender.retry_now()  # a flush is worth an attempt now
            if self._buffer or self._flushes:
                self._send_wake.set()
            if closing:
                return
            # At least every second, to empty the step deque before it overwrites records.
            await self._sleep(min(next_cut - loop.time(), 1.0))

    async def _follow(self) -> None:
        """Follow dlrover.control until the env is pinned for good (or for ever).

        A broker that cannot be reached is retried with the sender's back-off; the outage
        itself is told by the sender, so this says nothing about it.
        """
        settled = asyncio.Event()
        watcher = EnvWatcher(
            self._settings, on_change=lambda envs: self._real_is(real_env(envs), settled)
        )
        failures = 0
        while not settled.is_set():
            try:
                await watcher.run(settled)
            except Exception as err:
                failures += 1
                log.debug("dlrover-events: cannot read the env registry's topic: %s", err)
                await asyncio.sleep(self._sender.backoff.delay(failures))

    def _real_is(self, real: str | None, settled: asyncio.Event) -> None:
        before = self._following
        after = self._following = before.seen(real)
        if after.settled:
            settled.set()
        if before.following is None and after.following is not None:
            log.info(
                "dlrover-events: job %s reports to env %s, %s",
                self.identity.job.uuid,
                after.env,
                "and follows the real env" if after.following else "pinned (not the real env)",
            )
        if after.env != before.env:
            # Events already made keep the env they were made for: none goes to both.
            self.identity = replace(self.identity, env=after.env)
            log.warning(
                "dlrover-events: env %s is now the real env (was %s); job %s reports to it "
                "from now on",
                after.env,
                before.env,
                self.identity.job.uuid,
            )

    async def _sleep(self, seconds: float) -> None:
        assert self._wake is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(seconds, 0.0)):
                await self._wake.wait()
        self._wake.clear()

    def _drain_steps(self) -> None:
        self._cutter.drain()

    def _cut_sample(self) -> RuntimeSample | None:
        return self._cutter.cut(self.identity, self.batch_size, self._batch)


def _settings_from_env() -> tuple[Settings, UserError | None]:
    """The pod's settings; invalid ones (say, SASL without a password) are not raised
    into training: the reporter says why once, as an outage, and sends nothing."""
    try:
        return load_settings(), None
    except UserError as err:
        return Settings.model_construct(), err


def _interval_from_env() -> float:
    raw = os.environ.get(INTERVAL_ENV, "").strip()
    if not raw:
        return DEFAULT_INTERVAL_S
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{INTERVAL_ENV} must be a number of seconds, got {raw!r}") from None
