"""The reference tables of docs/, rendered from the code they describe, so that a document
cannot drift from it: the settings (every variable of every settings class), the commands,
the topics of an env, the metrics and the env settings; and the list of every variable
the code reads (dlrover_events/variables.py), by which the CLI refuses a misspelled one.

Each table lies in its document between two markers (`<!-- NAME: begin -->` ...
`<!-- NAME: end -->`); `dlrover-events docs write` renders them anew, `docs check` (and
tests/unit/test_reference_docs.py) fails while one differs from the code. The tables are
pure functions of the code; only the command writes files.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings
from typer._click.core import Context

from dlrover_events.bus.topics import CONTROL_SPEC, ENV_TOPICS
from dlrover_events.runtime.metrics import catalogue_markdown
from dlrover_events.settings import ENV_PREFIX, Settings
from schemas.settings_doc import bounds, number, type_name, with_reference

SETTINGS_GROUP = "dlrover_events.settings"


def begin(name: str) -> str:
    return f"<!-- {name}: begin -->"


def end(name: str) -> str:
    return f"<!-- {name}: end -->"


def with_part(document: str, name: str, body: str) -> str:
    """`document` with the part between NAME's markers replaced by `body` (a ValueError
    when the markers are missing)."""
    head, found_begin, rest = document.partition(begin(name) + "\n")
    _, found_end, tail = rest.partition(end(name))
    if not found_begin or not found_end:
        raise ValueError(f"no part {name!r}: the markers {begin(name)} ... {end(name)} are gone")
    return f"{head}{begin(name)}\n{body}{end(name)}{tail}"


# -- settings ---------------------------------------------------------------------------


def settings_classes() -> list[type[BaseSettings]]:
    """`Settings`, then every service's own settings (entry points ``dlrover_events.settings``)."""
    found = [ep.load() for ep in sorted(entry_points(group=SETTINGS_GROUP), key=lambda e: e.name)]
    for cls in found:
        if not (isinstance(cls, type) and issubclass(cls, BaseSettings)):
            raise TypeError(f"{cls!r} of {SETTINGS_GROUP} is not a pydantic-settings class")
    return [Settings, *found]


def _env_default(info: FieldInfo) -> str:
    value = info.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return number(value)
    if isinstance(value, SecretStr):
        return "(secret)"
    return str(value) if str(value) else '""'


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def settings_rows(classes: list[type[BaseSettings]] | None = None) -> list[dict[str, str]]:
    """One row per variable of every settings class: its class, type, default (as the
    docs write it), bounds and what it is for (`settings list --json`)."""
    rows = []
    for cls in settings_classes() if classes is None else classes:
        prefix = str(cls.model_config.get("env_prefix", ""))
        for name, info in cls.model_fields.items():
            rows.append(
                {
                    "variable": f"{prefix}{name.upper()}",
                    "class": f"{cls.__module__}.{cls.__name__}",
                    "type": type_name(info.annotation),
                    "default": _env_default(info),
                    "bounds": bounds(info),
                    "what": " ".join((info.description or "").split()),
                }
            )
    return rows


def settings_markdown(classes: list[type[BaseSettings]] | None = None) -> str:
    """One table per settings class: each variable, its type, default, bounds and meaning."""
    out: list[str] = []
    for cls in settings_classes() if classes is None else classes:
        prefix = str(cls.model_config.get("env_prefix", ""))
        doc = " ".join((cls.__doc__ or "").split("\n\n")[0].split())
        out += [f"### `{prefix}*`: `{cls.__module__}.{cls.__name__}`", "", doc, ""]
        out += ["| variable | type | default | bounds | what |", "| --- | --- | --- | --- | --- |"]
        for row in settings_rows([cls]):
            default = _cell(row["default"])
            default = default if default == "unset" else f"`{default}`"
            out.append(
                f"| `{row['variable']}` | {_cell(row['type'])} | {default} | {row['bounds']} "
                f"| {_cell(row['what'])} |"
            )
        out.append("")
    return "\n".join(out)


def undescribed_settings(classes: list[type[BaseSettings]] | None = None) -> list[str]:
    """Variables whose field says nothing of what it is for (the table would be mute)."""
    return [
        f"{cls.model_config.get('env_prefix', '')}{name.upper()}"
        for cls in (settings_classes() if classes is None else classes)
        for name, info in cls.model_fields.items()
        if not (info.description or "").strip()
    ]


# -- commands ---------------------------------------------------------------------------


