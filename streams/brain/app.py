"""`dlrover-events brain --env E`: the brain as a faust-streaming app.

faust runs the group membership, rebalances, offsets and the producer; the records go
from faust's fetcher straight to the BrainProcessor in the batches the broker returned.
faust's own path from fetcher to agent (a Message, an Event, two tasks per record for its
flow control, a queue and an ack each) cost more per record than deciding it, and capped
the brain below the speed it must keep up with (`bench brain` shows both). The processor
decides a batch and hands its plans and dead letters to a courier task, which publishes
them, batch after batch in order, while the next batch is decided; at most
`OUTBOX_BATCHES` decided batches wait for it, so backpressure reaches the fetcher.

A checkpoint task waits until the courier has published every batch decided so far,
writes the changed job states and the offsets they include to Postgres every few
seconds, and only then commits those offsets to the group. So the committed
offset never gets ahead of a durable checkpoint, and a restart reads again, at worst, what
the last checkpoint covers, which the processor skips by offset. The events after the
checkpoint are decided again and give the same plan ids (derived from their cause), so a
crash loses no plan and makes no new ones; a plan that was published before the crash may
be published again with the same id, which the operator applies at most once.

Faust's worker normally owns the event loop; `Brain` starts the App as the mode.Service
it is (`await app.start()`), so `up` runs it beside the other services in one loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import faust
import typer
from aiokafka import AIOKafkaConsumer, TopicPartition
from faust.sensors import Sensor
from faust.transport.drivers import aiokafka as faust_kafka
from faust.types import TP

from dlrover_events.bus import Producer, log_dead_letters
from dlrover_events.cli.app import run_async
from dlrover_events.embedded import resolve_postgres
from dlrover_events.envs import EnvRegistry
from dlrover_events.errors import UserError
from dlrover_events.services import Service, ServiceContext
from dlrover_events.settings import Settings, load_settings
from dlrover_events.store import EnvStore
from dlrover_events.topics import (
    BRAIN_PLANS,
    DLQ,
    JOB_EVENTS,
    JOB_METRICS,
    SCALE_PLANS,
    SCALE_RESULTS,
    topic,
    topic_of,
)
from schemas.codec import CodecError, decode, encode
from schemas.plans import OptimizePlan, ScalePlan
from streams.brain.checkpoint import BrainStore, Offsets, Snapshot
from streams.brain.configs import ConfigFollower
from streams.brain.processor import HISTORY_PER_SCENARIO, BrainProcessor, Output
from streams.brain.triggers import Policy

log = logging.getLogger(__name__)

GROUP = "brain"
#: tansu answers a fetch when its wait is over, not as soon as data arrives, so this wait
#: is the floor of the plan latency (faust itself fixes it at 1500 ms: about 0.4 s per
#: event measured at low rates); an idle brain pays with a fetch every 10 ms.
FETCH_MAX_WAIT_MS = 10


class _ConsumerThread(faust_kafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = getattr(self.app, "fetch_max_wait_ms", FETCH_MAX_WAIT_MS)
        return consumer


RecordSink = Callable[[list[Any]], Awaitable[None]]


class _Consumer(faust_kafka.Consumer):
    def _new_consumer_thread(self) -> Any:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def _drain_messages(self, fetcher: Any) -> None:
        """Hand each fetched batch to the app's record sink (aiokafka's ConsumerRecords,
        partition by partition in offset order), waiting for it before fetching on."""
        sink: RecordSink | None = getattr(self.app, "record_sink", None)
        if sink is None:
            await super()._drain_messages(fetcher)
            return
        consumer_stopped = self._stopped.is_set
        fetcher_stopped = fetcher._stopped.is_set
        read_offset = self._read_offset
        # faust's livelock check reads when records last reached a stream, from its Monitor
        inbound = self.app.monitor.stream_inbound_time
        try:
            while not (consumer_stopped() or fetcher_stopped()):
                records, active = await self._wait_next_records(1.0)
                if not records:
                    await asyncio.sleep(0)
                    continue
                # Even with a rebalance begun: the fetcher's position has moved past
                # these, so a batch dropped here would be lost until the next seek. The
                # sink keeps what is still ours and skips by offset what it has decided.
                batch: list[Any] = []
                now = time.monotonic()
                for tp, items in records.items():
                    if items and (active is None or tp in active):
                        batch.extend(items)
                        read_offset[tp] = items[-1].offset
                        inbound[tp] = now
                if batch:
                    # a rebalance cancels the fetcher: the batch is still decided and its
                    # plans published (the revocation waits for it), never half of it
                    await asyncio.shield(sink(batch))
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                return
            raise


class _Transport(faust_kafka.Transport):
    Consumer = _Consumer


class BrainApp(faust.App):
    """faust's App with a fetch wait of our choosing (faust has no setting for it) and
    without the sensor of its web view."""

    fetch_max_wait_ms: int = FETCH_MAX_WAIT_MS
    #: where fetched records go, in batches; None: through faust's agents and streams
    record_sink: RecordSink | None = None
    #: faust's Monitor sensor keeps per-event statistics for its web view, which the
    #: brain does not serve: four calls per event for nothing.
    monitored: bool = False

    def _new_transport(self) -> Any:
        return _Transport(self.conf.broker_consumer, self)

    def on_init_dependencies(self) -> Any:
        dependencies = super().on_init_dependencies()
        if not self.monitored:
            self.sensors.remove(self.monitor)
            self.sensors.add(_RebalanceSensor())
        return dependencies


class _RebalanceSensor(Sensor):
    """Does nothing per event; it only gives faust's rebalance bookkeeping a state, which
    it warns about at every rebalance when no sensor is left."""

    def on_rebalance_start(self, app: Any) -> dict[str, Any]:
        return {"brain": True}


#: gc thresholds of a brain process (young, middle, old generation).
GC_THRESHOLDS = (50_000, 50, 1_000)

#: How long a starting brain waits for the env's config documents.
CONFIGS_WAIT_S = 30.0

#: Decided batches whose plans wait to be published while the next batch is decided. A
#: batch's plans wait for the broker's acks (acks=all): deciding the next batch only after
#: them left the brain idle a tenth of its time, and made each batch's events wait for the
#: previous batch's acks. One courier publishes the batches in order, as before.
OUTBOX_BATCHES = 2
#: How long a checkpoint waits for the courier to catch up before it holds the stream.
CATCH_UP_S = 1.0


@dataclass(frozen=True)
class _Record:
    """One record the brain publishes; `plan`: its offset is where a restart looks for
    plans published after the checkpoint."""

    topic: str
    key: bytes | None
    value: bytes
    partition: int | None = None
    plan: bool = False


#: The brain reads what jobs and the operator say; scale results update a job's resources.
INPUTS = (JOB_METRICS, JOB_EVENTS, SCALE_RESULTS)


class Brain:
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
        freeze_gc: bool = True,
    ) -> None:
        self.settings = settings
        self.env = env
        self.group = f"{env}.{GROUP}"
        self.pg_dsn = pg_dsn
        #: the env's config documents: a job's config may name its optimizer there
        self.configs = ConfigFollower(settings, env)
        self.processor = BrainProcessor(env, self.group, policy, configs=self.configs.index)
        #: without a policy given, the env's settings (`brain` in the registry) say
        self._policy_given = policy is not None
        self.checkpoint_every_s = checkpoint_every_s
        self._freeze_gc = freeze_gc
        self._dlq = topic(env, DLQ)
        self._inputs = [topic(env, name) for name in INPUTS]
        self._outputs = [topic(env, BRAIN_PLANS), topic(env, SCALE_PLANS)]
        #: next offset per output partition after the plans this process published
        self._produced: Offsets = {}
        #: plan ids found on the outputs after the checkpoint we resumed from
        self._published: set[str] = set()
        self.republish_skipped = 0
        #: partitions of the topics published to every partition of (lockstep acks)
        self._partitions: dict[str, list[int]] = {}
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if datadir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="dlrover-brain-")
            datadir = Path(self._tmp.name)
        self.app = BrainApp(
            self.group,
            broker=[f"kafka://{hp.strip()}" for hp in settings.bootstrap_servers.split(",")],
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
        #: decided batches' output, published in order by the courier
        self._outbox: asyncio.Queue[Output] = asyncio.Queue(maxsize=OUTBOX_BATCHES)
        self._courier: asyncio.Task[None] | None = None
        self._checkpointer: asyncio.Task[None] | None = None
        self._stopping = False
        self.checkpoints = 0

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        # an env made by an older version gets the tables this brain writes
        record = await EnvRegistry(self.settings, self.pg_dsn).migrate(self.env)
        if not self._policy_given:
            raw = None if record is None else record.settings.get(GROUP)
            try:
                self.processor.policy = Policy.from_settings(raw)
            except ValueError as exc:
                raise UserError(f"env {self.env!r}: {exc}") from None
        await self.configs.start()
        try:
            # decide with the documents that exist, not with none while they load
            await self.configs.caught_up(CONFIGS_WAIT_S)
            env_store = await EnvStore.open(self.pg_dsn, self.env, max_size=4)
            self._store = BrainStore(env_store)
            self._courier = asyncio.create_task(self._courier_loop(), name="brain-courier")
            await self.app.start()
        except BaseException as exc:
            await self._stop_courier()
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

    async def stop(self) -> None:
        """Final checkpoint, then commit, then stop: a clean stop re-reads nothing."""
        if self._checkpointer is not None:
            self._checkpointer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checkpointer
        try:
            if self._store is not None:
                await self._checkpoint_held(stopping=True)
            self._stopping = True
            await self.app.stop()
        finally:
            await self._stop_courier()
            if self._store is not None:
                await self._store.store.close()
            await self.configs.stop()
            if self._tmp is not None:
                self._tmp.cleanup()

    async def run_until(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set or faust stops by itself (a crash), then stop cleanly."""
        waiter = asyncio.create_task(stop.wait())
        stopped = asyncio.create_task(self.app.wait_until_stopped())
        try:
            await asyncio.wait({waiter, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            stopped.cancel()
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
            # a batch fetched before a rebalance may hold partitions no longer ours
            mine = [r for r in records if (r.topic, r.partition) in assigned]
            # lockstep: a tick is whole once every one of these has its barrier
            self.processor.inputs = {(tp.topic, tp.partition) for tp in assigned}
            # every assigned partition's jobs, not only those of this batch: the free
            # GPUs count what all of them hold
            new = {p for _, p in self.processor.inputs} - self.processor.loaded
            if new:
                await self._load(new)
            out = self.processor.process(mine)
            if out.plans or out.letters or out.acks:
                await self._until_courier_done(self._outbox.put(out))

    async def _load(self, partitions: set[int]) -> None:
        """Resume partitions from their checkpoint, and learn which plans were published
        after it (before a crash), so replaying the events after the checkpoint does not
        publish them again."""
        assert self._store is not None
        for attempt in range(1, 1_000_000):
            try:
                loaded = await self._store.load(
                    partitions, self._inputs, history_per_scenario=HISTORY_PER_SCENARIO
                )
                since = await self._store.offsets(self._outputs)
                self._published |= await published_since(self.settings, self._outputs, since)
                break
            except Exception:  # Postgres or the broker away: wait rather than lose state
                log.exception("loading brain state of %s (attempt %d)", sorted(partitions), attempt)
                await asyncio.sleep(min(0.2 * attempt, 5.0))
        self.processor.install(partitions, loaded)

    # -- publishing ---------------------------------------------------------------------

    async def _courier_loop(self) -> None:
        """Publish the decided batches in the order they were decided. A failure here is
        not retried (`_deliver` retries sends for ever): it stops the courier, and with
        it the brain (`_until_courier_done`), before a checkpoint can cover the batch."""
        while True:
            out = await self._outbox.get()
            try:
                await self._publish(out)
            finally:
                self._outbox.task_done()

    async def _until_courier_done(self, work: Awaitable[None]) -> None:
        """`work`, unless the courier stops first: then its error, not a wait for ever."""
        courier = self._courier
        assert courier is not None, "the brain is not started"
        task = asyncio.ensure_future(work)
        try:
            await asyncio.wait({task, courier}, return_when=asyncio.FIRST_COMPLETED)
            if courier.done():
                error = None if courier.cancelled() else courier.exception()
                raise RuntimeError(f"the brain of {self.env} stopped publishing") from error
            await task
        finally:
            task.cancel()  # (done already, unless the courier stopped or we were cancelled)

    async def _published_all(self) -> None:
        """Wait until the outbox is empty: every batch decided so far published and
        acked. Only a caller holding the batch lock knows that no batch was added since."""
        await self._until_courier_done(self._outbox.join())

    async def _stop_courier(self) -> None:
        if self._courier is not None:
            self._courier.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._courier

    async def _publish(self, out: Output) -> None:
        """Plans and dead letters, acked by the broker before the batch counts as done;
        then, in lockstep, the acks of the ticks decided."""
        if not (out.plans or out.letters or out.acks):
            return
        todo: list[_Record] = []
        for plan in out.plans:
            if plan.plan_id in self._published:
                self.republish_skipped += 1
                continue
            key = plan.key.encode() if plan.key is not None else None
            todo.append(_Record(topic_of(plan), key, encode(plan), plan=True))
        for letter in out.letters:
            key = letter.key.encode() if letter.key is not None else None
            todo.append(_Record(self._dlq, key, encode(letter)))
        await self._deliver(todo)
        if out.acks:
            # after the tick's plans, on every partition: whoever reads any of them has
            # read that partition's plans of the tick when it meets the ack
            plans = topic(self.env, SCALE_PLANS)
            parts = await self._partitions_of(plans)
            await self._deliver(
                [_Record(plans, None, encode(ack), p) for ack in out.acks for p in parts]
            )
        log_dead_letters(out.letters)

    async def _deliver(self, todo: list[_Record]) -> None:
        """The batch is not done (and no checkpoint can cover it) until the broker has
        every record: retry what failed, for as long as it takes."""
        attempt = 0
        while todo:
            attempt += 1
            results = await asyncio.gather(
                *(self._send(r.topic, r.key, r.value, r.partition) for r in todo),
                return_exceptions=True,
            )
            failed = []
            for record, result in zip(todo, results, strict=True):
                if isinstance(result, BaseException):
                    if isinstance(result, asyncio.CancelledError):
                        raise result
                    failed.append(record)
                elif record.plan:
                    tp = (result.topic, result.partition)
                    self._produced[tp] = max(self._produced.get(tp, 0), result.offset + 1)
            if failed:
                log.warning("publishing %d records failed (attempt %d)", len(failed), attempt)
                await asyncio.sleep(min(0.1 * attempt, 5.0))
            todo = failed

    async def _send(
        self, name: str, key: bytes | None, value: bytes, partition: int | None = None
    ) -> Any:
        future = await self.app.producer.send(name, key, value, partition, None, None)
        return await future

    async def _partitions_of(self, name: str) -> list[int]:
        if name not in self._partitions:
            async with Producer(self.settings) as producer:  # once: topics keep their count
                self._partitions[name] = await producer.partitions(name)
        return self._partitions[name]

    # -- checkpoints --------------------------------------------------------------------

    async def _checkpoint_loop(self) -> None:
        while True:
            await asyncio.sleep(self.checkpoint_every_s)
            try:
                await self.checkpoint()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("brain checkpoint of %s failed; retrying", self.env)

    async def checkpoint(self) -> None:
        """Write what changed, then ack the batches it covers (faust commits them)."""
        async with self._checkpoint_lock:
            # Most of the wait for the courier with the stream going on, then, held, only
            # for what was decided meanwhile: the offsets must not get ahead of the plans,
            # and the events that arrive while the stream is held wait with it.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._published_all(), CATCH_UP_S)
            async with self._batch_lock:
                await self._published_all()
                snap = self._snapshot()
            await self._save(snap)

    async def _checkpoint_held(
        self, *, stopping: bool = False, drop: set[int] | None = None
    ) -> bool:
        """Checkpoint with the stream held (stop, rebalance), then stop taking batches or
        forget partitions. A failed checkpoint is not fatal: whoever reads those
        partitions next resumes from the previous one and decides the rest again."""
        async with self._checkpoint_lock, self._batch_lock:  # same order as checkpoint()
            if stopping:
                self._stopping = True  # batches taken from now on are left unacked
            try:
                await self._published_all()  # the offsets must not get ahead of the plans
                snap = self._snapshot()
                # no commit while partitions are revoked: faust's consumer thread waits
                # for this handler, and a commit would wait for that thread
                await self._save(snap, commit=drop is None)
                ok = True
            except Exception:
                log.exception("checkpoint of the brain of %s failed", self.env)
                ok = False
            if drop:
                self.processor.drop(drop)
                if self._store is not None:
                    self._store.forget(drop)
                # their next owner resumes from the checkpoint, whatever was committed
                self._to_commit = {tp: o for tp, o in self._to_commit.items() if tp[1] not in drop}
            return ok

    def _snapshot(self) -> Snapshot:
        snap = self.processor.snapshot()
        if snap.offsets:
            snap.offsets.update(self._produced)  # outputs: where a restart looks for plans
        return snap

    async def _save(self, snap: Snapshot, *, commit: bool = True) -> None:
        assert self._store is not None
        try:
            if snap:
                await self._store.save(snap)
        except BaseException:
            self.processor.restore(snap)
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

    async def _commit(self) -> None:
        """Commit what is checkpointed. A commit that fails is retried with the next
        checkpoint; until then a restart reads a little more and skips it by offset."""
        if not self._to_commit:
            return
        todo, self._to_commit = self._to_commit, {}
        try:
            await cast(Any, self.app.consumer)._commit_offsets(todo)
        except Exception:
            log.warning("committing the brain's offsets of %s failed; retrying", self.env)
            self._to_commit = {**todo, **self._to_commit}

    async def _on_revoked(self, sender: Any, *args: Any, **kwargs: Any) -> None:
        """Hand partitions over checkpointed, so their next owner resumes where we stop."""
        revoked: set[Any] = args[0] if args else kwargs.get("revoked", set())
        if self._store is None or self._stopping:
            return
        await self._checkpoint_held(drop={tp.partition for tp in revoked})

    async def _on_assigned(self, sender: Any, *args: Any, **kwargs: Any) -> None:
        self.ready.set()


async def published_since(
    settings: Settings, topics: Sequence[str], since: Offsets, timeout_s: float = 30.0
) -> set[str]:
    """Plan ids on `topics` from the checkpointed offsets to the end (from the start where
    none was checkpointed): what a crashed brain published after its last checkpoint."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap_servers,
        client_id=f"{settings.client_id}-brain-recovery",
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        request_timeout_ms=settings.request_timeout_ms,
    )
    await consumer.start()
    try:
        await consumer._client.force_metadata_update()
        parts = [
            TopicPartition(name, p)
            for name in topics
            for p in sorted(consumer.partitions_for_topic(name) or ())
        ]
        end = await consumer.end_offsets(parts) if parts else {}
        todo = {tp: end[tp] for tp in parts if since.get((tp.topic, tp.partition), 0) < end[tp]}
        if not todo:
            return set()
        consumer.assign(list(todo))
        for tp in todo:
            consumer.seek(tp, since.get((tp.topic, tp.partition), 0))
        found: set[str] = set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while todo and loop.time() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            for tp, records in batch.items():
                for record in records:
                    try:
                        event = decode(record.value)
                    except CodecError:
                        continue
                    if isinstance(event, OptimizePlan | ScalePlan):
                        found.add(event.plan_id)
                if records and records[-1].offset + 1 >= todo.get(tp, 0):
                    todo.pop(tp, None)
        if todo:
            log.warning("brain recovery did not reach the end of %s", sorted(map(str, todo)))
        return found
    finally:
        await consumer.stop()


# -- `up` and the command ----------------------------------------------------------------


async def run(ctx: ServiceContext) -> None:
    brain = Brain(ctx.settings, ctx.env, ctx.pg_dsn)
    await brain.start()
    try:
        ready = asyncio.create_task(brain.ready.wait())
        stop = asyncio.create_task(ctx.stop.wait())
        await asyncio.wait({ready, stop}, return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        stop.cancel()
        ctx.ready.set()
        await brain.run_until(ctx.stop)
    finally:
        await brain.stop()


service = Service(
    name="brain",
    description="job state, optimizer router, optimizers and planner: job topics in, plans out",
    run=run,
)


async def _standalone(settings: Settings, env: str) -> None:
    pg = await resolve_postgres(settings)
    try:
        if await EnvRegistry(settings, pg.dsn).get(env) is None:
            raise UserError(
                f"env {env!r} does not exist; create it with `dlrover-events env create`"
            )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        ctx = ServiceContext(settings, env, pg.dsn, stop=stop)
        await run(ctx)
    finally:
        pg.stop()


def brain(
    env: str = typer.Option(..., "--env", "-e", help="the env whose job topics to decide on"),
) -> None:
    """Run the brain of one env: job topics in, OptimizePlans and ScalePlans out."""
    run_async(_standalone(load_settings(), env))
