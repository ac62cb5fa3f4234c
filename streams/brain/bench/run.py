"""`dlrover-events bench brain`: how fast the brain decides, next to what the bus allows.

In one run, over the same pre-loaded events of a fresh env: a plain aiokafka consumer
that does nothing (the bus's ceiling), a faust agent that does nothing but take and ack
(faust's ceiling on this machine), and the brain (state, triggers, optimizers, planner,
checkpoints). Then, with the brain caught up, events at a controlled rate and the time
from an event's publication to the publication of the ScalePlan it causes (the plan
record's create time), and to its arrival at a consumer of `<env>.scale.plans`; beside
them the bus's own delay from an event's publication to a plain reader fetching as the
brain does: every plan latency includes such a delay, and tansu's has a tail of its own.
Last, the brain's decisions alone over the same events, without a bus: the part of the
brain's time that is its core's.
Ratios between numbers of one run are what to compare: the machine and the broker are shared
and their absolute speed varies.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import typer
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from dlrover_events.bus.kafka_client import kafka_connection, stop_consumer
from dlrover_events.bus.topics import JOB_EVENTS, JOB_METRICS, topic, topic_of
from dlrover_events.cli.runner import run_async
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.errors import UserError
from dlrover_events.runtime.embedded import resolve_postgres
from dlrover_events.settings import Settings, load_settings
from schemas.codec import encode
from schemas.control import EnvMode
from schemas.envelope import Event
from schemas.jobs import (
    JobMeta,
    JobStarted,
    JobSubmitted,
    NodeOOM,
    NodeRef,
    NodeUsage,
    OOMKind,
    RoleSpec,
    RuntimeSample,
)
from streams.brain.core.optimizers.numeric import GiB
from streams.brain.core.processor import BrainProcessor
from streams.brain.runtime.app import Brain, BrainApp

log = logging.getLogger(__name__)


WORKERS = 4
#: samples of one job are 15 s apart in event time, as DLRover's master reports them
SAMPLE_EVERY = timedelta(seconds=15)


@dataclass
class Workload:
    """Jobs that train and now and then run out of host memory, as events in the order a
    cluster would publish them; each job's timeline continues across phases."""

    env: str
    jobs: int
    seed: int = 7
    start: datetime = field(default_factory=lambda: datetime.now(UTC) - timedelta(days=30))
    #: events so far per job (a later phase, or process, continues from them)
    steps: list[int] = field(default_factory=list)
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self.steps = self.steps or [0] * self.jobs

    def meta(self, j: int) -> JobMeta:
        return JobMeta(uuid=f"bench-job-{j}", name=f"bench-{j}", scenario=f"scenario-{j % 5}")

    def lifecycle(self) -> list[Event]:
        out: list[Event] = []
        for j in range(self.jobs):
            job = self.meta(j)
            role = RoleSpec(
                replicas=WORKERS, min_replicas=1, max_replicas=8, cpu=8, memory=16 * GiB, gpu_num=1
            )
            out.append(
                JobSubmitted(
                    env=self.env,
                    job=job,
                    occurred_at=self.start,
                    roles={"worker": role},
                    batch_size=256,
                    application="bench",
                )
            )
            out.append(JobStarted(env=self.env, job=job, occurred_at=self.start))
        return out

    def next(self, j: int, oom_every: int) -> Event:
        """The job's next event: a runtime sample, or every `oom_every` an OOM."""
        i = self.steps[j]
        self.steps[j] = i + 1
        job = self.meta(j)
        at = self.start + SAMPLE_EVERY * (i + 1)
        if oom_every and i % oom_every == oom_every - 1:
            node = (i // oom_every) % WORKERS
            return NodeOOM(
                env=self.env,
                job=job,
                occurred_at=at,
                node=NodeRef(type="worker", id=node),
                kind=OOMKind.HOST_MEMORY,
                memory=16 * GiB,
                exit_code=137,
            )
        rng = self._rng
        return RuntimeSample(
            env=self.env,
            job=job,
            occurred_at=at,
            global_step=i * 10,
            speed=round(1.0 + rng.random() * 0.05, 4),
            samples_per_s=round(256 * (1.0 + rng.random() * 0.05), 2),
            batch_size=256,
            local_batch_size=64,
            nodes=[
                NodeUsage(
                    type="worker",
                    id=k,
                    cpu=round(4 + rng.random(), 3),
                    memory=int((10 + rng.random() * 2) * GiB),
                    gpu_util=round(0.7 + rng.random() * 0.2, 3),
                    gpu_memory=int(20 * GiB),
                    step_time=round(1.0 + rng.random() * 0.05, 4),
                )
                for k in range(WORKERS)
            ],
        )

    def round_robin(self, count: int, oom_every: int) -> list[Event]:
        return [self.next(n % self.jobs, oom_every) for n in range(count)]


def _key(event: Event) -> bytes:
    assert event.key is not None
    return event.key.encode()


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest rank: a value that was actually observed."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


async def _preload(settings: Settings, events: Sequence[Event]) -> None:
    producer = AIOKafkaProducer(
        **kafka_connection(settings),
        linger_ms=20,
        max_batch_size=1 << 20,
        acks="all",
        enable_idempotence=False,
    )
    await producer.start()
    try:
        futures = [await producer.send(topic_of(e), encode(e), key=_key(e)) for e in events]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


def _rate(total: int, first_batch: int, first_at: float, last_at: float) -> float:
    """Records per second after the first batch arrived: start-up and group joins are
    not what is measured. Too few events for more than one batch time nothing."""
    elapsed = last_at - first_at
    if total <= first_batch or elapsed <= 0:
        raise UserError(
            f"all {total} events were read at once: too few to time, give --events more"
        )
    return (total - first_batch) / elapsed


async def _baseline(settings: Settings, env: str, total: int) -> float:
    consumer = AIOKafkaConsumer(
        **kafka_connection(settings),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=8 << 20,
        fetch_max_bytes=64 << 20,
    )
    await consumer.start()
    try:
        parts: list[TopicPartition] = []
        for name in (JOB_METRICS, JOB_EVENTS):
            full = topic(env, name)
            await consumer._client.force_metadata_update()
            ids = consumer.partitions_for_topic(full) or set()
            parts.extend(TopicPartition(full, p) for p in sorted(ids))
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        seen = first = 0
        first_at = 0.0
        while seen < total:
            batch = await consumer.getmany(timeout_ms=1000, max_records=settings.consumer_batch)
            n = sum(len(records) for records in batch.values())
            if n and not seen:
                first, first_at = n, time.perf_counter()
            seen += n
        return _rate(seen, first, first_at, time.perf_counter())
    finally:
        await stop_consumer(consumer)


async def _faust_raw(settings: Settings, env: str, total: int, take_max: int) -> float:
    """A faust agent that only takes and acks: what faust costs before any brain work."""
    datadir = tempfile.TemporaryDirectory(prefix="dlrover-bench-faust-")
    app = BrainApp(
        f"{env}.bench-faust-{uuid.uuid4().hex[:6]}",
        datadir=datadir.name,
        broker=[f"kafka://{hp.strip()}" for hp in settings.bootstrap_servers.split(",")],
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=False,
        topic_allow_declare=False,
        topic_disable_leader=True,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=settings.session_timeout_ms / 1000,
        broker_heartbeat_interval=settings.heartbeat_interval_ms / 1000,
        stream_wait_empty=False,
    )
    inputs = app.topic(topic(env, JOB_METRICS), topic(env, JOB_EVENTS))
    done = asyncio.Event()
    seen = first = 0
    first_at = last_at = 0.0

    async def agent(stream: Any) -> None:
        nonlocal seen, first, first_at, last_at
        async for events in stream.noack_take(take_max, within=0.005):
            for event in events:
                await stream.ack(event)
            if not seen:
                first, first_at = len(events), time.perf_counter()
            seen += len(events)
            if seen >= total:
                last_at = time.perf_counter()
                done.set()

    app.agent(inputs, name="bench-faust-agent")(agent)
    await app.start()
    try:
        await done.wait()
    finally:
        await app.stop()
        datadir.cleanup()
    return _rate(seen, first, first_at, last_at)


async def _faust_sink(settings: Settings, env: str, total: int) -> float:
    """faust's batch path as the brain takes it: the fetched batches handed to a record
    sink that only counts them (`streams.brain.runtime.faust_glue`), with no agent, stream
    or ack. Beside the plain aiokafka consumer it says what faust's consumer thread and
    fetcher cost the brain before it decides anything."""
    datadir = tempfile.TemporaryDirectory(prefix="dlrover-bench-faust-sink-")
    app = BrainApp(
        f"{env}.bench-faust-sink-{uuid.uuid4().hex[:6]}",
        datadir=datadir.name,
        broker=[f"kafka://{hp.strip()}" for hp in settings.bootstrap_servers.split(",")],
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=False,
        topic_allow_declare=False,
        topic_disable_leader=True,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=settings.session_timeout_ms / 1000,
        broker_heartbeat_interval=settings.heartbeat_interval_ms / 1000,
        stream_wait_empty=False,
        broker_max_poll_records=settings.consumer_batch,
    )
    inputs = app.topic(
        topic(env, JOB_METRICS),
        topic(env, JOB_EVENTS),
        key_serializer="raw",
        value_serializer="raw",
    )
    app.topics.add(inputs)
    done = asyncio.Event()
    seen = first = 0
    first_at = last_at = 0.0

    async def sink(records: list[Any]) -> None:
        nonlocal seen, first, first_at, last_at
        if not records:
            return
        if not seen:
            first, first_at = len(records), time.perf_counter()
        seen += len(records)
        if seen >= total and not done.is_set():
            last_at = time.perf_counter()
            done.set()

    app.record_sink = sink
    await app.start()
    try:
        await done.wait()
    finally:
        await app.stop()
        datadir.cleanup()
    return _rate(seen, first, first_at, last_at)


@dataclass(frozen=True)
class _Record:
    """An input record as the processor reads it, without a bus."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


def decide_only(env: str, events: Sequence[Event], batch: int, passes: int) -> float:
    """The brain's decisions alone: a fresh processor over the same encoded events, in
    batches of a fetch's size, with no bus, faust, courier or checkpoint; events/s, the
    median of `passes`. Beside `events_per_s` it says how much of the brain's time its core
    takes, so a change in speed can be placed on one side (the core, or the shell and the
    bus) rather than looked for in both."""
    offsets: dict[str, int] = {}
    records: list[_Record] = []
    for event in events:
        name = topic_of(event)
        offset = offsets.get(name, 0)
        offsets[name] = offset + 1
        records.append(_Record(name, 0, offset, _key(event), encode(event)))
    rates = []
    for _ in range(passes):
        processor = BrainProcessor(env, "bench-decide-only")
        started = time.perf_counter()
        for i in range(0, len(records), batch):
            processor.process(records[i : i + batch])
        rates.append(len(records) / (time.perf_counter() - started))
    return statistics.median(rates)


def _seen(brain: Brain | None) -> int:
    """Input records the brain is done with, whatever it made of them."""
    if brain is None:
        return 0
    counters = brain.processor.counters
    return counters.processed + counters.dead_lettered + counters.ignored + counters.skipped


async def _brain_phase(brain: Brain, total: int) -> float:
    first = 0
    first_at = 0.0
    while _seen(brain) < total:
        await asyncio.sleep(0.005)
        if not first and _seen(brain):
            first, first_at = _seen(brain), time.perf_counter()
    return _rate(_seen(brain), first, first_at, time.perf_counter())


@dataclass
class LatencyPhase:
    """What one rate of the latency phase measured: each ScalePlan's latency from the
    publication of its cause, and the backlog the brain had left when the load generator
    finished sending (records published and not yet decided), and at most while it sent
    (against how far the generator said it got, every 0.1 s: it may not keep its rate)."""

    rate: float
    sent: int
    send_rate: float
    latencies: list[float]
    seen: list[float]
    bus: list[float]
    backlog_end: int
    backlog_max: int

    def summary(self) -> dict[str, Any]:
        return {
            "rate_events_per_s": self.rate,
            "events": self.sent,
            "send_rate_events_per_s": round(self.send_rate),
            "samples": len(self.latencies),
            "plan_latency_p50_ms": round(percentile(self.latencies, 50), 2),
            "plan_latency_p99_ms": round(percentile(self.latencies, 99), 2),
            "plan_latency_max_ms": round(max(self.latencies, default=float("nan")), 2),
            "bus_latency_p99_ms": round(percentile(self.bus, 99), 2),
            "backlog_end_records": self.backlog_end,
            "backlog_max_records": self.backlog_max,
        }


#: The load generator's result line: its latencies, a few tens of bytes each.
_RESULT_LINE_LIMIT = 64 * 1024 * 1024


async def _latency_phase(
    settings: Settings,
    workload: Workload,
    rate: float,
    seconds: float,
    oom_every: int,
    decided: Callable[[], int],
) -> LatencyPhase:
    """Run the load generator in its own process: in this one it would take the CPU that
    the brain's latency is measured on. `decided`: the records the brain is done with so
    far; the backlog is what was published and not yet decided, sampled while it sends
    and when it says it is done sending."""
    spec = {
        "bootstrap_servers": settings.bootstrap_servers,
        "env": workload.env,
        "jobs": workload.jobs,
        "seed": workload.seed + 1,
        "start": workload.start.isoformat(),
        "steps": list(workload.steps),
        "rate": rate,
        "seconds": seconds,
        "oom_every": oom_every,
    }
    count = int(rate * seconds)
    # the generator's workload moves on as the generator's does: the next phase continues
    # each job's timeline (the generator's rounds are round-robin over the jobs)
    for n in range(count):
        workload.steps[n % workload.jobs] += 1
    base = decided()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "streams.brain.bench.loadgen",
        json.dumps(spec),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        # its last line carries every latency it measured: past 64 KiB (asyncio's default
        # line limit) at about a thousand plans, which ended a run with a ValueError
        limit=_RESULT_LINE_LIMIT,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    errors = asyncio.ensure_future(proc.stderr.read())
    backlog_max = 0
    backlog_end: int | None = None
    sent: int | None = None
    lines: list[str] = []

    async def sample_backlog() -> None:
        nonlocal backlog_max
        while True:
            await asyncio.sleep(0.05)
            if sent is not None:
                # what the generator said it had published by now (it may not keep its rate)
                backlog_max = max(backlog_max, sent - (decided() - base))

    sampler = asyncio.ensure_future(sample_backlog())
    try:
        while line := (await proc.stdout.readline()).decode().strip():
            lines.append(line)
            said = json.loads(line)
            if "sending" in said:
                sent = int(said["sending"])
            elif "sent" in said and backlog_end is None:
                backlog_end = max(0, int(said["sent"]) - (decided() - base))
                backlog_max = max(backlog_max, backlog_end)
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    await proc.wait()
    err = await errors
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"load generator failed ({proc.returncode}): {err.decode()[-2000:]}")
    result = json.loads(lines[-1])
    return LatencyPhase(
        rate=rate,
        sent=int(result["sent"]),
        send_rate=float(result["send_rate"]),
        latencies=[float(x) for x in result["latencies_ms"]],
        seen=[float(x) for x in result["seen_ms"]],
        bus=[float(x) for x in result["bus_ms"]],
        backlog_end=backlog_end if backlog_end is not None else 0,
        backlog_max=backlog_max,
    )


def printed_rates(brain: float, baseline: float, raw: float | None) -> dict[str, Any]:
    """The rates in whole events/s and their ratios, each ratio computed from the rates
    as printed: a reader who divides the printed rates gets the printed ratio (from the
    unrounded rates it came out 0.0487 where the printed ones give 0.0486)."""
    shown, base = round(brain), round(baseline)
    shown_raw = None if raw is None else round(raw)
    return {
        "events_per_s": shown,
        "baseline_events_per_s": base,
        "faust_raw_events_per_s": shown_raw,
        "ratio_to_baseline": round(shown / base, 4) if base else None,
        "ratio_to_faust_raw": round(shown / shown_raw, 4) if shown_raw else None,
    }


async def run_bench(
    settings: Settings,
    events: int,
    jobs: int,
    *,
    rates: Sequence[float] = (1000.0,),
    seconds: float = 10.0,
    oom_every: int = 50,
    latency_oom_every: int = 10,
    faust_raw: bool = True,
    faust_sink: bool = True,
    decide_passes: int = 3,
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """`rates`: the latency phase at each, in turn (the first one's figures are also the
    top-level `plan_latency_*`)."""
    pg = await resolve_postgres(settings)
    registry = EnvRegistry(settings, pg.dsn)
    env = f"bench-{uuid.uuid4().hex[:8]}"
    await registry.create(env, EnvMode.VIRTUAL)
    brain: Brain | None = None
    try:
        workload = Workload(env, jobs)
        preload = workload.lifecycle()
        preload += workload.round_robin(max(events - len(preload), 0), oom_every)
        total = len(preload)
        progress(f"env {env}: pre-loading {total} events of {jobs} jobs")
        await _preload(settings, preload)
        progress("plain aiokafka consumer")
        baseline = await _baseline(settings, env, total)
        raw = None
        if faust_raw:
            progress("faust agent that only takes and acks")
            raw = await _faust_raw(settings, env, total, settings.consumer_batch)
        sink = None
        if faust_sink:
            progress("faust's fetched batches to a sink that only counts (the brain's path)")
            sink = await _faust_sink(settings, env, total)
        progress("brain")
        brain = Brain(
            settings, env, pg.dsn, freeze_gc=True
        )  # its own process, as `brain --tune-gc`
        await brain.start()
        brain_rate = await _brain_phase(brain, total)
        counters = dict(vars(brain.processor.counters))
        phases: list[LatencyPhase] = []
        for rate in rates:
            progress(f"latency at {rate:g} events/s for {seconds:g} s")
            phases.append(
                await _latency_phase(
                    settings, workload, rate, seconds, latency_oom_every, lambda: _seen(brain)
                )
            )
        first_phase = phases[0]
        latencies, seen, bus = first_phase.latencies, first_phase.seen, first_phase.bus
        result: dict[str, Any] = {
            "events": total,
            "jobs": jobs,
            **printed_rates(brain_rate, baseline, raw),
            "faust_sink_events_per_s": None if sink is None else round(sink),
            "decisions": counters["decisions"],
            "optimize_plans": counters["optimize_plans"],
            "scale_plans": counters["scale_plans"],
            "latency_rate_events_per_s": first_phase.rate,
            "latency_events": first_phase.sent,
            "latency_samples": len(latencies),
            "plan_latency_p50_ms": round(percentile(latencies, 50), 2),
            "plan_latency_p99_ms": round(percentile(latencies, 99), 2),
            "plan_latency_max_ms": round(max(latencies, default=float("nan")), 2),
            # to the plan's arrival at a consumer of `<env>.scale.plans`: one fetch more
            "plan_seen_latency_p50_ms": round(percentile(seen, 50), 2),
            "plan_seen_latency_p99_ms": round(percentile(seen, 99), 2),
            # a plain aiokafka reader of the job topics (the brain's fetch wait): the bus's
            # own delay from publication to a reader, which every plan latency includes
            "bus_latency_p50_ms": round(percentile(bus, 50), 2),
            "bus_latency_p99_ms": round(percentile(bus, 99), 2),
            # every rate: its plan latency and the backlog it left
            "latency_by_rate": [phase.summary() for phase in phases],
        }
        if decide_passes:
            # last, with the brain stopped: it holds the event loop for seconds, and takes
            # no CPU from the phases above (with the brain's GC settings, the process's)
            await brain.stop()
            brain = None
            progress(f"the brain's decisions alone, {decide_passes} passes")
            decided = decide_only(env, preload, settings.consumer_batch, decide_passes)
            result["decide_only_events_per_s"] = round(decided)
            result["ratio_to_decide_only"] = round(round(brain_rate) / round(decided), 4)
        return result
    finally:
        if brain is not None:
            with contextlib.suppress(Exception):
                await brain.stop()
        with contextlib.suppress(Exception):
            await registry.delete(env, force=True)
        pg.stop()


def bench_brain(
    events: int = typer.Option(100_000, "--events", min=1, help="events to pre-load"),
    jobs: int = typer.Option(100, "--jobs", min=1, help="jobs they belong to"),
    rate: list[float] = typer.Option(
        [1000.0, 10000.0, 30000.0],
        "--rate",
        min=1,
        help="events/s of the latency phase; repeat it for several phases, in turn (the "
        "first one's figures are also the top-level plan_latency_*)",
    ),
    seconds: float = typer.Option(10.0, "--seconds", min=1, help="length of the latency phase"),
    faust_raw: bool = typer.Option(
        True, "--faust-raw/--no-faust-raw", help="also time a faust agent that does nothing"
    ),
    faust_sink: bool = typer.Option(
        True,
        "--faust-sink/--no-faust-sink",
        help="also time faust's fetched batches handed to a sink that only counts them",
    ),
    decide_passes: int = typer.Option(
        3, "--decide-passes", min=0, help="passes of the decisions alone, without a bus (0: none)"
    ),
) -> None:
    """Pre-load EVENTS for JOBS into a fresh env, run the brain over them, then measure
    plan latency at a controlled rate; the last line is one JSON object."""

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    result = run_async(
        run_bench(
            load_settings(),
            events,
            jobs,
            rates=rate,
            seconds=seconds,
            faust_raw=faust_raw,
            faust_sink=faust_sink,
            decide_passes=decide_passes,
            progress=progress,
        )
    )
    typer.echo(json.dumps(result))
