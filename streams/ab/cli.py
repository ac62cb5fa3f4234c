"""`dlrover-events ab run`: compare brain settings on the same input, in virtual envs."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import typer
from rich.console import Console

from dlrover_events.cli.runner import run_async
from dlrover_events.domain.units import parse_speed
from dlrover_events.errors import UserError
from dlrover_events.runtime.embedded import resolve_postgres
from dlrover_events.settings import load_settings
from streams.ab.arms import parse_arms
from streams.ab.report import compare, table, write_report
from streams.ab.runner import ABTest, ArmCluster
from streams.ab.summary import SUMMARY_FILE, build_summary, write_summary

app = typer.Typer(help="A/B tests of brain settings in virtual envs.", no_args_is_help=True)


@app.command("run")
def run(
    arm: list[str] = typer.Option(
        ..., "--arm", help="name=settings.yaml (repeat; the first arm is the baseline)"
    ),
    trace: Path | None = typer.Option(None, "--trace", help="workload trace to feed every arm"),
    source: str | None = typer.Option(None, "--from", help="env whose inputs feed every arm"),
    nodes: int = typer.Option(16, min=1, help="nodes of each arm's simulated cluster"),
    gpus: int = typer.Option(4, min=1, help="GPUs per node"),
    speed: str = typer.Option(
        "lockstep",
        help="how simulated time moves: 'lockstep' (arms with a brain tick with it, the "
        "others as fast as possible: the same input gives the same result), '200x' "
        "(simulated per wall time, as before: about ±2 s per job from run to run), 'max' "
        "(as fast as possible; for arms without a brain)",
    ),
    timeout: float = typer.Option(1800, min=1, help="wall seconds to wait for every job"),
    out: Path = typer.Option(
        Path("ab-report"),
        help=f"folder for the HTML and PNG report and the machine-readable {SUMMARY_FILE}",
    ),
    keep_envs: bool = typer.Option(False, "--keep-envs", help="keep the arms' envs to inspect"),
) -> None:
    """Run every arm on the same input and say which is better, by how much, how sure."""
    arms = parse_arms(arm)
    if trace is not None and not trace.is_file():
        raise UserError(f"trace file {trace} does not exist")
    try:
        cluster = _cluster(nodes, gpus, speed)
    except ValueError as err:
        raise UserError(str(err)) from None
    settings = load_settings()
    console = Console(stderr=True)

    async def go() -> None:
        pg = await resolve_postgres(settings)
        test = ABTest(
            settings,
            pg.dsn,
            arms,
            trace=trace,
            source=source,
            cluster=cluster,
            timeout_s=timeout,
            keep_envs=keep_envs,
        )
        task = asyncio.current_task()
        if task is not None:  # SIGTERM like Ctrl-C: cancel, so the arms' envs are cleaned up
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        shown: dict[str, int] = {}

        def progress(name: str, done: int, total: int) -> None:
            """A line each time an arm passes another tenth of its jobs."""
            tenth = 10 * done // max(total, 1)
            if shown.get(name, -1) < tenth:
                shown[name] = tenth
                console.print(f"  {name}: {done}/{total} jobs finished", highlight=False)

        console.print(f"A/B run {test.run_id}: arms {', '.join(a.name for a in arms)}")
        results = await test.run(progress)
        comparison = compare(results)
        Console().print(table(comparison))
        for line in comparison.verdicts:
            typer.echo(line)
        html, png = write_report(comparison, out, f"A/B {test.run_id}: {trace or source}")
        summary = write_summary(out, build_summary(comparison, test.run_info()))
        typer.echo(f"report: {html} (plots: {png}, summary: {summary})")

    try:
        run_async(go())
    except asyncio.CancelledError:
        raise UserError(
            "the A/B run was stopped before every job finished; its envs were deleted"
        ) from None


def _cluster(nodes: int, gpus: int, speed: str) -> ArmCluster:
    """Each arm's simulated cluster and how its clock moves, from --speed."""
    if speed == "lockstep":
        return ArmCluster(nodes, gpus, lockstep=True)
    if speed == "max":
        return ArmCluster(nodes, gpus, None, lockstep=False)
    try:
        pace = parse_speed(speed)
    except ValueError as err:
        raise ValueError(f"{err}, or 'lockstep' or 'max'") from None
    return ArmCluster(nodes, gpus, pace, lockstep=False)
