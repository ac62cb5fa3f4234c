"""Root of the CLI: the global options, the built-in commands and those streams/ and
handlers/ contribute (entry points). How a command runs and exits is `cli.runner`'s.
"""

from __future__ import annotations

from importlib.metadata import entry_points

import typer

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
from dlrover_events.cli.runner import run_command
from dlrover_events.runtime import logs
from dlrover_events.runtime.logs import FORMAT_ENV, LEVEL_ENV, LogFormat, LogLevel
from dlrover_events.runtime.services import BENCH_GROUP, COMMAND_GROUP

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


_registered = False


def register_commands() -> typer.Typer:
    """Add the built-in and the contributed commands, once: at call time, so that
    importing the CLI does not load every contributed package."""
    global _registered
    if _registered:
        return app
    _registered = True
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
    run_command(lambda: register_commands()(args=argv, standalone_mode=False))
