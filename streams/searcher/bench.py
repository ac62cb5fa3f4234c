"""`dlrover-events bench experiments`: trial metric reports stored per second through the
experiments recorder, next to Optuna's storages storing the same values in the same run,
and the searcher's decision latency from a trial's report to the decision it causes.

Stored: a fresh virtual env with the recorder running (its consumer group joined: a first
report is stored before the clock starts); REPORTS TrialMetrics of TRIALS trials of
EXPERIMENTS experiments, encoded beforehand, are published as fast as the producer goes,
and the clock stops when the last of them is in the env's Postgres, counted by a query
every few milliseconds (queryable as they land, not after a flush). RUNS runs, the median
printed; each run is its own experiments.

Baselines, same reports, one intermediate value each: Optuna's ``InMemoryStorage`` and
its ``RDBStorage`` on the same Postgres (a schema of its own, dropped after). RDBStorage
needs SQLAlchemy and a Postgres driver it knows (psycopg2 or psycopg); without one its
rate is null and the output says why.

Decisions: the searcher service (`searcher`, entry point ``dlrover_events.services``) runs
in the env; an experiment of the ``random`` searcher, one trial at a time, each trial's
budget one step. For each trial created, its validation report at that step is published
and the clock stops at the next decision about that trial (it completes): DECISIONS
samples, p50 and p99. Without a searcher service installed that half is skipped, and said.

The last line is one JSON object.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import asyncpg
import typer

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topic_reader import TopicReader
from dlrover_events.bus.topics import TRIAL_DECISIONS, TRIAL_METRICS, topic
from dlrover_events.cli.params import duration
from dlrover_events.cli.runner import run_async
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.errors import UserError
from dlrover_events.experiments.store import ExperimentStore
from dlrover_events.runtime.embedded import bench_broker, resolve_postgres
from dlrover_events.runtime.services import ServiceContext, discover_services
from dlrover_events.settings import Settings, load_settings
from dlrover_events.store import create_pool, env_schema
from dlrover_events.store.database import quote_ident
from schemas.codec import decode, encode
from schemas.control import EnvMode
from schemas.experiments import (
    DecisionKind,
    ExperimentSpec,
    ExperimentSubmitted,
    TrialDecision,
    TrialMetrics,
)
from streams.searcher import recorder

log = logging.getLogger(__name__)

Say = Callable[[str], None]
#: how often the stored count is read while a run goes on
COUNT_EVERY_S = 0.005
#: RDBStorage is slow: it stores at most this many of the reports
RDB_REPORTS = 2_000


def _reports(env: str, experiments: list[str], trials: int, n: int) -> list[TrialMetrics]:
    """``n`` reports spread over the experiments' trials, each trial's steps in order;
    every tenth report of a trial a validation one."""
    out = []
    for i in range(n):
        experiment = experiments[i % len(experiments)]
        trial = (i // len(experiments)) % trials
        step = i // (len(experiments) * trials) + 1
        validation = step % 10 == 0
        metrics = {"val_loss": 1.0 / step} if validation else {"loss": 2.0 / step, "lr": 0.01}
        out.append(
            TrialMetrics(
                env=env,
                experiment=experiment,
                trial=trial,
                step=step,
                budget=float(step),
                validation=validation,
                metrics=metrics,
            )
        )
    return out


async def _stored(pool: Any, names: list[str]) -> int:
    return int(
        await pool.fetchval(
            "SELECT count(*) FROM trial_metrics WHERE experiment = ANY($1::text[])", names
        )
    )


async def store_run(
    producer: Producer, pool: Any, env: str, run: int, *, reports: int, trials: int,
    experiments: int, timeout_s: float,
) -> dict[str, Any]:  # fmt: skip
    """One run: publish the reports, time until the last one is stored."""
    names = [f"store-{run}-{i}" for i in range(experiments)]
    events = _reports(env, names, trials, reports)
    records = [(topic(env, TRIAL_METRICS), encode(e), e.experiment.encode()) for e in events]
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def publish() -> float:
        futures = [await producer.enqueue(t, v, k) for t, v, k in records]
        await asyncio.gather(*futures)
        return loop.time() - started

    publishing = asyncio.create_task(publish())
    stored = 0
    async with asyncio.timeout(timeout_s):
        while stored < reports:
            await asyncio.sleep(COUNT_EVERY_S)
            stored = await _stored(pool, names)
    seconds = loop.time() - started
    published_s = await publishing
    return {
        "reports": reports,
        "seconds": round(seconds, 3),
        "reports_per_s": round(reports / seconds, 1),
        "publish_s": round(published_s, 3),
        "stored_after_published_s": round(seconds - published_s, 3),
    }


def _pg_driver() -> str | None:
    """The SQLAlchemy dialect of an installed Postgres driver, if any."""
    if importlib.util.find_spec("sqlalchemy") is None:
        return None
    for module, dialect in (("psycopg2", "postgresql+psycopg2"), ("psycopg", "postgresql+psycopg")):
        if importlib.util.find_spec(module) is not None:
            return dialect
    return None


def _optuna_rate(storage: Any, values: list[tuple[int, int, float]], trials: int) -> float:
    """Intermediate values stored per second by an Optuna storage: one study, ``trials``
    running trials, each value ``(trial, step, value)`` stored as it comes."""
    import optuna

    study = storage.create_new_study([optuna.study.StudyDirection.MINIMIZE], f"b-{uuid.uuid4()}")
    ids = [storage.create_new_trial(study) for _ in range(trials)]
    started = time.perf_counter()
    for trial, step, value in values:
        storage.set_trial_intermediate_value(ids[trial], step, value)
    return len(values) / (time.perf_counter() - started)


async def optuna_baseline(
    dsn: str, events: list[TrialMetrics], trials: int, say: Say
) -> dict[str, Any]:
    """Optuna's storages on the same reports: in memory, and RDBStorage on this Postgres."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    values = [(e.trial, e.step, next(iter(e.metrics.values()))) for e in events]
    memory = await asyncio.to_thread(
        _optuna_rate, optuna.storages.InMemoryStorage(), values, trials
    )
    say(f"optuna InMemoryStorage: {memory:,.0f} reports/s")
    out: dict[str, Any] = {"optuna_memory_reports_per_s": round(memory, 1)}
    dialect = _pg_driver()
    if dialect is None:
        why = (
            "optuna's RDBStorage needs SQLAlchemy and a Postgres driver (psycopg2 or psycopg);"
            " none is installed"
        )
        say(f"optuna RDBStorage: skipped ({why})")
        return {**out, "optuna_rdb_reports_per_s": None, "optuna_rdb_skipped": why}
    schema = f"bench_optuna_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"CREATE SCHEMA {quote_ident(schema)}")
        url = dialect + dsn[dsn.index("://") :]
        storage = optuna.storages.RDBStorage(
            url, engine_kwargs={"connect_args": {"options": f"-csearch_path={schema}"}}
        )
        part = values[:RDB_REPORTS]
        rdb = await asyncio.to_thread(_optuna_rate, storage, part, trials)
        with contextlib.suppress(Exception):
            storage.engine.dispose()
    finally:
        await conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE")
        await conn.close()
    say(f"optuna RDBStorage ({dialect}, {len(part)} reports): {rdb:,.0f} reports/s")
    return {**out, "optuna_rdb_reports_per_s": round(rdb, 1), "optuna_rdb_reports": len(part)}


