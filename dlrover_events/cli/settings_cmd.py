"""`dlrover-events settings list`: every variable of every process (the tables of
docs/settings.md), for an operator who has the package but not the repository."""

from __future__ import annotations

import typer

from dlrover_events.cli.params import json_option, print_json
from dlrover_events.cli.reference import settings_markdown, settings_rows

app = typer.Typer(help="The settings of the processes (DLROVER_EVENTS_*).", no_args_is_help=True)


@app.command("list")
def list_settings(as_json: bool = json_option("a JSON list of the variables")) -> None:
    """Print every variable (type, default, bounds, what) as Markdown tables."""
    if as_json:
        print_json(settings_rows())
        return
    typer.echo(settings_markdown(), nl=False)
