"""What the brain reads off its input topics: one interface, two ways to read a sample.

Every input record becomes an `Input`: a runtime sample as a `SampleRead` (the brain's
form, `streams.brain.core.samples`), any other event as its pydantic model, and a record
that is no valid event as the `CodecError` that says why (its dead letter). How a runtime
sample is read is the one choice (`SampleDecode`):

- ``fast`` (the default): msgspec structs first, pydantic for what they do not take
  exactly as the contract would;
- ``pydantic``: the contract's models alone, the sample then made a `SampleRead`.

Both give the same states and plans on the same input (a test holds them to it), so the
pydantic way is there to check the fast one against: a brain takes it from the setting
`DLROVER_EVENTS_BRAIN_SAMPLE_DECODE`, and the test suite from `--sample-decode`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Literal, get_args

from pydantic import TypeAdapter, ValidationError

from schemas.bounds import MAX_EVENT_BYTES
from schemas.codec import decode
from schemas.envelope import Event
from schemas.events import AnyEvent
from schemas.jobs import RuntimeSample
from streams.brain.core.samples import SampleRead, read_of, read_sample

#: how the brain reads runtime samples
SampleDecode = Literal["fast", "pydantic"]
SAMPLE_DECODES: tuple[SampleDecode, ...] = get_args(SampleDecode)
#: what a processor not told otherwise reads with
DEFAULT_SAMPLE_DECODE: SampleDecode = "fast"

#: an input event: a runtime sample in the brain's form, or any other event
Input = Event | SampleRead
InputReader = Callable[[bytes | None], Input]

_EVENT: TypeAdapter[Event] = TypeAdapter(AnyEvent)


def read_event(value: bytes | None) -> Input:
    """The record's event the pydantic way: one-pass JSON validation (a third less than
    `decode`), then `decode` for anything invalid, so the dead letter says exactly what
    `decode` says (a CodecError). Both are strict, as `decode` is (no boolean read as a
    number, no number as a timestamp)."""
    event: Event | None = None
    if value is not None and len(value) <= MAX_EVENT_BYTES:
        with contextlib.suppress(ValidationError):
            event = _EVENT.validate_json(value, strict=True)
    if event is None:
        event = decode(value)
    if isinstance(event, RuntimeSample):
        return read_of(event)
    return event


def read_event_fast(value: bytes | None) -> Input:
    """`read_event`, with runtime samples read into structs first (`read_sample`)."""
    fast = read_sample(value)
    if fast is not None:
        return fast
    return read_event(value)


_READERS: dict[SampleDecode, InputReader] = {"fast": read_event_fast, "pydantic": read_event}


def input_reader(sample_decode: SampleDecode = DEFAULT_SAMPLE_DECODE) -> InputReader:
    """The reader of input records that reads runtime samples the `sample_decode` way."""
    try:
        return _READERS[sample_decode]
    except KeyError:
        known = ", ".join(SAMPLE_DECODES)
        raise ValueError(f"unknown sample decode {sample_decode!r}; known: {known}") from None