def _commands(command: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every leaf command under ``command`` (a group's commands loaded as it is walked)."""
    if hasattr(command, "list_commands"):
        ctx = Context(command, info_name=path[-1] if path else None)
        for name in sorted(command.list_commands(ctx)):
            yield from _commands(command.get_command(ctx, name), (*path, name))
    else:
        yield path, command


def all_commands(root: Any) -> list[tuple[tuple[str, ...], Any]]:
    """(path, click command) of every command under the CLI's root, groups' leaves only."""
    return list(_commands(root, ()))


def _synopsis(command: Any) -> str:
    """Arguments, then options by their long name; brackets around what may be left out."""
    parts = []
    for param in command.params:
        if param.param_type_name == "argument":
            name = (param.metavar or param.name).upper() + ("..." if param.nargs == -1 else "")
        elif getattr(param, "hidden", False) or param.name == "help":
            continue
        else:
            name = max(param.opts, key=len)
        parts.append(name if param.required else f"[{name}]")
    return " ".join(parts)


def commands_markdown(root: Any) -> str:
    """Every command under `root` (a click command, as typer builds it) with its arguments,
    options and the first sentence of its help."""
    rows = ["| command | arguments and options | what |", "| --- | --- | --- |"]
    for path, command in _commands(root, ()):
        what = _cell(command.get_short_help_str(limit=400))
        rows.append(f"| `{' '.join(path)}` | {_synopsis(command)} | {what} |")
    return "\n".join(rows) + "\n"


# -- variables ---------------------------------------------------------------------------

#: the packages whose sources may name a variable
PACKAGES = ("dlrover_events", "schemas", "streams", "handlers")
#: a variable's full name (a prefix such as DLROVER_EVENTS_GATEWAY_ is not one)
VARIABLE = re.compile(r"DLROVER_EVENTS_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_])")
#: the list this renders (it names every variable, so it is no source of names itself)
VARIABLES_FILE = "dlrover_events/variables.py"


def named_variables(source_root: Path) -> set[str]:
    """The DLROVER_EVENTS_* names the packages' sources under ``source_root`` spell."""
    named: set[str] = set()
    for package in PACKAGES:
        # the SDK's folder holds schemas and the SDK's part of dlrover_events
        trees = (source_root / package, source_root / "sdk" / package)
        for path in sorted(p for tree in trees for p in tree.rglob("*.py")):
            if path.relative_to(source_root).as_posix() != VARIABLES_FILE:
                named |= set(VARIABLE.findall(path.read_text("utf-8")))
    return named


def known_variables(source_root: Path | None = None) -> list[str]:
    """Every variable the code reads: the settings classes' and those its sources name."""
    root = source_root or Path(__file__).resolve().parents[2]
    from_classes = {
        f"{cls.model_config.get('env_prefix', '')}{name.upper()}"
        for cls in settings_classes()
        for name in cls.model_fields
    }
    return sorted(from_classes | named_variables(root))


def variables_text() -> str:
    return "".join(f"{name}\n" for name in known_variables())


# -- topics ------------------------------------------------------------------------------


def topics_markdown() -> str:
    """The topics of every env (`ENV_TOPICS`), and the bus's one control topic."""
    rows = ["| topic | kind | retention | what |", "| --- | --- | --- | --- |"]
    for spec in ENV_TOPICS:
        retention = f"`{ENV_PREFIX}RETENTION_{spec.retention.upper()}_MS`" if spec.retention else ""
        kind = "compacted" if spec.compacted else "log"
        rows.append(f"| `<env>.{spec.name}` | {kind} | {retention} | {_cell(spec.purpose)} |")
    control = f"`{CONTROL_SPEC.name}` (one for the bus)"
    rows.append(f"| {control} | compacted |  | {_cell(CONTROL_SPEC.purpose)} |")
    return "\n".join(rows) + "\n"


# -- the documents ----------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    """A document (relative to the repository's root) and how its generated part is made."""

    path: str
    render: Callable[[str], str]


def parts(cli_root: Any) -> list[Part]:
    """Every generated part of docs/; `cli_root` is the CLI's root command (the commands'
    table reads it, and this module does not import the CLI)."""

    def marked(name: str, body: Callable[[], str]) -> Callable[[str], str]:
        return lambda document: with_part(document, name, body())

    return [
        Part("docs/settings.md", marked("settings list", settings_markdown)),
        Part("docs/cli.md", marked("commands", lambda: commands_markdown(cli_root))),
        Part("docs/operations.md", marked("topics", topics_markdown)),
        Part("docs/metrics.md", marked("metrics list", catalogue_markdown)),
        Part("docs/env-settings.md", with_reference),
        Part(VARIABLES_FILE, marked("variables", variables_text)),
    ]


def stale(repo: Path, cli_root: Any) -> list[str]:
    """The documents whose generated part differs from the code (or lost its markers)."""
    out = []
    for part in parts(cli_root):
        text = (repo / part.path).read_text("utf-8")
        try:
            if part.render(text) != text:
                out.append(part.path)
        except ValueError as err:
            out.append(f"{part.path} ({err})")
    return out


__all__ = [
    "Part",
    "all_commands",
    "begin",
    "commands_markdown",
    "end",
    "known_variables",
    "parts",
    "settings_classes",
    "settings_markdown",
    "settings_rows",
    "stale",
    "topics_markdown",
    "undescribed_settings",
    "with_part",
]