def _experiment_spec(samples: int) -> ExperimentSpec:
    return ExperimentSpec.model_validate(
        {
            "hyperparameters": {"lr": {"type": "log", "minval": -4, "maxval": -1}},
            "searcher": {
                "name": "random",
                "metric": "val_loss",
                "max_trials": samples + 1,  # the experiment outlives the last sample
                "max_concurrent_trials": 1,
                "budget": {"unit": "steps", "max": 1},
                "seed": 1,
            },
            "trial": {"spec": {"roles": {"worker": {"replicas": 1}}}},
        }
    )


async def decision_latency(
    settings: Settings, dsn: str, env: str, samples: int, timeout_s: float, say: Say
) -> dict[str, Any]:
    """The searcher's time from a trial's report to its decision about that trial."""
    service = discover_services().get("searcher")
    if service is None:
        why = "no searcher service is installed (entry point `searcher` of dlrover_events.services)"
        say(f"decision latency: skipped ({why})")
        return {"decision_latency_skipped": why}
    ctx = ServiceContext(settings, env, dsn)
    searching = asyncio.create_task(service.run(ctx), name="bench-searcher")
    name = f"latency-{uuid.uuid4().hex[:6]}"
    latencies: list[float] = []
    reader = TopicReader(
        settings, [topic(env, TRIAL_DECISIONS)], client_id="bench-decisions", fetch_max_wait_ms=20
    )
    seen_after: list[float] = []
    try:
        async with Producer(settings) as producer, reader, asyncio.timeout(timeout_s):
            await producer.publish(
                ExperimentSubmitted(env=env, experiment=name, spec=_experiment_spec(samples))
            )
            reported: dict[int, float] = {}  # trial -> when its report was published
            while len(latencies) < samples:
                for record in await reader.fetch(timeout_ms=50):
                    if record.value is None or len(latencies) >= samples:
                        continue
                    seen = time.time()
                    decision = decode(record.value)
                    if not isinstance(decision, TrialDecision) or decision.experiment != name:
                        continue
                    if decision.decision is DecisionKind.DONE:
                        raise UserError(f"the searcher ended the experiment: {decision.reason}")
                    trial = decision.trial
                    assert trial is not None
                    if trial in reported:
                        # published (the record's time, set by the searcher's producer),
                        # and seen by a reader that waits 20 ms a fetch
                        sent = reported.pop(trial)
                        latencies.append(record.timestamp / 1000 - sent)
                        seen_after.append(seen - sent)
                    elif decision.decision is DecisionKind.CREATE:
                        report = TrialMetrics(
                            env=env, experiment=name, trial=trial, step=1, budget=1.0,
                            validation=True, metrics={"val_loss": 1.0 / (trial + 1)},
                        )  # fmt: skip
                        reported[trial] = time.time()
                        await producer.publish(report)
                if searching.done():
                    searching.result()
                    raise UserError("the searcher stopped")
    finally:
        ctx.stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(searching, 30)
    p50, p99 = _percentiles(latencies)
    seen50, seen99 = _percentiles(seen_after)
    say(
        f"decision latency over {len(latencies)} reports: p50 {p50:.1f} ms, p99 {p99:.1f} ms"
        f" (seen by a reader: p50 {seen50:.1f} ms, p99 {seen99:.1f} ms)"
    )
    return {
        "decisions": len(latencies),
        "decision_latency_p50_ms": round(p50, 1),
        "decision_latency_p99_ms": round(p99, 1),
        "decision_seen_latency_p50_ms": round(seen50, 1),
        "decision_seen_latency_p99_ms": round(seen99, 1),
    }


