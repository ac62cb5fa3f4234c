"""The virtual operator: a simulated cluster answers a virtual env's ScalePlans, so the
brain's loop closes without a cluster (the seed's Virtual Trainer: plan -> simulate ->
persist -> new metrics).

A thin adapter around handlers.simulator.fleet: it reads submissions and plans, applies
each plan_id at most once (the ledger in Postgres), moves the simulated clock and publishes
what the simulated jobs say. It refuses the real env, whose plans must reach real pods, and
imports no Kubernetes client, so it cannot pick up cluster credentials by accident.

The simulated cluster lives in memory and is one per env (a Postgres advisory lock keeps a
second operator of the same env out). Its clock starts at the time of the first input it
reads, so a replay fed at the operator's speed-up lines up with it.

A restart resumes: before the operator publishes anything and before it commits offsets,
it saves one checkpoint (handlers.simulator.checkpoint) in its env's Postgres schema, in
the same transaction as the ledger rows of the plans it applied: the cluster, the lockstep
tick, the input offsets the cluster includes and the events about to be published. A
restarted (or killed) operator restores it, publishes what was not yet published, skips
the inputs already in it and goes on; a plan is applied once, to the job it names.

In lockstep (schemas.lockstep) the clock moves only a tick at a time: after a tick's events
the operator publishes a Barrier to every partition the brain reads, and it applies the
tick's plans, at the tick's end, once the brain's BarrierAck is read on every partition of
the plans topic. The wall clock then plays no part, so the same input gives the same run.

Experiments (docs/experiments.md, Trials in a virtual env): a JobRequest is answered by the
reconciler's rules and its job simulated, a trial along its learning curve (trials.py,
handlers/simulator/trial.py); the searcher's decisions, creations, deletions and holds are
taken at a stop of the clock in one order. Out of wall-clock pace, while an experiment is
active the clock does not move on until the searcher has decided everything it was told
(its checkpoint's offsets cover what the operator published, its outbox is empty) and the
operator has read what it decided: a trial's reports are a function of the decisions it
got, and the searcher's decisions of the reports, whatever the wall clock did.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from dlrover_events.backoff import Backoff
from dlrover_events.bus.consumer import Consumer, Received
from dlrover_events.bus.producer import Producer, event_key
from dlrover_events.bus.topic_reader import TopicReader
from dlrover_events.bus.topics import (
    EXPERIMENTS,
    JOB_EVENTS,
    JOB_METRICS,
    JOB_REQUESTS,
    SCALE_PLANS,
    SCALE_RESULTS,
    TRIAL_DECISIONS,
    check_env_name,
    topic,
    topic_of,
)
from dlrover_events.envs.control import SettingsFollower
from dlrover_events.envs.env_settings import parse_settings
from dlrover_events.envs.registry import EnvRecord, EnvRegistry
from dlrover_events.errors import UserError
from dlrover_events.lifecycle import wait_for_any
from dlrover_events.runtime.metrics import OperatorMetrics
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.runtime.unjournaled import Unjournaled
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from dlrover_events.store.database import connect
from handlers.operator.reconcile import requests
from handlers.operator.reconcile.intake import RequestLedger
from handlers.operator.reconcile.ledger import (
    ALREADY_APPLIED,
    APPLIED_ONCE,
    Answer,
    ClusterCheckpoints,
    PlanLedger,
)
from handlers.operator.virtual import trials
from handlers.operator.virtual.clock import SimClock
from handlers.operator.virtual.settings import VirtualSettings, virtual_settings
from handlers.simulator import checkpoint
from handlers.simulator.checkpoint import CheckpointError, OperatorState, Outgoing
from handlers.simulator.curves import LearningCurve
from handlers.simulator.fleet import VirtualCluster
from handlers.simulator.job import PlanOutcome
from handlers.simulator.lockstep import TickGate
from handlers.simulator.throughput import TraceDataError, pollux_dir
from handlers.simulator.trial import Reporting
from schemas.codec import CodecError, check_env, decode, encode
from schemas.control import EnvAnnouncement, EnvMode
from schemas.env_settings import OperatorSettings
from schemas.envelope import Event
from schemas.experiments import ExperimentSubmitted, TrialDecision
from schemas.jobs import JobEvent, JobSubmitted, RuntimeSample
from schemas.lockstep import Barrier, BarrierAck
from schemas.plans import ScalePlan, ScaleResult, ScaleStatus
from schemas.requests import JobDeletion, JobRequest

log = logging.getLogger(__name__)

GROUP = "operator"
SOURCE = "virtual-operator"

#: Where the searcher's decisions and their effects reach the operator (and experiments,
#: read with them).
SEARCHER_WRITES = (JOB_REQUESTS, TRIAL_DECISIONS, SCALE_PLANS, EXPERIMENTS)
#: The searcher's checkpoint (dlrover_events/store/sql/env/0010): the inputs it decided, by
#: partition, and the events it decided that are not yet known to be published.
_SEARCHER_OFFSETS = "SELECT topic, partition, next_offset FROM searcher_offsets"
_SEARCHER_OUTBOX = "SELECT EXISTS (SELECT 1 FROM searcher_outbox)"
#: Wall seconds between two looks at the searcher's checkpoint while the clock waits.
SEARCHER_POLL_S = (0.005, 0.2)

#: Events the clock makes before publishing them, when it runs as fast as possible.
FAST_BATCH = 500

_RESULT_NAMESPACE = uuid.UUID("9b3e51a2-6d0c-4f8e-b7a1-2c4d6e8f0a13")

#: The topics the brain reads: a lockstep barrier goes to each of their partitions.
BARRIER_TOPICS = (JOB_EVENTS, JOB_METRICS, SCALE_RESULTS)

#: In lockstep each tick waits for the brain; tansu answers a fetch only when its wait is
#: over, so the wait is the floor of a tick's round trip (the brain waits as briefly).
#: Shorter is not faster: at 2 ms on both sides (`bench ab`, one arm) the polls cost more
#: CPU than they saved in waiting, in the one event loop an A/B's arms share.
LOCKSTEP_FETCH_WAIT_MS = 10

#: The producer's linger in lockstep: a tick's flush waits for the broker's acks anyway,
#: so a linger (5 ms by default, for batching) only added to every tick, twice (its events,
#: then its barrier): about a third of a tick's wall, measured by `bench ab`.
LOCKSTEP_LINGER_MS = 0

#: Wall seconds between two log lines of an operator that waits for its brain.
WAITING_LOG_S = 30.0

#: Wall seconds a lockstep tick waits for its acknowledgements before it asks whether the
#: broker lost what the operator published (a broker refilled from `up`'s journal without
#: the last records it acknowledged: the brain never saw the tick, or the operator's
#: acknowledgement was lost the same way and the brain publishes it again).
LOST_CHECK_S = 1.0
#: Tries of that question before a flush gives up (and the operator with it).
LOST_ATTEMPTS = 30
#: A record the broker did not take (away: `up` restarting it) is sent again after this.
PUBLISH_RETRY = Backoff(initial_s=0.2, max_s=5.0)


async def measured_samples(settings: Settings, env: str) -> list[RuntimeSample]:
    """The runtime samples in the env's job.metrics that its simulator did not make: what
    jobs measured in the real env this one is fed from (a replay copies their first
    phase). Read to the end once, before the clock starts, so every job of an untraced
    application finds its samples whichever partition is read first; samples replayed
    into a running operator later are not seen (its jobs fail "not simulable")."""
    samples: list[RuntimeSample] = []
    async with TopicReader(
        settings, [topic(env, JOB_METRICS)], client_id=f"{env}-operator-measured"
    ) as reader:
        while True:
            records = await reader.fetch()
            for record in records:
                try:
                    event = decode(record.value)
                except CodecError:
                    continue  # the brain's dead letters say so; nothing to measure here
                if isinstance(event, RuntimeSample) and event.source != SOURCE:
                    samples.append(event)
            if not records and await reader.caught_up():
                return samples


async def check_virtual(settings: Settings, dsn: str, env: str) -> EnvRecord:
    """The env must exist and be virtual: simulated answers to the real env's plans would
    tell the brain that real jobs had been rescaled when nothing happened."""
    check_env_name(env)
    record = await EnvRegistry(settings, dsn).get(env)
    if record is None:
        raise UserError(f"no env named {env!r}; create it with `dlrover-events env create {env}`")
    if record.mode is not EnvMode.VIRTUAL:
        raise UserError(
            f"env {env!r} is the {record.mode.value} env: the virtual operator runs only in "
            "virtual envs (its simulated cluster would answer for real jobs)"
        )
    return record


#: Options a running virtual operator takes from a change of the env's settings.
LIVE_OPTIONS = ("speed", "fast", "max_sleep")


class VirtualOperator:
    def __init__(
        self,
        settings: Settings,
        env: str,
        dsn: str,
        options: VirtualSettings,
        metrics: OperatorMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.env = env
        self.dsn = dsn
        self.options = options
        self.clock = SimClock(None if options.fast or options.lockstep else options.speed)
        # What a restart must find again (the cluster, the tick, the offsets it includes,
        # the events not yet published): saved before anything is published or committed.
        self.state = OperatorState()
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        # The state changed since it was last saved.
        self._dirty = False
        # Answers to plans applied since the last save: their ledger rows go with it.
        self._pending: dict[str, tuple[ScalePlan, Answer]] = {}
        self._producer: Producer | None = None
        self._ledger: PlanLedger | None = None
        self._checkpoints: ClusterCheckpoints | None = None
        self._db: Any = None
        #: plans answered by status, and how long from reading each to its result
        self.metrics = metrics
        # When each plan (by event id) was read, and the answers awaiting publication.
        self._read_at: dict[uuid.UUID, float] = {}
        # What the env's jobs measured in their real env (see measured_samples).
        self._measured: list[RuntimeSample] = []
        self._answered: list[tuple[str, float]] = []
        # The saved checkpoint's outbox being marked published, awaited before the next
        # save (which must not be overtaken by it) rather than before going on.
        self._marking: asyncio.Task[None] | None = None
        # What the simulated trials measure (the env's operator.trials.curves), loaded at
        # start, and how often they report.
        self._curve: LearningCurve | None = None
        self._reporting = Reporting(
            validate_every=options.trials.validate_every, train_every=options.trials.train_every
        )
        # Answers to job requests and deletions given since the last save: their ledger
        # rows go with it.
        self._request_answers: dict[str, tuple[JobRequest | JobDeletion, requests.Answer]] = {}
        # Something the searcher has to decide on (or the operator to take) since the
        # searcher was last found idle: the clock waits for it before it moves on.
        self._unsettled = False
        # Counts of the searcher's inputs taken and of events published to it: a round of
        # waiting that changes neither ends the wait.
        self._taken = 0
        self._told = 0
        # Reads the searcher's outputs to their end once it is idle (made at first use).
        self._reader: TopicReader | None = None
        self._requests: RequestLedger | None = None
        # What the broker acknowledged and its journal has not copied yet: published again
        # if the broker loses it (dlrover_events.runtime.unjournaled).
        self._unjournaled: Unjournaled | None = None
        # The partitions of the topics a barrier goes to, asked once.
        self._topic_partitions: dict[str, list[int]] = {}

    def take_settings(self, options: VirtualSettings, version: int) -> None:
        """A newer version of the env's settings, while it runs: the pace (`speed`,
        `fast`, `max_sleep`) is taken at once, the simulated time going on from where it
        is. The rest made the simulated cluster (its shape, admission, job model,
        lockstep): it keeps them, as its checkpoint does across restarts; a new env
        takes them."""
        kept = sorted(
            name
            for name in OperatorSettings.model_fields
            if name not in LIVE_OPTIONS and getattr(options, name) != getattr(self.options, name)
        )
        if kept:
            log.warning(
                "env %s: settings version %d: the simulated cluster keeps its %s (fixed "
                "when it was made; an env created with them takes them)",
                self.env,
                version,
                ", ".join(f"operator.{name}" for name in kept),
            )
        pace = {name: getattr(options, name) for name in LIVE_OPTIONS}
        if all(getattr(self.options, k) == v for k, v in pace.items()):
            return
        self.options = self.options.model_copy(update=pace)
        if not self.options.lockstep:
            self._pace(None if self.options.fast else self.options.speed)
        log.warning(
            "env %s: settings version %d: the simulated cluster runs %s from now on",
            self.env,
            version,
            "as fast as possible" if self.options.fast else f"at {self.options.speed:g}x",
        )
        self._wake.set()

    def _pace(self, speed: float | None) -> None:
        """The clock at a new pace, going on from the simulated time it is."""
        fleet = self.state.fleet
        now = self.clock.now()
        if now is None and fleet is not None and fleet.started:
            now = fleet.clock
        self.clock = SimClock(speed)
        if now is not None:
            self.clock.start(now)

    @property
    def fleet(self) -> VirtualCluster | None:
        return self.state.fleet

    @property
    def gate(self) -> TickGate | None:
        return self.state.gate

    async def run(self, stop: asyncio.Event, ready: asyncio.Event | None = None) -> None:
        """Serve until ``stop`` is set; a precondition that fails is a UserError."""
        await check_virtual(self.settings, self.dsn, self.env)
        try:
            pollux_dir()
        except TraceDataError as e:
            raise UserError(str(e)) from None
        holder = await connect(self.dsn)
        try:
            await self._lock_env(holder)
            store = await EnvStore.open(self.dsn, self.env, max_size=2)
            # One connection held for the operator's life: its queries run one at a time
            # (under its lock), and a pool's connection is reset on every release, a round
            # trip more per save, mark and lookup (a lockstep tick makes several).
            conn = await store.pool.acquire()
            try:
                self._db = conn
                # (they query with fetchrow, fetchval and execute, which a connection has)
                self._ledger = PlanLedger(conn)
                self._checkpoints = ClusterCheckpoints(conn)
                self._requests = RequestLedger(conn)
                self._unjournaled = Unjournaled(self._db, self.settings)
                self._curve = await trials.load_curve(self.options.trials.curves, self.dsn)
                await self._restore()
                self._measured = await measured_samples(self.settings, self.env)
                if self._measured:
                    log.warning(
                        "env %s: %d measured sample(s) of %d job(s): a job whose "
                        "application has no traces is simulated from its own",
                        self.env,
                        len(self._measured),
                        len({s.job.uuid for s in self._measured}),
                    )
                if self.state.fleet is not None:
                    self.state.fleet.measured(self._measured)
                consumer = Consumer(
                    self.settings,
                    self.env,
                    [JOB_EVENTS, SCALE_PLANS, JOB_REQUESTS, EXPERIMENTS, TRIAL_DECISIONS],
                    GROUP,
                    self._handle,
                    fetch_max_wait_ms=LOCKSTEP_FETCH_WAIT_MS if self.options.lockstep else 500,
                )
                linger = {"linger_ms": LOCKSTEP_LINGER_MS} if self.options.lockstep else {}
                async with Producer(self.settings, **linger) as producer, consumer:
                    self._producer = producer
                    if self.options.lockstep and self.state.gate is None:
                        plans = await producer.partitions(topic(self.env, SCALE_PLANS))
                        self.state.gate = TickGate.over(plans)
                    async with self._lock:
                        await self._resume_held_plans()
                        await self._flush()  # what the last run had not published
                    if ready is not None:
                        ready.set()
                    await self._serve(consumer, stop)
            finally:
                with contextlib.suppress(Exception):  # (unmarked: published again at start)
                    await self._marked()
                if self._reader is not None:
                    with contextlib.suppress(Exception):
                        await self._reader.stop()
                await store.pool.release(conn)
                await store.close()
        finally:
            await holder.close()  # and with it the advisory lock

    async def _lock_env(self, holder: Any) -> None:
        taken = await holder.fetchval(
            "SELECT pg_try_advisory_lock(hashtextextended($1, 0))",
            f"dlrover-events/operator/{self.env}",
        )
        if not taken:
            raise UserError(
                f"another operator already runs env {self.env!r}; an env has one simulated "
                "cluster, so stop that one first"
            )

    # -- checkpoints ----------------------------------------------------------------------

    async def _restore(self) -> None:
        """Go on from the env's checkpoint, if there is one."""
        assert self._checkpoints is not None
        saved = await self._checkpoints.load()
        if saved is None:
            if self.options.lockstep:
                self.state.ticks = checkpoint.tick_clock_for(None, self.options.tick_seconds)
            return
        data, published = saved
        try:
            state = checkpoint.load(
                data,
                source=SOURCE,
                published=published,
                curve=self._curve,
                reporting=self._reporting,
            )
        except CheckpointError as e:
            raise UserError(
                f"env {self.env!r}: the simulated cluster's checkpoint cannot be restored ({e})"
            ) from None
        except TraceDataError as e:
            raise UserError(f"env {self.env!r}: a job of its simulated cluster: {e}") from None
        if state.fleet is not None and (
            differs := checkpoint.shape_differs(state.fleet, self.options.cluster())
        ):
            log.warning(
                "env %s: the restored simulated cluster keeps its shape, %s: its jobs hold "
                "pods on its nodes",
                self.env,
                differs,
            )
        if state.fleet is not None and state.fleet.admission != self.options.admission:
            log.warning(
                "env %s: the restored simulated cluster keeps its admission, %s (asked: %s): "
                "its jobs were started under it",
                self.env,
                state.fleet.admission,
                self.options.admission,
            )
        if self.options.lockstep and state.ticks is None:
            state.ticks = checkpoint.tick_clock_for(state.fleet, self.options.tick_seconds)
        elif not self.options.lockstep:
            state.ticks = None  # its gate's held plans are applied at once (see run)
        self.state = state
        if state.fleet is not None and state.fleet.started:
            self.clock.start(state.fleet.clock)
        figures = checkpoint.summary(state)
        log.warning(
            "env %s: simulated cluster restored: %d job(s), clock at %.0f s, tick %s, "
            "%d event(s) to publish again",
            self.env,
            figures["jobs"],
            figures["clock_s"],
            figures["tick"],
            figures["unpublished"],
        )

    async def _resume_held_plans(self) -> None:
        """Plans a lockstep gate held when the operator stopped, for an operator that now
        runs out of lockstep: they were read (and committed), so they are applied now."""
        if self.options.lockstep or self.state.gate is None:
            return
        plans = checkpoint.held_plans(self.state.gate)
        self.state.gate = None
        self._dirty = True
        for plan in plans:
            await self._apply(self._catch_up(plan), plan)

    async def _save(self) -> None:
        """Make the state durable with the ledger rows of the plans it applied, in one
        transaction: neither without the other."""
        assert self._ledger is not None
        assert self._checkpoints is not None
        await self._marked()
        data = checkpoint.dump(self.state)
        async with self._db.transaction():
            # By plan id, the order the brain records plans in too: two transactions
            # writing the same rows in different orders would deadlock each other.
            for plan, answer in sorted(self._pending.values(), key=lambda pa: pa[0].plan_id):
                recorded = await self._ledger.record(
                    plan, answer.status, answer.reason, answer.not_applied, conn=self._db
                )
                if not recorded:
                    log.warning("plan %s was already in the ledger as applied", plan.plan_id)
            assert self._requests is not None
            for request, given in sorted(
                self._request_answers.values(), key=lambda ra: ra[0].request_id
            ):
                await self._requests.record(request, given)
            await self._checkpoints.save(self._db, data, published=not self.state.outbox)
        self._pending.clear()
        self._request_answers.clear()
        self._dirty = False

    async def _flush(self, during: str = "") -> None:
        """Save, then publish what the state says is still to publish, in order.

        ``during``: the prefix of the phases it is timed under (``input_`` while handling
        what the consumer read, which a lockstep tick may be waiting for)."""
        if self._dirty or self._pending or self._request_answers or self.state.outbox:
            started = time.monotonic()
            await self._save()
            self._spent(f"{during}checkpoint", started)
        if not self.state.outbox:
            return
        assert self._producer is not None
        assert self._checkpoints is not None
        await self._republish_lost()  # before anything new, so it lands where it was
        started = time.monotonic()
        outbox = self.state.outbox
        plain: list[Event] = []
        for item in outbox:
            if not item.broadcast:
                plain.append(item.event)
                continue
            await self._publish(plain)  # before the barrier that follows them
            plain = []
            await self._broadcast(item.event, item.broadcast)
        await self._publish(plain)
        self.state.outbox = []
        now = time.monotonic()
        self._spent(f"{during}publish", started, now)
        if self.metrics is not None:
            for status, read_at in self._answered:
                self.metrics.answered(status, now - read_at)
        self._answered.clear()
        # Whatever follows the last barrier waits for the next one.
        self.state.unbarriered = not outbox[-1].broadcast
        # Marked while the operator goes on (a tick waits for its brain meanwhile): until
        # it is, a restart publishes the outbox again, as it would after a crash between
        # publishing and marking; the events keep their ids.
        self._marking = asyncio.create_task(
            self._mark_published(during), name=f"{self.env}.operator.mark"
        )

    async def _publish(self, events: list[Event]) -> None:
        """Publish, pipelined, and note where what the searcher reads landed: the offsets
        it must have decided before the clock moves on."""
        records: list[tuple[Any, ...]] = [(topic_of(e), encode(e), event_key(e)) for e in events]
        if not records:
            return
        metas = await self._send_all(records)
        for event, meta in zip(events, metas, strict=True):
            if trials.searcher_decides_on(event):
                key = (meta.topic, meta.partition)
                self.state.said[key] = max(self.state.said.get(key, 0), meta.offset + 1)
                self._told += 1

    async def _broadcast(self, event: Event, topics: Iterable[str]) -> None:
        """One event to every partition of each topic (a lockstep barrier)."""
        value = encode(event)
        records: list[tuple[Any, ...]] = [
            (name, value, None, part) for name in topics for part in await self._partitions(name)
        ]
        await self._send_all(records)

    async def _partitions(self, name: str) -> list[int]:
        """A topic's partitions (its count never changes: asked once, while the broker
        answers)."""
        assert self._producer is not None
        attempt = 0
        while name not in self._topic_partitions:
            try:
                self._topic_partitions[name] = await self._producer.partitions(name)
            except KafkaError as err:
                attempt += 1
                self._say_not_sent(attempt, 1, err)
                await asyncio.sleep(PUBLISH_RETRY.delay(attempt))
        return self._topic_partitions[name]

    async def _send_all(self, records: list[tuple[Any, ...]]) -> list[Any]:
        """Each record (topic, value, key[, partition]) until the broker has it, pipelined;
        their metadata, in order. One the broker did not take (away: `up` restarts it,
        longer than a request's timeout on a loaded machine) is sent again, alone of its
        batch, until it goes through: the operator waits for its broker rather than end
        (a stop cancels the wait)."""
        assert self._producer is not None
        metas: list[Any] = [None] * len(records)
        todo = list(range(len(records)))
        attempt = 0
        while todo:
            futures: list[asyncio.Future[Any]] = []
            why: BaseException | None = None
            for i in todo:
                try:
                    futures.append(await self._producer.enqueue(*records[i]))
                except KafkaError as err:  # no metadata: the broker away
                    why = err
                    break
            results = await asyncio.gather(*futures, return_exceptions=True)
            failed = todo[len(futures) :]
            for i, result in zip(todo, results, strict=False):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                if isinstance(result, KafkaError):
                    failed.append(i)
                    why = result
                elif isinstance(result, BaseException):
                    raise result
                else:
                    metas[i] = result
            todo = sorted(failed)
            if todo:
                attempt += 1
                self._say_not_sent(attempt, len(todo), why)
                await asyncio.sleep(PUBLISH_RETRY.delay(attempt))
        self._note(records, metas)
        return metas

    def _say_not_sent(self, attempt: int, count: int, why: BaseException | None) -> None:
        if attempt == 1 or attempt % 10 == 0:
            log.warning(
                "env %s: the broker did not take %d record(s) (attempt %d: %s: %s); sending "
                "them again",
                self.env,
                count,
                attempt,
                type(why).__name__,
                why,
            )

    def _note(self, records: Iterable[tuple[Any, ...]], metas: Iterable[Any]) -> None:
        """What the broker acknowledged, kept until its journal has it."""
        if self._unjournaled is not None:
            for (_, value, key, *_), meta in zip(records, metas, strict=True):
                self._unjournaled.note(meta.topic, meta.partition, meta.offset, key, value)

    async def _republish_lost(self) -> None:
        """Publish again, first, what the broker acknowledged and then lost (refilled from
        `up`'s journal without its last records): into partitions only the operator
        writes, it lands at the offsets it had, so what the brain read of them stays
        true, and a tick whose barrier or events were lost is seen. Under the lock."""
        if self._unjournaled is None or self._producer is None:
            return
        await self._marked()  # (one connection: one query at a time)
        for attempt in range(1, LOST_ATTEMPTS + 1):
            try:
                lost = await self._unjournaled.lost()
                break
            except Exception as err:  # Postgres, or a broker that died again meanwhile
                log.warning(
                    "env %s: could not ask whether the broker lost records (attempt %d of "
                    "%d): %s: %s",
                    self.env,
                    attempt,
                    LOST_ATTEMPTS,
                    type(err).__name__,
                    err,
                )
                if attempt == LOST_ATTEMPTS:
                    raise
                await asyncio.sleep(LOST_CHECK_S)
        if not lost:
            return
        records: list[tuple[Any, ...]] = [(s.topic, s.value, s.key, s.partition) for s in lost]
        metas = await self._send_all(records)
        moved = sum(meta.offset != s.offset for s, meta in zip(lost, metas, strict=True))
        log.warning(
            "env %s: the broker lost %d record(s) it had acknowledged (refilled from its "
            "journal without them): published again, %s",
            self.env,
            len(lost),
            f"{moved} of them at other offsets" if moved else "at their offsets",
        )

    async def _mark_published(self, during: str) -> None:
        assert self._checkpoints is not None
        started = time.monotonic()
        await self._checkpoints.mark_published()
        self._spent(f"{during}mark_published", started)

    async def _marked(self) -> None:
        """Wait for the last mark: a save must not be overwritten by an earlier mark."""
        marking, self._marking = self._marking, None
        if marking is not None:
            await marking

    def _spent(self, phase: str, started: float, now: float | None = None) -> None:
        """Wall seconds of a phase since ``started``, in the metrics (`bench ab` splits a
        lockstep tick's wall time with them)."""
        if self.metrics is not None:
            self.metrics.spent(phase, (time.monotonic() if now is None else now) - started)

    def _say(self, events: Iterable[Event]) -> None:
        """To publish, in order; with whatever the trials reported meanwhile (they go on
        another topic, so after the job events of the same moves). Something the searcher
        decides on makes the clock wait for it."""
        said = list(events)
        fleet = self.state.fleet
        if fleet is not None:
            said.extend(fleet.take_reports())
        self.state.outbox.extend(Outgoing(e) for e in said)
        if any(trials.searcher_decides_on(e) for e in said):
            self._unsettled = True  # (a report, an answer, a trial's end)
        self._dirty = True

    async def _serve(self, consumer: Consumer, stop: asyncio.Event) -> None:
        clock = self._tick(stop) if not self.options.lockstep else self._lockstep(stop)
        tasks = [
            asyncio.create_task(self._consume(consumer, stop), name=f"{self.env}.operator.consume"),
            asyncio.create_task(clock, name=f"{self.env}.operator.clock"),
        ]
        try:
            await wait_for_any([stop], tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in tasks:
            if not task.cancelled() and (err := task.exception()) is not None:
                raise err

    async def _consume(self, consumer: Consumer, stop: asyncio.Event) -> None:
        while not stop.is_set():
            read = await consumer.poll(timeout_ms=500)
            if read == 0 and self.fleet is not None and not self.fleet.started:
                # The backlog is read: start the clock at its earliest submission.
                async with self._lock:
                    self._start_clock()
                    await self._flush()
                self._wake.set()

    # -- inputs ---------------------------------------------------------------------------

    async def _handle(self, batch: list[Received]) -> None:
        async with self._lock:
            await self._flush("input_")
            state = self.state
            # Records below the checkpoint's offsets are in the state already: read again
            # after a restart that came before the consumer's commit.
            fresh = [r for r in batch if state.fresh(r.topic, r.partition, r.offset)]
            # A backlog read after a restart may hold a job's plan in the same batch as its
            # submission: the job comes first. Other job events (ours included, and our
            # barriers) are not inputs. The sort is stable: a partition keeps its order, so
            # a plan read before its partition's acknowledgement belongs to that tick.
            read_at = time.monotonic()
            for item in sorted(fresh, key=lambda r: not isinstance(r.event, JobSubmitted)):
                event = item.event
                if isinstance(event, ScalePlan):
                    self._read_at[event.event_id] = read_at
                if isinstance(event, JobRequest):
                    self._catch_up(event)
                    await self._request(event)
                elif trials.is_searchers(event):
                    # taken at the clock's next stop, with the others, in one order
                    self._catch_up(event)
                    state.pending.append(event)
                    self._taken += 1
                    self._unsettled = True
                    self._dirty = True
                elif isinstance(event, ExperimentSubmitted):
                    self._catch_up(event).experiment(event)
                    self._taken += 1
                    self._unsettled = True
                    self._dirty = True
                elif isinstance(event, JobSubmitted):
                    fleet = self._catch_up(event)
                    known = fleet.job(event.job.uuid) is not None
                    self._say(fleet.submit(event))
                    if not known and fleet.job(event.job.uuid) is not None:
                        self._announce_arrival()
                elif isinstance(event, ScalePlan) and state.gate is not None:
                    state.gate.plan(item.partition, event)  # applied at its tick's end
                    self._dirty = True
                elif isinstance(event, ScalePlan):
                    await self._apply(self._catch_up(event), event)
                elif isinstance(event, BarrierAck) and state.gate is not None:
                    state.gate.ack(item.partition, event.tick)
                    self._dirty = True
            for item in fresh:
                state.consumed(item.topic, item.partition, item.offset)
            await self._flush("input_")
        self._wake.set()

    # -- experiments ----------------------------------------------------------------------

    async def _earlier(self, request_id: str) -> requests.Answer | None:
        """The answer a request (or deletion) of this id got, if it got one."""
        assert self._requests is not None
        given = self._request_answers.get(request_id)
        if given is not None:
            return given[1]
        await self._marked()  # (one connection: one query at a time)
        return await self._requests.answer(request_id)

    def _say_answer(self, request: JobRequest | JobDeletion, answer: requests.Answer) -> None:
        if answer.status in requests.FINAL:
            self._request_answers[request.request_id] = (request, answer)
        self._unsettled = True  # the searcher reads the answer
        log.info(
            "env %s: job %s %s for %s from %s %s: %s",
            self.env,
            "deletion" if isinstance(request, JobDeletion) else "request",
            request.request_id,
            request.name,
            request.source,
            answer.status.value,
            answer.reason,
        )
        self._say([requests.result(self.env, request, answer, SOURCE)])

    async def _request(self, request: JobRequest) -> None:
        """Answer a request now, by the reconciler's rules (a request delivered again gets
        its first answer again); a job it creates joins the simulated cluster at the
        clock's next stop, with the searcher's other inputs."""
        earlier = await self._earlier(request.request_id)
        if earlier is not None:
            self._say_answer(request, earlier.repeated())
            return
        existing = trials.existing_job(self.env, self.state.fleet, request.name, self.state.pending)
        made = trials.decide_request(self.env, request, existing)
        if isinstance(made, trials.Creation):
            self.state.pending.append(request)
            self._taken += 1
            self._unsettled = True
            self._say_answer(request, made.answer)
        else:
            self._say_answer(request, made)

    async def _take_pending(self) -> None:
        """Take the searcher's inputs read so far, in one order (trials.canonical): the
        clock stands still meanwhile, so the cluster does the same whatever order they
        were read in."""
        fleet = self.state.fleet
        if not self.state.pending or fleet is None or not fleet.started:
            return
        pending, self.state.pending = trials.canonical(self.state.pending), []
        self._dirty = True
        for event in pending:
            if isinstance(event, JobRequest):
                made = trials.decide_request(self.env, event, None)
                assert isinstance(made, trials.Creation)  # (it was answered created)
                submitted = trials.submission(
                    self.env, made, fleet, self.options.trials.application, SOURCE
                )
                self._say([submitted])
                self._say(fleet.request(submitted, made.document, made.trial))
            elif isinstance(event, TrialDecision):
                self._say(fleet.decide(event))
            elif isinstance(event, ScalePlan):
                await self._apply(fleet, event)
            elif isinstance(event, JobDeletion):
                await self._delete(fleet, event)

    async def _delete(self, fleet: VirtualCluster, deletion: JobDeletion) -> None:
        earlier = await self._earlier(deletion.request_id)
        if earlier is not None:
            self._say_answer(deletion, earlier.repeated())
            return
        answer = trials.decide_deletion(
            deletion, trials.existing_job(self.env, fleet, deletion.name)
        )
        if answer.status is requests.JobRequestStatus.DELETED:
            self._say(fleet.delete(deletion.name))
        self._say_answer(deletion, answer)

    def _waits_for_searcher(self) -> bool:
        """Whether the clock must wait for the searcher before it moves on: out of
        wall-clock pace, an experiment active, and something said or read since the
        searcher was last found idle."""
        fleet = self.state.fleet
        return (
            self._unsettled
            and self.options.trials.wait_for_searcher
            and (self.clock.fast or self.options.lockstep)
            and fleet is not None
            and bool(fleet.active_experiments())
        )

    async def _settle(self, stop: asyncio.Event) -> None:
        """Wait until the searcher has decided everything it was told and the operator has
        read everything it decided (rounds, until a round reads and says nothing new)."""
        while not stop.is_set():
            async with self._lock:
                await self._flush()
                wanted = self._told_offsets()
                before = (self._taken, self._told)
            if not await self._searcher_covers(wanted, stop):
                return
            await self._read_searcher()
            async with self._lock:
                await self._flush()
                if (self._taken, self._told) == before:
                    self._unsettled = False
                    return

    def _told_offsets(self) -> dict[tuple[str, int], int]:
        """What the searcher must have decided: every record published where it reads, and
        every experiment record the operator read."""
        wanted = dict(self.state.said)
        experiments = topic(self.env, EXPERIMENTS)
        for (name, partition), offset in self.state.offsets.items():
            if name == experiments:
                wanted[(name, partition)] = offset
        return wanted

    async def _searcher_covers(
        self, wanted: Mapping[tuple[str, int], int], stop: asyncio.Event
    ) -> bool:
        """Wait until the searcher's checkpoint covers ``wanted`` and its outbox is empty
        (everything it decided is on the bus); False if stopped first."""
        prefix = f"{self.env}."
        pause, longest = SEARCHER_POLL_S
        waited_since = time.monotonic()
        said_at = waited_since
        while not stop.is_set():
            async with self._lock:
                await self._marked()  # (one connection: one query at a time)
                rows = await self._db.fetch(_SEARCHER_OFFSETS)
                busy = bool(await self._db.fetchval(_SEARCHER_OUTBOX))
            have: dict[tuple[str, int], int] = {}
            for row in rows:
                full = row["topic"] if row["topic"].startswith(prefix) else prefix + row["topic"]
                have[(full, row["partition"])] = row["next_offset"]
            behind = {k: v for k, v in wanted.items() if have.get(k, 0) < v}
            if not behind and not busy:
                return True
            now = time.monotonic()
            if now - said_at > WAITING_LOG_S:
                said_at = now
                log.warning(
                    "env %s: the simulated clock waits %.0f s for the searcher: it has not "
                    "decided %s%s (is `dlrover-events searcher --env %s` running?)",
                    self.env,
                    now - waited_since,
                    ", ".join(f"{t}[{p}] to {o}" for (t, p), o in sorted(behind.items()))
                    or "nothing",
                    "; its outbox is not yet published" if busy else "",
                    self.env,
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), pause)
            pause = min(pause * 2, longest)
        return False

    async def _read_searcher(self) -> None:
        """Read what the searcher published to its end (it is all on the bus: its outbox
        is empty), from where the operator stands on each partition, and take it as the
        consumer would have."""
        names = [topic(self.env, name) for name in SEARCHER_WRITES]
        if self._reader is None:
            reader = TopicReader(
                self.settings,
                names,
                client_id=f"{self.env}-operator-searcher",
                require=False,
                fetch_max_wait_ms=LOCKSTEP_FETCH_WAIT_MS,
            )
            await reader.start()
            self._reader = reader
        reader = self._reader
        await reader.refresh()
        async with self._lock:
            at = {TopicPartition(t, p): o for (t, p), o in self.state.offsets.items() if t in names}
        await reader.seek(at)
        records = await reader.read_to_end()
        batch: list[Received] = []
        for r in records:
            try:
                event = check_env(decode(r.value), self.env, r.topic)
            except CodecError:
                continue  # the consumer dead-letters it
            batch.append(Received(event, r.topic, r.partition, r.offset, r.timestamp))
        if batch:
            await self._handle(batch)

    def _catch_up(self, event: Event) -> VirtualCluster:
        """The fleet at the current simulated time, made at the first input.

        Its clock starts once the backlog is read (or when a plan must be applied), at the
        earliest submission: the origin does not depend on which partition is read first.
        """
        if self.state.fleet is None:
            self.state.fleet = VirtualCluster(
                self.options.cluster(),
                origin=None,
                restart_delay=self.options.restart_delay,
                in_place_delay=self.options.in_place_seconds,
                sample_interval=self.options.sample_interval,
                source=SOURCE,
                admission=self.options.admission,
                curve=self._curve,
                reporting=self._reporting,
            )
            self.state.fleet.measured(self._measured)
            self._dirty = True
        fleet = self.state.fleet
        if not fleet.started:
            if isinstance(event, ScalePlan):
                self._start_clock(event.occurred_at)
        elif (now := self.clock.now()) is not None:
            self._say(fleet.advance_to(now))
        return fleet

    def _start_clock(self, origin: datetime | None = None) -> None:
        assert self.state.fleet is not None
        self._say(self.state.fleet.start(origin))
        if self.state.fleet.jobs():
            self._announce_arrival()
        self.clock.start(0.0)

    def _announce_arrival(self) -> None:
        """A job arrived now. Under the brain's admission that makes no event (nothing
        starts), yet only the brain can start the job, and in lockstep it decides at a
        barrier: one must follow, as it follows events, or both sides would wait."""
        fleet = self.state.fleet
        if self.options.lockstep and fleet is not None and fleet.admission == "brain":
            self.state.unbarriered = True
            self._dirty = True

    async def _apply(self, fleet: VirtualCluster, plan: ScalePlan) -> None:
        """Apply the plan once and answer it: a plan delivered again after it applied gets
        its first answer again (a partial one with its parts), saying it is a repeat."""
        assert self._ledger is not None
        await self._marked()  # (one connection: one query at a time)
        pending = self._pending.get(plan.plan_id)
        earlier = pending[1] if pending is not None else await self._ledger.answer(plan.plan_id)
        if earlier is not None and earlier.status in APPLIED_ONCE:
            answer = earlier.repeated()
        else:
            try:
                outcome = fleet.apply(plan)
            except Exception as e:
                # A simulator bug must give a failed result, not a consumer that crash-loops.
                log.exception("plan %s of job %s", plan.plan_id, plan.job.uuid)
                outcome = PlanOutcome(ScaleStatus.FAILED, f"simulator error: {e!r}")
            self._say(outcome.events)
            answer = Answer(outcome.status, outcome.reason, outcome.not_applied)
            self._pending[plan.plan_id] = (plan, answer)
        status, reason = answer.status, answer.reason
        # (a plan held by a restored lockstep gate counts from now)
        self._answered.append((status.value, self._read_at.pop(plan.event_id, time.monotonic())))
        self._say(
            [
                ScaleResult(
                    env=self.env,
                    job=plan.job,
                    source=SOURCE,
                    # The same delivery answered the same way keeps its id (re-processing
                    # after a crash duplicates nothing downstream); a different answer is a
                    # new fact.
                    event_id=uuid.uuid5(
                        _RESULT_NAMESPACE, f"{self.env}/{plan.event_id}/{status.value}/{reason}"
                    ),
                    occurred_at=fleet.at(),
                    plan_id=plan.plan_id,
                    status=status,
                    reason=reason,
                    observed=fleet.observed(plan.job.uuid),
                    not_applied=list(answer.not_applied),
                )
            ]
        )

    # -- time -----------------------------------------------------------------------------

    async def _tick(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if self._waits_for_searcher():
                await self._settle(stop)
                continue  # (the searcher may have said more meanwhile)
            async with self._lock:
                await self._take_pending()
                # what taking them said (a trial's end, an answer) is decided first
                moved = False if self._waits_for_searcher() else self._advance()
                await self._flush()
            await self._sleep(self._pause(moved))

    def _advance(self) -> bool:
        fleet = self.state.fleet
        if fleet is None:
            return False
        now = self.clock.now()
        if now is not None:
            self._say_if_any(fleet.advance_to(now))
            return True
        # As fast as possible: several jumps per broker round trip, or the round trips
        # would set the pace; inputs wait at most one batch.
        moved = False
        while len(self.state.outbox) < FAST_BATCH and (events := fleet.step()) is not None:
            self._say_if_any(events)
            moved = True
            if self._waits_for_searcher():
                break  # a trial reported: the searcher decides before the clock goes on
        return moved

    def _say_if_any(self, events: list[JobEvent]) -> None:
        """Events of the clock moving; a move that says nothing need not be saved (a
        restart redoes it from the last checkpoint, the same way). A trial's report is
        something to say."""
        fleet = self.state.fleet
        if events or (fleet is not None and fleet.has_reports):
            self._say(events)

    def _pause(self, moved: bool) -> float:
        """Wall seconds until the clock has something to do; inputs cut the wait short."""
        longest = self.options.max_sleep
        fleet = self.state.fleet
        if fleet is None:
            return longest
        if (self.state.pending and fleet.started) or self._waits_for_searcher():
            return 0.0  # the searcher's inputs wait to be taken, or it has to decide
        if self.clock.fast:
            return 0.0 if moved else longest
        upcoming, now = fleet.next_event_at(), self.clock.now()
        if upcoming is None or now is None:
            return longest
        return min(longest, max(0.001, self.clock.wall_seconds(upcoming - now)))

    # -- lockstep -------------------------------------------------------------------------

    async def _lockstep(self, stop: asyncio.Event) -> None:
        """Tick, barrier, wait for every acknowledgement, apply the tick's plans; again.

        A restarted operator whose tick's barrier was out already waits for that tick's
        acknowledgements instead of running another."""
        gate = self.state.gate
        assert gate is not None
        while not stop.is_set():
            if not gate.barrier_out and self._waits_for_searcher():
                await self._settle(stop)  # between ticks: the searcher decides first
                continue
            async with self._lock:
                if not gate.barrier_out:
                    await self._take_pending()
                    if self._waits_for_searcher():
                        await self._flush()
                        continue  # what taking them said is decided before the tick
                tick = gate.open_tick if gate.barrier_out else await self._run_tick()
            if tick is None:
                await self._until(self._has_work, None)  # idle until an input arrives
                continue
            started = time.monotonic()
            await self._until(lambda: gate.due, tick)
            self._spent("wait_acks", started)
            async with self._lock:
                fleet = self.state.fleet
                assert fleet is not None
                plans = gate.take()
                self._dirty = True
                started = time.monotonic()
                for plan in plans:
                    await self._apply(fleet, plan)
                self._spent("apply", started)
                # Their results are flushed with the next tick (saved and published before
                # its events and barrier, as they belong to it), not in a round trip of
                # their own; an input handled meanwhile flushes them first.

    def _has_work(self) -> bool:
        fleet, gate = self.state.fleet, self.state.gate
        if fleet is None or not fleet.started or gate is None:
            return False
        return (
            fleet.next_event_at() is not None
            or self._unbarriered()
            or gate.holding
            or bool(self.state.pending)
            or self._waits_for_searcher()
        )

    def _unbarriered(self) -> bool:
        """Something said or to say waits for a barrier: what was published last was not
        one, or the outbox (results not flushed yet) ends with something else."""
        outbox = self.state.outbox
        return not outbox[-1].broadcast if outbox else self.state.unbarriered

    async def _run_tick(self) -> int | None:
        """One tick of the fleet, its events, then its barrier on every partition."""
        ticks, gate, fleet = self.state.ticks, self.state.gate, self.state.fleet
        assert ticks is not None
        assert gate is not None
        if not self._has_work():
            await self._flush()  # what the last tick's plans said, if anything
            return None
        assert fleet is not None
        carrying = self._unbarriered() or gate.holding
        started = time.monotonic()
        tick = ticks.run(fleet, carrying=carrying)
        self._spent("simulate", started)
        if tick is None:
            await self._flush()
            return None
        if self.metrics is not None:
            self.metrics.ticks.inc()
        self._say(tick.events)
        barrier = Barrier(
            env=self.env,
            source=SOURCE,
            # One id per tick: a re-published barrier duplicates nothing downstream.
            event_id=uuid.uuid5(_RESULT_NAMESPACE, f"{self.env}/barrier/{tick.number}"),
            occurred_at=tick.at,
            tick=tick.number,
            sim_at=tick.at,
        )
        self.state.outbox.append(
            Outgoing(barrier, tuple(topic(self.env, name) for name in BARRIER_TOPICS))
        )
        gate.barrier(tick.number)
        await self._flush()
        return tick.number

    async def _until(self, ready: Callable[[], bool], tick: int | None) -> None:
        """Wait (on inputs, not by polling) until ``ready()``; a tick that waits for its
        brain asks every `LOST_CHECK_S` whether the broker lost what it published, and
        says now and then that it waits (the brain may have stopped)."""
        said = checked = time.monotonic()
        while True:
            self._wake.clear()
            if ready():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._wake.wait(), WAITING_LOG_S if tick is None else LOST_CHECK_S
                )
            if tick is None:
                continue
            if time.monotonic() - checked >= LOST_CHECK_S:
                async with self._lock:
                    with contextlib.suppress(Exception):  # (said; asked again)
                        await self._republish_lost()
                checked = time.monotonic()
            if time.monotonic() - said < WAITING_LOG_S:
                continue
            said = time.monotonic()
            gate = self.state.gate
            if gate is not None:
                log.warning(
                    "env %s: tick %d waits for the brain's BarrierAck on %s partition(s) %s",
                    self.env,
                    tick,
                    SCALE_PLANS,
                    gate.waiting_on,
                )

    async def _sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)  # let the consumer take the lock between jumps
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)
        self._wake.clear()


