"""The evaluator of an env: folds its topics into a Ledger and reports KPIs.

The ledger is a derived view, rebuilt from the topics at start (a group-less read from
the beginning), so the evaluator needs no offsets and no state of its own to be right
after a restart. Reports go to ``<env>.eval.reports`` and the env's Postgres.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Sequence
from datetime import UTC, datetime

import typer
from rich.console import Console
from rich.table import Table

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.tail import Line
from dlrover_events.bus.tailer import follow
from dlrover_events.bus.topic_reader import read_topic
from dlrover_events.bus.topics import (
    BRAIN_PLANS,
    EXPERIMENTS,
    JOB_EVENTS,
    JOB_METRICS,
    SCALE_PLANS,
    SCALE_RESULTS,
    TRIAL_METRICS,
    topic,
)
from dlrover_events.cli.params import duration, env_name, json_option, print_json
from dlrover_events.cli.runner import run_async
from dlrover_events.errors import UserError
from dlrover_events.lifecycle import wait_or_stop
from dlrover_events.runtime.embedded import resolve_postgres
from dlrover_events.runtime.metrics import EvaluatorMetrics
from dlrover_events.runtime.services import Service, ServiceContext
from dlrover_events.runtime.standalone import serve_alone
from dlrover_events.settings import Settings, load_settings
from dlrover_events.store import EnvStore
from schemas.codec import CodecError, decode
from schemas.evaluation import EvaluationReport
from streams.evaluators.ledger import Ledger
from streams.evaluators.registry import EVALUATORS, evaluate

#: (experiments and trial metrics: what the experiments evaluator reads of trials)
INPUTS = (
    JOB_EVENTS,
    JOB_METRICS,
    BRAIN_PLANS,
    SCALE_PLANS,
    SCALE_RESULTS,
    EXPERIMENTS,
    TRIAL_METRICS,
)


def reports(env: str, ledger: Ledger, now: datetime) -> list[EvaluationReport]:
    """One report per evaluator over everything seen so far."""
    jobs = ledger.in_window(None, None)
    start = min((j.submitted_at for j in jobs if j.submitted_at), default=now)
    end = max(ledger.last_event_at or now, start)
    return [
        EvaluationReport(
            env=env,
            source="evaluator",
            evaluator=name,
            window_start=start,
            window_end=end,
            jobs=len(jobs),
            metrics=evaluate(jobs, end, [name]),
        )
        for name in EVALUATORS
    ]


async def publish(settings: Settings, store: EnvStore, batch: list[EvaluationReport]) -> None:
    async with Producer(settings) as producer:
        await producer.publish_many(batch)
    for report in batch:
        await store.save_evaluation(report)


async def ledger_of(settings: Settings, env: str, topics: Sequence[str] = INPUTS) -> Ledger:
    """Everything the env's topics (all inputs by default) hold now, folded."""
    ledger = Ledger()
    for name in topics:
        for record in await read_topic(settings, topic(env, name)):
            with contextlib.suppress(CodecError):
                ledger.observe(decode(record.value))
    return ledger


async def run(ctx: ServiceContext, interval_s: float = 10.0) -> None:
    ledger = Ledger()
    metrics = EvaluatorMetrics(ctx.metrics, ctx.env)

    def fold(line: Line) -> None:
        if line.event is not None:
            ledger.observe(line.event)
            metrics.records.inc()

    store = await EnvStore.open(ctx.pg_dsn, ctx.env, max_size=2)
    tail = asyncio.create_task(
        follow(ctx.settings, ctx.env, INPUTS, fold, start="earliest", stop=ctx.stop)
    )
    try:
        ctx.ready.set()
        while not ctx.stop.is_set():
            await wait_or_stop(ctx.stop, interval_s)
            if tail.done():
                tail.result()  # surfaces why following stopped
            if ledger.jobs:
                batch = reports(ctx.env, ledger, datetime.now(UTC))
                await publish(ctx.settings, store, batch)
                for report in batch:
                    metrics.reports.labels(ctx.env, report.evaluator).inc()
    finally:
        ctx.stop.set()
        await asyncio.gather(tail, return_exceptions=True)
        await store.close()


service = Service(
    name="evaluator",
    description="folds the env's topics into KPIs and reports them every 10 s",
    run=run,
)


def evaluate_command(
    env: str = typer.Option(..., "--env", "-e", parser=env_name, help="env to evaluate"),
    publish_reports: bool = typer.Option(
        False, "--publish", help="also publish the reports to <env>.eval.reports and Postgres"
    ),
    as_json: bool = json_option("JSON: the KPIs by name, and each evaluator's report"),
) -> None:
    """Print the KPIs of an env from everything its topics hold now."""
    settings = load_settings()

    async def go() -> None:
        ledger = await ledger_of(settings, env)
        batch = reports(env, ledger, datetime.now(UTC))
        kpis = {k: v for r in batch for k, v in r.metrics.items() if k != "jobs"}
        if as_json:
            print_json({"env": env, "jobs": len(ledger.jobs), "metrics": kpis, "reports": batch})
        else:
            table = Table("metric", "value", title=f"{env}: {len(ledger.jobs)} jobs")
            for key, value in kpis.items():
                table.add_row(key, f"{value:.6g}")
            Console().print(table)
        if publish_reports:
            pg = await resolve_postgres(settings)
            store = await EnvStore.open(pg.dsn, env, max_size=1)
            async with store:
                await publish(settings, store, batch)

    run_async(go())


def evaluator_command(
    env: str = typer.Option(..., "--env", "-e", parser=env_name, help="the env to evaluate"),
    interval: float = typer.Option(
        10.0, parser=duration, help="between two rounds of reports: 10s, 1m (at least 0.1 s)"
    ),
) -> None:
    """Run the evaluator of one env alone: its KPIs reported to <env>.eval.reports and
    Postgres every --interval seconds (`evaluate` prints them once)."""

    def say(ctx: ServiceContext) -> None:
        typer.echo(
            f"evaluator of env {env} is running (metrics: {ctx.endpoints['metrics']}, "
            "/healthz and /readyz beside them); Ctrl-C stops it",
            err=True,
        )

    if interval < 0.1:
        raise UserError(f"--interval {interval:g}s: at least 0.1s")
    work = functools.partial(run, interval_s=interval)
    run_async(serve_alone(load_settings(), env, "evaluator", work, on_ready=say))
