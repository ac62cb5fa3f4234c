"""Dead letters: what a consumer could not process, with why, in a record any producer
can send.

A dead letter keeps the original bytes (base64) so nothing is lost, up to a budget: the
letter itself must fit an event's bound (``MAX_EVENT_BYTES``), which is also what a broker
takes in one message. Base64 makes bytes a third larger, so a 900 KB bad record kept whole
became a 1.2 MB letter no producer would send, and the consumer that tried retried for
ever. Past the budget a letter keeps a prefix of the original bytes, says so
(``truncated``), and keeps the original sizes and the reason whole.
"""

from __future__ import annotations

import base64
from enum import StrEnum
from typing import ClassVar, Literal

from pydantic import Field

from schemas.bounds import MAX_EVENT_BYTES, Text
from schemas.envelope import Event

#: Bytes of the original value a letter keeps: as base64, 2/3 of an event's bound.
MAX_ORIGINAL_VALUE_BYTES = MAX_EVENT_BYTES // 2
#: Bytes of the original key a letter keeps.
MAX_ORIGINAL_KEY_BYTES = 16 * 1024
#: Characters of the reason.
MAX_ERROR_CHARS = 2_000
#: Characters of the envelope's key (the original key as text) and of its source.
MAX_KEY_CHARS = 512
MAX_SOURCE_CHARS = 256


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
    error: Text = Field(max_length=MAX_ERROR_CHARS)
    consumer_group: str = ""
    truncated: bool = Field(
        default=False,
        description="original_key or original_value holds only the first bytes of the"
        f" original (at most {MAX_ORIGINAL_KEY_BYTES} and {MAX_ORIGINAL_VALUE_BYTES})",
    )
    original_size: int | None = Field(
        default=None, ge=0, description="bytes of the original value (None: a tombstone)"
    )
    original_key_size: int | None = Field(
        default=None, ge=0, description="bytes of the original key (None: no key)"
    )

    @staticmethod
    def b64(data: bytes | None) -> str | None:
        return None if data is None else base64.b64encode(data).decode("ascii")

    def value_bytes(self) -> bytes | None:
        return None if self.original_value is None else base64.b64decode(self.original_value)

    def key_bytes(self) -> bytes | None:
        return None if self.original_key is None else base64.b64decode(self.original_key)


def _text(value: str, limit: int) -> str:
    """``value`` as a string every consumer can store: no NUL, at most ``limit`` chars."""
    return value.replace("\x00", "\\u0000")[:limit]


def fitting_letter(
    *,
    env: str,
    original_topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    kind: FailureKind,
    error: str,
    group: str,
) -> DeadLetter:
    """A dead letter of any record, whatever its bytes, that encodes within an event's
    bound: never raises on the record's content (a letter that cannot be built or sent
    is a consumer that stops)."""
    kept_key = key[:MAX_ORIGINAL_KEY_BYTES] if key is not None else None
    kept_value = value[:MAX_ORIGINAL_VALUE_BYTES] if value is not None else None
    return DeadLetter(
        env=env,
        source=_text(group, MAX_SOURCE_CHARS),
        key=None
        if key is None
        else _text(key[: 4 * MAX_KEY_CHARS].decode("utf-8", "replace"), MAX_KEY_CHARS),
        original_topic=original_topic,
        partition=partition,
        offset=offset,
        original_key=DeadLetter.b64(kept_key),
        original_value=DeadLetter.b64(kept_value),
        error_kind=kind,
        error=_text(error, MAX_ERROR_CHARS),
        consumer_group=group,
        truncated=len(kept_key or b"") < len(key or b"")
        or len(kept_value or b"") < len(value or b""),
        original_size=None if value is None else len(value),
        original_key_size=None if key is None else len(key),
    )
