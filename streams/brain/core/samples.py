"""Runtime samples on the brain's hot path: read off the bus and kept in job states.

Runtime samples are nearly every event the brain reads, and a job keeps its last 60.
Validated into pydantic models they cost the brain more than deciding on them: the
pydantic RuntimeSample took about 18 us to decode, and its nodes and the state's copy of
it stay tracked by the garbage collector, which walked all of them again and again.
msgspec decodes the same JSON into structs in about 4 us, and structs made with
`gc=False` are never walked.

The sample is declared once, by the contract: `schemas.jobs.RuntimeSample`. The structs
here (`streams.brain.core.sample_structs`) are written from it by
`streams.brain.core.sample_codegen`, and a test fails while they differ. `read_sample`
takes only what that model accepts, with the same values, and returns None for anything
else, which then goes the pydantic way (and to the dead-letter queue with pydantic's
reason if it is invalid). It may refuse valid samples (an id that is not lowercase
canonical, a string with an escape it does not look into), never accept an invalid one;
timestamps are parsed by pydantic's own parser. The contract's bounds (`schemas.bounds`)
are its constraints too: a sample past them (a memory of 10^30 bytes, an infinite cpu, a
NUL) must reach the pydantic way and its dead letter, never a job's state. A property
test holds it to that. Either way a sample reaches the folds in one form, `SampleRead`
(`read_of` makes it of a pydantic RuntimeSample); `streams.brain.core.inputs` chooses
the way.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta, timezone
from types import MappingProxyType
from typing import Any

import msgspec
from msgspec import Struct
from pydantic import AwareDatetime, GetCoreSchemaHandler, GetJsonSchemaHandler, TypeAdapter
from pydantic_core import core_schema

from schemas.jobs import JobMeta, RuntimeSample
from streams.brain.core.sample_structs import (
    JobRef,
    NodeUse,
    SampleReport,
    SampleValues,
    StoredSample,
    stored,
)


class Sample(StoredSample, frozen=True, gc=False, kw_only=True):
    """A runtime sample without its envelope: what optimizers read of a job's progress
    (the contract's own fields, `event_id` and `at`: `StoredSample`).

    In a JobState's JSON (checkpoints, `optimize --state`) it is an object of these
    fields; pydantic validates and writes it through the hooks at the end.
    """

    def usage(self, role: str) -> tuple[NodeUse, ...]:
        """The role's nodes."""
        nodes = self.nodes
        for n in nodes:
            if n.type != role:
                return tuple(n for n in nodes if n.type == role)
        return nodes  # all of them (a job of one role): the tuple itself

    def count(self, role: str) -> int:
        return len(self.usage(role))

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            _sample_from,
            serialization=core_schema.plain_serializer_function_ser_schema(_sample_fields),
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        return _JSON_SCHEMA


def _json_schema() -> dict[str, Any]:
    """Sample's JSON schema with NodeUse inlined: pydantic places it inside its own."""
    _, defs = msgspec.json.schema_components((Sample,), ref_template="{name}")
    schema = dict(defs["Sample"])
    nodes = dict(schema["properties"]["nodes"])
    nodes["items"] = defs["NodeUse"]
    schema["properties"] = {**schema["properties"], "nodes": nodes}
    return schema


_JSON_SCHEMA = _json_schema()


def _sample_from(value: Any) -> Sample:
    if isinstance(value, Sample):
        return value
    try:
        return msgspec.convert(value, Sample, strict=False)
    except msgspec.ValidationError as exc:
        raise ValueError(f"invalid sample: {exc}") from None


def _sample_fields(sample: Sample) -> dict[str, Any]:
    return msgspec.to_builtins(sample, builtin_types=(datetime,))


def job_meta(job: JobRef) -> JobMeta:
    """The contract's JobMeta of a job read the fast way (a new job's state keeps it)."""
    return JobMeta.model_validate(msgspec.to_builtins(job))


# -- reading samples off the bus ------------------------------------------------------


_REPORT = msgspec.json.Decoder(SampleReport)
_AWARE: TypeAdapter[datetime] = TypeAdapter(AwareDatetime)
#: one tzinfo per offset: pydantic makes a new one per timestamp, and a state's 60
#: samples of 100 jobs kept 27,000 of them for the garbage collector to walk. Every
#: whole-minute offset within a day, made once (read only).
_ZONES: Mapping[timedelta, timezone] = MappingProxyType(
    {timedelta(minutes=m): timezone(timedelta(minutes=m)) for m in range(-1439, 1440)}
    | {timedelta(0): UTC}
)


#: a time as this project's encoders write it (UTC, `Z`, at most microseconds): the
#: standard library's parser reads it as pydantic does, at a tenth of the cost (pydantic's
#: read of the time was a fifth of a sample's read), into the shared UTC zone
_ENCODED_UTC = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,6})?Z\Z")


def _time_of(text: str) -> datetime:
    """The aware time `text` says, exactly as pydantic reads it (ValueError if it does
    not take it)."""
    if _ENCODED_UTC.match(text):
        with contextlib.suppress(ValueError):  # (a day that does not exist: pydantic says)
            return datetime.fromisoformat(text)
    return _shared_zone(_AWARE.validate_python(text))


def _shared_zone(at: datetime) -> datetime:
    offset = at.utcoffset()
    assert offset is not None  # aware
    zone = _ZONES.get(offset)
    if zone is None:  # an offset with seconds: its own
        return at
    return at.replace(tzinfo=zone)


class SampleRead(Struct, frozen=True, gc=False):
    """A runtime sample as the brain reads it: what the processor and the folds need of
    it, whichever way it was decoded."""

    env: str
    job: JobRef
    occurred_at: datetime
    sample: Sample

    @property
    def event_id(self) -> str:
        return self.sample.event_id


def read_sample(value: bytes | None) -> SampleRead | None:
    """The runtime sample in `value`, or None when it is not one this path can read
    exactly as pydantic would (then decode it the pydantic way)."""
    if value is None or b"\\u0000" in value or b"\x00" in value:
        return None  # a NUL, which the contract refuses (or an escaped backslash before u0000)
    try:
        report = _REPORT.decode(value)
        at = _time_of(report.occurred_at)
    except (msgspec.ValidationError, msgspec.DecodeError, ValueError):
        return None
    return SampleRead(
        env=report.env,
        job=report.job,
        occurred_at=at,
        sample=stored(Sample, report, report.event_id, at),
    )


def read_of(event: RuntimeSample) -> SampleRead:
    """The brain's form of a runtime sample decoded the pydantic way (validated already)."""
    at = _shared_zone(event.occurred_at)
    values = msgspec.convert(event, SampleValues, from_attributes=True)
    return SampleRead(
        env=event.env,
        job=msgspec.convert(event.job, JobRef, from_attributes=True),
        occurred_at=at,
        sample=stored(Sample, values, str(event.event_id), at),
    )


def sample_of(event: RuntimeSample) -> Sample:
    """The sample of a validated pydantic RuntimeSample."""
    return read_of(event).sample
