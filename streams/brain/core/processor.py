"""The brain's stream processor without the stream framework: records in, plans out.

It holds every job's state in memory, keyed by job (the job topics are keyed by job id,
so a job's events all arrive in one partition, in order), and the next offset of each
input partition that the states include. The faust app around it only moves records in
and plans out; keeping this part free of faust makes it fast to test and lets the
benchmark show what faust itself costs.

Nothing here raises on input: a record that does not decode, belongs to another env, or
makes the processor fail becomes a dead letter (`schemas.dlq.fitting_letter`, as
`dlrover_events.bus` makes them) and the processor moves on; the runtime sends it.
"""

from __future__ import annotations

import heapq
import logging
import math
import uuid
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from schemas.cluster import CapacityReported, PlatformCapabilities
from schemas.codec import CodecError, check_env
from schemas.dlq import DeadLetter, FailureKind, fitting_letter
from schemas.jobs import JobCompleted, JobEvent, JobFailed, JobHeld, JobSubmitted
from schemas.lockstep import Barrier, BarrierAck
from schemas.plans import OptimizePlan, ScalePlan
from streams.brain.core import inputs
from streams.brain.core.cluster_round import platform_capacity, run_round
from streams.brain.core.config_index import ConfigIndex
from streams.brain.core.inputs import Input, SampleDecode, input_reader
from streams.brain.core.memo import SampleMemo
from streams.brain.core.policy import Policy
from streams.brain.core.samples import SampleRead
from streams.brain.core.schedulers.api import ClusterCapacity
from streams.brain.core.snapshot import Loaded, Offsets, Snapshot, merge_offsets
from streams.brain.core.state import FINISHED, JobState, JobStatus, gpus_claimed
from streams.brain.core.triggers import JobContext, StepOutcome, arrive, step

log = logging.getLogger(__name__)

#: Completed jobs kept per scenario for the history-based optimizers.
HISTORY_PER_SCENARIO = 50


