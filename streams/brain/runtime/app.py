"""`dlrover-events brain --env E`: the brain as a faust-streaming app.

faust runs the group membership, rebalances and the producer; the records go from faust's
fetcher straight to the brain in the batches the broker returned (the faust-specific code
is in `streams.brain.runtime.faust_glue`, alone). The brain merges its input partitions into one
order that depends on the records, not on the batches (`streams.brain.core.merge`), and the
BrainProcessor decides them in that order. faust's own path from fetcher to agent (a
Message, an Event, two tasks per record for its flow control, a queue and an ack each)
cost more per record than deciding it, and capped the brain below the speed it must keep
up with (`bench brain` shows both). The processor decides a batch and hands its plans and
dead letters to a courier task, which publishes them, batch after batch in order, while
the next batch is decided; at most `OUTBOX_BATCHES` decided batches wait for it, so
backpressure reaches the fetcher.

A checkpoint task waits until the courier has published every batch decided so far,
writes the changed job states and the offsets they include to Postgres every few
seconds, and only then commits those offsets to the group. So the committed
offset never gets ahead of a durable checkpoint, and a restart reads again, at worst, what
the last checkpoint covers, which the processor skips by offset. The events after the
checkpoint are decided again and give the same plan ids (derived from their cause), so a
crash loses no plan and makes no new ones; a plan that was published before the crash may
be published again with the same id, which the operator applies at most once.

An env with a cluster scheduler is decided by one brain instance at a time, so that the
scheduler sees every job of the env: `run` (the service and the command) first takes the
env's leader lock (`streams.brain.runtime.leader`), standing by while another instance holds it,
and halts its brain at once if the lock is lost. Other envs spread their partitions over
the instances, as the consumer group assigns them.

Faust's worker normally owns the event loop; `Brain` starts the App as the mode.Service
it is (`await app.start()`), so `up` runs it beside the other services in one loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import typer
from faust.types import TP

from dlrover_events.backoff import Backoff
from dlrover_events.bus.kafka_client import kafka_connection
from dlrover_events.bus.topics import (
    BRAIN_PLANS,
    JOB_EVENTS,
    JOB_METRICS,
    SCALE_PLANS,
    SCALE_RESULTS,
    topic,
)
from dlrover_events.cli.params import env_name
from dlrover_events.cli.runner import run_async
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.errors import BusUnavailable, UserError
from dlrover_events.lifecycle import (
    AsyncResource,
    Stopping,
    background,
    cancel_and_wait,
    unless,
    wait_for_any,
    wait_or_stop,
)
from dlrover_events.runtime.metrics import BrainMetrics, CollectorRegistry
from dlrover_events.runtime.services import Service, ServiceContext
from dlrover_events.runtime.standalone import serve_alone
from dlrover_events.runtime.unjournaled import Unjournaled
from dlrover_events.settings import Settings, load_settings
from dlrover_events.store import EnvStore
from streams.brain.core.inputs import SampleDecode
from streams.brain.core.merge import Fetch, Merge, event_time
from streams.brain.core.policy import Policy
from streams.brain.core.processor import HISTORY_PER_SCENARIO, BrainProcessor, Output
from streams.brain.core.snapshot import Offsets, Snapshot
from streams.brain.runtime.capacity import CAPACITY_WAIT_S, CapacityFollower
from streams.brain.runtime.checkpoint import BrainStore
from streams.brain.runtime.configs import ConfigFollower
from streams.brain.runtime.courier import OUTBOX_BATCHES, Courier
from streams.brain.runtime.faust_glue import (
    FETCH_MAX_WAIT_MS,
    BrainApp,
    RecordSink,
    broker_credentials,
    commit,
    fetch_progress,
)
from streams.brain.runtime.journal import (
    JOURNAL_WAIT_S,
    BrokerRefilling,
    JournalBehind,
    JournalGuard,
)
from streams.brain.runtime.leader import Leadership
from streams.brain.runtime.live_policy import LivePolicy, env_policy
from streams.brain.runtime.recovery import published_since, recover, stale_offsets, warn_stale
from streams.brain.runtime.retention import Pruner
from streams.brain.runtime.settings import load_brain_settings

log = logging.getLogger(__name__)

GROUP = "brain"
#: gc thresholds of a brain process (young, middle, old generation).
GC_THRESHOLDS = (50_000, 50, 1_000)

#: How long a starting brain waits for the env's config documents.
CONFIGS_WAIT_S = 30.0

#: How long a checkpoint waits for the courier to catch up before it holds the stream.
CATCH_UP_S = 1.0
#: How long the merge of the input partitions waits for one that lags without delivering
#: (`streams.brain.core.merge`), and how many records it buffers at most meanwhile.
MAX_IDLE_S = 5.0
MAX_BUFFERED = 100_000
#: How long a stopping brain gives its last checkpoint.
STOP_CHECKPOINT_S = 20.0
#: A state that did not load is loaded again after this; a checkpoint that failed is
#: written again after this (or the checkpoint interval, if longer).
#: how long a checkpoint with the stream held (a stop, a revoke) waits for the journal: a
#: revoke that waits long stalls faust's rebalance (seen in the chaos test of issue 37)
HELD_JOURNAL_WAIT_S = 0.5
#: How long a revocation may take to hand its partitions over checkpointed. faust's
#: rebalance waits for it, and every member of the group with it: a revocation that waited
#: for good on a lock whose holder waited on a broker that had died (a publication, a
#: commit) hung a standalone brain and its operator for good (issue 37). Past this, the
#: brain hands them over without a checkpoint and starts again (`rewind`), from its last
#: checkpoint, deciding the rest again with the same plan ids.
REVOKE_WAIT_S = 30.0
#: How long a checkpoint waits for its commit to the group (aiokafka retries a commit for
#: as long as the group's coordinator is not found, without a word): past this, the
#: offsets are committed with the next checkpoint. The checkpoint's lock is not held
#: meanwhile, so a revocation never waits for a commit.
COMMIT_WAIT_S = 10.0
LOAD_RETRY = Backoff(initial_s=0.2, max_s=30.0)
CHECKPOINT_RETRY = Backoff(initial_s=1.0, max_s=30.0)
#: a brain started again (a regroup, a rewind) while the bus is away tries again after this
REGROUP_RETRY = Backoff(initial_s=0.5, max_s=10.0)


def _record_time(record: Any) -> float:
    return event_time(record.value)


def _seen(counters: Any) -> int:
    """Input records the processor is done with, whatever it made of them."""
    return int(counters.processed + counters.ignored + counters.dead_lettered)


#: The brain reads what jobs and the operator say; scale results update a job's resources.
INPUTS = (JOB_METRICS, JOB_EVENTS, SCALE_RESULTS)


class Brain(AsyncResource):
    """One env's brain: a faust App, the processor and its checkpoints, in the caller's loop.

    `batch_max` bounds the records of one fetch, and so how many records' plans wait for
    the slowest of them (a crash test makes it small to crash mid-stream).
    """

    def __init__(
        self,
        settings: Settings,
        env: str,
        pg_dsn: str,
        *,
        policy: Policy | None = None,
        checkpoint_every_s: float = 2.0,
        batch_max: int | None = None,
        datadir: Path | None = None,
        freeze_gc: bool = False,
        metrics: BrainMetrics | None = None,
        sample_decode: SampleDecode | None = None,
    ) -> None:
        """`sample_decode`: how runtime samples are read (default: the process's
        setting, DLROVER_EVENTS_BRAIN_SAMPLE_DECODE)."""
        self.settings = settings
        #: what `up` or the command serve on /metrics (a registry of its own otherwise)
        self.metrics = metrics or BrainMetrics(CollectorRegistry(auto_describe=True), env)
        self.env = env
        self.group = f"{env}.{GROUP}"
        self.pg_dsn = pg_dsn
        #: the env's config documents: a job's config may name its optimizer there
        self.configs = ConfigFollower(settings, env)
        self.processor = BrainProcessor(
            env,
            self.group,
            policy,
            configs=self.configs.index,
            sample_decode=sample_decode or load_brain_settings().sample_decode,
        )
        #: the platform's word on the cluster a scheduler gives out (real envs)
        self.capacity = CapacityFollower(settings, env, self.processor.set_capacity)
        #: without a policy given, the env's settings (`brain` in the registry) say
        self._policy_given = policy is not None
        self.checkpoint_every_s = checkpoint_every_s
        #: gc frozen and its thresholds raised: for the whole process, so only where the
        #: brain has the process to itself (`brain --tune-gc`, `bench brain`)
        self._freeze_gc = freeze_gc
        self._pruner: Pruner | None = None
        self._inputs = [topic(env, name) for name in INPUTS]
        self._outputs = [topic(env, BRAIN_PLANS), topic(env, SCALE_PLANS)]
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if datadir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="dlrover-brain-")
            datadir = Path(self._tmp.name)
        self.app = BrainApp(
            self.group,
            broker=[f"kafka://{hp.strip()}" for hp in settings.bootstrap_servers.split(",")],
            broker_credentials=broker_credentials(kafka_connection(settings)),
            key_serializer="raw",
            value_serializer="raw",
            datadir=str(datadir),
            web_enabled=False,
            # env topics are created by `env create`; the brain never invents topics
            topic_allow_declare=False,
            topic_disable_leader=True,
            consumer_auto_offset_reset="earliest",
            broker_session_timeout=settings.session_timeout_ms / 1000,
            broker_heartbeat_interval=settings.heartbeat_interval_ms / 1000,
            broker_request_timeout=max(
                settings.request_timeout_ms / 1000, settings.session_timeout_ms / 1000 + 1
            ),
            broker_client_id=f"{settings.client_id}-brain",
            producer_acks=-1,
            # faust would wait at each rebalance and stop for acks that only our
            # checkpoint gives; the checkpoint on revocation takes care of them instead
            stream_wait_empty=False,
            processing_guarantee="at_least_once",
            broker_max_poll_records=batch_max or settings.consumer_batch,
        )
        self.inputs = self.app.topic(*self._inputs, key_serializer="raw", value_serializer="raw")
        # subscribed without an agent: the fetched batches go to `_handle` (the sink)
        self.app.topics.add(self.inputs)
        self.app.record_sink = self._handle
        # mode types receivers narrowly; these take (sender, partitions, signal=...)
        self.app.on_partitions_revoked.connect(cast(Any, self._on_revoked))
        self.app.on_partitions_assigned.connect(cast(Any, self._on_assigned))
        self.ready = asyncio.Event()
        self._batch_lock = asyncio.Lock()
        self._checkpoint_lock = asyncio.Lock()
        #: input offsets checkpointed but not yet committed to the group
        self._to_commit: dict[TP, int] = {}
        self._store: BrainStore | None = None
        #: the journal of `up`'s broker, if it keeps one: checkpoints held to what it copied
        self._journal: JournalGuard | None = None
        #: set when the journal will never hold what this brain decided since its last
        #: checkpoint (records it read or plans it published were lost with a broker that
        #: died): it must start again from that checkpoint, deciding the rest again
        self.rewind = asyncio.Event()
        #: decided batches' output, published in order by the courier
        self._checkpointer: asyncio.Task[None] | None = None
        self._stopping = False
        #: fail-stopped (`halt`): no batch decided, no checkpoint written from then on
        self.halted = False
        #: set as soon as a stop begins: every retry loop gives up at once
        self._closing = asyncio.Event()
        #: publishes the decided batches, in order, while the next ones are decided
        self.courier = Courier(
            settings, env, self._send, self.metrics, self._closing, publish=self._publish
        )
        self.checkpoints = 0
        self._what = f"the brain of {env}"
        #: the input partitions merged into one order (`streams.brain.core.merge`)
        self._merge: Merge[Any] = Merge(
            _record_time, max_idle_s=MAX_IDLE_S, max_buffered=MAX_BUFFERED
        )
        self._stalled: frozenset[tuple[str, int]] = frozenset()
        #: offsets found beyond their log's end: overwritten by the next checkpoint
        self._resets: Offsets = {}
        #: revocations begun: offsets of a commit that failed are kept for the next only if
        #: no partition was handed over meanwhile
        self._revokes = 0

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        if self._policy_given:
            # an env made by an older version gets the tables this brain writes
            await EnvRegistry(self.settings, self.pg_dsn).migrate(self.env)
        else:
            self.processor.policy, _ = await env_policy(self.settings, self.pg_dsn, self.env)
        await self.configs.start()
        try:
            # decide with the documents that exist, not with none while they load
            await self.configs.caught_up(CONFIGS_WAIT_S)
            await self.capacity.start()
            await self.capacity.caught_up(CAPACITY_WAIT_S)
            env_store = await EnvStore.open(self.pg_dsn, self.env, max_size=4)
            self._store = BrainStore(env_store)
            self._journal = JournalGuard(env_store.pool, self.settings.bootstrap_servers)
            self.courier.unjournaled = Unjournaled(env_store.pool, self.settings)
            self._pruner = Pruner(env_store, self.processor)
            await self.courier.start()
            await self.app.start()
        except BaseException as exc:
            await self.courier.stop()
            await self.capacity.stop()
            await self.configs.stop()
            if isinstance(exc, TimeoutError) and self._store is None:
                raise UserError(
                    f"env {self.env!r}: its config documents were not read within "
                    f"{CONFIGS_WAIT_S:g} s; is the broker up?"
                ) from None
            raise
        if self._freeze_gc:
            # Over half a million objects of imported modules live as long as the
            # process, and every full collection walked them all: pauses of up to 0.8 s
            # and a quarter less throughput, measured. Frozen, only later objects are.
            gc.freeze()
            # The job states then make most of what is left: collected as often as the
            # default asks (every 700 allocations), the pauses set the tail of the plan
            # latency. Measured in `bench brain` (p99 at 1,000 events/s about halved).
            gc.set_threshold(*GC_THRESHOLDS)
        self._checkpointer = asyncio.create_task(self._checkpoint_loop(), name="brain-checkpoint")

    def use_policy(self, policy: Policy) -> None:
        """Decide from the next batch on with `policy` (`streams.brain.runtime.live_policy`): a
        batch is decided whole, in one call, so it never sees two policies."""
        self.processor.policy = policy

    def halt(self) -> None:
        """Fail-stop (a scheduler leader that lost its lock, `streams.brain.runtime.leader`):
        decide no more batches and write no more checkpoints, from now on. Another
        instance may be resuming these partitions from the last checkpoint already: a
        checkpoint or commit written now could overwrite what it saves. What was decided
        and not yet checkpointed is decided again there, with the same plan ids."""
        self.halted = True
        self._stopping = True
        self._closing.set()
        if self._checkpointer is not None:
            self._checkpointer.cancel()

    async def stop(self) -> None:
        """Final checkpoint, then commit, then stop: a clean stop re-reads nothing. A
        brain stuck retrying (state that does not load, a broker away) gives up at once
        and leaves that work to its next start; a halted one stops without them."""
        self._closing.set()
        await cancel_and_wait(self._checkpointer)
        try:
            if self._store is not None and not self.halted:
                try:
                    async with asyncio.timeout(STOP_CHECKPOINT_S):
                        await self._checkpoint_held(stopping=True)
                except TimeoutError:
                    log.warning(
                        "the last checkpoint of the brain of %s took over %g s: stopping "
                        "without it (the next start decides again what follows the one before)",
                        self.env,
                        STOP_CHECKPOINT_S,
                    )
            self._stopping = True
            await self.app.stop()
        finally:
            await self.courier.stop()
            if self._store is not None:
                await self._store.store.close()
            await self.capacity.stop()
            await self.configs.stop()
            if self._tmp is not None:
                self._tmp.cleanup()

    async def run_until(self, stop: asyncio.Event | list[asyncio.Event]) -> None:
        """Run until `stop` (one of them) is set or faust stops by itself (a crash)."""
        with contextlib.suppress(Stopping):
            await unless(stop, self.app.wait_until_stopped(), self._what)
        if self.app.crash_reason is not None:
            raise RuntimeError(f"brain of {self.env} crashed: {self.app.crash_reason!r}")

    # -- records in, plans out ----------------------------------------------------------

    async def _handle(self, records: list[Any]) -> None:
        """One fetched batch: decided, and its output handed to the courier (waiting while
        the outbox is full), before the fetcher hands over the next."""
        async with self._batch_lock:
            if self._stopping:
                return  # not checkpointed: the next start reads them again
            assigned = self.app.consumer.assignment()
            inputs = {(tp.topic, tp.partition) for tp in assigned}
            # lockstep: a tick is whole once every one of these has its barrier
            self.processor.inputs = inputs
            # every assigned partition's jobs, not only those of this batch: the free
            # GPUs count what all of them hold
            new = {p for _, p in inputs} - self.processor.loaded
            try:
                if new:
                    await self._load(new)
                now = time.monotonic()
                fetch = fetch_progress(self.app, inputs)
                counters = self.processor.counters
                before = (counters.decisions, _seen(counters))
                started = time.monotonic()
                if self.processor.policy.settings.lockstep:
                    # ticks are merged whole by the processor; a batch fetched before a
                    # rebalance may hold partitions no longer ours
                    out = self.processor.process(
                        [r for r in records if (r.topic, r.partition) in inputs]
                    )
                    fetched_at = now
                else:
                    out = self.processor.process(self._merged(records, inputs, fetch, now))
                    fetched_at = self._merge.released_since or now
                self.metrics.decide_duration.observe(time.monotonic() - started)
                self._measure(fetch, before)
                if out.plans or out.letters or out.acks:
                    await self.courier.put(out, fetched_at)
            except Stopping:
                return  # not checkpointed: the next start reads them again

    def _measure(self, fetch: dict[tuple[str, int], Fetch], before: tuple[int, int]) -> None:
        """Lag per input partition (its end as last fetched minus what is decided), and
        what this batch decided."""
        counters, metrics = self.processor.counters, self.metrics
        done = self.processor.offsets
        for (name, part), f in fetch.items():
            if f.highwater is not None:
                metrics.lag(name, part, max(0, f.highwater - done.get((name, part), 0)))
        decisions, seen = before
        if counters.decisions > decisions:
            metrics.decisions.inc(counters.decisions - decisions)
        if _seen(counters) > seen:
            metrics.events.inc(_seen(counters) - seen)

    def _merged(
        self,
        records: list[Any],
        inputs: set[tuple[str, int]],
        fetch: dict[tuple[str, int], Fetch],
        now: float,
    ) -> list[Any]:
        """The records that may be decided now, in the merge's order (see
        `streams.brain.core.merge`). The processor's offsets move only with what is released,
        so a checkpoint never covers a record still buffered here."""
        merge = self._merge
        merge.assign(inputs)
        if not records and not merge.buffered:
            merge.released_since = None
            return []
        self._check_log_ends(fetch)
        done = self.processor.offsets
        # what the states include already (read again after a restart or a rebalance)
        # never enters the merge: it would change the order of what follows it
        merge.add((r for r in records if r.offset >= done.get((r.topic, r.partition), 0)), now)
        forced = merge.forced
        released = merge.release(fetch, now)
        if merge.stalled != self._stalled:
            self._stalled = merge.stalled
            if merge.stalled:
                log.warning(
                    "brain of %s: %s lag without delivering for over %g s; deciding the "
                    "other partitions without waiting for them",
                    self.env,
                    ", ".join(f"{t}[{p}]" for t, p in sorted(merge.stalled)),
                    merge.max_idle_s,
                )
        if merge.forced > forced and forced == 0:
            log.warning(
                "brain of %s: over %d records buffered while a partition lags; deciding "
                "them without waiting for it (their order may depend on fetching)",
                self.env,
                merge.max_buffered,
            )
        return released

    def _check_log_ends(self, fetch: dict[tuple[str, int], Fetch]) -> None:
        """A log that now ends before what the states include restarted under a running
        brain: read it from its beginning (the consumer did, its position out of range)."""
        ends = {tp: f.highwater for tp, f in fetch.items() if f.highwater is not None}
        stale = stale_offsets(self.processor.offsets, ends)
        if stale and self._journal is not None and self._journal.journaled:
            # a journaled broker's log is never shorter than a checkpoint: it is being
            # refilled (what it sends below the states' offsets is skipped as included)
            return
        if stale:
            warn_stale(stale, f"brain of {self.env}: input")
            for tp in stale:
                self.processor.offsets[tp] = 0
                self._resets[tp] = 0

    async def _load(self, partitions: set[int]) -> None:
        """Resume partitions from their checkpoint, and learn which plans were published
        after it (before a crash), so replaying the events after it does not publish them
        again. An offset beyond its log's end (a restarted broker) is said so and the
        partition read from the beginning. Retried while it fails (Postgres or the broker
        away: waiting beats losing state), saying why, until the brain stops."""
        assert self._store is not None
        store = self._store
        attempt = 0
        while True:
            attempt += 1
            try:

                async def load() -> Any:
                    loaded = await store.load(
                        partitions, self._inputs, history_per_scenario=HISTORY_PER_SCENARIO
                    )
                    since = await store.offsets(self._outputs)
                    inputs = {
                        (name, p): loaded.offsets.get((name, p), 0)
                        for name in self._inputs
                        for p in sorted(partitions)
                    }
                    found = await recover(self.settings, inputs, self._outputs, since)
                    short = {**found.stale_inputs, **found.stale_outputs}
                    if self._journal is not None and await self._journal.coming_back(short):
                        raise BrokerRefilling(
                            f"{len(short)} log(s) end before the checkpoint while the broker "
                            "is refilled from its journal"
                        )
                    rebuilt = {}
                    if found.stale_inputs and self._journal is not None and self._journal.journaled:
                        stale = {part for _, part in found.stale_inputs}
                        rebuilt = await self._rebuild(loaded, partitions, stale)
                    return loaded, found, rebuilt

                loaded, found, rebuilt = await unless(self._closing, load(), self._what)
                break
            except Stopping:
                raise
            except Exception as exc:
                delay = LOAD_RETRY.delay(attempt)
                log.warning(
                    "loading the brain state of %s partitions %s failed (attempt %d; "
                    "retrying in %.1f s): %s: %s",
                    self.env,
                    sorted(partitions),
                    attempt,
                    delay,
                    type(exc).__name__,
                    exc,
                    exc_info=attempt == 1 and not isinstance(exc, BrokerRefilling),
                )
                if await wait_or_stop(self._closing, delay):
                    raise Stopping(f"{self._what} is stopping") from exc
        stale = found.stale_inputs
        warn_stale(stale, f"brain of {self.env}: input")
        warn_stale(found.stale_outputs, f"brain of {self.env}: output")
        if not rebuilt:
            for tp in stale:
                del loaded.offsets[tp]
        self._resets.update(dict.fromkeys([*stale, *rebuilt, *found.stale_outputs], 0))
        self.courier.published |= found.published
        self.processor.install(partitions, loaded)

    async def _rebuild(
        self, loaded: Any, partitions: set[int], short: set[int]
    ) -> dict[tuple[str, int], tuple[int, int]]:
        """A journaled broker whose logs of partitions `short` end before their checkpoint
        (one written before the journal held what it covered): every partition loaded with
        them is read again from offset 0, its states dropped, in Postgres too
        (`BrainStore.rebuild`), so that no record is folded twice and none is kept that no
        topic holds. All of them, not only the short ones: a decision counts the GPUs of
        every job held (and a lockstep tick is decided over every partition at once), so
        a replay of some partitions beside others resumed at their checkpoint decides its
        ticks again with the others' jobs as they are now, not as they were then (a job
        grew into GPUs that another had held at that tick: tests/integration/brain/
        test_brain_rebuild.py). Returns the input offsets reset, as (stored, 0)."""
        assert self._store is not None
        log.warning(
            "brain of %s: partitions %s end before their checkpoint on a journaled broker; "
            "rebuilding the states of partitions %s from the log",
            self.env,
            sorted(short),
            sorted(partitions),
        )
        dropped = await self._store.rebuild(loaded, partitions, self._inputs)
        return {tp: (offset, 0) for tp, offset in dropped.items()}

    # -- publishing ---------------------------------------------------------------------

    async def _publish(self, out: Output) -> None:
        """What the courier does with a decided batch (a test may put itself between)."""
        started = time.monotonic()
        await self.courier.publish(out)
        self.metrics.publish_duration.observe(time.monotonic() - started)

    @property
    def republish_skipped(self) -> int:
        """Plans not published again: a crashed brain had published them."""
        return self.courier.republish_skipped

    async def _send(
        self, name: str, key: bytes | None, value: bytes, partition: int | None = None
    ) -> Any:
        future = await self.app.producer.send(name, key, value, partition, None, None)
        return await future

    # -- checkpoints --------------------------------------------------------------------

    async def _checkpoint_loop(self) -> None:
        """Checkpoint every few seconds; after a failure, say why and back off (the state
        stays in memory, and a restart decides again what follows the last checkpoint)."""
        failures = 0
        while True:
            delay = CHECKPOINT_RETRY.delay(failures) if failures else 0.0
            await asyncio.sleep(max(delay, self.checkpoint_every_s))
            try:
                await self.checkpoint()
                failures = 0
            except asyncio.CancelledError:
                raise
            except Stopping:
                return
            except JournalBehind as exc:
                log.warning(
                    "brain of %s: %s; what it decided since its last checkpoint is not all "
                    "on the broker any more (a broker that died lost it): starting again from "
                    "that checkpoint",
                    self.env,
                    exc,
                )
                self.rewind.set()
                return
            except Exception as exc:
                failures += 1
                log.warning(
                    "brain checkpoint of %s failed (%d in a row; retrying in %.0f s): %s: %s",
                    self.env,
                    failures,
                    max(CHECKPOINT_RETRY.delay(failures), self.checkpoint_every_s),
                    type(exc).__name__,
                    exc,
                    exc_info=failures == 1,
                )

    async def checkpoint(self) -> None:
        """Write what changed, then ack the batches it covers (faust commits them)."""
        async with self._checkpoint_lock:
            # Most of the wait for the courier with the stream going on, then, held, only
            # for what was decided meanwhile: the offsets must not get ahead of the plans,
            # and the events that arrive while the stream is held wait with it.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.courier.published_all(), CATCH_UP_S)
            async with self._batch_lock:
                await self.courier.published_all()
                snap = self._snapshot()
            await self._save(snap, commit=False)
            if self._pruner is not None:
                # finished jobs past the retention (every `prune_every_s` at most), with
                # the stream held: a late event must not meet a job half pruned
                async with self._batch_lock:
                    await self._pruner.maybe_prune()
        # committed with no lock held: a commit waits on the broker, and a revocation that
        # needs the lock would wait with it (while faust's rebalance waits for that)
        await self._commit(timeout_s=COMMIT_WAIT_S)

    async def _checkpoint_held(
        self,
        *,
        stopping: bool = False,
        drop: set[int] | None = None,
        waiting: list[str] | None = None,
    ) -> bool:
        """Checkpoint with the stream held (stop, rebalance), then stop taking batches or
        forget partitions. A failed checkpoint is not fatal: whoever reads those
        partitions next resumes from the previous one and decides the rest again.
        ``waiting``: what it waits for is appended there, as it goes (to say so)."""
        waiting = [] if waiting is None else waiting
        # same order as checkpoint()
        waiting.append("the checkpoint's lock (a checkpoint under way)")
        async with self._checkpoint_lock:
            waiting.append("the stream's lock (a batch being decided or handed to the courier)")
            async with self._batch_lock:
                return await self._checkpoint_locked(stopping, drop, waiting)

    async def _checkpoint_locked(
        self, stopping: bool, drop: set[int] | None, waiting: list[str]
    ) -> bool:
        """The rest of `_checkpoint_held`, with both locks held."""
        if stopping:
            self._stopping = True  # batches taken from now on are left unacked
        try:
            waiting.append("the courier publishing the batches decided (the broker's acks)")
            await self.courier.published_all()  # the offsets must not get ahead of the plans
            snap = self._snapshot()
            waiting.append("the checkpoint's save (the broker journal, Postgres)")
            # no commit while partitions are revoked: faust's consumer thread waits
            # for this handler, and a commit would wait for that thread; nor a long
            # wait for the journal (a broker that died copies nothing more)
            await self._save(snap, commit=drop is None, journal_wait_s=HELD_JOURNAL_WAIT_S)
            ok = True
        except Stopping as exc:
            log.warning(
                "brain of %s: not checkpointed, plans unpublished (%s); the next start "
                "decides again what follows the last checkpoint",
                self.env,
                exc.__cause__ or exc,
            )
            ok = False
        except Exception:
            log.exception("checkpoint of the brain of %s failed", self.env)
            ok = False
        if drop:
            self._merge.assign({tp for tp in self._merge.assigned if tp[1] not in drop})
            self.processor.drop(drop)
            if self._store is not None:
                self._store.forget(drop)
            # their next owner resumes from the checkpoint, whatever was committed
            self._to_commit = {tp: o for tp, o in self._to_commit.items() if tp[1] not in drop}
        return ok

    def _snapshot(self) -> Snapshot:
        snap = self.processor.snapshot()
        if snap.offsets:
            snap.offsets.update(self.courier.produced)  # outputs: where a restart looks
        snap.reset, self._resets = self._resets, {}
        return snap

    async def _save(
        self, snap: Snapshot, *, commit: bool = True, journal_wait_s: float = JOURNAL_WAIT_S
    ) -> None:
        assert self._store is not None
        if self.halted:
            raise Stopping(f"{self._what} is halted")
        started = time.monotonic()
        try:
            if snap.offsets and self._journal is not None:
                await self._journal.wait_copied(snap.offsets, journal_wait_s)
            if snap:
                await self._store.save(snap)
        except BaseException:
            self.processor.restore(snap)
            self._resets = {**snap.reset, **self._resets}
            raise
        self.checkpoints += 1
        inputs = set(self._inputs)
        self._to_commit.update(
            (TP(name, part), offset)
            for (name, part), offset in snap.offsets.items()
            if name in inputs
        )
        if commit:
            await self._commit()
        self.metrics.checkpoint_duration.observe(time.monotonic() - started)

    async def _commit(self, timeout_s: float | None = None) -> None:
        """Commit what is checkpointed. A commit that fails, or does not end within
        ``timeout_s``, is retried with the next checkpoint; until then a restart reads a
        little more and skips it by offset."""
        if not self._to_commit:
            return
        todo, self._to_commit = self._to_commit, {}
        revokes = self._revokes
        try:
            async with asyncio.timeout(timeout_s):
                await commit(self.app, todo)
        except Exception as exc:
            log.warning(
                "committing the brain's offsets of %s failed%s; retrying with the next checkpoint",
                self.env,
                f" (no answer within {timeout_s:g} s: the broker away?)"
                if isinstance(exc, TimeoutError)
                else f": {type(exc).__name__}: {exc}",
            )
            if revokes == self._revokes:  # (else partitions of it may be another's now)
                self._to_commit = {**todo, **self._to_commit}

    async def _on_revoked(self, sender: Any, *args: Any, **kwargs: Any) -> None:
        """Hand partitions over checkpointed, so their next owner resumes where we stop.

        Within `REVOKE_WAIT_S`: faust's rebalance, and the whole group, waits for this. A
        checkpoint or a batch that holds the stream may wait on a broker that died (a
        publication retried until it is back, a commit); past the bound the partitions
        go without a checkpoint and this brain stops deciding (`halt`) and asks to be
        started again (`rewind`): whoever reads them next, this brain started again
        included, resumes from the last checkpoint and decides the rest again, with the
        same plan ids. A brain that went on instead could checkpoint partitions that are
        another's by then."""
        revoked: set[Any] = args[0] if args else kwargs.get("revoked", set())
        if self._store is None or self._stopping:
            return
        self._revokes += 1
        waiting: list[str] = []
        try:
            async with asyncio.timeout(REVOKE_WAIT_S):
                await self._checkpoint_held(drop={tp.partition for tp in revoked}, waiting=waiting)
        except TimeoutError:
            log.warning(
                "brain of %s: handing partitions %s over took over %g s, waiting for %s (a "
                "broker that died?): handed over without a checkpoint; this brain stops and "
                "starts again from its last checkpoint",
                self.env,
                sorted({tp.partition for tp in revoked}),
                REVOKE_WAIT_S,
                waiting[-1] if waiting else "its start",
            )
            self.halt()
            self.rewind.set()

    async def _on_assigned(self, sender: Any, *args: Any, **kwargs: Any) -> None:
        self.ready.set()


