"""`dlrover-events experiment create|list|describe|pause|activate|kill|searchers` and
`dlrover-events trial metrics`: experiments from a terminal.

`create` checks the document where it is typed (the contract, and the searcher's name
against the registry, which lives here in streams/) and refuses a name the env already
has; then it publishes an ExperimentSubmitted on the env's bus, as the REST door does, and
the searcher takes it from there. `pause`, `activate` and `kill` publish an
ExperimentAction. What is read (`list`, `describe`, `trial metrics`) is the experiments
recorder's tables, through the queries every door shares (dlrover_events.experiments);
`--json` prints the same rows the REST API serves.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from dlrover_events.bus.producer import Producer
from dlrover_events.cli.params import env_name, json_option, print_json
from dlrover_events.cli.runner import run_async
from dlrover_events.envs.choice import chosen_env
from dlrover_events.errors import UserError
from dlrover_events.experiments.document import ExperimentInvalid, experiment_yaml
from dlrover_events.experiments.rows import FINAL
from dlrover_events.experiments.store import ExperimentStore
from dlrover_events.runtime.embedded import resolve_postgres
from dlrover_events.settings import Settings, load_settings
from dlrover_events.store import create_pool, env_schema
from schemas.experiments import (
    ExperimentAction,
    ExperimentActionKind,
    ExperimentDocument,
    ExperimentSubmitted,
)

T = TypeVar("T")

experiment_app = typer.Typer(
    help="Experiments: create one from a file, list, describe, pause, activate, kill.",
    no_args_is_help=True,
)
trial_app = typer.Typer(help="An experiment's trials: what each reported.", no_args_is_help=True)

ENV = typer.Option(
    None, "--env", "-e", parser=env_name, help="default: the real env (the registry's)"
)
#: the most of a document read from a file (a sweep is a few KiB)
MAX_FILE = 1 << 20


@asynccontextmanager
async def _tables(env: str | None) -> AsyncIterator[tuple[Settings, str, ExperimentStore]]:
    """The settings, the env meant and its experiment tables."""
    settings = load_settings()
    dsn = (await resolve_postgres(settings)).dsn
    target = await chosen_env(settings, dsn, env)
    pool = await create_pool(dsn, env_schema(target), max_size=1)
    try:
        yield settings, target, ExperimentStore(pool)
    finally:
        await pool.close()


def _read(env: str | None, read: Callable[[ExperimentStore], Awaitable[T]]) -> T:
    async def go() -> T:
        async with _tables(env) as (_, _, store):
            return await read(store)

    return run_async(go())


def _check_searcher(document: ExperimentDocument) -> None:
    """The searcher must be one the registry has, and take the experiment (its own check:
    a grid needs a count for every real-valued hyperparameter, ...)."""
    from streams.searcher.core.registry import SEARCHERS

    name = document.spec.searcher.name
    searcher = SEARCHERS.get(name)
    if searcher is None:
        known = ", ".join(SEARCHERS.names())
        raise ExperimentInvalid("spec.searcher.name", f"unknown searcher {name!r}; known: {known}")
    problem = searcher.check(document.spec)
    if problem is not None:
        raise ExperimentInvalid("", problem)


@experiment_app.command("create")
def create(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help="an Experiment YAML"),
    env: str | None = ENV,
) -> None:
    """Check the experiment of FILE (its fields, its searcher) and submit it to the env:
    its searcher creates its trials. A name the env already has is refused."""
    try:
        with file.open("rb") as f:
            text = f.read(MAX_FILE + 1).decode()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{file}: cannot read it ({e})") from None
    if len(text) > MAX_FILE:
        raise UserError(f"{file}: more than {MAX_FILE} bytes; an experiment is a few KiB")
    try:
        document = experiment_yaml(text)
        _check_searcher(document)
    except ExperimentInvalid as e:
        raise UserError(f"{file}: {e}") from None
    name = document.metadata.name

    async def go() -> str:
        async with _tables(env) as (settings, target, store):
            if await store.exists(name):
                status = await store.status(name)
                raise UserError(
                    f"env {target} already has an experiment named {name!r} ({status.value});"
                    " name this one otherwise"
                )
            event = ExperimentSubmitted(
                env=target, experiment=name, spec=document.spec, source="cli"
            )
            async with Producer(settings) as producer:
                await producer.publish(event)
            return target

    target = run_async(go())
    typer.echo(f"experiment {name} submitted to {target}.experiments")


@experiment_app.command("list")
def list_experiments(
    env: str | None = ENV, as_json: bool = json_option("the experiments as JSON")
) -> None:
    """The env's experiments, newest first: status, searcher, trials created, the best
    validation value of each one's metric and the trial that reported it."""
    rows = _read(env, lambda store: store.experiments())
    if as_json:
        print_json(rows)
        return
    table = Table("name", "status", "searcher", "metric", "trials", "best", "submitted")
    for r in rows:
        best = (
            "-" if r["best_value"] is None else f"{r['best_value']:.6g} (trial {r['best_trial']})"
        )
        goal = "" if r["metric"] is None else ("min " if r["smaller_is_better"] else "max ")
        trials = f"{r['trials']}/{r['max_trials']}" if r["max_trials"] else str(r["trials"])
        table.add_row(
            r["name"],
            r["status"],
            r["searcher"] or "-",
            goal + (r["metric"] or "-"),
            trials,
            best,
            _when(r["submitted_at"]),
        )
    Console().print(table)


def _when(iso: str | None) -> str:
    """An ISO 8601 time as people read it in a table (to the second, UTC as stored)."""
    return "-" if iso is None else iso[:19].replace("T", " ")


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def _hparams(values: dict[str, Any]) -> str:
    return " ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items()
    )


