"""`dlrover-events ab run`: compare brain settings on the same input, in virtual envs."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import typer
from rich.console import Console

from dlrover_events.cli.params import duration, env_name, json_option
from dlrover_events.cli.runner import run_async
from dlrover_events.domain.units import parse_speed
from dlrover_events.errors import UserError
from dlrover_events.experiments.document import ExperimentInvalid, experiment_yaml
from dlrover_events.extras import SIM
from dlrover_events.runtime.embedded import bench_broker, resolve_postgres
from dlrover_events.settings import Settings, load_settings
from schemas.experiments import ExperimentDocument
from streams.ab.arms import parse_arms
from streams.ab.report import compare, table, write_report
from streams.ab.runner import ABTest, ArmCluster
from streams.ab.summary import SUMMARY_FILE, build_summary, write_summary
from streams.searcher.core.registry import SEARCHERS

app = typer.Typer(help="A/B tests of brain settings in virtual envs.", no_args_is_help=True)


#: --speed besides a speed-up: how an arm's clock may move
SPEED_WORDS = ("lockstep", "max")


@app.command("run")
def run(
    arm: list[str] = typer.Option(
        ...,
        "--arm",
        metavar="NAME[=FILE]",
        help="a preset (static, goodput, tiresias, goodput-cluster, cluster-inplace), "
        "name=settings.yaml, or name= (the default brain); repeat, the first is the baseline",
    ),
    trace: Path | None = typer.Option(None, "--trace", help="workload trace to feed every arm"),
    experiment: Path | None = typer.Option(
        None,
        "--experiment",
        help="an experiment (the YAML `experiment create` takes) every arm runs beside its "
        "input; an arm's `experiment:` section changes its searcher or its trials' size",
    ),
    target: float | None = typer.Option(
        None, "--target", help="with --experiment: the metric value whose time to reach is a KPI"
    ),
    deadline: float | None = typer.Option(
        None,
        "--deadline",
        parser=duration,
        help="with --experiment: the simulated time by which the best metric is a KPI",
    ),
    source: str | None = typer.Option(
        None, "--from", parser=env_name, help="env whose inputs feed every arm"
    ),
    jobs: int | None = typer.Option(
        None, "--jobs", min=1, metavar="N", help="only the trace's first N jobs (a quick run)"
    ),
    nodes: int = typer.Option(16, min=1, help="nodes of each arm's simulated cluster"),
    gpus: int = typer.Option(4, min=1, help="GPUs per node"),
    speed: str = typer.Option(
        "lockstep",
        metavar="lockstep|max|SPEED",
        help="how simulated time moves: 'lockstep' (arms with a brain tick with it, the "
        "others as fast as possible: the same input gives the same result), a speed-up "
        "such as 200x (simulated per wall time: about ±2 s per job from run to run), 'max' "
        "(as fast as possible; for arms without a brain)",
    ),
    timeout: float = typer.Option(
        1800.0, parser=duration, help="wall time to wait for every job: 30m, 1h, seconds"
    ),
    out: Path = typer.Option(
        Path("ab-report"),
        help=f"folder for the HTML and PNG report and the machine-readable {SUMMARY_FILE}",
    ),
    keep_envs: bool = typer.Option(False, "--keep-envs", help="keep the arms' envs to inspect"),
    as_json: bool = json_option(f"the {SUMMARY_FILE} document instead of the table"),
) -> None:
    """Run every arm on the same input and say which is better, by how much, how sure.

    With nothing running it starts its own broker and Postgres (as `bench ab` does), and
    stops them after."""
    SIM.require()
    arms = parse_arms(arm)
    if trace is not None and source is not None:
        raise UserError("give at most one of --trace FILE and --from ENV")
    if trace is None and source is None and experiment is None:
        raise UserError("give --trace FILE, --from ENV or --experiment FILE")
    if (target is not None or deadline is not None) and experiment is None:
        raise UserError("--target and --deadline measure an experiment: give --experiment")
    document = _experiment(experiment) if experiment is not None else None
    if trace is not None and not trace.is_file():
        raise UserError(f"trace file {trace} does not exist")
    if jobs is not None and trace is None:
        raise UserError("--jobs takes the first jobs of --trace; --from copies an env whole")
    if timeout <= 0:
        raise UserError("--timeout must be more than 0s")
    try:
        cluster = _cluster(nodes, gpus, speed)
    except ValueError as err:
        raise UserError(f"--speed {err}") from None
    if trace is not None and jobs is not None:
        trace = _first_jobs(trace, jobs, out)
    console = Console(stderr=True)

    async def go(settings: Settings) -> None:
        pg = await resolve_postgres(settings)
        if pg.kind == "embedded":
            console.print(f"started an embedded Postgres under {settings.data_dir / 'postgres'}")
        try:
            await _run(settings, pg.dsn, console)
        finally:
            pg.stop()

    async def _run(settings: Settings, dsn: str, console: Console) -> None:
        test = ABTest(
            settings,
            dsn,
            arms,
            trace=trace,
            source=source,
            cluster=cluster,
            timeout_s=timeout,
            keep_envs=keep_envs,
            experiment=document,
            target=target,
            deadline_s=deadline,
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
        what = " + ".join(str(x) for x in (trace or source, experiment) if x is not None)
        html, png = write_report(comparison, out, f"A/B {test.run_id}: {what}")
        summary = build_summary(comparison, test.run_info())
        written = write_summary(out, summary)
        if as_json:
            typer.echo(written.read_text("utf-8"), nl=False)
            return
        Console().print(table(comparison))
        for line in comparison.verdicts:
            typer.echo(line)
        typer.echo(f"report: {html} (plots: {png}, summary: {written})")

    def say(line: str) -> None:
        console.print(line, highlight=False)

    try:
        with bench_broker(load_settings(), say) as settings:
            run_async(go(settings))
    except asyncio.CancelledError:
        raise UserError(
            "the A/B run was stopped before every job finished; its envs were deleted"
        ) from None


def _experiment(path: Path) -> ExperimentDocument:
    """The experiment file, checked as `experiment create` checks one (one line)."""
    try:
        text = path.read_text()
    except OSError as err:
        raise UserError(f"--experiment {path}: {err.strerror}") from None
    try:
        return experiment_yaml(text, searchers=list(SEARCHERS))
    except ExperimentInvalid as err:
        raise UserError(f"--experiment {path}: {err}") from None


def _first_jobs(trace: Path, jobs: int, out: Path) -> Path:
    """The trace's header and first ``jobs`` submissions, beside the report (so that the
    summary names the input the arms had)."""
    from streams.ab.bench import first_jobs

    out.mkdir(parents=True, exist_ok=True)
    subset = out / f"{trace.stem}-first-{jobs}{trace.suffix}"
    subset.write_text(first_jobs(trace, jobs))
    return subset


def _cluster(nodes: int, gpus: int, speed: str) -> ArmCluster:
    """Each arm's simulated cluster and how its clock moves, from --speed (a speed-up in
    the syntax of every command's --speed, or a word of SPEED_WORDS)."""
    word = speed.strip().lower()
    if word == "lockstep":
        return ArmCluster(nodes, gpus, lockstep=True)
    if word == "max":
        return ArmCluster(nodes, gpus, None, lockstep=False)
    try:
        pace = parse_speed(speed)
    except ValueError as err:
        raise ValueError(f"{err}, or {' or '.join(repr(w) for w in SPEED_WORDS)}") from None
    return ArmCluster(nodes, gpus, pace, lockstep=False)
