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

In lockstep (schemas.lockstep) the clock moves only a tick at a time: after a tick's events
the operator publishes a Barrier to every partition the brain reads, and it applies the
tick's plans, at the tick's end, once the brain's BarrierAck is read on every partition of
the plans topic. The wall clock then plays no part, so the same input gives the same run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from dlrover_events.bus import Consumer, Producer, Received
from dlrover_events.envs import EnvRecord, EnvRegistry
from dlrover_events.errors import UserError
from dlrover_events.services import ServiceContext
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from dlrover_events.store.database import connect
from dlrover_events.topics import (
    JOB_EVENTS,
    JOB_METRICS,
    SCALE_PLANS,
    SCALE_RESULTS,
    check_env_name,
    topic,
)
from handlers.operator.clock import SimClock
from handlers.operator.ledger import ALREADY_APPLIED, Answer, PlanLedger
from handlers.operator.settings import VirtualSettings, virtual_settings
from handlers.simulator.fleet import VirtualCluster
from handlers.simulator.job import PlanOutcome
from handlers.simulator.lockstep import Tick, TickClock, TickGate
from handlers.simulator.throughput import TraceDataError, pollux_dir
from schemas.control import EnvMode
from schemas.envelope import Event
from schemas.jobs import JobSubmitted
from schemas.lockstep import Barrier, BarrierAck
from schemas.plans import ScalePlan, ScaleResult, ScaleStatus

log = logging.getLogger(__name__)

GROUP = "operator"
SOURCE = "virtual-operator"

#: Events the clock makes before publishing them, when it runs as fast as possible.
FAST_BATCH = 500

_RESULT_NAMESPACE = uuid.UUID("9b3e51a2-6d0c-4f8e-b7a1-2c4d6e8f0a13")

#: The topics the brain reads: a lockstep barrier goes to each of their partitions.
BARRIER_TOPICS = (JOB_EVENTS, JOB_METRICS, SCALE_RESULTS)

#: In lockstep each tick waits for the brain; tansu answers a fetch only when its wait is
#: over, so the wait is the floor of a tick's round trip (the brain waits as briefly).
LOCKSTEP_FETCH_WAIT_MS = 10

#: Wall seconds between two log lines of an operator that waits for its brain.
WAITING_LOG_S = 30.0


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


