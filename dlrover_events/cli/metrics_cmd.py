"""`dlrover-events metrics list`: every Prometheus metric of every service, as the table
of docs/metrics.md (written from `dlrover_events.runtime.metrics.catalogue`, never by hand)."""

from __future__ import annotations

import typer

from dlrover_events.cli.params import json_option, print_json
from dlrover_events.runtime.metrics import catalogue, catalogue_markdown

app = typer.Typer(help="The Prometheus metrics the services serve.", no_args_is_help=True)


@app.command("list")
def list_metrics(as_json: bool = json_option("a JSON list of the metrics")) -> None:
    """Print every metric (name, type, labels, what it says) as a Markdown table."""
    if as_json:
        print_json(
            [
                {"name": m.name, "type": m.type, "labels": m.labels, "what": m.help}
                for m in catalogue()
            ]
        )
        return
    typer.echo(catalogue_markdown(), nl=False)