@experiment_app.command("describe")
def describe(
    name: str,
    env: str | None = ENV,
    as_json: bool = json_option("the experiment, its trials and their decisions as JSON"),
) -> None:
    """One experiment: its status and why, the best trial, the rungs, every trial (its
    hyperparameters, status, rung, budget given and used, last and best validation value)
    and what each trial was told, with why."""
    seen = _read(env, lambda store: store.describe(name))
    if as_json:
        print_json(seen)
        return
    out = Console()
    goal = "smaller is better" if seen["smaller_is_better"] else "larger is better"
    budget = ((seen["spec"] or {}).get("searcher") or {}).get("budget") or {}
    out.print(f"experiment {seen['name']}: {seen['status']}", highlight=False)
    if seen["status_reason"]:
        out.print(f"  why:       {seen['status_reason']}", highlight=False)
    out.print(f"  searcher:  {seen['searcher'] or '-'}", highlight=False)
    out.print(f"  metric:    {seen['metric'] or '-'} ({goal})", highlight=False)
    if budget:
        out.print(f"  budget:    {budget.get('max')} {budget.get('unit')}", highlight=False)
    out.print(f"  submitted: {_when(seen['submitted_at'])}", highlight=False)
    best = seen["best_trial"]
    if best is not None:
        out.print(
            f"  best:      trial {best['trial']}: {_number(best['value'])}"
            f" ({_hparams(best['hparams'])})",
            highlight=False,
        )
    for rung in seen["rungs"]:
        out.print(
            f"  rung {rung['rung']}: budget {_number(rung['budget'])},"
            f" trials {', '.join(str(t) for t in rung['trials'])}",
            highlight=False,
        )
    table = Table("trial", "status", "rung", "budget", "used", "last", "best", "hparams")
    for t in seen["trials"]:
        table.add_row(
            str(t["trial"]),
            t["status"],
            "-" if t["rung"] is None else str(t["rung"]),
            _number(t["budget"]),
            _number(t["budget_used"]),
            _number(t["last_value"]),
            _number(t["best_value"]),
            _hparams(t["hparams"]),
        )
    out.print(table)
    out.print("what each trial was told:", highlight=False)
    for t in seen["trials"]:
        for d in t["decisions"]:
            given = "" if d["budget"] is None else f" to {_number(d['budget'])}"
            rung = "" if d["rung"] is None else f" (rung {d['rung']})"
            why = f": {d['reason']}" if d["reason"] else ""
            out.print(
                f"  #{d['seq']} trial {t['trial']} {d['decision']}{given}{rung}{why}",
                highlight=False,
                markup=False,
            )
    for d in seen["decisions"]:
        why = f": {d['reason']}" if d["reason"] else ""
        out.print(f"  #{d['seq']} {d['decision']}{why}", highlight=False, markup=False)


def _act(name: str, action: ExperimentActionKind, env: str | None, reason: str) -> str:
    async def go() -> str:
        async with _tables(env) as (settings, target, store):
            status = await store.status(name)
            if status in FINAL:
                raise UserError(
                    f"experiment {name} is {status.value}: there is nothing to {action.value}"
                )
            event = ExperimentAction(
                env=target, experiment=name, action=action, reason=reason, source="cli"
            )
            async with Producer(settings) as producer:
                await producer.publish(event)
            return target

    target = run_async(go())
    return f"{action.value} of experiment {name} published to {target}.experiments"


REASON = typer.Option("", "--reason", help="why, recorded with the action")


@experiment_app.command("pause")
def pause(name: str, env: str | None = ENV, reason: str = REASON) -> None:
    """Pause the experiment: no trial runs or starts (running ones are suspended, their
    checkpoints kept) until it is activated."""
    typer.echo(_act(name, ExperimentActionKind.PAUSE, env, reason))


@experiment_app.command("activate")
def activate(name: str, env: str | None = ENV, reason: str = REASON) -> None:
    """Activate a paused experiment: its searcher goes on."""
    typer.echo(_act(name, ExperimentActionKind.ACTIVATE, env, reason))


@experiment_app.command("kill")
def kill(name: str, env: str | None = ENV, reason: str = REASON) -> None:
    """Kill the experiment: every trial is stopped and its job deleted."""
    typer.echo(_act(name, ExperimentActionKind.KILL, env, reason))


@experiment_app.command("searchers")
def searchers() -> None:
    """The searchers an experiment may name (spec.searcher.name), one line each."""
    from streams.searcher.core.registry import describe_searchers

    known = describe_searchers()
    width = max((len(name) for name, _ in known), default=0)
    for name, description in known:
        typer.echo(f"{name:{width}}  {description}")


@trial_app.command("metrics")
def metrics(
    experiment: str,
    trial: int = typer.Argument(..., min=0, help="the trial's index"),
    env: str | None = ENV,
    as_json: bool = json_option("the reports as JSON rows"),
) -> None:
    """What trial TRIAL of EXPERIMENT reported, training and validation, by step."""
    rows = _read(env, lambda store: store.trial_metrics(experiment, trial))
    if as_json:
        print_json(rows)
        return
    names = sorted({k for r in rows for k in r["metrics"]})
    table = Table("step", "budget", "kind", *names)
    for r in rows:
        table.add_row(
            str(r["step"]),
            _number(r["budget"]),
            "validation" if r["validation"] else "training",
            *(_number(r["metrics"].get(n)) for n in names),
        )
    Console().print(table)


__all__ = ["experiment_app", "trial_app"]