class VirtualOperator:
    def __init__(self, settings: Settings, env: str, dsn: str, options: VirtualSettings) -> None:
        self.settings = settings
        self.env = env
        self.dsn = dsn
        self.options = options
        self.clock = SimClock(None if options.fast or options.lockstep else options.speed)
        self.fleet: VirtualCluster | None = None
        self.ticks = TickClock(options.tick_seconds) if options.lockstep else None
        # Made once the plans topic's partitions are known: each must acknowledge a tick.
        self.gate: TickGate | None = None
        # Something was published since the last barrier: the brain waits for one.
        self._unbarriered = False
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        # Events made but not yet acknowledged by the broker: a handler attempt that fails
        # half-way leaves them here for the next attempt, since the fleet makes them once.
        self._outbox: list[Event] = []
        self._producer: Producer | None = None
        self._ledger: PlanLedger | None = None

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
            try:
                self._ledger = PlanLedger(store.pool)
                consumer = Consumer(
                    self.settings,
                    self.env,
                    [JOB_EVENTS, SCALE_PLANS],
                    GROUP,
                    self._handle,
                    fetch_max_wait_ms=LOCKSTEP_FETCH_WAIT_MS if self.ticks else 500,
                )
                async with Producer(self.settings) as producer, consumer:
                    self._producer = producer
                    if self.ticks is not None:
                        plans = await producer.partitions(topic(self.env, SCALE_PLANS))
                        self.gate = TickGate.over(plans)
                    if ready is not None:
                        ready.set()
                    await self._serve(consumer, stop)
            finally:
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

    async def _serve(self, consumer: Consumer, stop: asyncio.Event) -> None:
        clock = self._tick(stop) if self.ticks is None else self._lockstep(stop)
        tasks = [
            asyncio.create_task(self._consume(consumer, stop), name=f"{self.env}.operator.consume"),
            asyncio.create_task(clock, name=f"{self.env}.operator.clock"),
        ]
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait([*tasks, stopping], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (*tasks, stopping):
                task.cancel()
            await asyncio.gather(*tasks, stopping, return_exceptions=True)
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
            await self._flush()
            # A backlog read after a restart may hold a job's plan in the same batch as its
            # submission: the job comes first. Other job events (ours included, and our
            # barriers) are not inputs. The sort is stable: a partition keeps its order, so
            # a plan read before its partition's acknowledgement belongs to that tick.
            for item in sorted(batch, key=lambda r: not isinstance(r.event, JobSubmitted)):
                event = item.event
                if isinstance(event, JobSubmitted):
                    self._outbox.extend(self._catch_up(event).submit(event))
                elif isinstance(event, ScalePlan) and self.gate is not None:
                    self.gate.plan(item.partition, event)  # applied at its tick's end
                elif isinstance(event, ScalePlan):
                    await self._apply(self._catch_up(event), event)
                elif isinstance(event, BarrierAck) and self.gate is not None:
                    self.gate.ack(item.partition, event.tick)
            await self._flush()
        self._wake.set()

    def _catch_up(self, event: Event) -> VirtualCluster:
        """The fleet at the current simulated time, made at the first input.

        Its clock starts once the backlog is read (or when a plan must be applied), at the
        earliest submission: the origin does not depend on which partition is read first.
        """
        if self.fleet is None:
            self.fleet = VirtualCluster(
                self.options.cluster(),
                origin=None,
                restart_delay=self.options.restart_delay,
                sample_interval=self.options.sample_interval,
                source=SOURCE,
            )
        if not self.fleet.started:
            if isinstance(event, ScalePlan):
                self._start_clock(event.occurred_at)
        elif (now := self.clock.now()) is not None:
            self._outbox.extend(self.fleet.advance_to(now))
        return self.fleet

    def _start_clock(self, origin: datetime | None = None) -> None:
        assert self.fleet is not None
        self._outbox.extend(self.fleet.start(origin))
        self.clock.start(0.0)

    async def _apply(self, fleet: VirtualCluster, plan: ScalePlan) -> None:
        """Apply the plan once and answer it: a plan delivered again after it applied gets
        its first answer again (a partial one with its parts), saying it is a repeat."""
        assert self._ledger is not None
        earlier = await self._ledger.answer(plan.plan_id)
        if earlier is not None:
            answer = earlier.repeated()
        else:
            try:
                outcome = fleet.apply(plan)
            except Exception as e:
                # A simulator bug must give a failed result, not a consumer that crash-loops.
                log.exception("plan %s of job %s", plan.plan_id, plan.job.uuid)
                outcome = PlanOutcome(ScaleStatus.FAILED, f"simulator error: {e!r}")
            self._outbox.extend(outcome.events)
            answer = Answer(outcome.status, outcome.reason, outcome.not_applied)
            if not await self._ledger.record(
                plan, answer.status, answer.reason, answer.not_applied
            ):
                earlier = await self._ledger.answer(plan.plan_id)
                answer = (
                    earlier.repeated()
                    if earlier is not None
                    else Answer(ScaleStatus.APPLIED, ALREADY_APPLIED)
                )
        status, reason = answer.status, answer.reason
        self._outbox.append(
            ScaleResult(
                env=self.env,
                job=plan.job,
                source=SOURCE,
                # The same delivery answered the same way keeps its id (re-processing after
                # a crash duplicates nothing downstream); a different answer is a new fact.
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
        )

    async def _flush(self) -> None:
        if self._outbox:
            assert self._producer is not None
            await self._producer.publish_many(self._outbox)
            self._outbox.clear()
            self._unbarriered = True

    # -- time -----------------------------------------------------------------------------

    async def _tick(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            async with self._lock:
                moved = self._advance()
                await self._flush()
            await self._sleep(self._pause(moved))

    def _advance(self) -> bool:
        if self.fleet is None:
            return False
        now = self.clock.now()
        if now is not None:
            self._outbox.extend(self.fleet.advance_to(now))
            return True
        # As fast as possible: several jumps per broker round trip, or the round trips
        # would set the pace; inputs wait at most one batch.
        moved = False
        while len(self._outbox) < FAST_BATCH and (events := self.fleet.step()) is not None:
            self._outbox.extend(events)
            moved = True
        return moved

    def _pause(self, moved: bool) -> float:
        """Wall seconds until the clock has something to do; inputs cut the wait short."""
        longest = self.options.max_sleep
        if self.fleet is None:
            return longest
        if self.clock.fast:
            return 0.0 if moved else longest
        upcoming, now = self.fleet.next_event_at(), self.clock.now()
        if upcoming is None or now is None:
            return longest
        return min(longest, max(0.001, self.clock.wall_seconds(upcoming - now)))

    # -- lockstep -------------------------------------------------------------------------

    async def _lockstep(self, stop: asyncio.Event) -> None:
        """Tick, barrier, wait for every acknowledgement, apply the tick's plans; again."""
        assert self.gate is not None
        gate = self.gate
        while not stop.is_set():
            async with self._lock:
                tick = await self._run_tick()
            if tick is None:
                await self._until(self._has_work, None)  # idle until an input arrives
                continue
            await self._until(lambda: gate.due, tick)
            async with self._lock:
                assert self.fleet is not None
                for plan in gate.take():
                    await self._apply(self.fleet, plan)
                await self._flush()  # before the next barrier: they belong to the next tick

    def _has_work(self) -> bool:
        fleet, gate = self.fleet, self.gate
        if fleet is None or not fleet.started or gate is None:
            return False
        return fleet.next_event_at() is not None or self._unbarriered or gate.holding

    async def _run_tick(self) -> Tick | None:
        """One tick of the fleet, its events, then its barrier on every partition."""
        assert self.ticks is not None
        assert self.gate is not None
        if not self._has_work():
            return None
        assert self.fleet is not None
        carrying = self._unbarriered or self.gate.holding
        tick = self.ticks.run(self.fleet, carrying=carrying)
        if tick is None:
            return None
        self._outbox.extend(tick.events)
        await self._flush()
        await self._publish_barriers(tick)
        self.gate.barrier(tick.number)
        return tick

    async def _publish_barriers(self, tick: Tick) -> None:
        assert self._producer is not None
        barrier = Barrier(
            env=self.env,
            source=SOURCE,
            # One id per tick: a re-published barrier duplicates nothing downstream.
            event_id=uuid.uuid5(_RESULT_NAMESPACE, f"{self.env}/barrier/{tick.number}"),
            occurred_at=tick.at,
            tick=tick.number,
            sim_at=tick.at,
        )
        await asyncio.gather(
            *(
                self._producer.publish_to_partitions(barrier, topic(self.env, name))
                for name in BARRIER_TOPICS
            )
        )
        self._unbarriered = False

    async def _until(self, ready: Callable[[], bool], tick: Tick | None) -> None:
        """Wait (on inputs, not by polling) until ``ready()``; say so now and then when a
        tick waits for its brain, which may have stopped."""
        while True:
            self._wake.clear()
            if ready():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), WAITING_LOG_S)
                continue
            if tick is not None and self.gate is not None:
                log.warning(
                    "env %s: tick %d (to %s) waits for the brain's BarrierAck on %s "
                    "partition(s) %s",
                    self.env,
                    tick.number,
                    tick.at.isoformat(),
                    SCALE_PLANS,
                    self.gate.waiting_on,
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
    speed) come first; options given on the command line override them.
    """
    record = await check_virtual(ctx.settings, ctx.pg_dsn, ctx.env)
    from_env = record.settings.get("operator", {})
    if not isinstance(from_env, Mapping):
        raise UserError(f"env {ctx.env!r}: settings.operator must be a mapping of options")
    merged = {**from_env, **options}
    operator = VirtualOperator(ctx.settings, ctx.env, ctx.pg_dsn, virtual_settings(merged))
    o = operator.options
    pace = "as fast as possible" if o.fast else f"at {o.speed:g}x wall time"
    if o.lockstep:
        pace = f"in lockstep with its brain, {o.tick_seconds:g} s a tick"
    log.warning(
        "virtual operator of env %s: %d nodes x %d GPUs, simulated %s",
        ctx.env,
        o.nodes,
        o.gpus_per_node,
        pace,
    )
    await operator.run(ctx.stop, ctx.ready)


__all__ = [
    "ALREADY_APPLIED",
    "BARRIER_TOPICS",
    "GROUP",
    "SOURCE",
    "VirtualOperator",
    "check_virtual",
    "run",
]