def _percentiles(seconds: list[float]) -> tuple[float, float]:
    """p50 and p99 in milliseconds (nearest rank)."""
    ms = sorted(x * 1000 for x in seconds)
    return ms[len(ms) // 2], ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]


async def run_bench(
    settings: Settings, *, reports: int, trials: int, experiments: int, runs: int,
    decisions: int, baseline: bool, timeout_s: float, say: Say,
) -> dict[str, Any]:  # fmt: skip
    pg = await resolve_postgres(settings)
    registry = EnvRegistry(settings, pg.dsn)
    env = f"bench-exp-{uuid.uuid4().hex[:6]}"
    await registry.create(env, EnvMode.VIRTUAL)
    result: dict[str, Any] = {"env": env, "reports": reports, "trials": trials}
    ctx = ServiceContext(settings, env, pg.dsn)
    tally = recorder.Tally()
    recording = asyncio.create_task(recorder.run(ctx, tally), name="bench-recorder")
    pool = await create_pool(pg.dsn, env_schema(env), max_size=2)
    try:
        async with Producer(settings) as producer:
            # the group joined and a batch stored before any clock starts
            warm = _reports(env, ["warm-up"], 1, 1)[0]
            await producer.publish(warm)
            async with asyncio.timeout(timeout_s):
                while await _stored(pool, ["warm-up"]) < 1:
                    if recording.done():
                        recording.result()
                    await asyncio.sleep(0.05)
            measured = []
            for run in range(runs):
                one = await store_run(
                    producer, pool, env, run, reports=reports, trials=trials,
                    experiments=experiments, timeout_s=timeout_s,
                )  # fmt: skip
                say(
                    f"run {run + 1}/{runs}: {reports} reports stored in {one['seconds']:.2f} s"
                    f" ({one['reports_per_s']:,.0f}/s; published in {one['publish_s']:.2f} s)"
                )
                measured.append(one)
        rates = [m["reports_per_s"] for m in measured]
        result.update(
            experiments=experiments,
            runs=measured,
            reports_per_s=round(statistics.median(rates), 1),
            recorder_batches=tally.batches,
        )
        say(f"stored: median {result['reports_per_s']:,.0f} reports/s over {runs} run(s)")
        assert await ExperimentStore(pool).count_metrics("warm-up") == 1
    finally:
        ctx.stop.set()
        await recording
        await pool.close()
    try:
        if baseline:
            events = _reports(env, ["optuna"], trials, reports)
            result.update(await optuna_baseline(pg.dsn, events, trials, say))
            rdb = result.get("optuna_rdb_reports_per_s")
            if rdb:
                result["vs_optuna_rdb"] = round(result["reports_per_s"] / rdb, 1)
        if decisions > 0:
            result.update(await decision_latency(settings, pg.dsn, env, decisions, timeout_s, say))
    finally:
        with contextlib.suppress(Exception):
            await registry.delete(env, force=True)
        pg.stop()
    return result


def bench_experiments(
    reports: int = typer.Option(20_000, "--reports", min=1, help="trial metric reports a run"),
    trials: int = typer.Option(16, "--trials", min=1, help="trials of each experiment"),
    experiments: int = typer.Option(
        1, "--experiments", min=1, help="experiments the reports are spread over"
    ),
    runs: int = typer.Option(3, "--runs", min=1, help="runs of the stored rate (median)"),
    decisions: int = typer.Option(
        50, "--decisions", min=0, help="reports timed to their decision (0: no searcher)"
    ),
    baseline: bool = typer.Option(
        True, "--baseline/--no-baseline", help="also time Optuna's storages on the same reports"
    ),
    timeout_s: float = typer.Option(
        300.0, "--timeout", parser=duration, help="longest wait of each phase: 5m, 300"
    ),
) -> None:
    """Trial metric reports stored per second through the experiments recorder (median of
    RUNS, beside Optuna's storages), then the searcher's decision latency from a report to
    its decision; the last line is one JSON object."""

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with bench_broker(load_settings(), say) as settings:
        result = run_async(
            run_bench(
                settings, reports=reports, trials=trials, experiments=experiments, runs=runs,
                decisions=decisions, baseline=baseline, timeout_s=timeout_s, say=say,
            )
        )  # fmt: skip
    typer.echo(json.dumps(result))


__all__ = ["bench_experiments", "run_bench"]