async def run(ctx: ServiceContext, options: Mapping[str, Any]) -> None:
    """Entry of the mode dispatch (modes.run_operator) for virtual envs.

    The env's own settings (``operator:`` in the registry, e.g. an A/B arm's cluster and
    speed) come first; options given on the command line override them. The settings are
    followed while it runs: a newer version's pace is taken at once (`take_settings`).
    """
    record = await check_virtual(ctx.settings, ctx.pg_dsn, ctx.env)
    try:
        from_env = _operator_settings(record.settings)
    except UserError as e:
        raise UserError(f"env {ctx.env!r}: {e}") from None
    operator = VirtualOperator(
        ctx.settings,
        ctx.env,
        ctx.pg_dsn,
        virtual_settings({**from_env, **options}),
        OperatorMetrics(ctx.metrics, ctx.env, "virtual"),
    )
    o = operator.options
    pace = "as fast as possible" if o.fast else f"at {o.speed:g}x wall time"
    if o.lockstep:
        pace = f"in lockstep with its brain, {o.tick_seconds:g} s a tick"
    log.warning(
        "virtual operator of env %s: %d nodes x %d GPUs, simulated %s, admission by the %s",
        ctx.env,
        o.nodes,
        o.gpus_per_node,
        pace,
        o.admission,
    )

    def changed(announced: EnvAnnouncement) -> None:
        try:
            taken = virtual_settings({**_operator_settings(announced.settings), **options})
        except UserError as e:
            log.error(
                "env %s: its operator does not take settings version %d (%s)",
                ctx.env,
                announced.settings_version,
                e,
            )
            return
        operator.take_settings(taken, announced.settings_version)

    follower = SettingsFollower(ctx.settings, ctx.env, record.settings_version, changed)
    following = asyncio.create_task(follower.run(ctx.stop), name=f"{ctx.env}.operator-settings")
    try:
        await operator.run(ctx.stop, ctx.ready)
    finally:
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following


def _operator_settings(stored: Mapping[str, Any]) -> dict[str, Any]:
    """What the env's settings set of `operator` (the schema's reading)."""
    return parse_settings(stored).operator.model_dump(exclude_unset=True)


__all__ = [
    "ALREADY_APPLIED",
    "BARRIER_TOPICS",
    "GROUP",
    "SOURCE",
    "VirtualOperator",
    "check_virtual",
    "run",
]