__all__ = [
    "FETCH_MAX_WAIT_MS",
    "OUTBOX_BATCHES",
    "Brain",
    "BrainApp",
    "RecordSink",
    "published_since",
    "service",
]


# -- `up` and the command ----------------------------------------------------------------


async def run(ctx: ServiceContext, *, freeze_gc: bool = False) -> None:
    """Decide the env's events until stopped. An env with a cluster scheduler is decided
    by one brain instance at a time, its leader (`streams.brain.runtime.leader`): this one stands
    by until it leads, and stands by again if it loses the lead.

    The env's settings are followed while it runs (`streams.brain.runtime.live_policy`): a change
    is taken between two batches, or, when it changes who decides the env (a scheduler
    on or off, lockstep), the brain hands its partitions over and starts again under it."""
    metrics = BrainMetrics(ctx.metrics, ctx.env)
    live = await LivePolicy.open(ctx.settings, ctx.pg_dsn, ctx.env)
    async with background(live.run(ctx.stop), name=f"{ctx.env}.brain-settings"):
        again = 0  # starts again in a row with the bus away
        started = False
        while not ctx.stop.is_set():
            live.regroup.clear()
            try:
                if live.policy.scheduler is None:
                    await _decide(ctx, live, metrics, freeze_gc=freeze_gc)
                else:
                    await _lead(ctx, live, metrics, freeze_gc=freeze_gc)
                again = 0
            except BusUnavailable as err:
                if not started:
                    raise  # (its first start: said, as any service's)
                # started again (a regroup, a rewind) while the bus is away: a broker that
                # `up` restarts; the brain waits for it rather than end
                again += 1
                delay = REGROUP_RETRY.delay(again)
                log.warning(
                    "brain of %s: the bus is away as it starts again (%s); again in %.1f s",
                    ctx.env,
                    err,
                    delay,
                )
                if await wait_or_stop(ctx.stop, delay):
                    return
                live.regroup.set()
            started = True
            if not live.regroup.is_set():
                return


