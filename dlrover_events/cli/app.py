"""Root of the CLI. User mistakes end in one line on stderr and exit code 2; only bugs
show a traceback.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from importlib.metadata import entry_points
from typing import Any, TypeVar

import typer

from dlrover_events.errors import UserError
from dlrover_events.runtime import logs
from dlrover_events.runtime.logs import FORMAT_ENV, LEVEL_ENV, LogFormat, LogLevel
from dlrover_events.runtime.services import BENCH_GROUP, COMMAND_GROUP

T = TypeVar("T")

app = typer.Typer(
    name="dlrover-events",
    help="The event-driven Brain of an elastic deep-learning training cluster, on Kafka.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def root(
    log_level: LogLevel | None = typer.Option(
        None,
        "--log-level",
        envvar=LEVEL_ENV,
        case_sensitive=False,
        help="DEBUG, INFO, WARNING, ERROR or CRITICAL [default: INFO for `up` and the "
        "services run alone, WARNING for the other commands]",
        show_default=False,
    ),
    log_format: LogFormat = typer.Option(
        LogFormat.TEXT,
        "--log-format",
        envvar=FORMAT_ENV,
        case_sensitive=False,
        help="text, or json: one JSON object a line (timestamp, level, logger, message, "
        "env, service, job, plan_id)",
    ),
) -> None:
    """The event-driven Brain of an elastic deep-learning training cluster, on Kafka."""
    logs.configure(log_level, log_format)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def fail(message: str) -> typer.Exit:
    """Print one line to stderr; the caller raises the returned Exit."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


_registered = False


def register_commands() -> typer.Typer:
    """Add the built-in and the contributed commands, once.

    At call time, not import time: contributed commands import this module for
    ``run_async``, and loading them while it is half-imported would be circular.
    """
    global _registered
    if _registered:
        return app
    _registered = True
    from dlrover_events.cli import (
        bootstrap,
        docs_cmd,
        env,
        metrics_cmd,
        schemas_cmd,
        settings_cmd,
        tail,
        up,
    )

    app.add_typer(env.app, name="env")
    app.add_typer(metrics_cmd.app, name="metrics")
    app.add_typer(schemas_cmd.app, name="schemas")
    app.add_typer(settings_cmd.app, name="settings")
    app.add_typer(docs_cmd.app, name="docs")
    app.command("tail")(tail.tail)
    app.command("up")(up.up)
    app.command("bootstrap")(bootstrap.bootstrap_command)
    # Commands contributed by streams/ and handlers/ (brain, operator, gateway, bench...).
    for ep in entry_points(group=COMMAND_GROUP):
        contributed = ep.load()
        if isinstance(contributed, typer.Typer):
            app.add_typer(contributed, name=ep.name)
        else:
            app.command(ep.name)(contributed)
    benches = typer.Typer(
        help="Benchmarks: each prints, last, one JSON line of measurements.",
        no_args_is_help=True,
    )
    for ep in entry_points(group=BENCH_GROUP):
        benches.command(ep.name)(ep.load())
    app.add_typer(benches, name="bench")
    return app


def main(argv: list[str] | None = None) -> None:
    logs.configure()  # until the root's options are read (`root`)
    try:
        register_commands()(args=argv, standalone_mode=False)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(130)
    except typer.TyperException as exc:
        # Usage mistakes: one line that names the problem, and where to look.
        ctx = getattr(exc, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        typer.echo(f"error: {exc.format_message()}{hint}", err=True)
        sys.exit(exc.exit_code)
    except UserError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
