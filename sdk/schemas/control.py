"""Env announcements on the compacted ``dlrover.control`` topic.

Keyed by env name, so compaction keeps the latest word on each env and every process can
learn the whole registry (and which env is real) by reading the topic from the start.
"""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from schemas.bounds import Document, Text
from schemas.envelope import EnvName, Event


class EnvMode(StrEnum):
    REAL = "real"
    VIRTUAL = "virtual"


class EnvAnnouncement(Event):
    topic: ClassVar[str] = "dlrover.control"  # global, not env-prefixed
    type: Literal["env.announcement"] = "env.announcement"
    name: EnvName
    mode: EnvMode
    partitions: int = Field(ge=1)
    settings: Document = Field(
        default_factory=dict, description="what the env's settings set (schemas.env_settings)"
    )
    settings_version: int = Field(
        default=1,
        ge=1,
        le=2**31 - 1,
        description="counts the settings' changes: a follower takes only a newer version",
    )
    deleted: bool = False
    reason: Text = ""

    @model_validator(mode="after")
    def _key_is_name(self) -> EnvAnnouncement:
        self.key = self.name
        return self
