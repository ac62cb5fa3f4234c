"""What the options of every command share: one syntax for durations, speed-ups and env
names (typer parsers over the pure functions, so a bad value is the usual one-line usage
error naming the option, exit 2), readable metavars, and `--json` output.

    timeout: float = typer.Option(1800.0, parser=duration, help=...)
    env: str = typer.Option(..., "--env", "-e", parser=env_name)
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from datetime import date, datetime
from enum import Enum
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from typer.core import TyperArgument, TyperOption

from dlrover_events.domain.units import parse_duration, parse_speed

if TYPE_CHECKING:
    from pydantic_core import PydanticCustomError

F = TypeVar("F", bound=Callable[..., Any])


def _metavar(name: str) -> Callable[[F], F]:
    """What a parser's option takes, as its help names it."""

    def mark(parser: F) -> F:
        parser.metavar = name  # type: ignore[attr-defined]
        return parser

    return mark


def _refuse(kind: str, err: ValueError | str) -> PydanticCustomError:
    # typer checks a value through pydantic: a custom error's text is shown as it is
    from pydantic_core import PydanticCustomError

    return PydanticCustomError(kind, str(err))


@_metavar("DURATION")
def duration(value: Any) -> float:
    """``30s``, ``10m``, ``1.5h``, ``2d`` or seconds -> float seconds (`parse_duration`)."""
    if isinstance(value, int | float):
        return float(value)
    try:
        return parse_duration(str(value))
    except ValueError as err:
        raise _refuse("duration", err) from None


@_metavar("SPEED")
def speed(value: Any) -> float:
    """``100x`` or ``100`` -> a float factor (`parse_speed`)."""
    if isinstance(value, int | float):
        return float(value)
    try:
        return parse_speed(str(value))
    except ValueError as err:
        raise _refuse("speed", err) from None


@_metavar("SPEED|max")
def speed_or_max(value: Any) -> float | None:
    """A speed-up, or ``max`` (None): as fast as possible."""
    if value is None or str(value).strip().lower() == "max":
        return None
    if isinstance(value, int | float):
        return speed(value)
    try:
        return parse_speed(str(value))
    except ValueError as err:
        raise _refuse("speed", f"{err}, or 'max'") from None


@_metavar("ENV")
def env_name(value: Any) -> str:
    """An env's name, checked where it is typed: it becomes a topic prefix, a schema and
    a folder under the data dir, so ``../x`` gets no further than the parser."""
    from dlrover_events.bus.topics import check_env_name

    try:
        return check_env_name(str(value))
    except ValueError as err:
        raise _refuse("env", err) from None


def json_option(what: str = "one JSON document instead of the table") -> Any:
    """The `--json` flag of a command that lists or describes."""
    return typer.Option(False, "--json", help=f"print {what}")


def _plain(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    raise TypeError(f"{type(value).__name__} is not JSON")


def print_json(document: Any) -> None:
    """``document`` as one JSON document on stdout (datetimes ISO 8601, enums their value)."""
    import orjson

    sys.stdout.buffer.write(
        orjson.dumps(document, default=_plain, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
        + b"\n"
    )
    sys.stdout.flush()


class _NamedArgument(TyperArgument):
    """An argument its metavar names alone (``NAME``, not ``name <str>``)."""

    def display_type_rich(self, ctx: Any) -> str | None:
        return None


def readable_metavars(params: Iterable[object]) -> None:
    """Name what an option takes for people (``--nodes NODES``, ``--mode [real|virtual]``,
    ``--timeout DURATION``) where typer prints Python types (``<list[str]>``)."""
    for param in params:
        if isinstance(param, TyperArgument):
            if param.metavar is None and param.name:
                param.metavar = param.name.upper()
            if type(param) is TyperArgument:
                param.__class__ = _NamedArgument
            continue
        if not isinstance(param, TyperOption) or param.metavar is not None:
            continue
        if param.is_flag or param.count:
            continue
        desc = param.type_descriptor
        own = getattr(desc.parameter_info.parser, "metavar", None)
        if isinstance(own, str):
            param.metavar = own
        elif desc.is_choice and desc.choices:
            names = [str(c.value if isinstance(c, Enum) else c) for c in desc.choices]
            param.metavar = f"[{'|'.join(names)}]"
        elif param.opts:
            param.metavar = max(param.opts, key=len).lstrip("-").replace("-", "_").upper()


__all__ = [
    "duration",
    "env_name",
    "json_option",
    "print_json",
    "readable_metavars",
    "speed",
    "speed_or_max",
]
