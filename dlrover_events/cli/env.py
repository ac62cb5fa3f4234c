"""`dlrover-events env ...`: manage envs (topic prefix + Postgres schema each)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
import yaml
from rich.console import Console
from rich.table import Table

from dlrover_events.cli.app import run_async
from dlrover_events.embedded import resolve_postgres
from dlrover_events.envs import EnvRegistry
from dlrover_events.errors import UserError
from dlrover_events.settings import load_settings
from dlrover_events.topic_manifests import kafka_topics
from schemas.control import EnvMode

app = typer.Typer(
    help="Create, list and delete envs (each a topic prefix and a schema).", no_args_is_help=True
)


def _read_settings(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text())
    except OSError as err:
        raise UserError(f"cannot read {path}: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise UserError(f"{path} is not valid YAML: {err}") from None
    if not isinstance(loaded, dict):
        raise UserError(f"{path} must hold a mapping of settings (brain:, operator:)")
    return loaded


async def _registry() -> EnvRegistry:
    settings = load_settings()
    pg = await resolve_postgres(settings)
    return EnvRegistry(settings, pg.dsn)


@app.command()
def create(
    name: str = typer.Argument(..., help="env name: [a-z][a-z0-9-]{0,30}"),
    mode: EnvMode = typer.Option(EnvMode.VIRTUAL, help="real (touches the cluster) or virtual"),
    partitions: int | None = typer.Option(
        None, min=1, help="partitions per topic (default: settings.partitions)"
    ),
    settings_file: Path | None = typer.Option(
        None, "--settings", help="YAML of the env's settings (brain:, operator:)"
    ),
) -> None:
    """Create an env: its topics <env>.*, its schema env_<name> (migrated), and announce it."""
    env_settings = _read_settings(settings_file) if settings_file else {}

    async def go() -> None:
        registry = await _registry()
        rec = await registry.create(name, mode, partitions=partitions, settings=env_settings)
        typer.echo(f"created env {rec.name} ({rec.mode.value}, {rec.partitions} partitions)")

    run_async(go())


@app.command("list")
def list_envs() -> None:
    """List envs with their mode and partitions."""

    async def go() -> None:
        registry = await _registry()
        envs = await registry.list()
        table = Table("name", "mode", "partitions", "created")
        for e in envs:
            table.add_row(e.name, e.mode.value, str(e.partitions), e.created_at.isoformat())
        Console().print(table)

    run_async(go())


@app.command()
def delete(
    name: str = typer.Argument(..., help="env to delete"),
    force: bool = typer.Option(False, "--force", help="allow deleting the real env"),
) -> None:
    """Delete an env: drops its schema and topics, and tombstones it on dlrover.control."""

    async def go() -> None:
        registry = await _registry()
        await registry.delete(name, force=force)
        typer.echo(f"deleted env {name}")

    run_async(go())


@app.command()
def promote(
    name: str = typer.Argument(..., help="virtual env to make the real one"),
    reason: str = typer.Option("", help="why: recorded with the change and announced"),
) -> None:
    """Make a virtual env the real one and the old real env virtual, atomically."""

    async def go() -> None:
        registry = await _registry()
        new, old = await registry.promote(name, reason=reason)
        was = f"; {old.name} is now virtual" if old else ""
        typer.echo(f"{new.name} is now the real env{was}")

    run_async(go())


@app.command()
def history(name: str | None = typer.Argument(None, help="only this env")) -> None:
    """The registry's changes (create, delete, promote, demote) with their reasons."""

    async def go() -> None:
        registry = await _registry()
        table = Table("when", "env", "change", "mode", "reason")
        for c in await registry.changes(name):
            table.add_row(
                c["changed_at"].isoformat(), c["name"], c["change"], c["mode"] or "", c["reason"]
            )
        Console().print(table)

    run_async(go())


@app.command()
def topics(
    envs: list[str] = typer.Argument(..., help="env names (their topics are <env>.*)"),
    partitions: int | None = typer.Option(
        None, min=1, help="partitions per env topic (default: settings.partitions)"
    ),
    replicas: int | None = typer.Option(
        None, min=1, help="replicas per topic (default: settings.replication_factor)"
    ),
    strimzi: bool = typer.Option(
        False, "--strimzi", help="print Strimzi KafkaTopic resources (YAML) to apply"
    ),
    cluster: str | None = typer.Option(
        None, help="with --strimzi: the Kafka resource's name (label strimzi.io/cluster)"
    ),
    namespace: str | None = typer.Option(
        None, help="with --strimzi: the namespace of the resources (the Topic Operator's)"
    ),
    control: bool = typer.Option(
        True, "--control/--no-control", help="include the bus's one dlrover.control topic"
    ),
) -> None:
    """The topics of envs with their partitions, replicas and configs (retention, compaction
    from the settings), as `env create` makes them; with --strimzi as KafkaTopic resources,
    for clusters where Strimzi makes topics (then set DLROVER_EVENTS_CREATE_TOPICS=false).
    Reads no registry and needs no broker."""
    settings = load_settings()
    parts = partitions or settings.partitions
    reps = replicas or settings.replication_factor
    if strimzi and not cluster:
        raise UserError("--strimzi needs --cluster NAME (the name of the Strimzi Kafka resource)")
    resources = kafka_topics(
        envs,
        settings,
        partitions=parts,
        replicas=reps,
        cluster=cluster or "",
        namespace=namespace,
        control=control,
    )
    if strimzi:
        typer.echo(yaml.safe_dump_all(resources, sort_keys=False), nl=False)
        return
    table = Table("topic", "partitions", "replicas", "configs")
    for r in resources:
        spec = r["spec"]
        configs = ", ".join(f"{k}={v}" for k, v in spec.get("config", {}).items())
        table.add_row(spec["topicName"], str(spec["partitions"]), str(spec["replicas"]), configs)
    Console().print(table)
