"""`dlrover-events replay`: feed a virtual env from another env or from a workload trace."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from dlrover_events.bus.tail import parse_since
from dlrover_events.cli.params import env_name, speed_or_max
from dlrover_events.cli.runner import run_async
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.errors import UserError
from dlrover_events.runtime.embedded import resolve_postgres
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.runtime.standalone import standalone
from dlrover_events.settings import Settings, load_settings
from schemas.control import EnvMode
from streams.replay.copier import Replay, ReplayReport
from streams.replay.core import DEFAULT_TYPES, Pacer, Selection
from streams.replay.trace import replay_trace


def replay(
    to: str = typer.Option(..., "--to", parser=env_name, help="virtual env to feed"),
    source: str | None = typer.Option(
        None, "--from", parser=env_name, help="env to copy from (e.g. prod)"
    ),
    trace: Path | None = typer.Option(None, "--trace", help="workload trace file to replay"),
    adapter: str = typer.Option("pollux", help="workload adapter for --trace"),
    since: str | None = typer.Option(
        None, metavar="DURATION|TIME", help="copy from this time: 2h (ago) or ISO time"
    ),
    until: str | None = typer.Option(
        None, metavar="DURATION|TIME", help="copy up to this time: 10m (ago) or ISO time"
    ),
    follow: bool = typer.Option(False, "--follow", help="keep copying live after catching up"),
    pace: float | None = typer.Option(
        "1x",
        "--speed",
        parser=speed_or_max,
        help="speed-up of the original timing: 10x, 100x, or max (as fast as possible)",
    ),
    as_fast_as_possible: bool = typer.Option(
        False, "--as-fast-as-possible", help="ignore the original timing (as --speed max)"
    ),
    types: str = typer.Option(
        ",".join(DEFAULT_TYPES), help="event types to copy (comma-separated globs; '*' = all)"
    ),
    all_metrics: bool = typer.Option(
        False, "--all-metrics", help="copy every runtime sample, not only a job's first phase"
    ),
    restart: bool = typer.Option(False, "--restart", help="ignore the saved position"),
) -> None:
    """Copy one env's inputs (or a trace's job arrivals) into a virtual env.

    Keys, per-job order and relative timing (scaled by --speed) are preserved; the
    position is saved, so running the same replay again resumes where it stopped.
    """
    if (source is None) == (trace is None):
        raise UserError("give exactly one of --from ENV and --trace FILE")
    try:
        pacer = Pacer(None if as_fast_as_possible else pace)
        start = parse_since(since) if since else None
        end = parse_since(until) if until else None
    except ValueError as err:
        raise UserError(str(err)) from None
    if trace is not None and (since or until or follow):
        raise UserError("--since, --until and --follow apply to --from, not to --trace")
    settings = load_settings()
    work: Work
    if trace is not None:
        if not trace.is_file():
            raise UserError(f"trace file {trace} does not exist")
        work = partial(replay_trace, settings, trace, to, adapter=adapter, pacer=pacer)
    else:
        assert source is not None
        chosen = tuple(t.strip() for t in types.split(",") if t.strip())
        work = Replay(
            settings,
            source,
            to,
            pacer=pacer,
            selection=Selection(chosen, first_phase_only=not all_metrics),
            since=start,
            until=end,
            follow=follow,
            restart=restart,
        ).run
    run_async(_run(settings, to, source, work))


#: Replay.run or replay_trace, called as work(progress=..., stop=...).
Work = Callable[..., Awaitable[ReplayReport]]


async def _run(settings: Settings, to: str, source: str | None, work: Work) -> None:
    """Check the envs, then run the copy with a progress bar, stoppable by Ctrl-C."""
    pg = await resolve_postgres(settings)
    registry = EnvRegistry(settings, pg.dsn)
    target = await registry.get(to)
    if target is None:
        raise UserError(f"no env named {to!r}; create it: dlrover-events env create {to}")
    if target.mode != EnvMode.VIRTUAL:
        raise UserError(f"env {to!r} is the real env; replay only into virtual envs")
    if source is not None and await registry.get(source) is None:
        raise UserError(f"no env named {source!r} to replay from")
    ctx = ServiceContext(settings, to, pg.dsn)
    stop = ctx.stop  # Ctrl-C, SIGTERM, or the target env deleted under the replay
    async with standalone(ctx, "replay"):
        ctx.ready.set()  # copying from here on: /readyz says so
        report = await _copy(to, work, stop)
    _summary(report, to)


async def _copy(to: str, work: Work, stop: asyncio.Event) -> ReplayReport:
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not sys.stderr.isatty(),
    ) as bar:
        task = bar.add_task(f"replay -> {to}", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        return await work(progress=progress, stop=stop)


def _summary(report: ReplayReport, to: str) -> None:
    topics = ", ".join(f"{n} {t}" for t, n in sorted(report.per_topic.items())) or "nothing"
    typer.echo(
        f"replayed into {to}: {report.copied} copied ({topics}), {report.skipped} skipped, "
        f"{report.undecodable} undecodable, {report.read} read"
    )
