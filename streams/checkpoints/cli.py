"""`dlrover-events checkpoint list` and `dlrover-events model register|list|describe|versions`:
the env's checkpoint catalog and model registry from a terminal.

What is read is the checkpoints service's table and the registry's, through the queries
every door shares (dlrover_events.checkpoints.store); `--json` prints the rows the REST
API (``/v1/checkpoints``, ``/v1/models``) serves. `model register` writes the registry
itself, in the transaction that keeps retention from deleting the checkpoint it
references.
"""

from __future__ import annotations

import getpass
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from dlrover_events.checkpoints.store import CheckpointStore
from dlrover_events.cli.params import env_name, json_option, print_json
from dlrover_events.cli.runner import run_async
from dlrover_events.envs.choice import chosen_env
from dlrover_events.errors import UserError
from dlrover_events.runtime.embedded import resolve_postgres
from dlrover_events.settings import load_settings
from dlrover_events.store import create_pool, env_schema

T = TypeVar("T")

checkpoint_app = typer.Typer(
    help="The env's checkpoints: what each job committed, kept or deleted.",
    no_args_is_help=True,
)
model_app = typer.Typer(
    help="The model registry: versions of checkpoints, with their lineage.",
    no_args_is_help=True,
)

ENV = typer.Option(
    None, "--env", "-e", parser=env_name, help="default: the real env (the registry's)"
)


@asynccontextmanager
async def _store(env: str | None) -> AsyncIterator[CheckpointStore]:
    settings = load_settings()
    dsn = (await resolve_postgres(settings)).dsn
    target = await chosen_env(settings, dsn, env)
    pool = await create_pool(dsn, env_schema(target), max_size=1)
    try:
        yield CheckpointStore(pool)
    finally:
        await pool.close()


def _with(env: str | None, work: Callable[[CheckpointStore], Awaitable[T]]) -> T:
    async def go() -> T:
        async with _store(env) as store:
            return await work(store)

    return run_async(go())


def _console() -> Console:
    """A table's console: the terminal's width, or wide enough for whole lines when the
    output goes to a pipe or a file (a script's grep then finds each row whole)."""
    return Console() if sys.stdout.isatty() else Console(width=240)


def _when(iso: str | None) -> str:
    return "-" if iso is None else iso[:19].replace("T", " ")


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def _metrics(values: dict[str, Any]) -> str:
    return " ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items()
    )


@checkpoint_app.command("list")
def list_checkpoints(
    job: str | None = typer.Argument(None, help="the job (name or uuid)"),
    experiment: str | None = typer.Option(
        None, "--experiment", help="every checkpoint of this experiment's trials"
    ),
    include_deleted: bool = typer.Option(
        False, "--all", help="deleted checkpoints too, with why they were"
    ),
    env: str | None = ENV,
    as_json: bool = json_option("the checkpoints as JSON rows"),
) -> None:
    """The checkpoints of JOB (or of an experiment's trials), newest first: step, world
    size, plan, metrics, size, what the save blocked and what the persist took, where it
    lies, and whether retention keeps it."""
    if job is None and experiment is None:
        raise UserError("name a job, or an experiment with --experiment")
    rows = _with(
        env,
        lambda s: s.checkpoints(job=job, experiment=experiment, include_deleted=include_deleted),
    )
    if as_json:
        print_json(rows)
        return
    table = Table(
        "checkpoint", "job", "step", "world", "plan", "metrics", "size", "blocked", "persist",
        "reason", "state", "url",
    )  # fmt: skip
    for r in rows:
        state = r["state"] if r["state"] == "kept" else f"{r['state']}: {r['delete_detail']}"
        job_of = r["job_name"] or r["job_uuid"]
        if r["trial"] is not None:
            job_of += f" ({r['experiment']} #{r['trial']})"
        table.add_row(
            r["checkpoint_id"], job_of, str(r["step"]), str(r["world_size"]),
            r["plan_id"] or "-", _metrics(r["metrics"]), _size(r["size_bytes"]),
            f"{r['blocking_s']:.3g} s", f"{r['persist_s']:.3g} s", r["reason"], state, r["url"],
        )  # fmt: skip
    _console().print(table)


