"""The CLI starts light: `--help` and a command's `--help` import no command they do not
show (counted in a fresh interpreter, not timed); the table the root lists the commands
from says what the commands say; one meaning per short flag; metavars for people; the
version; shell completion without importing the commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from importlib.metadata import entry_points, version
from typing import Any

import pytest
from typer._click.core import Context
from typer.core import TyperArgument, TyperOption

from dlrover_events.cli.app import BENCH_GROUP, BUILT_IN, COMMAND_GROUP, SHORT_HELP, root_command
from dlrover_events.cli.reference import all_commands

#: What a command line that only shows help must never import.
HEAVY = ("faust", "kubernetes_asyncio", "asyncpg", "scipy", "torch", "numpy", "matplotlib")

IMPORTED = """
import json, sys
from dlrover_events.cli.app import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def imported_by(*args: str) -> set[str]:
    """The modules a fresh interpreter holds after `dlrover-events ARGS` (its stderr's last
    line), the command's own output aside."""
    done = subprocess.run(
        [sys.executable, "-c", IMPORTED, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("DLROVER_EVENTS_")},
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stderr.strip().splitlines()[-1]))


def heavy(modules: set[str]) -> list[str]:
    return sorted({m.split(".")[0] for m in modules} & set(HEAVY))


@pytest.mark.parametrize(
    "args", [["--help"], ["tail", "--help"], ["env", "topics", "--help"], ["--version"]]
)
def test_help_imports_no_heavy_library(args: list[str]) -> None:
    modules = imported_by(*args)
    assert heavy(modules) == [], f"`{' '.join(args)}` imports {heavy(modules)}"


def test_the_roots_help_imports_no_command() -> None:
    modules = imported_by("--help")
    commands = sorted(m for m in modules if m.startswith(("streams", "handlers")))
    assert commands == [], f"`--help` imported {commands}"
    assert "dlrover_events.cli.env" not in modules
    # a few hundred modules: the interpreter, typer and the CLI's own; the command tree
    # imported everything (about 1,900 modules) before commands were loaded on use
    assert len(modules) < 400, len(modules)


def test_the_lazy_root_fails_without_its_laziness() -> None:
    """The import count above can fail: loading every command (what `--help` did before)
    pulls in the heavy libraries."""
    code = (
        "import sys, json\n"
        "from dlrover_events.cli.app import root_command\n"
        "from dlrover_events.cli.reference import all_commands\n"
        "all_commands(root_command())\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert heavy(set(json.loads(done.stdout))), "every command loaded imports no heavy library?"


def _loaded() -> list[tuple[tuple[str, ...], Any]]:
    return all_commands(root_command())


def test_the_root_lists_every_command_by_the_help_it_has() -> None:
    root = root_command()
    ctx = Context(root)
    names = root.list_commands(ctx)
    contributed = {ep.name for ep in entry_points(group=COMMAND_GROUP)}
    benches = {f"bench {ep.name}" for ep in entry_points(group=BENCH_GROUP)}
    assert set(names) == set(BUILT_IN) | contributed
    assert set(SHORT_HELP) == set(names) | benches, "SHORT_HELP names a command that is not"
    for path in [*names, *benches]:
        command: Any = root
        for part in path.split():
            command = command.get_command(ctx, part)
        assert SHORT_HELP[path] == command.get_short_help_str(limit=10_000), (
            f"SHORT_HELP[{path!r}] is not what `{path} --help` says first"
        )


def test_one_meaning_per_short_flag() -> None:
    meanings: dict[str, set[str]] = defaultdict(set)
    for path, command in _loaded():
        for param in command.params:
            for opt in (*param.opts, *getattr(param, "secondary_opts", ())):
                if len(opt) == 2 and opt.startswith("-"):
                    meanings[opt].add(max(param.opts, key=len))
                    meanings[f"{opt} in"].add(" ".join(path))
    several = {k: v for k, v in meanings.items() if not k.endswith(" in") and len(v) > 1}
    assert several == {}, f"short flags with more than one meaning: {several}"
    assert meanings["-n"] == {"--namespace"} and meanings["-e"] == {"--env"}
    assert meanings["-s"] == {"--service"}


def test_every_value_is_named_for_people() -> None:
    """No `<list[str]>` or `<int range>`: a metavar on every option that takes a value."""
    for path, command in _loaded():
        ctx = Context(command)
        for param in command.params:
            if isinstance(param, TyperOption) and not (param.is_flag or param.count):
                assert param.metavar, f"{' '.join(path)} {param.opts}"
                record = param.get_help_record(ctx)
                assert record is not None and "<" not in record[0], (path, record)
            if isinstance(param, TyperArgument):
                assert param.metavar and param.metavar.isupper(), (path, param.name)


def test_speed_and_durations_have_one_syntax_everywhere() -> None:
    speeds = durations = 0
    for path, command in _loaded():
        for param in command.params:
            if "--speed" in param.opts:
                speeds += 1
                assert "SPEED" in (param.metavar or ""), path
            if set(param.opts) & {"--timeout", "--interval", "--tick", "--window"}:
                durations += 1
                assert param.metavar == "DURATION", (path, param.opts)
    assert speeds >= 3 and durations >= 4


#: options spelled like an env's that name something else: `model register --from` names
#: the checkpoint a version is made from
NOT_ENVS: dict[tuple[str, ...], set[str]] = {("model", "register"): {"--from"}}


def test_every_env_option_checks_the_name() -> None:
    """An env's name becomes a topic prefix, a schema and a folder: every option (and every
    `env` command's argument) that takes one checks it where it is typed."""
    checked = 0
    for path, command in _loaded():
        if path[0] == "bench" and path[1] != "gateway":
            continue  # a bench makes its own envs
        for param in command.params:
            named = set(param.opts) - NOT_ENVS.get(tuple(path), set())
            takes_env = bool(named & {"--env", "--to", "--from", "--standby"}) or (
                path[0] == "env" and isinstance(param, TyperArgument)
            )
            if takes_env:
                parser = param.type_descriptor.parameter_info.parser  # type: ignore[attr-defined]
                assert getattr(parser, "__name__", "") == "env_name", (path, param.opts)
                checked += 1
    assert checked >= 20, checked


def test_version() -> None:
    done = subprocess.run(
        [sys.executable, "-c", IMPORTED, "--version"], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == f"dlrover-events {version('dlrover-events')}"


def test_shell_completion_names_commands_without_importing_them() -> None:
    code = IMPORTED.replace("main(sys.argv[1:])", "main()")
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "_DLROVER_EVENTS_COMPLETE": "complete_bash",
            "COMP_WORDS": "dlrover-events e",
            "COMP_CWORD": "1",
        },
    )
    assert set(done.stdout.split()) == {
        "env",
        "evaluate",
        "evaluator",
        "experiment",
        "experiments-recorder",
    }, done.stdout
    modules = set(json.loads(done.stderr.strip().splitlines()[-1]))
    assert not any(m.startswith(("streams", "handlers")) for m in modules)
    assert (
        "--install-completion"
        in subprocess.run(
            [sys.executable, "-c", IMPORTED, "--help"], capture_output=True, text=True, timeout=60
        ).stdout
    )
