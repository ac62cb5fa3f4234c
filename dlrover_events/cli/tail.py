"""`dlrover-events tail`: one readable line per event, or JSON lines for piping."""

from __future__ import annotations

import asyncio
import sys

import typer
from rich.console import Console
from rich.text import Text

from dlrover_events.bus.tail import Filter, Line, format_json, format_text, parse_since
from dlrover_events.bus.tailer import Start, follow
from dlrover_events.bus.topics import ENV_TOPIC_NAMES
from dlrover_events.cli.params import env_name
from dlrover_events.cli.runner import run_async
from dlrover_events.envs.control import EnvWatcher
from dlrover_events.errors import UserError
from dlrover_events.lifecycle import wait_for_any
from dlrover_events.settings import Settings, load_settings

_STYLE = {
    "node.oom": "bold red",
    "node.failed": "red",
    "job.failed": "red",
    "brain.plan": "cyan",
    "scale.plan": "magenta",
    "scale.result": "green",
    "job.request": "magenta",
    "job.request.result": "green",
    "dlq.record": "yellow",
}


def tail(
    topics: list[str] = typer.Argument(
        None, help=f"env topics to follow (default: all of {', '.join(ENV_TOPIC_NAMES)})"
    ),
    env: str | None = typer.Option(
        None,
        "--env",
        "-e",
        parser=env_name,
        help="env to tail (default: the real env, as dlrover.control announces it)",
    ),
    job: str | None = typer.Option(None, "--job", "-j", help="only this job id"),
    type_: str | None = typer.Option(None, "--type", "-t", help="only these types (glob: node.*)"),
    from_beginning: bool = typer.Option(False, "--from-beginning", help="start at the oldest"),
    since: str | None = typer.Option(
        None,
        "--since",
        metavar="DURATION|TIME",
        help="start this long ago (30s, 10m, 2h) or at this ISO time",
    ),
    as_json: bool = typer.Option(False, "--json", help="raw JSON lines for piping"),
    limit: int | None = typer.Option(
        None, "--limit", min=1, metavar="N", help="stop after N events"
    ),
) -> None:
    """Follow env topics live, one line per event (colour on a terminal)."""
    settings = load_settings()
    for t in topics or []:
        if t not in ENV_TOPIC_NAMES:
            raise UserError(f"unknown topic {t!r}; choose from {', '.join(ENV_TOPIC_NAMES)}")
    if from_beginning and since:
        raise UserError("--from-beginning and --since exclude each other")
    start: Start = "earliest" if from_beginning else "latest"
    if since:
        try:
            start = parse_since(since)
        except ValueError as err:
            raise UserError(str(err)) from None
    console = Console(highlight=False, soft_wrap=True)
    colour = sys.stdout.isatty() and not as_json

    def emit(line: Line) -> None:
        if as_json:
            sys.stdout.buffer.write(format_json(line) + b"\n")
            sys.stdout.flush()
        elif colour:
            style = "yellow" if line.event is None else _STYLE.get(line.event.type, "")
            console.print(Text(format_text(line), style=style))
        else:
            print(format_text(line), flush=True)

    async def go() -> None:
        await follow(
            settings,
            env or await real_env(settings),
            topics or [],
            emit,
            where=Filter(job, type_),
            start=start,
            max_events=limit,
        )

    run_async(go())


async def real_env(settings: Settings) -> str:
    """The env that is real now, as dlrover.control says (read to its end once): after
    `env promote`, the new one; no Postgres needed, only the bus that `tail` reads."""
    watcher, stop = EnvWatcher(settings), asyncio.Event()
    watching = asyncio.create_task(watcher.run(stop))
    try:
        if not await wait_for_any([watcher.caught_up], [watching]):
            watching.result()  # why it stopped (the broker away: one line)
    finally:
        stop.set()
        await asyncio.gather(watching, return_exceptions=True)
    if watcher.real is None:
        raise UserError("no env is real now (see `dlrover-events env list`); name one with --env")
    return watcher.real