async def _lead(
    ctx: ServiceContext, live: LivePolicy, metrics: BrainMetrics, *, freeze_gc: bool
) -> None:
    """Decide as the env's scheduler leader, standing by while another instance leads,
    until stopped or the settings regroup the env."""
    leadership = Leadership(ctx.pg_dsn, ctx.env, poll_s=ctx.settings.fence_check_s)
    leading = metrics.scheduler_leader.labels(ctx.env)
    leading.set(0)
    until = asyncio.Event()  # stopped, or regrouped
    async with background(
        # standing by is this instance's job while another leads: ready (not failing)
        _ready_once(leadership.standing_by, ctx),
        _set_on_any(until, ctx.stop, live.regroup),
    ):
        while await leadership.acquire(until):
            leading.set(1)
            try:
                await _decide(ctx, live, metrics, freeze_gc=freeze_gc, lost=leadership.lost)
            finally:
                leading.set(0)
                await leadership.release()
            if not leadership.lost.is_set():
                return


async def _set_on_any(target: asyncio.Event, *events: asyncio.Event) -> None:
    await wait_for_any(list(events))
    target.set()


async def _ready_once(event: asyncio.Event, ctx: ServiceContext) -> None:
    await event.wait()
    ctx.ready.set()


async def _decide(
    ctx: ServiceContext,
    live: LivePolicy,
    metrics: BrainMetrics,
    *,
    freeze_gc: bool,
    lost: asyncio.Event | None = None,
) -> None:
    """One brain, from its start until `ctx.stop`, a crash, a change of settings that
    regroups the env (then stopped as at `ctx.stop`: checkpointed), or `lost` (then
    halted at once: the lock that made it the env's only decider is gone)."""
    brain = Brain(
        ctx.settings,
        ctx.env,
        ctx.pg_dsn,
        policy=live.policy,
        metrics=metrics,
        freeze_gc=freeze_gc,
    )
    live.attach(brain.use_policy)
    halting = () if lost is None else (_halt_when(lost, brain),)
    try:
        async with background(*halting), brain:
            stops = [ctx.stop, live.regroup, brain.rewind] + ([] if lost is None else [lost])
            if await wait_for_any([brain.ready, *stops]) and brain.ready.is_set():
                ctx.ready.set()
            await brain.run_until(stops)
            if brain.rewind.is_set() and not ctx.stop.is_set():
                brain.halt()  # no checkpoint of what the journal lost: from the last one
                live.regroup.set()  # `run` starts a brain again
    finally:
        live.attach(None)


async def _halt_when(lost: asyncio.Event, brain: Brain) -> None:
    await lost.wait()
    brain.halt()


service = Service(
    name="brain",
    description="job state, optimizer router, optimizers and planner: job topics in, plans out",
    run=run,
)


async def _standalone(settings: Settings, env: str, freeze_gc: bool) -> None:
    def say(ctx: ServiceContext) -> None:
        typer.echo(
            f"brain of {env}: metrics on {ctx.endpoints['metrics']}, /healthz and /readyz "
            "beside them",
            err=True,
        )

    # the fence refuses a missing env in one line
    await serve_alone(
        settings, env, "brain", functools.partial(run, freeze_gc=freeze_gc), on_ready=say
    )


def brain(
    env: str = typer.Option(
        ..., "--env", "-e", parser=env_name, help="the env whose job topics to decide on"
    ),
    tune_gc: bool = typer.Option(
        False,
        "--tune-gc",
        help="freeze the objects of imported modules and collect less often (the whole "
        "process: for a brain with a process of its own; higher throughput, shorter pauses)",
    ),
) -> None:
    """Run the brain of one env: job topics in, OptimizePlans and ScalePlans out."""
    run_async(_standalone(load_settings(), env, tune_gc))
