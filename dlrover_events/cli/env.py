"""`dlrover-events env ...`: manage envs (topic prefix + Postgres schema each)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
import yaml
from rich.console import Console
from rich.table import Table

from dlrover_events.bus.topic_manifests import kafka_topics
from dlrover_events.cli.params import env_name, json_option, print_json
from dlrover_events.cli.runner import run_async
from dlrover_events.envs.env_settings import (
    Edit,
    apply_edits,
    load_settings_file,
    parse_set,
    parse_settings,
    parse_unset,
    read_settings_file,
    render,
)
from dlrover_events.envs.failover import last_switch, role, standby_name
from dlrover_events.errors import EnvError, UserError
from dlrover_events.settings import load_settings
from schemas.control import EnvMode

if TYPE_CHECKING:
    from dlrover_events.envs.registry import EnvRegistry

app = typer.Typer(
    help="Create, list and delete envs (each a topic prefix and a schema).", no_args_is_help=True
)


#: The most of a settings change's summary kept as its reason in `env history`.
MAX_SUMMARY_CHARS = 500


async def _registry() -> EnvRegistry:
    # (imported here: `env topics` and every --help need no Postgres driver)
    from dlrover_events.envs.registry import EnvRegistry
    from dlrover_events.runtime.embedded import resolve_postgres

    settings = load_settings()
    pg = await resolve_postgres(settings)
    return EnvRegistry(settings, pg.dsn)


@app.command()
def create(
    name: str = typer.Argument(..., parser=env_name, help="env name: [a-z][a-z0-9-]{0,30}"),
    mode: EnvMode = typer.Option(EnvMode.VIRTUAL, help="real (touches the cluster) or virtual"),
    partitions: int | None = typer.Option(
        None, min=1, help="partitions per topic (default: settings.partitions)"
    ),
    settings_file: Path | None = typer.Option(
        None,
        "--settings",
        help="YAML of the env's settings (brain:, operator:; docs/env-settings.md)",
    ),
) -> None:
    """Create an env: its topics <env>.*, its schema env_<name> (migrated), and announce it."""
    # (checked before anything is made; the registry checks the same again)
    env_settings = load_settings_file(settings_file) if settings_file else None

    async def go() -> None:
        registry = await _registry()
        rec = await registry.create(name, mode, partitions=partitions, settings=env_settings)
        typer.echo(f"created env {rec.name} ({rec.mode.value}, {rec.partitions} partitions)")

    run_async(go())


@app.command("list")
def list_envs(as_json: bool = json_option("a JSON list of the envs")) -> None:
    """List envs with their mode, role (real, the watchdog's standby, virtual) and
    partitions, and the last switch of the real env with its reason."""

    async def go() -> None:
        registry = await _registry()
        envs = await registry.list()
        standby = standby_name()
        switch = last_switch(await registry.changes())
        if as_json:
            print_json(
                [
                    {
                        "name": e.name,
                        "mode": e.mode,
                        "role": role(e.name, e.mode, standby),
                        "partitions": e.partitions,
                        "created_at": e.created_at,
                        "settings_version": e.settings_version,
                        # the promotion that made it real (the real env's only)
                        "switch": switch.as_json()
                        if switch is not None and e.mode == EnvMode.REAL and switch.to == e.name
                        else None,
                    }
                    for e in envs
                ]
            )
            return
        table = Table("name", "mode", "role", "partitions", "created")
        for e in envs:
            table.add_row(
                e.name,
                e.mode.value,
                role(e.name, e.mode, standby).value,
                str(e.partitions),
                e.created_at.isoformat(),
            )
        console = Console()
        console.print(table)
        if standby is not None and standby not in {e.name for e in envs}:
            console.print(f"standby: {standby} (DLROVER_EVENTS_WATCHDOG_STANDBY) is no env yet")
        console.print(f"last switch: {switch.line()}" if switch else "last switch: none yet")

    run_async(go())


@app.command()
def delete(
    name: str = typer.Argument(..., parser=env_name, help="env to delete"),
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
    name: str = typer.Argument(..., parser=env_name, help="virtual env to make the real one"),
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
def history(
    name: str | None = typer.Argument(None, parser=env_name, help="only this env"),
    as_json: bool = json_option("a JSON list of the changes"),
) -> None:
    """The registry's changes (create, delete, promote, demote) with their reasons."""

    async def go() -> None:
        registry = await _registry()
        changes = await registry.changes(name)
        if as_json:
            keys = ("changed_at", "name", "change", "mode", "reason", "settings")
            print_json([{k: c[k] for k in keys} for c in changes])
            return
        table = Table("when", "env", "change", "mode", "reason")
        for c in changes:
            table.add_row(
                c["changed_at"].isoformat(), c["name"], c["change"], c["mode"] or "", c["reason"]
            )
        Console().print(table)

    run_async(go())


@app.command()
def topics(
    envs: list[str] = typer.Argument(
        ..., parser=env_name, help="env names (their topics are <env>.*)"
    ),
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
    as_json: bool = json_option("a JSON list of the topics"),
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
    if as_json:
        print_json(
            [
                {
                    "topic": r["spec"]["topicName"],
                    "partitions": r["spec"]["partitions"],
                    "replicas": r["spec"]["replicas"],
                    "config": r["spec"].get("config", {}),
                }
                for r in resources
            ]
        )
        return
    table = Table("topic", "partitions", "replicas", "configs")
    for r in resources:
        spec = r["spec"]
        configs = ", ".join(f"{k}={v}" for k, v in spec.get("config", {}).items())
        table.add_row(spec["topicName"], str(spec["partitions"]), str(spec["replicas"]), configs)
    Console().print(table)


@app.command("settings")
def settings(
    name: str = typer.Argument(..., parser=env_name, help="the env"),
    set_: list[str] = typer.Option(
        None,
        "--set",
        metavar="KEY=VALUE",
        help="set one setting, e.g. brain.scheduler.name=goodput-cluster (the value is "
        "YAML: 16, goodput, null, {explore: false}); repeatable",
    ),
    unset: list[str] = typer.Option(
        None, "--unset", metavar="KEY", help="a setting back to its default; repeatable"
    ),
    file: Path | None = typer.Option(
        None,
        "--file",
        help="YAML that replaces all of the env's settings (a key left out goes back to "
        "its default); --unset and --set then apply on top of it",
    ),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of YAML"),
    defaults: bool = typer.Option(
        False, "--defaults", help="print every setting, the defaults of those not set too"
    ),
    reason: str = typer.Option("", help="why: recorded in `env history` and announced"),
) -> None:
    """Show an env's settings, or change them: validated, stored with a new version (and
    a row in `env history`), announced on dlrover.control; the env's running brain and
    operator take the change without a restart (docs/env-settings.md)."""
    edits = [*(parse_unset(k) for k in unset or []), *(parse_set(a) for a in set_ or [])]
    replacement = read_settings_file(file) if file is not None else None
    changing = replacement is not None or bool(edits)

    async def go() -> None:
        registry = await _registry()
        if not changing:
            record = await registry.get(name)
            if record is None:
                raise EnvError(f"no env named {name!r} (see `dlrover-events env list`)")
            doc = record.settings
            if defaults:
                doc = parse_settings(record.settings).model_dump(mode="json")
            if not as_json:
                typer.echo(f"# env {name}: settings version {record.settings_version}")
            typer.echo(render(doc, as_json=as_json))
            return
        summary = _summary(file, edits)
        why = f"{reason} ({summary})" if reason else summary
        record, changed = await registry.change_settings(
            name,
            lambda stored: apply_edits(stored if replacement is None else replacement, edits),
            reason=why,
        )
        if changed:
            typer.echo(
                f"env {name}: settings version {record.settings_version} stored and announced"
            )
        else:
            typer.echo(f"env {name}: settings unchanged (version {record.settings_version})")

    run_async(go())


def _summary(file: Path | None, edits: list[Edit]) -> str:
    said = ([f"settings from {file.name}"] if file is not None else []) + [str(e) for e in edits]
    text = "; ".join(said)
    return text if len(text) <= MAX_SUMMARY_CHARS else text[: MAX_SUMMARY_CHARS - 3] + "..."
