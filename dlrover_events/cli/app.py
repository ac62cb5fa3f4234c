"""Root of the CLI: the global options, and every command, loaded on use (`cli.lazy`): the
built-in ones (below) and those streams/ and handlers/ contribute (entry points). How a
command runs and exits is `cli.runner`'s.

`--help` imports no command: the names come from the table below and the entry points,
what each is for from `SHORT_HELP` (tests/unit/test_cli_start.py checks that the table
says what the commands say, and that `--help` imports none of the heavy libraries).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import cache
from importlib.metadata import entry_points
from typing import Any

import typer

from dlrover_events.cli.lazy import Lazy, LazyGroup
from dlrover_events.cli.params import readable_metavars
from dlrover_events.cli.runner import run_command
from dlrover_events.runtime import logs
from dlrover_events.runtime.logs import FORMAT_ENV, LEVEL_ENV, LogFormat, LogLevel

PROG = "dlrover-events"
#: Entry-point groups of the commands streams/ and handlers/ contribute, and of the benches.
COMMAND_GROUP = "dlrover_events.commands"
BENCH_GROUP = "dlrover_events.benches"

#: What each command is for, as `--help` lists it (the first sentence of its help), by its
#: path: read instead of importing the command.
SHORT_HELP: Mapping[str, str] = {
    "ab": "A/B tests of brain settings in virtual envs.",
    "agent": "Run this host's agent for the hosts platform: its slots reported, the pods "
    "placed on it run.",
    "archiver": "Run the archiver of one env alone: every valid event into the env's Postgres.",
    "bench": "Benchmarks: each prints, last, one JSON line of measurements.",
    "bench ab": "Run a lockstep A/B of the workload's first JOBS jobs RUNS times and split a "
    "tick's wall time by what the services recorded; the last line is one JSON object.",
    "bench brain": "Pre-load EVENTS for JOBS into a fresh env, run the brain over them, then "
    "measure plan latency at a controlled rate; the last line is one JSON object.",
    "bench checkpoint": "Blocking time per save and persist time of ElasticCheckpoint against "
    "torch.save in the loop, and the training throughput with saves every N steps against none.",
    "bench elastic": "Seconds from a plan to the first step at the new world size, restart "
    "and in place.",
    "bench experiments": "Trial metric reports stored per second through the experiments "
    "recorder (median of RUNS, beside Optuna's storages), then the searcher's decision latency "
    "from a report to its decision; the last line is one JSON object.",
    "bench fuzz": "Send BAD labelled bad messages among VALID valid events into a fresh env "
    "with an archiver and a brain running, and report per consumer what it dead-lettered "
    "(and why), processed, and wrongly refused; the last line is one JSON object.",
    "bench gateway": "Load N documents, drive the gateway with concurrent clients, print one "
    "JSON line.",
    "bench sdk": "Per-step overhead of the SDK reporter in microseconds (median of runs vs a "
    "baseline).",
    "bench scheduler": "Time the first and the steady rounds of a cluster scheduler at each "
    "cluster size; the last line is one JSON object.",
    "bootstrap": "Set up an install: migrations, the real and standby envs (settings, "
    "topics), and the gateway tokens (Kubernetes Secrets in a pod, else files).",
    "brain": "Run the brain of one env: job topics in, OptimizePlans and ScalePlans out.",
    "checkpoint": "The env's checkpoints: what each job committed, kept or deleted.",
    "checkpoints": "Run the checkpoints service of one env alone: its checkpoints recorded, "
    "those its retention policy no longer keeps deleted.",
    "console": (
        "Serve the web console until Ctrl-C: envs, jobs, A/B results, dead letters, "
        "configs; actions with an admin token (tokens: `gateway-token create`)."
    ),
    "docs": "The reference tables of docs/, written from the code.",
    "env": "Create, list and delete envs (each a topic prefix and a schema).",
    "evaluate": "Print the KPIs of an env from everything its topics hold now.",
    "evaluator": "Run the evaluator of one env alone: its KPIs reported to <env>.eval.reports "
    "and Postgres every --interval seconds (`evaluate` prints them once).",
    "experiment": "Experiments: create one from a file, list, describe, pause, activate, kill.",
    "experiments-recorder": "Run the experiments recorder of one env alone: its experiments, "
    "trial decisions and trial metrics into the env's Postgres.",
    "gateway": "Serve the config gateway of one env until Ctrl-C.",
    "gateway-token": "Bearer tokens of an env's config gateway (stored hashed; shown once).",
    "job": "TrainingJobs on the cluster: submit, list, describe, scale, delete.",
    "metrics": "The Prometheus metrics the services serve.",
    "model": "The model registry: versions of checkpoints, with their lineage.",
    "operator": "Apply an env's ScalePlans: on the cluster when the env is real (only that "
    "operator loads cluster credentials), on the simulated cluster when it is virtual.",
    "optimize": "Print the OptimizePlan and ScalePlan the brain would make for a job state.",
    "optimizers": "List the optimizers the brain knows, with what each is for.",
    "replay": "Copy one env's inputs (or a trace's job arrivals) into a virtual env.",
    "searcher": "Run the searcher of one env alone: experiments and trial metrics in, trial "
    "decisions and their job requests and plans out.",
    "schemas": "Export or check the JSON Schema files of every event, render the settings' doc.",
    "settings": "The settings of the processes (DLROVER_EVENTS_*).",
    "tail": "Follow env topics live, one line per event (colour on a terminal).",
    "trial": "An experiment's trials: what each reported.",
    "up": "Start the broker (tansu), Postgres, the real env and its services on 127.0.0.1.",
    "watchdog": "Watch the real env; when too many jobs fail, promote the standby env, then "
    "keep running (a Deployment's container) until Ctrl-C or SIGTERM.",
}

#: The built-in commands, by name: where each is.
BUILT_IN: Mapping[str, str] = {
    "bench": "dlrover_events.cli.app:bench",
    "bootstrap": "dlrover_events.cli.bootstrap:bootstrap_command",
    "docs": "dlrover_events.cli.docs_cmd:app",
    "env": "dlrover_events.cli.env:app",
    "metrics": "dlrover_events.cli.metrics_cmd:app",
    "schemas": "dlrover_events.cli.schemas_cmd:app",
    "settings": "dlrover_events.cli.settings_cmd:app",
    "tail": "dlrover_events.cli.tail:tail",
    "up": "dlrover_events.cli.up:up",
}


def _from_entry_points(group: str, prefix: str = "") -> dict[str, Lazy]:
    return {
        ep.name: Lazy(ep.value, SHORT_HELP.get(f"{prefix}{ep.name}", ""))
        for ep in entry_points(group=group)
    }


def _version(given: bool) -> None:
    if given:
        from importlib.metadata import version

        typer.echo(f"{PROG} {version(PROG)}")
        raise typer.Exit()


class Root(LazyGroup):
    """The root: the built-in commands and those of the entry points, loaded on use."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.lazy = {
            name: Lazy(target, SHORT_HELP.get(name, "")) for name, target in BUILT_IN.items()
        }
        self.find = lambda: _from_entry_points(COMMAND_GROUP)
        readable_metavars(self.params)


