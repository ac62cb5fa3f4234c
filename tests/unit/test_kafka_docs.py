"""docs/kafka.md lists every Kafka setting with its variable and default: the table that
mirrors `Settings` is checked, so a setting added without its line fails here."""

from __future__ import annotations

import re
from pathlib import Path

from dlrover_events.settings import ENV_PREFIX, Settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "kafka.md"
KAFKA = ("security_", "sasl_", "ssl_", "retention_")
TOPICS = ("create_topics", "min_insync_replicas", "replication_factor")


def _documented() -> dict[str, str]:
    rows = re.findall(r"^\| `(DLROVER_EVENTS_[A-Z_]+)` \| ([^|]+) \|", DOC.read_text(), re.M)
    return {name: default.strip() for name, default in rows}


def _default(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def test_every_kafka_setting_has_its_line_with_its_default() -> None:
    fields = {
        name: field
        for name, field in Settings.model_fields.items()
        if name.startswith(KAFKA) or name in TOPICS
    }
    assert len(fields) >= 19
    documented = _documented()
    for name, field in fields.items():
        variable = f"{ENV_PREFIX}{name.upper()}"
        assert variable in documented, f"{variable} is missing from docs/kafka.md"
        assert documented[variable] == _default(field.default), variable
    extra = {v for v in documented if v.removeprefix(ENV_PREFIX).lower() not in fields}
    assert not extra, f"docs/kafka.md documents settings that do not exist: {extra}"