@model_app.command("register")
def register(
    name: str = typer.Argument(..., help="the model's name (made at its first version)"),
    checkpoint: str | None = typer.Option(
        None, "--from", help="the checkpoint's id (see `checkpoint list`)"
    ),
    best: str | None = typer.Option(
        None, "--best", help="the experiment whose best kept checkpoint to register"
    ),
    notes: str = typer.Option("", "--notes", help="what this version is, for whoever uses it"),
    labels: list[str] = typer.Option([], "--label", help="a label (repeat for more)"),
    description: str | None = typer.Option(None, "--description", help="the model's"),
    env: str | None = ENV,
    as_json: bool = json_option("the version registered as JSON"),
) -> None:
    """Register a checkpoint as the next version of model NAME, with its lineage: the job,
    trial and experiment, the hyperparameters, the plans it trained under. Retention
    never deletes a checkpoint a version references."""
    if (checkpoint is None) == (best is None):
        raise UserError("give one of --from CHECKPOINT or --best EXPERIMENT")

    async def go(store: CheckpointStore) -> dict[str, Any]:
        chosen = checkpoint if checkpoint is not None else await store.best_of(best or "")
        return await store.register(
            name,
            chosen,
            notes=notes,
            labels=labels,
            description=description,
            registered_by=f"cli:{getpass.getuser()}",
        )

    described = _with(env, go)
    if as_json:
        print_json(described)
        return
    version = described["version"]
    typer.echo(
        f"model {name} version {version['version']}: checkpoint {version['checkpoint_id']}"
        f" ({version['checkpoint']['url']})"
    )


@model_app.command("list")
def list_models(env: str | None = ENV, as_json: bool = json_option("the models as JSON")) -> None:
    """The env's models, the latest updated first, with their versions."""
    rows = _with(env, lambda s: s.models())
    if as_json:
        print_json(rows)
        return
    table = Table("model", "versions", "latest", "updated", "description")
    for r in rows:
        table.add_row(
            r["name"], str(r["versions"]), str(r["latest"] or "-"), _when(r["updated_at"]),
            r["description"],
        )  # fmt: skip
    _console().print(table)


@model_app.command("versions")
def versions(
    name: str, env: str | None = ENV, as_json: bool = json_option("the versions as JSON")
) -> None:
    """Every version of model NAME, newest first: its checkpoint, where it came from."""
    rows = _with(env, lambda s: s.versions(name))
    if as_json:
        print_json(rows)
        return
    table = Table("version", "checkpoint", "job", "step", "metrics", "labels", "registered")
    for r in rows:
        job = r["job_name"] + (f" ({r['experiment']} #{r['trial']})" if r["experiment"] else "")
        table.add_row(
            str(r["version"]), r["checkpoint_id"], job, str(r["step"]), _metrics(r["metrics"]),
            ", ".join(r["labels"]), _when(r["created_at"]),
        )  # fmt: skip
    _console().print(table)


@model_app.command("describe")
def describe(
    name: str,
    version: int | None = typer.Option(None, "--version", min=1, help="default: the latest"),
    env: str | None = ENV,
    as_json: bool = json_option("the model, the version and its lineage as JSON"),
) -> None:
    """Model NAME and one version: notes, labels, the checkpoint and its lineage (the job,
    trial and experiment it came from, the hyperparameters, the plans in force)."""
    seen = _with(env, lambda s: s.describe(name, version))
    if as_json:
        print_json(seen)
        return
    v = seen["version"]
    ck = v["checkpoint"]
    lineage = v["lineage"]

    def line(text: str) -> None:
        typer.echo(text)

    line(f"model {seen['name']} version {v['version']} of {seen['versions']}")
    if seen["description"]:
        line(f"  description: {seen['description']}")
    if v["notes"]:
        line(f"  notes:       {v['notes']}")
    if v["labels"]:
        line(f"  labels:      {', '.join(v['labels'])}")
    line(f"  registered:  {_when(v['created_at'])} by {v['registered_by'] or '-'}")
    line(f"  checkpoint:  {ck['checkpoint_id']} ({ck['state']}) at {ck['url']}")
    line(
        f"               step {ck['step']}, world size {ck['world_size']},"
        f" {_size(ck['size_bytes'])}, {ck['format']} v{ck['format_version']}, {ck['reason']}"
    )
    line("lineage:")
    job = lineage["job"]
    line(f"  job:         {job['name'] or '-'} ({job['uuid']})")
    if lineage["experiment"] is not None:
        line(f"  experiment:  {lineage['experiment']}, trial {lineage['trial']}")
        searcher = lineage.get("searcher") or {}
        if searcher:
            goal = "smaller is better" if searcher.get("smaller_is_better") else "larger is better"
            line(f"  searcher:    {searcher.get('name')} on {searcher.get('metric')} ({goal})")
        line(f"  hyperparameters: {_metrics(lineage['hyperparameters']) or '-'}")
    line(f"  metrics:     {_metrics(lineage['metrics']) or '-'}")
    line(f"  plan in force: {lineage['plan_in_force'] or '-'}")
    for p in lineage["plans"]:
        what = ", ".join(
            x
            for x in (
                p["status"] and f"status {p['status']}",
                p["optimizer"] and f"by {p['optimizer']}",
                p["reason"],
            )
            if x
        )
        sizes = "/".join(str(w) for w in p["world_sizes"])
        line(
            f"    plan {p['plan_id']}: steps {p['first_step']}-{p['last_step']}, world size"
            f" {sizes}" + (f" ({what})" if what else "")
        )


__all__ = ["checkpoint_app", "model_app"]
