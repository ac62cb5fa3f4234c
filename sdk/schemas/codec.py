"""The wire codec: events <-> JSON bytes (orjson).

``decode`` never lets an exception other than CodecError escape, whatever the bytes: the
consumer turns a CodecError into a dead letter and moves on.

Decoding is strict, one rule for every consumer (the bus, the brain, the archiver, the
tailer, the gateways): a value must have its field's JSON type. No boolean is read as a
number (``true`` as step 1), no number as a timestamp, no string as a number (``"1"`` as
schema version 1). Lax coercion let producers send wrong types that each consumer read
its own way; a strict contract reads the same everywhere, and `schemas/json` says it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Protocol, TypeVar

import orjson
from pydantic import TypeAdapter, ValidationError

from schemas.bounds import MAX_EVENT_BYTES
from schemas.dlq import FailureKind
from schemas.envelope import SCHEMA_VERSION, Event
from schemas.events import EVENT_TYPES, AnyEvent

_ADAPTER: TypeAdapter[Event] = TypeAdapter(AnyEvent)

DecodeFailure = FailureKind


class OfEnv(Protocol):
    """Anything that names the env it belongs to (an event, or a fast read of one)."""

    @property
    def env(self) -> str: ...


E = TypeVar("E", bound=OfEnv)


class CodecError(Exception):
    """Bytes that are not a valid event; ``kind`` says how they failed."""

    def __init__(self, kind: FailureKind | StrEnum, message: str) -> None:
        super().__init__(message)
        self.kind = FailureKind(kind)
        self.message = message

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.message}"


def encode(event: Event) -> bytes:
    return orjson.dumps(event.model_dump(mode="json", by_alias=True))


def _summarise(err: ValidationError, type_name: str, limit: int = 5) -> str:
    parts = []
    for e in err.errors(include_url=False)[:limit]:
        path = list(e["loc"])
        if path and path[0] == type_name:  # the union's tag adds nothing for the reader
            path = path[1:]
        loc = ".".join(str(p) for p in path) or "<event>"
        parts.append(f"{loc}: {e['msg']}")
    more = err.error_count() - limit
    if more > 0:
        parts.append(f"... and {more} more")
    return "; ".join(parts)


def decode_obj(obj: Any) -> Event:
    """Validate an already-parsed JSON value as an event, by the rule `decode` applies."""
    try:
        data = orjson.dumps(obj)
    except TypeError as err:  # not a JSON value (an integer beyond 64 bits, ...)
        raise CodecError(FailureKind.MALFORMED, f"not a JSON value: {err}") from None
    return _validate(obj, data)


def _validate(obj: Any, data: bytes | bytearray) -> Event:
    """`obj`, parsed from `data`, as an event: checked on `obj`, validated (strictly, as
    JSON) on `data`."""
    if not isinstance(obj, dict):
        raise CodecError(FailureKind.MALFORMED, f"expected a JSON object, got {type(obj).__name__}")
    type_name = obj.get("type")
    if not isinstance(type_name, str) or type_name not in EVENT_TYPES:
        raise CodecError(FailureKind.UNKNOWN_TYPE, f"unknown event type {type_name!r}")
    version = obj.get("schema_version", SCHEMA_VERSION)
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        raise CodecError(
            FailureKind.UNSUPPORTED_VERSION,
            f"schema_version {version} is newer than this consumer's {SCHEMA_VERSION}",
        )
    try:
        return _ADAPTER.validate_json(data, strict=True)
    except ValidationError as err:
        raise CodecError(
            FailureKind.INVALID, f"{type_name}: {_summarise(err, type_name)}"
        ) from None


def decode(data: bytes | bytearray | memoryview | None) -> Event:
    if data is None:
        raise CodecError(FailureKind.MALFORMED, "empty message (tombstone)")
    if len(data) > MAX_EVENT_BYTES:
        raise CodecError(
            FailureKind.MALFORMED, f"{len(data)} bytes, more than an event's {MAX_EVENT_BYTES}"
        )
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as err:
        raise CodecError(FailureKind.MALFORMED, f"not JSON: {err}") from None
    return _validate(obj, data if isinstance(data, bytes | bytearray) else bytes(data))


def check_env(event: E, env: str, topic: str) -> E:
    """``event``, read from ``topic`` of ``env``, if it is of that env; else CodecError
    (``wrong_env``). An env's topics carry that env's events only: every reader refuses
    another env's event the same way, by this, with the same reason."""
    if event.env != env:
        raise CodecError(
            FailureKind.WRONG_ENV,
            f"event of env {event.env!r} on topic {topic!r} of env {env!r}",
        )
    return event
