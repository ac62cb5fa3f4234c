"""`dlrover-events schemas ...`: JSON Schema files for producers not written in Python, and
the env settings' reference in docs/env-settings.md."""

from __future__ import annotations

from pathlib import Path

import typer

from dlrover_events.errors import UserError
from schemas.jsonschema import DEFAULT_DIR, render_all, stale_files, write_all
from schemas.settings_doc import with_reference

app = typer.Typer(
    help="Export or check the JSON Schema files of every event, render the settings' doc.",
    no_args_is_help=True,
)


@app.command()
def export(out: Path = typer.Option(DEFAULT_DIR, help="folder to write into")) -> None:
    """Write one JSON Schema file per event type, plus event.json for any event."""
    written = write_all(out)
    typer.echo(f"wrote {len(written)} schema files to {out}")


@app.command()
def check(folder: Path = typer.Option(DEFAULT_DIR, help="folder to compare")) -> None:
    """Exit non-zero when the files differ from the models (run `schemas export`)."""
    stale = stale_files(folder, render_all())
    if stale:
        raise UserError(
            f"stale schema files: {', '.join(stale)}; run `dlrover-events schemas export`"
        )
    typer.echo("schema files are up to date")


@app.command("settings-doc")
def settings_doc(
    doc: Path = typer.Option(Path("docs/env-settings.md"), help="the document to update"),
) -> None:
    """Render the env settings' reference tables into the document (between its markers)."""
    try:
        text = doc.read_text("utf-8")
        doc.write_text(with_reference(text), "utf-8")
    except OSError as err:
        raise UserError(f"cannot update {doc}: {err.strerror}") from None
    except ValueError as err:
        raise UserError(f"{doc}: {err}") from None
    typer.echo(f"rendered the settings' reference into {doc}")