class InputRecord(Protocol):
    """What the processor needs of a consumed record (faust's Message and aiokafka's
    ConsumerRecord both have it)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...


@dataclass
class Output:
    """What one batch produced: plans to publish (in order) and dead letters."""

    plans: list[OptimizePlan | ScalePlan] = field(default_factory=list)
    letters: list[DeadLetter] = field(default_factory=list)
    #: lockstep: ticks decided whole, to acknowledge after the plans
    acks: list[BarrierAck] = field(default_factory=list)
    #: the input record each plan was decided on, beside `plans` (None: a lockstep tick's
    #: round or arrival): the runtime times a plan from that record's publication
    causes: list[InputRecord | None] = field(default_factory=list)

    def add(self, plans: Sequence[OptimizePlan | ScalePlan], cause: InputRecord | None) -> None:
        self.plans.extend(plans)
        self.causes.extend([cause] * len(plans))


@dataclass
class Counters:
    processed: int = 0
    skipped: int = 0
    #: events that decide nothing: not about a job, or late (below)
    ignored: int = 0
    #: of those, events of a job after it finished (its state final, or pruned)
    late: int = 0
    dead_lettered: int = 0
    decisions: int = 0
    optimize_plans: int = 0
    scale_plans: int = 0
    errors: int = 0
    ticks: int = 0


#: Events after which an event-time scheduler decides at once, not at the next interval.
_ROUND_NOW = (JobSubmitted, JobCompleted, JobFailed, JobHeld)

_ACK_NAMESPACE = uuid.UUID("4f1c8d2e-9a7b-4e3f-8c6d-1b2a3c4d5e6f")


def _merge_key(item: tuple[InputRecord, Input | None, int]) -> tuple[float, int]:
    _, event, rank = item
    return (event.occurred_at.timestamp() if event is not None else float("-inf"), rank)


@dataclass(slots=True)
class HeldJob:
    """One job the processor holds in memory, and everything kept for it alone: all of it
    comes with the job (an event, a loaded checkpoint) and goes with it (finished and
    checkpointed, its partition dropped)."""

    state: JobState
    #: the input partition its events come from (the same on every job topic)
    partition: int
    #: GPUs it holds or waits for, counted in the processor's free GPUs
    held: int = 0
    #: the routing error last dead-lettered, and the config problems: said once per change
    last_error: str | None = None
    config_errors: tuple[str, ...] = ()
    #: what the brain derives from its samples, made once per sample
    memo: SampleMemo = field(default_factory=SampleMemo)


class JobStates(Mapping[str, JobState]):
    """The states of the jobs a processor holds, by job id (a read-only view)."""

    __slots__ = ("_jobs",)

    def __init__(self, jobs: dict[str, HeldJob]) -> None:
        self._jobs = jobs

    def __getitem__(self, job_uuid: str) -> JobState:
        return self._jobs[job_uuid].state

    def __iter__(self) -> Iterator[str]:
        return iter(self._jobs)

    def __len__(self) -> int:
        return len(self._jobs)


class Lockstep:
    """A virtual env's ticks, decided whole (`lockstep` of the env's brain settings,
    `schemas.lockstep`).

    Records wait here until their tick's barrier is in on every input partition; then
    the tick's records of all partitions are merged in an order that depends on what the
    partitions hold, not on when it arrived. The processor's offsets move only with what
    is decided, so a checkpoint never covers a held record and a restart reads it again.
    """

    def __init__(self) -> None:
        #: the input partitions a tick's barrier must come from
        self.inputs: set[tuple[str, int]] = set()
        #: records read but waiting for their tick (decoded), per input partition
        self.waiting: dict[tuple[str, int], deque[tuple[InputRecord, Input | None]]] = {}
        #: barriers among the waiting records, and the next offset read, per partition
        self.barriers: dict[tuple[str, int], int] = {}
        self.read_to: dict[tuple[str, int], int] = {}
        #: the latest tick decided (None until one is, and once partitions are dropped, as
        #: a rebalance does; a checkpoint keeps it, `Snapshot.ticks`, so that partitions
        #: resumed from one know it). A barrier of it or of an earlier tick is a copy: a
        #: producer published again, at other offsets, records the broker had lost
        #: (dlrover_events/runtime/unjournaled.py) while this brain had read them already;
        #: deciding that tick again would fold its records twice (a decision on an input
        #: no run without kills has). Copies that lie after a checkpoint's offsets were
        #: decided again by a brain started from it, before it kept the tick
        self.decided: int | None = None
        #: records dropped as such copies (barriers included), and events left out of a
        #: tick because the tick had an event with their id already
        self.copies = 0
        #: per partition, the offset past the last copy dropped (not yet in the offsets)
        self.copied_to: dict[tuple[str, int], int] = {}
        #: the barriers among them: acknowledged again (the same ids), since whoever
        #: published them again may wait for that
        self.copied_barriers: list[Barrier] = []

    def hold(self, record: InputRecord, event: Input | None) -> None:
        tp = (record.topic, record.partition)
        self.read_to[tp] = record.offset + 1
        self.waiting.setdefault(tp, deque()).append((record, event))
        if isinstance(event, Barrier):
            self.barriers[tp] = self.barriers.get(tp, 0) + 1

    def read(self, tp: tuple[str, int], decided: int) -> int:
        """The offset below which a record of `tp` is decided or held already."""
        return max(decided, self.read_to.get(tp, 0))

    def tick_ready(self) -> bool:
        if self.decided is not None:
            for tp in self.inputs:
                self._drop_copies(tp)
        return bool(self.inputs) and all(self.barriers.get(tp, 0) for tp in self.inputs)

    def _drop_copies(self, tp: tuple[str, int]) -> None:
        """Drop the records of a tick decided already at the front of `tp` (its barrier, and
        the records before it: copies, published again in order); `tp` counts as read past
        them (`copied_to`), so a checkpoint covers them."""
        assert self.decided is not None
        queue = self.waiting.get(tp)
        while queue and self.barriers.get(tp, 0):
            count, barrier = 0, None
            for record, event in queue:
                count += 1
                if isinstance(event, Barrier):
                    barrier = (record, event)
                    break
            assert barrier is not None  # (the partition holds a barrier)
            if barrier[1].tick > self.decided:
                return
            for _ in range(count):
                queue.popleft()
            self.barriers[tp] -= 1
            self.copies += count
            self.copied_to[tp] = barrier[0].offset + 1
            self.copied_barriers.append(barrier[1])

    def next_tick(
        self,
    ) -> tuple[Barrier, list[tuple[InputRecord, Input]], dict[tuple[str, int], int]]:
        """The records of the lowest tick held whole, merged: each partition's order is
        kept, and they interleave by event time, then topic, then partition number.
        Returns the tick's barrier, the records (undecodable ones left out: their dead
        letters are filed already), and each partition's offset past its barrier."""
        fronts: dict[tuple[str, int], int] = {}
        for tp in self.inputs:
            for _, event in self.waiting[tp]:
                if isinstance(event, Barrier):
                    fronts[tp] = event.tick
                    break
        tick = min(fronts.values())
        # a partition whose next barrier is a later tick has nothing of this one
        runs = []
        passed: dict[tuple[str, int], int] = {}
        last: Barrier | None = None
        for rank, tp in enumerate(sorted(tp for tp, t in fronts.items() if t == tick)):
            queue = self.waiting[tp]
            run = []
            while True:
                record, event = queue.popleft()
                if isinstance(event, Barrier):
                    self.barriers[tp] -= 1
                    passed[tp] = record.offset + 1
                    last = event
                    break
                run.append((record, event, rank))
            runs.append(run)
        assert last is not None  # the lowest tick's partitions each had its barrier
        self.decided = tick if self.decided is None else max(self.decided, tick)
        merged = []
        ids: set[str] = set()
        for record, event, _ in heapq.merge(*runs, key=_merge_key):
            if event is None:
                continue
            event_id = str(event.event_id)
            if event_id in ids:  # an original and its copy published again: once
                self.copies += 1
                continue
            ids.add(event_id)
            merged.append((record, event))
        return last, merged, passed

    def drop(self, gone: set[int]) -> None:
        self.copied_barriers.clear()
        for held in (self.waiting, self.barriers, self.read_to, self.copied_to):
            for tp in [tp for tp in held if tp[1] in gone]:
                del held[tp]
        # partitions taken over again resume from their checkpoint, ticks before the last
        # one decided included: those are decided again, not copies
        self.decided = None
        self.inputs = {tp for tp in self.inputs if tp[1] not in gone}


