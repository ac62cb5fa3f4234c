"""Runtime samples on the brain's hot path: read off the bus and kept in job states.

Runtime samples are nearly every event the brain reads, and a job keeps its last 60.
Validated into pydantic models they cost the brain more than deciding on them: the
pydantic RuntimeSample took about 18 us to decode, and its nodes and the state's copy of
it stay tracked by the garbage collector, which walked all of them again and again.
msgspec decodes the same JSON into structs in about 4 us, and structs made with
`gc=False` are never walked.

The contract stays `schemas.jobs.RuntimeSample`: `read_sample` takes only what that model
accepts, with the same values, and returns None for anything else, which then goes the
pydantic way (and to the dead-letter queue with pydantic's reason if it is invalid). It
may refuse valid samples (an id that is not lowercase canonical, a string with an escape
it does not look into), never accept an invalid one; timestamps are parsed by pydantic's
own parser. The contract's bounds (`schemas.bounds`) are its constraints too: a sample
past them (a memory of 10^30 bytes, an infinite cpu, a NUL) must reach the pydantic way
and its dead letter, never a job's state. A property test holds it to that.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta, timezone
from types import MappingProxyType
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct
from pydantic import AwareDatetime, GetCoreSchemaHandler, GetJsonSchemaHandler, TypeAdapter
from pydantic_core import core_schema

from schemas.bounds import (
    INT64_MAX,
    MAX_BYTES,
    MAX_CPU,
    MAX_GRAD_STAT,
    MAX_LABEL_CHARS,
    MAX_LABELS,
    MAX_NODE_ID,
    MAX_NODES,
    MAX_RATE,
)
from schemas.envelope import ENV_NAME_PATTERN, SCHEMA_VERSION
from schemas.jobs import JobMeta, RuntimeSample

NonNegInt = Annotated[int, Meta(ge=0, le=INT64_MAX)]
PosInt = Annotated[int, Meta(ge=1, le=INT64_MAX)]
Rate = Annotated[float, Meta(ge=0, le=MAX_RATE)]
Bytes = Annotated[int, Meta(ge=0, le=MAX_BYTES)]
NodeCount = Annotated[int, Meta(ge=1, le=MAX_NODES)]
GradStat = Annotated[float, Meta(ge=0, le=MAX_GRAD_STAT)]
#: what `str(uuid.UUID(...))` gives: such an id reads the same as text and as a UUID
_CANONICAL_UUID = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z"


class NodeUse(Struct, frozen=True, gc=False, kw_only=True, forbid_unknown_fields=True):
    """One node's use in a runtime sample (`schemas.jobs.NodeUsage`, as a struct)."""

    type: Annotated[str, Meta(min_length=1)]
    id: Annotated[int, Meta(ge=0, le=MAX_NODE_ID)]
    cpu: Annotated[float, Meta(ge=0, le=MAX_CPU)] = 0.0
    memory: Bytes = 0
    gpu_util: Annotated[float, Meta(ge=0, le=1)] | None = None
    gpu_memory: Bytes | None = None
    step_time: Rate | None = None


class Sample(Struct, frozen=True, gc=False, kw_only=True):
    """A runtime sample without its envelope: what optimizers read of a job's progress.

    In a JobState's JSON (checkpoints, `optimize --state`) it is an object of these
    fields; pydantic validates and writes it through the hooks at the end.
    """

    event_id: str
    at: datetime
    global_step: NonNegInt = 0
    speed: Rate = 0.0
    samples_per_s: Rate = 0.0
    batch_size: PosInt | None = None
    local_batch_size: PosInt | None = None
    accumulation_steps: PosInt = 1
    world_size: PosInt | None = None
    nodes: Annotated[tuple[NodeUse, ...], Meta(max_length=MAX_NODES)] = ()
    #: what a cluster scheduler fits a job's goodput from (`schemas.jobs.RuntimeSample`)
    num_nodes: NodeCount | None = None
    grad_sqr: GradStat | None = None
    grad_var: GradStat | None = None
    compute_s: Rate | None = None
    allreduce_s: Rate | None = None

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


def sample_of(event: RuntimeSample) -> Sample:
    """The sample of a validated pydantic RuntimeSample (events not read by `read_sample`)."""
    nodes = msgspec.convert(event.nodes, tuple[NodeUse, ...], from_attributes=True)
    return _sample(event, str(event.event_id), event.occurred_at, nodes)


