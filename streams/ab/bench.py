"""`dlrover-events bench ab`: where the wall time of a lockstep A/B goes.

A lockstep arm's result depends on its input alone, but its speed is set by round trips:
each tick the virtual operator simulates, checkpoints its cluster, publishes the tick's
events and a barrier, and waits for the brain's acknowledgement on every partition of the
plans topic; the brain fetches, decides, publishes plans and acks. The same brain and
simulator code decide a whole workload in seconds of CPU, so nearly all of an A/B's wall
is waiting. This bench runs a small A/B (the first N jobs of a Pollux workload) on the
embedded broker and Postgres, and splits a tick's wall time by the timings the services
record in their metrics (`dlrover_events.runtime.metrics`): the operator's phases, the brain's
deciding, publishing and checkpoints. Beside them, measured in the same run, the bus's own
delay from a publication to a reader that fetches as the lockstep consumers do: a tick
holds at least two of those (barrier to brain, acknowledgement to operator).

Per-tick wall comes from the broker's timestamps of consecutive barriers (the operator
publishes one per tick). Each arm's per-job JCTs are digested, so a change meant to make
the run faster can show it changed no result. The machine is shared: quote the load the
JSON carries with the numbers.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
import typer
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from prometheus_client import CollectorRegistry

from dlrover_events.bus.kafka_client import kafka_connection, stop_consumer
from dlrover_events.bus.topic_reader import read_topic
from dlrover_events.bus.topics import JOB_EVENTS, JOB_METRICS, topic
from dlrover_events.cli.runner import run_async
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.errors import UserError
from dlrover_events.extras import SIM
from dlrover_events.lifecycle import end_within
from dlrover_events.runtime.embedded import bench_broker, resolve_postgres
from dlrover_events.runtime.services import ServiceContext, discover_services
from dlrover_events.settings import Settings, load_settings
from schemas.codec import CodecError, decode
from schemas.control import EnvMode
from schemas.lockstep import Barrier
from streams.ab.arms import Arm, parse_arm
from streams.ab.runner import ABTest, ArmCluster, _brain

#: The workload the bench takes its first jobs from (the A/B the issue measured).
WORKLOAD = (
    Path(__file__).resolve().parents[2] / "handlers/simulator/data/pollux/workloads/workload-6.csv"
)

#: The lockstep consumers' fetch wait (the operator's and the brain's): the probe of the
#: bus's delay fetches with the same.
PROBE_FETCH_WAIT_MS = 10
PROBE_SAMPLES = 50

#: The operator's phases (`OperatorMetrics.spent`), in the split's order.
OPERATOR_PHASES = (
    "simulate",
    "apply",
    "checkpoint",
    "publish",
    "mark_published",
    "wait_acks",
    # while handling what its consumer read (acknowledgements among it): inside wait_acks
    "input_checkpoint",
    "input_publish",
    "input_mark_published",
)

ProgressLine = Callable[[str], None]


def first_jobs(workload: Path, jobs: int) -> str:
    """The workload's header and its first `jobs` submissions, as a trace file's text."""
    lines = workload.read_text().splitlines()
    if len(lines) < 2:
        raise UserError(f"{workload} holds no jobs")
    return "\n".join(lines[: jobs + 1]) + "\n"


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (nearest rank); None of nothing."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def jct_digest(jct: dict[str, float]) -> str:
    """A short digest of an arm's per-job JCTs: equal digests, equal results."""
    text = json.dumps({k: round(v, 6) for k, v in sorted(jct.items())}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def tick_walls(stamps: dict[int, int]) -> list[float]:
    """Wall seconds between consecutive ticks' barriers (broker timestamps, ms), by tick."""
    ticks = sorted(stamps)
    return [(stamps[b] - stamps[a]) / 1000.0 for a, b in itertools.pairwise(ticks) if b == a + 1]


def split_per_tick(samples: dict[str, float], ticks: int) -> dict[str, float]:
    """Milliseconds per tick of each phase, from the services' totals (seconds).

    `wait_acks` (the operator waiting for its brain) holds the brain's deciding and
    publishing; what is left of it is the bus: fetch waits and round trips.
    """
    if ticks <= 0:
        return {}
    per = {k: 1000.0 * v / ticks for k, v in samples.items() if k != "brain_checkpoints"}
    inside = (
        "brain_decide",
        "brain_publish",
        "operator_input_checkpoint",
        "operator_input_publish",
    )
    per["wait_acks_bus"] = max(
        0.0, per.get("operator_wait_acks", 0.0) - sum(per.get(k, 0.0) for k in inside)
    )
    return {k: round(v, 3) for k, v in per.items()}


def _value(registry: CollectorRegistry, name: str, labels: dict[str, str]) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def service_totals(
    operator: CollectorRegistry, brain: CollectorRegistry | None, env: str
) -> tuple[int, dict[str, float]]:
    """(ticks, seconds per phase) an arm's operator and brain recorded."""
    labels = {"env": env, "platform": "virtual"}
    ticks = int(_value(operator, "dlrover_events_operator_ticks_total", labels))
    totals = {
        f"operator_{phase}": _value(
            operator, "dlrover_events_operator_phase_seconds_total", {**labels, "phase": phase}
        )
        for phase in OPERATOR_PHASES
    }
    if brain is not None:
        for what, name in (
            ("decide", "dlrover_events_brain_decide_duration_seconds"),
            ("publish", "dlrover_events_brain_publish_duration_seconds"),
            ("checkpoint", "dlrover_events_brain_checkpoint_duration_seconds"),
        ):
            totals[f"brain_{what}"] = _value(brain, f"{name}_sum", {"env": env})
        totals["brain_checkpoints"] = _value(
            brain, "dlrover_events_brain_checkpoint_duration_seconds_count", {"env": env}
        )
    return ticks, totals


async def barrier_stamps(settings: Settings, env: str) -> dict[int, int]:
    """When each tick's barrier reached the broker (ms), on the first partition of
    job.events (the operator publishes a tick's barrier to every partition)."""
    stamps: dict[int, int] = {}
    for record in await read_topic(settings, topic(env, JOB_EVENTS)):
        if record.partition != 0:
            continue
        with contextlib.suppress(CodecError):
            event = decode(record.value)
            if isinstance(event, Barrier):
                stamps.setdefault(event.tick, record.timestamp)
    return stamps


async def bus_delay(settings: Settings, env: str, samples: int = PROBE_SAMPLES) -> list[float]:
    """Seconds from publishing a record (acked) to a reader fetching it, the reader waiting
    at most `PROBE_FETCH_WAIT_MS` per fetch, as the lockstep consumers do."""
    tp = TopicPartition(topic(env, JOB_METRICS), 0)
    connection = kafka_connection(settings)
    consumer = AIOKafkaConsumer(
        **connection, enable_auto_commit=False, fetch_max_wait_ms=PROBE_FETCH_WAIT_MS
    )
    producer = AIOKafkaProducer(**connection, acks="all")
    await consumer.start()
    await producer.start()
    delays: list[float] = []
    try:
        consumer.assign([tp])
        await consumer.seek_to_end(tp)
        for i in range(samples):
            started = time.monotonic()
            await producer.send_and_wait(tp.topic, f"probe-{i}".encode(), partition=0)
            while not (await consumer.getmany(tp, timeout_ms=1000)).get(tp):
                pass
            delays.append(time.monotonic() - started)
    finally:
        await producer.stop()
        await stop_consumer(consumer)
    return delays


async def run_arms(
    test: ABTest, progress: ProgressLine
) -> tuple[dict[str, dict[str, Any]], dict[str, float]]:
    """One A/B of `test`'s arms, as `ABTest.run` runs it, with each service's metrics in a
    registry of ours; per arm what it measured, and the run's walls."""
    services = discover_services()
    registry = EnvRegistry(test.settings, test.dsn)
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    created: list[str] = []
    registries: dict[tuple[str, str], CollectorRegistry] = {}
    try:
        expected = 0
        for arm in test.arms:
            env = arm.env(test.run_id)
            await registry.create(env, EnvMode.VIRTUAL, settings=test.env_settings(arm))
            created.append(env)
            expected = await test._feed(env)
        contexts = []
        started = time.monotonic()
        for arm in test.arms:
            for name in ["operator", *(["brain"] if _brain(arm) else [])]:
                ctx = ServiceContext(test.settings, arm.env(test.run_id), test.dsn, stop=stop)
                registries[(arm.env(test.run_id), name)] = ctx.metrics
                contexts.append(ctx)
                tasks.append(asyncio.create_task(services[name].run(ctx), name=name))
        await test._until_ready(contexts, tasks)
        ready, cpu = time.monotonic(), time.process_time()
        ledgers = await test._until_done(expected, tasks, None)
        done, cpu = time.monotonic(), time.process_time() - cpu
        stop.set()
        await end_within(tasks, 20)
        tasks = []
        # (the arms' services share this process's one event loop: CPU near the wall
        # means the loop, not the round trips, sets the pace)
        walls = {"start_s": ready - started, "run_s": done - ready, "cpu_s": cpu}
        out: dict[str, dict[str, Any]] = {}
        for arm in test.arms:
            env = arm.env(test.run_id)
            result = test._result(arm, ledgers[env], expected)
            ticks, totals = service_totals(
                registries[(env, "operator")], registries.get((env, "brain")), env
            )
            walls_per_tick = tick_walls(await barrier_stamps(test.settings, env))
            out[arm.name] = {
                "ticks": ticks,
                "unfinished": result.unfinished,
                "jct_digest": jct_digest(result.jct),
                "jct_mean_s": round(statistics.fmean(result.jct.values()), 3)
                if result.jct
                else None,
                "tick_walls": walls_per_tick,
                "totals": totals,
            }
            progress(f"  {arm.name}: {ticks} ticks, JCTs {out[arm.name]['jct_digest']}")
        return out, walls
    finally:
        stop.set()
        await end_within(tasks, 20)
        for env in created:
            with contextlib.suppress(Exception):
                await registry.delete(env, force=True)


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 3) if present else None


