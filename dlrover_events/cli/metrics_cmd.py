"""`dlrover-events metrics list`: every Prometheus metric of every service, as the table
of docs/metrics.md (written from `dlrover_events.runtime.metrics.catalogue`, never by hand)."""

from __future__ import annotations

import typer

from dlrover_events.runtime.metrics import catalogue_markdown

app = typer.Typer(help="The Prometheus metrics the services serve.", no_args_is_help=True)


@app.command("list")
def list_metrics() -> None:
    """Print every metric (name, type, labels, what it says) as a Markdown table."""
    typer.echo(catalogue_markdown(), nl=False)
