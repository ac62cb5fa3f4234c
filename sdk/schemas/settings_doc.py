"""docs/env-settings.md's reference tables, rendered from `schemas.env_settings`, so
the document cannot drift from the models (a test compares them;
`dlrover-events schemas settings-doc` writes them)."""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from schemas.env_settings import (
    BrainSettings,
    JobDefaults,
    LimitSettings,
    OperatorSettings,
    SchedulerSettings,
)

#: The generated part of the document lies between these lines.
BEGIN = "<!-- generated from schemas/env_settings.py by `dlrover-events schemas settings-doc` -->"
END = "<!-- end of generated -->"


def type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return type_name(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(annotation))
    if origin is Literal:
        return " or ".join(
            str(a).lower() if isinstance(a, bool) else repr(a) for a in typing.get_args(annotation)
        )
    if origin is dict:
        key, value = typing.get_args(annotation)
        return f"map of {type_name(key)} to {type_name(value)}"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    names = {str: "string", int: "integer", float: "number", bool: "boolean", Any: "any"}
    names |= {Path: "path", SecretStr: "secret"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def bounds(info: FieldInfo) -> str:
    said = []
    for meta in info.metadata:
        for attr, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
            value = getattr(meta, attr, None)
            if value is not None:
                said.append(f"{sign} {number(value)}")
    return ", ".join(said)


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
        return "{}" if isinstance(value, dict | BaseModel) else repr(value)
    if info.default is PydanticUndefined:
        return "required"
    if info.default is None:
        return "null"
    if isinstance(info.default, bool):
        return str(info.default).lower()
    if isinstance(info.default, int | float):
        return number(info.default)
    return str(info.default)


def number(value: float) -> str:
    """A number as a reader takes it in: whole numbers whole, bytes in GiB too."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    if isinstance(value, int) and value >= 2**30 and value % 2**30 == 0:
        return f"{value} ({value // 2**30} GiB)"
    return str(value) if isinstance(value, int) else f"{value:g}"


def _table(prefix: str, model: type[BaseModel]) -> list[str]:
    lines = [
        f"### `{prefix}`",
        "",
        " ".join((model.__doc__ or "").split()),
        "",
        "| setting | type | default | bounds | what |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, info in model.model_fields.items():
        desc = (info.description or "").replace("|", "\\|")
        kind = type_name(info.annotation).replace("|", "\\|")
        row = f"| `{prefix}.{name}` | {kind} | {_default(info)} | {bounds(info)} | {desc} |"
        lines.append(row)
    return [*lines, ""]


def render_markdown() -> str:
    """The settings' reference, as docs/env-settings.md holds it between its markers."""
    parts = [
        *_table("brain", BrainSettings),
        *_table("brain.limits", LimitSettings),
        *_table("brain.job_config", JobDefaults),
        *_table("brain.scheduler", SchedulerSettings),
        *_table("operator", OperatorSettings),
    ]
    return "\n".join(parts).rstrip() + "\n"


def with_reference(document: str) -> str:
    """`document` with its generated part rendered anew (a ValueError if it has no
    markers)."""
    head, begin, rest = document.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"the document has no generated part ({BEGIN} ... {END})")
    return f"{head}{BEGIN}\n\n{render_markdown()}\n{END}{tail}"


__all__ = ["BEGIN", "END", "bounds", "number", "render_markdown", "type_name", "with_reference"]
