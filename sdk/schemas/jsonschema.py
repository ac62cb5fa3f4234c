"""JSON Schema files generated from the models, for producers in other languages."""

from __future__ import annotations

from pathlib import Path

import orjson
from pydantic import TypeAdapter

from schemas.events import EVENT_TYPES, AnyEvent

DEFAULT_DIR = Path(__file__).parent / "json"


def _dump(schema: dict[str, object]) -> bytes:
    return orjson.dumps(schema, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


def render_all() -> dict[str, bytes]:
    """file name -> content: one file per event type and ``event.json`` for the union."""
    files = {
        f"{name}.json": _dump(cls.model_json_schema(by_alias=True, mode="validation"))
        for name, cls in EVENT_TYPES.items()
    }
    union = TypeAdapter(AnyEvent).json_schema(by_alias=True, mode="validation")
    union["title"] = "Event"
    files["event.json"] = _dump(union)
    return files


def write_all(folder: Path = DEFAULT_DIR) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    rendered = render_all()
    for old in folder.glob("*.json"):
        if old.name not in rendered:
            old.unlink()
    paths = []
    for name, content in rendered.items():
        path = folder / name
        path.write_bytes(content)
        paths.append(path)
    return paths


def stale_files(folder: Path, rendered: dict[str, bytes]) -> list[str]:
    """Names that are missing, different, or no longer generated."""
    stale = [
        n
        for n, c in rendered.items()
        if not (folder / n).is_file() or (folder / n).read_bytes() != c
    ]
    stale += [p.name for p in folder.glob("*.json") if p.name not in rendered]
    return sorted(stale)
