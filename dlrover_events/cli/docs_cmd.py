"""`dlrover-events docs write|check`: the generated parts of docs/ (`dlrover_events.cli.reference`),
for whoever changes the code: run from the repository's root."""

from __future__ import annotations

from pathlib import Path

import typer

from dlrover_events.cli.reference import parts, stale
from dlrover_events.errors import UserError

app = typer.Typer(
    help="The reference tables of docs/, written from the code.", no_args_is_help=True
)

ROOT = typer.Option(Path("."), "--root", help="the repository's root (holds docs/)")


def _checked_root(root: Path) -> Path:
    if not (root / "docs").is_dir():
        raise UserError(f"{root.resolve()} has no docs/: run from the repository's root or --root")
    return root


@app.command("write")
def write(ctx: typer.Context, root: Path = ROOT) -> None:
    """Render every generated table of docs/ anew from the code."""
    root = _checked_root(root)
    rendered = []
    for part in parts(ctx.find_root().command):  # every part first: nothing half-written
        path = root / part.path
        try:
            text = path.read_text("utf-8")
            rendered.append((path, part.path, text, part.render(text)))
        except OSError as err:
            raise UserError(f"cannot read {part.path}: {err.strerror}") from None
        except ValueError as err:
            raise UserError(f"{part.path}: {err}") from None
    for path, name, text, new in rendered:
        if new != text:
            path.write_text(new, "utf-8")
            typer.echo(f"rewrote {name}")


@app.command("check")
def check(ctx: typer.Context, root: Path = ROOT) -> None:
    """Exit 1 and name the documents whose tables differ from the code."""
    out_of_date = stale(_checked_root(root), ctx.find_root().command)
    if out_of_date:
        typer.echo(f"out of date: {', '.join(out_of_date)} (run `dlrover-events docs write`)")
        raise typer.Exit(1)
    typer.echo("docs/ tables agree with the code")