app = typer.Typer(
    name=PROG,
    cls=Root,
    help="The event-driven Brain of an elastic deep-learning training cluster, on Kafka.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def root(
    log_level: LogLevel | None = typer.Option(
        None,
        "--log-level",
        envvar=LEVEL_ENV,
        case_sensitive=False,
        help="DEBUG, INFO, WARNING, ERROR or CRITICAL [default: INFO for `up` and the "
        "services run alone, WARNING for the other commands]",
        show_default=False,
    ),
    log_format: LogFormat = typer.Option(
        LogFormat.TEXT,
        "--log-format",
        envvar=FORMAT_ENV,
        case_sensitive=False,
        help="text, or json: one JSON object a line (timestamp, level, logger, message, "
        "env, service, job, plan_id)",
    ),
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_version, help="print the version and exit"
    ),
) -> None:
    """The event-driven Brain of an elastic deep-learning training cluster, on Kafka."""
    from dlrover_events.variables import check_variables

    logs.configure(log_level, log_format)
    check_variables(os.environ)


def _benches() -> LazyGroup:
    group = LazyGroup(
        name="bench", help=SHORT_HELP["bench"], no_args_is_help=True, rich_markup_mode=None
    )
    group.find = lambda: _from_entry_points(BENCH_GROUP, "bench ")
    return group


#: `dlrover-events bench NAME`: one command per entry point of BENCH_GROUP.
bench = _benches()


@cache
def root_command() -> Root:
    """The root command of the CLI (a click command; nothing of its commands imported)."""
    group = typer.main.get_command(app)
    assert isinstance(group, Root)
    return group


def main(argv: list[str] | None = None) -> None:
    logs.configure()  # until the root's options are read (`root`)
    run_command(lambda: root_command().main(args=argv, prog_name=PROG, standalone_mode=False))


__all__ = ["BUILT_IN", "SHORT_HELP", "app", "bench", "main", "root_command"]
