"""`dlrover-events bootstrap`: set up a fresh install (the bootstrap Job of a cluster),
idempotently: migrations, the real and the standby env with their settings and topics,
and the gateway tokens, kept in Kubernetes Secrets (in a pod) or in files."""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer

from dlrover_events.cli.params import env_name
from dlrover_events.cli.runner import run_async
from dlrover_events.envs.bootstrap import (
    BootstrapPlan,
    EnvSpec,
    Report,
    TokenFiles,
    TokenKeeper,
    TokenSecrets,
    bootstrap,
)
from dlrover_events.envs.env_settings import load_settings_file
from dlrover_events.errors import UserError
from dlrover_events.runtime.embedded import resolve_postgres
from dlrover_events.settings import Settings, load_settings
from schemas.control import EnvMode


class Keep(StrEnum):
    """Where the tokens are kept."""

    KUBERNETES = "kubernetes"
    FILES = "files"


def _in_a_pod() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def bootstrap_command(
    env: str | None = typer.Option(
        None,
        "--env",
        "-e",
        parser=env_name,
        help="the real env (default DLROVER_EVENTS_DEFAULT_ENV, prod)",
    ),
    standby: str | None = typer.Option(
        None,
        "--standby",
        parser=env_name,
        envvar="DLROVER_EVENTS_WATCHDOG_STANDBY",
        help="the virtual env the watchdog promotes (default DLROVER_EVENTS_WATCHDOG_STANDBY;"
        " unset: none)",
    ),
    settings_file: Path | None = typer.Option(
        None, "--settings", help="YAML of the real env's settings (as `env create --settings`)"
    ),
    standby_settings: Path | None = typer.Option(
        None, "--standby-settings", help="YAML of the standby's settings (default: --settings)"
    ),
    partitions: int | None = typer.Option(
        None, min=1, help="partitions of a new env's topics (default: settings.partitions)"
    ),
    keep: Keep | None = typer.Option(
        None,
        "--tokens",
        help="where the tokens are kept: kubernetes (Secrets; the default in a pod) or files"
        " (--tokens-dir; the default elsewhere)",
    ),
    tokens_dir: Path | None = typer.Option(
        None, "--tokens-dir", help="folder of the token files (default <data_dir>/tokens)"
    ),
    namespace: str | None = typer.Option(
        None, "--namespace", "-n", help="the Secrets' namespace (default: the pod's)"
    ),
    jobs_namespaces: list[str] = typer.Option(
        [],
        "--jobs-namespace",
        help="a namespace where training pods run: it gets the read token's Secret too"
        " (repeatable; default DLROVER_EVENTS_OPERATOR_NAMESPACE, if set)",
    ),
    kubeconfig: Path | None = typer.Option(
        None, "--kubeconfig", help="cluster credentials (default $KUBECONFIG, in-cluster)"
    ),
    context: str | None = typer.Option(None, "--context", help="kubeconfig context"),
    rotate: bool = typer.Option(
        False, "--rotate", help="mint every token anew and revoke the old ones"
    ),
    apply_settings: bool = typer.Option(
        False,
        "--apply-settings",
        help="an existing env whose settings differ from the files gets theirs (default: "
        "it keeps them, as changed since with `env settings`)",
    ),
) -> None:
    """Set up an install: migrations, the real and standby envs (settings, topics), and the
    gateway tokens (Kubernetes Secrets in a pod, else files). A re-run changes nothing and
    says so; a kept token is never minted again unless --rotate."""
    settings = load_settings()
    real = env or settings.default_env
    specs = [EnvSpec(real, EnvMode.REAL, _settings(settings_file))]
    if standby:
        if standby == real:
            raise UserError(f"the standby must be another env than the real one ({real})")
        specs.append(
            EnvSpec(standby, EnvMode.VIRTUAL, _settings(standby_settings or settings_file))
        )
    plan = BootstrapPlan(specs, partitions=partitions, rotate=rotate, apply_settings=apply_settings)
    chosen = keep or (Keep.KUBERNETES if _in_a_pod() else Keep.FILES)
    if chosen == Keep.FILES and (namespace or jobs_namespaces or kubeconfig or context):
        raise UserError(
            "--namespace, --jobs-namespace, --kubeconfig, --context need --tokens kubernetes"
        )
    jobs = list(jobs_namespaces)
    if not jobs and (operator_ns := os.environ.get("DLROVER_EVENTS_OPERATOR_NAMESPACE")):
        jobs = [operator_ns]
    options = {"namespace": namespace, "jobs": jobs, "kubeconfig": kubeconfig, "context": context}
    folder = tokens_dir or settings.data_dir / "tokens"
    run_async(_run(settings, plan, chosen, folder, options))


def _settings(path: Path | None) -> dict[str, Any] | None:
    """The file's settings, validated before anything is made, as the registry stores
    them (only what is set), so that they compare with an env's stored ones."""
    return None if path is None else load_settings_file(path).stored()


async def _run(
    settings: Settings, plan: BootstrapPlan, keep: Keep, folder: Path, options: dict[str, Any]
) -> None:
    report = Report(typer.echo)
    postgres = await resolve_postgres(settings)
    try:
        if keep == Keep.FILES:
            await bootstrap(settings, postgres.dsn, plan, TokenFiles(folder), report)
        else:
            await _in_cluster(settings, postgres.dsn, plan, options, report)
    finally:
        postgres.stop()  # only an embedded server this command started
    if report.changes:
        typer.echo(f"bootstrap: done ({report.changes} changes)")
    else:
        typer.echo("bootstrap: nothing to do (everything was in place)")


async def _in_cluster(
    settings: Settings, dsn: str, plan: BootstrapPlan, options: dict[str, Any], report: Report
) -> None:
    from dlrover_events.kube.credentials import connect  # only a cluster's run loads them

    api, namespace = await connect(
        options["kubeconfig"],
        options["context"],
        options["namespace"],
        hint="run bootstrap in a pod, or give --kubeconfig (or --tokens files)",
    )
    async with api:
        keeper: TokenKeeper = TokenSecrets(api, namespace, options["jobs"])
        await bootstrap(settings, dsn, plan, keeper, report)