class BrainProcessor:
    def __init__(
        self,
        env: str,
        group: str,
        policy: Policy | None = None,
        configs: ConfigIndex | None = None,
        sample_decode: SampleDecode | None = None,
    ) -> None:
        """`sample_decode`: how runtime samples are read (`streams.brain.core.inputs`;
        default `inputs.DEFAULT_SAMPLE_DECODE`, which the test suite's --sample-decode
        sets)."""
        self.env = env
        self.sample_decode = sample_decode or inputs.DEFAULT_SAMPLE_DECODE
        self._read = input_reader(self.sample_decode)
        #: the config service's documents, for the router (none: the job's own config)
        self.configs = configs
        self.group = group
        self.policy = policy or Policy()
        #: the jobs held in memory (not finished, or finished and not yet checkpointed)
        self.jobs: dict[str, HeldJob] = {}
        self.states: Mapping[str, JobState] = JobStates(self.jobs)
        #: next offset per input (topic, partition) that the states include
        self.offsets: Offsets = {}
        #: input partitions (numbers: a job has the same one on every job topic) whose
        #: checkpoint is loaded
        self.loaded: set[int] = set()
        self.counters = Counters()
        self._dirty: set[str] = set()
        self._changed_offsets: set[tuple[str, int]] = set()
        self._unsaved_plans: list[OptimizePlan | ScalePlan] = []
        #: lockstep: the latest tick decided as the last snapshot said it
        self._ticks_saved: int | None = None
        self._history: dict[str, deque[JobState]] = {}
        #: the sum of the jobs' `held`: the cluster's GPUs less this are free
        self._held_total = 0
        self.lockstep = Lockstep()
        #: jobs that finished (-> partition): their states leave memory once checkpointed,
        #: and what still comes for them is ignored, as a finished job's state would
        self.finished: dict[str, int] = {}
        self._evict: set[str] = set()
        #: the latest event time decided: retention's clock, so a virtual env replaying
        #: last year prunes by its own time, and a restart by the same as a live run
        self.event_time: datetime | None = None
        #: lockstep: the simulated time of the tick being decided; a submission stamped
        #: later waits for it (`awaiting_arrival`), in `_awaiting` (job -> its time)
        self.tick_at: datetime | None = None
        self._awaiting: dict[str, datetime] = {}
        #: the cluster scheduler's last round (event time; lockstep: its tick)
        self.last_round: datetime | None = None
        self.rounds = 0
        #: the real cluster as its platform last reported it (`set_capacity`); None: the
        #: scheduler settings' static cluster (a virtual env's, or before the first report)
        self.capacity: ClusterCapacity | None = None
        #: what the platform can apply, as it reported it with its capacity; None: not
        #: said (a virtual env, before the first report): plans are not held to it
        self.platform: PlatformCapabilities | None = None

    @property
    def inputs(self) -> set[tuple[str, int]]:
        """Lockstep: the input partitions a tick's barrier must come from."""
        return self.lockstep.inputs

    @inputs.setter
    def inputs(self, inputs: set[tuple[str, int]]) -> None:
        self.lockstep.inputs = inputs

    # -- partitions ---------------------------------------------------------------------

    def install(self, partitions: Iterable[int], loaded: Loaded) -> None:
        """Take over partitions with their checkpointed states and offsets (finished
        jobs' states in the order they finished: the newest are remembered)."""
        self.finished.update(loaded.finished)
        for job_uuid, (partition, state) in loaded.states.items():
            if state.pruned_at is None:  # a pruned job's tombstone has nothing to teach
                self._remember(state)
            if state.status in FINISHED:
                self.finished[job_uuid] = partition
                continue
            self._forget_job(job_uuid)  # (a job held already: the checkpoint's is the one)
            entry = self.jobs[job_uuid] = HeldJob(state, partition)
            self._hold(entry)
            self._note_arrival(job_uuid, state)
            since = state.share.since if state.share is not None else None
            if since is not None and (self.last_round is None or since > self.last_round):
                self.last_round = since  # (a round counts every share it holds)
        merge_offsets(self.offsets, loaded.offsets)
        parts = set(partitions)
        if parts and all(p in loaded.ticks for p in parts):
            # ticks up to the least of theirs are decided for all of them: a barrier of
            # one is a copy (a partition without one: nothing is known, none is a copy)
            tick = min(loaded.ticks[p] for p in parts)
            decided = self.lockstep.decided
            self.lockstep.decided = tick if decided is None else min(decided, tick)
        self.loaded.update(partitions)

    def drop(self, partitions: Iterable[int]) -> None:
        """Forget partitions another instance now owns (after they were checkpointed)."""
        gone = set(partitions)
        for job_uuid in [u for u, e in self.jobs.items() if e.partition in gone]:
            self._forget_job(job_uuid)
            self._dirty.discard(job_uuid)
            self._evict.discard(job_uuid)
        for job_uuid in [u for u, p in self.finished.items() if p in gone]:
            del self.finished[job_uuid]
        for tp in [tp for tp in self.offsets if tp[1] in gone]:
            del self.offsets[tp]
            self._changed_offsets.discard(tp)
        self.lockstep.drop(gone)
        self.loaded -= gone

    def _forget_job(self, job_uuid: str) -> HeldJob | None:
        """The job's entry out of memory, with all that was kept for it."""
        entry = self.jobs.pop(job_uuid, None)
        if entry is not None:
            self._held_total -= entry.held
        self._awaiting.pop(job_uuid, None)
        return entry

    def _note_arrival(self, job_uuid: str, state: JobState) -> None:
        if state.awaiting_arrival and state.submitted_at is not None:
            self._awaiting[job_uuid] = state.submitted_at
        else:
            self._awaiting.pop(job_uuid, None)

    # -- records ------------------------------------------------------------------------

    def process(self, records: Iterable[InputRecord]) -> Output:
        out = Output()
        if self.policy.settings.lockstep:
            self._wait_for_ticks(records, out)
        else:
            for record in records:
                tp = (record.topic, record.partition)
                if record.offset < self.offsets.get(tp, 0):
                    self.counters.skipped += 1  # already in the states (replay after restart)
                    continue
                event = self._decode(record, out)
                if event is not None:
                    if self.policy.scheduler is not None:
                        self._round_if_due(event.occurred_at, out, record)
                    self._one(record, event, out)
                    if self.policy.scheduler is not None and isinstance(event, _ROUND_NOW):
                        # an arrival or an end changes who may hold GPUs: decided at once,
                        # or a quiet env (no samples to move event time) would wait forever
                        self._round(event.occurred_at, out, f"after {event.event_id}", record)
                self.offsets[tp] = record.offset + 1
                self._changed_offsets.add(tp)
        self.counters.dead_lettered += len(out.letters)
        return out

    # -- lockstep -----------------------------------------------------------------------

    def _wait_for_ticks(self, records: Iterable[InputRecord], out: Output) -> None:
        """Hold records until their tick's barrier is in on every input partition, then
        decide the tick (see `Lockstep`)."""
        lockstep = self.lockstep
        for record in records:
            tp = (record.topic, record.partition)
            if record.offset < lockstep.read(tp, self.offsets.get(tp, 0)):
                self.counters.skipped += 1  # decided, or held already (read again)
                continue
            # a dead letter is filed now; order is moot
            lockstep.hold(record, self._decode(record, out))
        while lockstep.tick_ready():
            self._decide_tick(out)
        for tp, offset in lockstep.copied_to.items():
            # copies of a tick decided: read past, as a checkpoint must say
            if offset > self.offsets.get(tp, 0):
                self.offsets[tp] = offset
                self._changed_offsets.add(tp)
        lockstep.copied_to.clear()
        out.acks += [self._ack(barrier) for barrier in lockstep.copied_barriers]
        lockstep.copied_barriers.clear()

    def _decide_tick(self, out: Output) -> None:
        barrier, records, passed = self.lockstep.next_tick()
        for tp, offset in passed.items():
            self.offsets[tp] = offset
            self._changed_offsets.add(tp)
        # (each partition's offset already stands past its barrier: the tick is decided
        # whole within this call, so no checkpoint sees it half done)
        self.tick_at = barrier.sim_at
        due = sorted(
            (at, job_uuid) for job_uuid, at in self._awaiting.items() if at <= barrier.sim_at
        )
        for record, event in records:
            # jobs arrive at their own time, among the tick's events (before a tie)
            while due and due[0][0] <= event.occurred_at:
                self._arrive(due.pop(0)[1], out)
            self._one(record, event, out)
        for _, job_uuid in due:
            self._arrive(job_uuid, out)
        if self.policy.scheduler is not None:
            self._round(barrier.sim_at, out, f"tick {barrier.tick}")
        self.counters.ticks += 1
        out.acks.append(self._ack(barrier))

    def _ack(self, barrier: Barrier) -> BarrierAck:
        return BarrierAck(
            env=self.env,
            # one answer per tick and brain: a brain that decides it again says the same
            event_id=uuid.uuid5(_ACK_NAMESPACE, f"{self.group}/{barrier.tick}"),
            occurred_at=barrier.sim_at,
            source=self.group,
            tick=barrier.tick,
            sim_at=barrier.sim_at,
        )

    # -- arrivals and the cluster scheduler -----------------------------------------------

    def _arrive(self, job_uuid: str, out: Output) -> None:
        """A lockstep job whose submission was read early reaches its time: from now on
        it exists for every decision (free GPUs, the scheduler), and is decided as its
        submission would have been."""
        entry = self.jobs.get(job_uuid)
        self._awaiting.pop(job_uuid, None)
        if entry is None or not entry.state.awaiting_arrival:
            return
        outcome = arrive(
            entry.state,
            self.policy,
            JobContext(
                self._history_for(entry.state, None),
                self.free_gpus(),
                None if self.configs is None else self.configs.config_for,
                entry.memo,
                platform=self.platform,
            ),
        )
        entry.state = outcome.state
        self._hold(entry)
        self._dirty.add(job_uuid)
        self._publish_outcome(entry, outcome, out)

    def _round_if_due(self, at: datetime, out: Output, cause: InputRecord | None = None) -> None:
        """On event time: a round at each multiple of the interval that `at` passed
        (one, at the last of them: rounds in between would have seen nothing new)."""
        scheduler = self.policy.scheduler
        assert scheduler is not None
        every = scheduler.interval_s
        boundary = datetime.fromtimestamp(math.floor(at.timestamp() / every) * every, tz=at.tzinfo)
        if self.last_round is None:
            self.last_round = boundary  # (the clock starts: nothing came before to decide)
            return
        if boundary > self.last_round:
            self._round(boundary, out, "interval", cause)

    def _round(
        self, now: datetime, out: Output, cause: str, record: InputRecord | None = None
    ) -> None:
        """A round of the scheduler at `now`; `cause` (the tick, the interval, the event
        that called it) keeps two rounds at one instant from sharing plan ids; `record`:
        the input it was called on, if any.

        Never before the last round: the scheduler's clock is the latest time it decided
        at. An event stamped earlier (late, or read after a replay's submissions that are
        ahead of it) is decided at that clock: a round back in time would leave out jobs
        that had arrived since, while their GPUs stay held."""
        scheduler = self.policy.scheduler
        assert scheduler is not None
        if self.last_round is not None and now < self.last_round:
            now = self.last_round
        self.last_round = now
        self.rounds += 1
        try:
            result = run_round(self.states, now, self.policy, cause, nodes=self.capacity)
        except Exception:  # a bug of the scheduler must not stop the brain for all
            log.exception("cluster scheduler %s failed at %s", scheduler.name, now)
            self.counters.errors += 1
            return
        for job_uuid, state in result.states.items():
            entry = self.jobs[job_uuid]
            entry.state = state
            self._hold(entry)
            self._dirty.add(job_uuid)
        if result.plans:
            self.counters.decisions += len(result.plans) // 2
            for plan in result.plans:
                if isinstance(plan, ScalePlan):
                    self.counters.scale_plans += 1
                else:
                    self.counters.optimize_plans += 1
            out.add(result.plans, record)
            self._unsaved_plans.extend(result.plans)

    # -- one record ---------------------------------------------------------------------

    def _decode(self, record: InputRecord, out: Output) -> Input | None:
        """The record's event, or None with a dead letter saying why there is none."""
        try:
            return check_env(self._read(record.value), self.env, record.topic)
        except CodecError as err:
            out.letters.append(self._letter(record, err.kind, err.message))
            return None

    def _one(self, record: InputRecord, event: Input, out: Output) -> None:
        if not isinstance(event, SampleRead | JobEvent):
            self.counters.ignored += 1
            return
        at = event.occurred_at
        if self.event_time is None or at > self.event_time:
            self.event_time = at
        job_uuid = event.job.uuid
        if job_uuid in self.finished:
            self.counters.ignored += 1  # a late report of a finished job decides nothing
            self.counters.late += 1
            return
        entry = self.jobs.get(job_uuid)
        state = None if entry is None else entry.state
        memo = SampleMemo() if entry is None else entry.memo
        try:
            context = JobContext(
                self._history_for(state, event),
                self.free_gpus(),
                None if self.configs is None else self.configs.config_for,
                memo,
                self.tick_at if self.policy.settings.lockstep else None,
                self.platform,
            )
            outcome = step(state, event, self.policy, context)
        except Exception as err:  # a bug for one job must not stop the brain for all
            log.exception(
                "brain failed on %s[%d]@%d", record.topic, record.partition, record.offset
            )
            text = f"{type(err).__name__}: {err}"
            out.letters.append(self._letter(record, FailureKind.HANDLER, text))
            return
        if outcome is not None and outcome.late:  # finished, not yet evicted: the same
            self.counters.ignored += 1
            self.counters.late += 1
            return
        self.counters.processed += 1
        if outcome is None:
            return
        after = outcome.state
        if entry is None:
            entry = self.jobs[job_uuid] = HeldJob(after, record.partition, memo=memo)
            self._hold(entry)
            self._note_arrival(job_uuid, after)
        else:
            before, entry.state, entry.partition = entry.state, after, record.partition
            if (
                after.roles is not before.roles
                or after.status != before.status
                or after.awaiting_arrival != before.awaiting_arrival
                or after.on_hold != before.on_hold
            ):
                self._hold(entry)  # (a sample changes neither: folds keep the dict)
                self._note_arrival(job_uuid, after)
        self._dirty.add(job_uuid)
        self._publish(record, entry, outcome, out)
        if after.status in FINISHED and (state is None or state.status not in FINISHED):
            self._remember(after)
            self._evict.add(job_uuid)

    def _publish(
        self, record: InputRecord, entry: HeldJob, outcome: StepOutcome, out: Output
    ) -> None:
        """What a step says: plans, and the user's errors (once per change)."""
        if outcome.trigger is not None:
            self.counters.decisions += 1
        if outcome.config_errors and outcome.config_errors != entry.config_errors:
            for problem in outcome.config_errors:
                text = f"brain: invalid_config: {problem} (decided without it)"
                out.letters.append(self._letter(record, FailureKind.HANDLER, text))
        if outcome.config_errors or outcome.trigger is not None:
            entry.config_errors = outcome.config_errors
        if outcome.error is not None:
            error = outcome.error
            self._route_error(record, entry, f"{error.code}: {error.message}", out)
        if outcome.optimize_plan is not None:
            self.counters.optimize_plans += 1
        if outcome.scale_plan is not None:
            self.counters.scale_plans += 1
        if outcome.optimize_plan is not None or outcome.scale_plan is not None:
            plans = outcome.plans
            out.add(plans, record)
            self._unsaved_plans.extend(plans)

    def _publish_outcome(self, entry: HeldJob, outcome: StepOutcome, out: Output) -> None:
        """What a decision without an input record says (an arrival): its plans; an error
        is counted and logged, there being no record to dead-letter."""
        if outcome.trigger is not None:
            self.counters.decisions += 1
        if outcome.error is not None:
            self.counters.errors += 1
            if entry.last_error != outcome.error.message:
                entry.last_error = outcome.error.message
                log.warning(
                    "brain: %s: %s (job %s)",
                    outcome.error.code,
                    outcome.error.message,
                    entry.state.job.uuid,
                )
        if outcome.optimize_plan is not None:
            self.counters.optimize_plans += 1
        if outcome.scale_plan is not None:
            self.counters.scale_plans += 1
        plans = outcome.plans
        if plans:
            out.add(plans, None)
            self._unsaved_plans.extend(plans)

    def set_capacity(self, report: CapacityReported) -> None:
        """Schedule from now on the cluster the platform reported (its latest word), and
        plan only what it says it can apply. A report whose hosts are not counted says
        only the latter: the scheduler keeps its settings' cluster."""
        self.capacity = platform_capacity(report) if report.hosts_counted else None
        self.platform = report.capabilities

    def free_gpus(self) -> int | None:
        """The cluster's GPUs that no job holds or waits for; None when the cluster is
        unknown (neither reported by the platform nor set in the brain's settings).

        Counted over the jobs of this instance: with the job topics split across several
        brains, each sees only its share of the cluster's use.
        """
        gpus = (
            self.capacity.total_gpus
            if self.capacity is not None
            else self.policy.settings.cluster_gpus
        )
        if gpus is None:
            return None
        return max(0, gpus - self._held_total)

    def _hold(self, entry: HeldJob) -> None:
        held = gpus_claimed(entry.state)
        self._held_total += held - entry.held
        entry.held = held

    def _route_error(self, record: InputRecord, entry: HeldJob, message: str, out: Output) -> None:
        """A job whose config names an unknown optimizer fails the same way at every
        decision: say it once per change, not at every sample."""
        self.counters.errors += 1
        if entry.last_error == message:
            return
        entry.last_error = message
        out.letters.append(self._letter(record, FailureKind.HANDLER, f"brain: {message}"))

    def _letter(self, record: InputRecord, kind: FailureKind, error: str) -> DeadLetter:
        return fitting_letter(
            env=self.env,
            original_topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            key=record.key,
            value=record.value,
            kind=kind,
            error=error,
            group=self.group,
        )

    def _history_for(
        self, state: JobState | None, event: SampleRead | JobEvent | None
    ) -> Sequence[JobState]:
        if not self._history:
            return ()  # no job has completed yet (this costs every event a lookup)
        if state is None and event is None:
            return ()
        scenario = (state.job if state is not None else event.job).scenario  # type: ignore[union-attr]
        found = self._history.get(scenario) if scenario else None
        return found if found else ()  # read only while deciding this event

    def _remember(self, state: JobState) -> None:
        if state.status != JobStatus.COMPLETED or not state.job.scenario:
            return
        jobs = self._history.setdefault(state.job.scenario, deque(maxlen=HISTORY_PER_SCENARIO))
        jobs.append(state)

    def forget(self, job_uuids: Iterable[str]) -> None:
        """Finished jobs whose tombstones retention deleted: an event of theirs is now
        one of an unknown job (see `streams.brain.runtime.retention`)."""
        for job_uuid in job_uuids:
            if job_uuid not in self.jobs:  # (finished jobs only; a live one stays)
                self.finished.pop(job_uuid, None)

    # -- checkpoints --------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """Everything changed since the last snapshot; call it only between batches whose
        plans are published, so the offsets never get ahead of the published plans."""
        jobs = self.jobs
        decided = self.lockstep.decided
        snap = Snapshot(
            states={u: (jobs[u].partition, jobs[u].state) for u in self._dirty},
            offsets={tp: self.offsets[tp] for tp in self._changed_offsets},
            plans=self._unsaved_plans,
            ticks=(
                dict.fromkeys(self.loaded | {p for _, p in self.lockstep.inputs}, decided)
                if decided is not None and decided != self._ticks_saved
                else {}
            ),
        )
        self._ticks_saved = decided
        self._dirty = set()
        self._changed_offsets = set()
        self._unsaved_plans = []
        for job_uuid in self._evict:  # their last state is in this snapshot
            entry = self._forget_job(job_uuid)
            assert entry is not None
            self.finished[job_uuid] = entry.partition
        self._evict = set()
        return snap

    def restore(self, snap: Snapshot) -> None:
        """A snapshot that could not be written: write it (and what came since) next time."""
        for job_uuid, (partition, state) in snap.states.items():
            if job_uuid not in self.jobs and self.finished.get(job_uuid) == partition:
                # evicted with this snapshot: back until one that is written has it
                del self.finished[job_uuid]
                entry = self.jobs[job_uuid] = HeldJob(state, partition)
                self._hold(entry)
                self._evict.add(job_uuid)
        self._dirty.update(u for u in snap.states if u in self.jobs)
        self._changed_offsets.update(tp for tp in snap.offsets if tp in self.offsets)
        self._unsaved_plans = [*snap.plans, *self._unsaved_plans]
        if snap.ticks:
            self._ticks_saved = None  # (written with the next one)