def summarize(runs: list[tuple[dict[str, dict[str, Any]], dict[str, float]]]) -> dict[str, Any]:
    """Per arm, the median over runs of each figure; a result that differs between runs
    (it must not, in lockstep) shows as several digests."""
    arms: dict[str, Any] = {}
    for name in runs[0][0]:
        per_run = [measured[name] for measured, _ in runs]
        ticks = [m["ticks"] for m in per_run]
        splits = [split_per_tick(m["totals"], m["ticks"]) for m in per_run]
        phases = sorted({k for s in splits for k in s})
        arms[name] = {
            "ticks": int(statistics.median(ticks)),
            "jct_digests": sorted({m["jct_digest"] for m in per_run}),
            "jct_mean_s": per_run[0]["jct_mean_s"],
            "unfinished": max(m["unfinished"] for m in per_run),
            "wall_per_tick_ms_p50": _median(
                [_ms(percentile(m["tick_walls"], 50)) for m in per_run]
            ),
            "wall_per_tick_ms_p90": _median(
                [_ms(percentile(m["tick_walls"], 90)) for m in per_run]
            ),
            "wall_per_tick_ms_mean": _median(
                [
                    _ms(statistics.fmean(m["tick_walls"])) if m["tick_walls"] else None
                    for m in per_run
                ]
            ),
            "split_ms_per_tick": {p: _median([s.get(p) for s in splits]) for p in phases},
            "brain_checkpoints": _median([m["totals"].get("brain_checkpoints") for m in per_run]),
        }
    return {
        "run_s_p50": _median([w["run_s"] for _, w in runs]),
        "run_s_all": [round(w["run_s"], 2) for _, w in runs],
        "start_s_p50": _median([w["start_s"] for _, w in runs]),
        "process_cpu_s_p50": _median([w["cpu_s"] for _, w in runs]),
        "arms": arms,
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000.0 * seconds


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


async def run_bench(
    settings: Settings,
    *,
    jobs: int,
    arms: list[Arm],
    runs: int,
    nodes: int,
    gpus: int,
    workload: Path,
    progress: ProgressLine,
) -> dict[str, Any]:
    pg = await resolve_postgres(settings)
    registry = EnvRegistry(settings, pg.dsn)
    probe_env = f"bench-{uuid.uuid4().hex[:8]}"
    try:
        with tempfile.TemporaryDirectory(prefix="bench-ab-") as tmp:
            trace = Path(tmp) / "trace.csv"
            trace.write_text(first_jobs(workload, jobs))
            await registry.create(probe_env, EnvMode.VIRTUAL)
            progress(f"bus delay: {PROBE_SAMPLES} publications to a reader")
            delays = await bus_delay(settings, probe_env)
            measured = []
            for i in range(runs):
                test = ABTest(
                    settings,
                    pg.dsn,
                    arms,
                    trace=trace,
                    cluster=ArmCluster(nodes, gpus),
                    timeout_s=1800.0,
                    poll_s=2.0,
                )
                progress(f"run {i + 1}/{runs}: {jobs} jobs, arms {', '.join(a.name for a in arms)}")
                measured.append(await run_arms(test, progress))
        return {
            "jobs": jobs,
            "nodes": nodes,
            "gpus_per_node": gpus,
            "runs": runs,
            "load_1m": round(os.getloadavg()[0], 2),
            "bus_delay_ms_p50": _round(_ms(percentile(delays, 50))),
            "bus_delay_ms_p90": _round(_ms(percentile(delays, 90))),
            **summarize(measured),
        }
    finally:
        with contextlib.suppress(Exception):
            await registry.delete(probe_env, force=True)
        pg.stop()


def bench_ab(
    jobs: int = typer.Option(20, "--jobs", min=1, help="first jobs of the workload"),
    arm: list[str] = typer.Option(
        ["tiresias"], "--arm", help="arm (a preset name or name=settings.yaml; repeat)"
    ),
    runs: int = typer.Option(3, "--runs", min=1, help="A/B runs; figures are their medians"),
    nodes: int = typer.Option(16, min=1, help="nodes of each arm's simulated cluster"),
    gpus: int = typer.Option(4, min=1, help="GPUs per node"),
    workload: Path = typer.Option(WORKLOAD, "--workload", help="Pollux workload CSV"),
) -> None:
    """Run a lockstep A/B of the workload's first JOBS jobs RUNS times and split a tick's
    wall time by what the services recorded; the last line is one JSON object."""

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    SIM.require()
    if not workload.is_file():
        raise UserError(f"workload {workload} does not exist (run from the repository's root)")
    parsed = [parse_arm(a) for a in arm]
    if len({a.name for a in parsed}) != len(parsed):
        raise UserError("arm names must differ")
    progress(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with bench_broker(load_settings(), progress) as settings:
        result = run_async(
            run_bench(
                settings,
                jobs=jobs,
                arms=parsed,
                runs=runs,
                nodes=nodes,
                gpus=gpus,
                workload=workload,
                progress=progress,
            )
        )
    typer.echo(orjson.dumps(result).decode())
