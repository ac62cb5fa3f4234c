"""`dlrover-events operator --env E`: run the operator of one env until Ctrl-C.

Kafka and Postgres are found as `up` finds them, so against a stack started by `up` only
the env is needed. The simulator options apply to virtual envs; given to a real env's
operator they are refused there.
"""

from __future__ import annotations

import asyncio
import functools
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer

from dlrover_events.cli.params import duration, env_name, speed
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.runtime.standalone import serve_alone
from dlrover_events.settings import Settings, load_settings
from handlers.operator.wiring.modes import run_operator


class Admission(StrEnum):
    """The simulated cluster's admission (handlers.operator.settings.VirtualSettings)."""

    CLUSTER = "cluster"
    BRAIN = "brain"


def operator(
    env: str = typer.Option(
        ..., "--env", "-e", parser=env_name, help="the env whose ScalePlans to apply"
    ),
    nodes: int = typer.Option(None, "--nodes", min=1, help="simulated nodes (default 16)"),
    gpus: int = typer.Option(None, "--gpus", min=0, help="GPUs per simulated node (default 4)"),
    speed_up: float = typer.Option(
        None,
        "--speed",
        parser=speed,
        help="simulated seconds per wall second: 100x or 100 (default 1x)",
    ),
    fast: bool = typer.Option(
        None, "--fast/--no-fast", help="simulate as fast as possible, event to event"
    ),
    lockstep: bool = typer.Option(
        None,
        "--lockstep/--no-lockstep",
        help="a tick at a time, each once the env's brain (in lockstep too) has decided it",
    ),
    tick: float = typer.Option(
        None,
        "--tick",
        parser=duration,
        help="simulated time per lockstep tick: 60s, 1m (default: the sample interval)",
    ),
    sample_interval: float = typer.Option(
        None,
        "--sample-interval",
        parser=duration,
        help="simulated time between runtime samples (default 30s)",
    ),
    restart_delay: float = typer.Option(
        None,
        "--restart-delay",
        parser=duration,
        help="simulated time a rescaled job takes to restart (default 30s)",
    ),
    rescale_mode: str = typer.Option(
        None,
        "--rescale-mode",
        help="how simulated jobs take a new allocation: restart (default) or in_place "
        "(the in-place cost when one of a job's pods stays where it was)",
    ),
    admission: Admission = typer.Option(
        None,
        "--admission",
        help="who starts a submitted job: cluster (as soon as its gang fits; default) or "
        "brain (only a plan that gives it replicas: for a cluster scheduler in the brain)",
    ),
    follow_real: bool = typer.Option(
        None,
        "--follow-real/--no-follow-real",
        help="real cluster: act for whichever env is real, switching on promotion",
    ),
    kubeconfig: Path = typer.Option(
        None, "--kubeconfig", help="real cluster: kubeconfig (default $KUBECONFIG, in-cluster)"
    ),
    namespace: str = typer.Option(
        None, "--namespace", "-n", help="real cluster: namespace of the TrainingJobs"
    ),
    platform: str = typer.Option(
        None,
        "--platform",
        help="real env: where its TrainingJobs run, kubernetes (default) or local "
        "(processes on this machine)",
    ),
    slots: int = typer.Option(
        None,
        "--slots",
        min=0,
        help="local platform: what this machine has for jobs, as GPUs (a pod takes the GPUs "
        "it names, else one); published as the env's capacity",
    ),
) -> None:
    """Apply an env's ScalePlans: on the cluster when the env is real (only that operator
    loads cluster credentials), on the simulated cluster when it is virtual."""
    given: dict[str, Any] = {
        "platform": platform,
        "follow_real": follow_real,
        "kubeconfig": kubeconfig,
        "namespace": namespace,
        "nodes": nodes,
        "gpus_per_node": gpus,
        "speed": speed_up,
        "fast": fast,
        "lockstep": lockstep,
        "tick_s": tick,
        "sample_interval": sample_interval,
        "restart_delay": restart_delay,
        "rescale_mode": rescale_mode,
        "admission": None if admission is None else admission.value,
        "slots": slots,
    }
    asyncio.run(_run(load_settings(), env, {k: v for k, v in given.items() if v is not None}))


async def _run(settings: Settings, env: str, options: dict[str, Any]) -> None:
    def say(ctx: ServiceContext) -> None:
        typer.echo(
            f"operator of env {env} is running (metrics: {ctx.endpoints['metrics']}, /healthz "
            "and /readyz beside them); Ctrl-C stops it",
            err=True,
        )

    await serve_alone(
        settings, env, "operator", functools.partial(run_operator, options=options), on_ready=say
    )
