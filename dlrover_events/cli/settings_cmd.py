"""`dlrover-events settings list`: every variable of every process (the tables of
docs/settings.md), for an operator who has the package but not the repository."""

from __future__ import annotations

import typer

from dlrover_events.cli.reference import settings_markdown

app = typer.Typer(help="The settings of the processes (DLROVER_EVENTS_*).", no_args_is_help=True)


@app.command("list")
def list_settings() -> None:
    """Print every variable (type, default, bounds, what) as Markdown tables."""
    typer.echo(settings_markdown(), nl=False)
