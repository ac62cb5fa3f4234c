"""Dead letters: what a consumer could not process, kept whole so nothing is lost."""

from __future__ import annotations

import base64
from enum import StrEnum
from typing import ClassVar, Literal

from pydantic import Field

from schemas.envelope import Event


class FailureKind(StrEnum):
    MALFORMED = "malformed"  # not JSON, or not a JSON object
    UNKNOWN_TYPE = "unknown_type"  # no event type of that name
    INVALID = "invalid"  # JSON of a known type that breaks its schema
    UNSUPPORTED_VERSION = "unsupported_version"  # written by a newer producer
    WRONG_ENV = "wrong_env"  # a valid event on another env's topic
    HANDLER = "handler"  # decoded fine, but the processor's effect failed for good


class DeadLetter(Event):
    """Original bytes are base64 text so the record is plain JSON for any consumer."""

    topic: ClassVar[str] = "dlq"
    type: Literal["dlq.record"] = "dlq.record"
    original_topic: str
    partition: int = Field(ge=0)
    offset: int = Field(ge=0)
    original_key: str | None = Field(default=None, description="base64")
    original_value: str | None = Field(default=None, description="base64")
    error_kind: FailureKind
    error: str
    consumer_group: str = ""

    @staticmethod
    def b64(data: bytes | None) -> str | None:
        return None if data is None else base64.b64encode(data).decode("ascii")

    def value_bytes(self) -> bytes | None:
        return None if self.original_value is None else base64.b64decode(self.original_value)

    def key_bytes(self) -> bytes | None:
        return None if self.original_key is None else base64.b64decode(self.original_key)
