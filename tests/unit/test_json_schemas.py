"""The JSON Schema files for non-Python producers must match the models."""

from __future__ import annotations

from pathlib import Path

import orjson

from schemas.events import EVENT_TYPES
from schemas.jsonschema import DEFAULT_DIR, render_all, stale_files, write_all


def test_committed_schema_files_are_up_to_date() -> None:
    stale = stale_files(DEFAULT_DIR, render_all())
    assert not stale, f"run `make schemas` (dlrover-events schemas export): stale {stale}"


def test_a_changed_model_makes_the_files_stale(tmp_path: Path) -> None:
    write_all(tmp_path)
    assert stale_files(tmp_path, render_all()) == []
    (tmp_path / "node.oom.json").write_text("{}")
    (tmp_path / "gone.json").write_text("{}")
    assert stale_files(tmp_path, render_all()) == ["gone.json", "node.oom.json"]


def test_every_event_type_has_a_schema_with_the_envelope() -> None:
    for name in EVENT_TYPES:
        schema = orjson.loads((DEFAULT_DIR / f"{name}.json").read_bytes())
        for field in ("event_id", "type", "schema_version", "env", "occurred_at", "source", "key"):
            assert field in schema["properties"], (name, field)
        assert schema["properties"]["type"]["const"] == name