def _sample(
    of: RuntimeSample | SampleReport, event_id: str, at: datetime, nodes: tuple[NodeUse, ...]
) -> Sample:
    """The sample fields, which the pydantic event and the struct read name alike."""
    return Sample(
        event_id=event_id,
        at=at,
        global_step=of.global_step,
        speed=of.speed,
        samples_per_s=of.samples_per_s,
        batch_size=of.batch_size,
        local_batch_size=of.local_batch_size,
        accumulation_steps=of.accumulation_steps,
        world_size=of.world_size,
        nodes=nodes,
        num_nodes=of.num_nodes,
        grad_sqr=of.grad_sqr,
        grad_var=of.grad_var,
        compute_s=of.compute_s,
        allreduce_s=of.allreduce_s,
    )


# -- reading samples off the bus ------------------------------------------------------


class JobRef(Struct, frozen=True, gc=False, kw_only=True, forbid_unknown_fields=True):
    """`schemas.jobs.JobMeta`, as a struct."""

    uuid: Annotated[str, Meta(min_length=1, max_length=256)]
    name: str = ""
    namespace: str = "default"
    cluster: str = ""
    user: str = ""
    group: str = ""
    scenario: str = ""
    app: str = ""
    labels: Annotated[
        dict[
            Annotated[str, Meta(max_length=MAX_LABEL_CHARS)],
            Annotated[str, Meta(max_length=MAX_LABEL_CHARS)],
        ],
        Meta(max_length=MAX_LABELS),
    ] = {}

    def meta(self) -> JobMeta:
        return JobMeta.model_validate(msgspec.to_builtins(self))


class SampleReport(Struct, frozen=True, gc=False, kw_only=True, forbid_unknown_fields=True):
    """A `job.runtime_sample` event as read off the bus by `read_sample`: the envelope
    fields the brain reads, and the sample. Required here where pydantic would fill a
    default (event_id, occurred_at): a report without them goes the pydantic way."""

    event_id: Annotated[str, Meta(pattern=_CANONICAL_UUID)]
    type: Literal["job.runtime_sample"]
    schema_version: Annotated[int, Meta(ge=1, le=SCHEMA_VERSION)] = SCHEMA_VERSION
    env: Annotated[str, Meta(pattern=ENV_NAME_PATTERN)]
    occurred_at: str
    source: Annotated[str, Meta(max_length=256)] = ""
    key: Annotated[str, Meta(max_length=512)] | None = None
    job: JobRef
    global_step: NonNegInt
    speed: Rate = 0.0
    samples_per_s: Rate = 0.0
    batch_size: PosInt | None = None
    local_batch_size: PosInt | None = None
    accumulation_steps: PosInt = 1
    world_size: PosInt | None = None
    nodes: Annotated[tuple[NodeUse, ...], Meta(max_length=MAX_NODES)] = ()
    num_nodes: NodeCount | None = None
    grad_sqr: GradStat | None = None
    grad_var: GradStat | None = None
    compute_s: Rate | None = None
    allreduce_s: Rate | None = None

    def __post_init__(self) -> None:
        if self.key is not None and self.key != self.job.uuid:
            raise ValueError("key must be the job's uuid")
        if (self.grad_sqr is None) != (self.grad_var is None):
            raise ValueError("grad_sqr and grad_var come together")


_REPORT = msgspec.json.Decoder(SampleReport)
_AWARE: TypeAdapter[datetime] = TypeAdapter(AwareDatetime)
#: one tzinfo per offset: pydantic makes a new one per timestamp, and a state's 60
#: samples of 100 jobs kept 27,000 of them for the garbage collector to walk. Every
#: whole-minute offset within a day, made once (read only).
_ZONES: Mapping[timedelta, timezone] = MappingProxyType(
    {timedelta(minutes=m): timezone(timedelta(minutes=m)) for m in range(-1439, 1440)}
    | {timedelta(0): UTC}
)


def _shared_zone(at: datetime) -> datetime:
    offset = at.utcoffset()
    assert offset is not None  # aware
    zone = _ZONES.get(offset)
    if zone is None:  # an offset with seconds: its own
        return at
    return at.replace(tzinfo=zone)


class SampleRead(Struct, frozen=True, gc=False):
    """A runtime sample read off the bus: what the processor and the folds need of it."""

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
        at = _shared_zone(_AWARE.validate_python(report.occurred_at))
    except (msgspec.ValidationError, msgspec.DecodeError, ValueError):
        return None
    return SampleRead(
        env=report.env,
        job=report.job,
        occurred_at=at,
        sample=_sample(report, report.event_id, at, report.nodes),
    )
