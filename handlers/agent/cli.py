"""`dlrover-events agent`: run this host's agent until Ctrl-C or SIGTERM (a systemd unit:
deploy/hosts/). A stop leaves the pods running: the next agent takes them back."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import typer

from dlrover_events.cli.params import env_name
from dlrover_events.runtime import logs
from dlrover_events.settings import Settings, load_settings
from handlers.agent.agent import Agent, AgentSettings, agent_settings


def agent(
    env: str = typer.Option(
        None,
        "--env",
        "-e",
        parser=env_name,
        help="the env whose operator it obeys (default: the env that is real now)",
    ),
    host: str = typer.Option(None, "--host", help="this host's name (default: the host name)"),
    workdir: Path = typer.Option(
        None, "--workdir", help="where it keeps its pods (default ~/.dlrover-events/agent)"
    ),
    artificial_slots: int = typer.Option(
        None, "--artificial-slots", min=0, help="a CPU-only host's slots (default: its GPUs)"
    ),
    address: str = typer.Option(
        None, "--address", help="where other hosts reach this one (default: its route to the bus)"
    ),
) -> None:
    """Run this host's agent for the hosts platform: its slots reported, the pods placed on
    it run. Until Ctrl-C or SIGTERM; its pods go on, and the next agent takes them back."""
    conf = agent_settings(
        env=env, host=host, workdir=workdir, artificial_slots=artificial_slots, address=address
    )
    asyncio.run(_run(load_settings(), conf.env, conf))


async def _run(settings: Settings, env: str | None, conf: AgentSettings) -> None:
    logs.for_service()
    if env is None:
        from dlrover_events.cli.tail import real_env

        env = await real_env(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    runner = Agent(settings, env, conf)
    await runner.run(stop)
