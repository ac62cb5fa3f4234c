"""A dead letter of any record is an event every consumer and producer takes: it encodes
within an event's bound, decodes back equal, and says whether (and how much) it cut."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.bounds import MAX_EVENT_BYTES
from schemas.codec import decode, encode
from schemas.dlq import (
    MAX_ERROR_CHARS,
    MAX_ORIGINAL_KEY_BYTES,
    MAX_ORIGINAL_VALUE_BYTES,
    DeadLetter,
    FailureKind,
    fitting_letter,
)


@st.composite
def payloads(draw: st.DrawFn, largest: int) -> bytes | None:
    """None, small arbitrary bytes, or a large block (a prefix repeated), up to ``largest``."""
    kind = draw(st.sampled_from(["none", "small", "large"]))
    if kind == "none":
        return None
    if kind == "small":
        return draw(st.binary(max_size=64))
    size = draw(st.integers(min_value=0, max_value=largest))
    unit = draw(st.binary(min_size=1, max_size=16))
    return (unit * (size // len(unit) + 1))[:size]


@settings(max_examples=150, deadline=None)
@given(
    key=payloads(4 * MAX_ORIGINAL_KEY_BYTES),
    value=payloads(2 * MAX_EVENT_BYTES),
    kind=st.sampled_from(list(FailureKind)),
    error=st.text(max_size=3 * MAX_ERROR_CHARS) | st.just("\x00" * 5000),
    group=st.text(min_size=1, max_size=400),
    offset=st.integers(min_value=0, max_value=2**62),
)
def test_any_record_makes_a_letter_within_the_event_bound(
    key: bytes | None, value: bytes | None, kind: FailureKind, error: str, group: str, offset: int
) -> None:
    letter = fitting_letter(
        env="prod",
        original_topic="prod.job.events",
        partition=3,
        offset=offset,
        key=key,
        value=value,
        kind=kind,
        error=error,
        group=group,
    )
    data = encode(letter)
    assert len(data) <= MAX_EVENT_BYTES
    back = decode(data)
    assert back == letter and isinstance(back, DeadLetter)
    assert "\x00" not in back.error and back.error_kind == kind
    assert back.original_size == (None if value is None else len(value))
    assert back.original_key_size == (None if key is None else len(key))
    cut_value = value is not None and len(value) > MAX_ORIGINAL_VALUE_BYTES
    cut_key = key is not None and len(key) > MAX_ORIGINAL_KEY_BYTES
    assert back.truncated == (cut_value or cut_key)
    if value is not None:
        assert back.value_bytes() == value[:MAX_ORIGINAL_VALUE_BYTES]
    if key is not None:
        assert back.key_bytes() == key[:MAX_ORIGINAL_KEY_BYTES]
