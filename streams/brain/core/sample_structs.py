"""The runtime sample's fields as msgspec structs, for the brain's fast read.

Written from `schemas.jobs.RuntimeSample` (with its `NodeUsage`, `JobMeta` and envelope)
by `streams/brain/core/sample_codegen.py`: do not edit. After changing the contract,
`.venv/bin/python -m streams.brain.core.sample_codegen > streams/brain/core/sample_structs.py`
(tests/unit/brain/core/test_sample_structs.py fails until then).
"""

from datetime import datetime
from typing import Annotated, Literal, TypeVar

from msgspec import Meta, Struct

from schemas.envelope import ENV_NAME_PATTERN

CANONICAL_UUID = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z"

_JobRef_labels_key = Annotated[str, Meta(max_length=1024)]
_JobRef_labels_value = Annotated[str, Meta(max_length=1024)]


class NodeUse(Struct, frozen=True, gc=False, kw_only=True, forbid_unknown_fields=True):
    """One node's use in a runtime sample: `NodeUsage`."""

    type: Annotated[str, Meta(min_length=1)]
    id: Annotated[int, Meta(ge=0, le=2147483647)]
    cpu: Annotated[float, Meta(ge=0, le=1000000.0)] = 0.0
    memory: Annotated[int, Meta(ge=0, le=281474976710656)] = 0
    gpu_util: Annotated[float, Meta(ge=0, le=1)] | None = None
    gpu_memory: Annotated[int, Meta(ge=0, le=281474976710656)] | None = None
    step_time: Annotated[float, Meta(ge=0, le=1000000000000.0)] | None = None


class JobRef(Struct, frozen=True, gc=False, kw_only=True, forbid_unknown_fields=True):
    """The job a runtime sample is of: `JobMeta`."""

    uuid: Annotated[str, Meta(min_length=1, max_length=256)]
    name: str = ""
    namespace: str = "default"
    cluster: str = ""
    user: str = ""
    group: str = ""
    scenario: str = ""
    app: str = ""
    labels: Annotated[dict[_JobRef_labels_key, _JobRef_labels_value], Meta(max_length=256)] = {}


class SampleValues(Struct, frozen=True, gc=False, kw_only=True):
    """A runtime sample's own fields: `RuntimeSample` less the envelope and the job."""

    global_step: Annotated[int, Meta(ge=0, le=9223372036854775807)]
    speed: Annotated[float, Meta(ge=0, le=1000000000000.0)] = 0.0
    samples_per_s: Annotated[float, Meta(ge=0, le=1000000000000.0)] = 0.0
    batch_size: Annotated[int, Meta(ge=1, le=9223372036854775807)] | None = None
    local_batch_size: Annotated[int, Meta(ge=1, le=9223372036854775807)] | None = None
    accumulation_steps: Annotated[int, Meta(ge=1, le=9223372036854775807)] = 1
    world_size: Annotated[int, Meta(ge=1, le=9223372036854775807)] | None = None
    nodes: Annotated[tuple[NodeUse, ...], Meta(max_length=10000)] = ()
    num_nodes: Annotated[int, Meta(ge=1, le=10000)] | None = None
    grad_sqr: Annotated[float, Meta(ge=0, le=1e100)] | None = None
    grad_var: Annotated[float, Meta(ge=0, le=1e100)] | None = None
    compute_s: Annotated[float, Meta(ge=0, le=1000000000000.0)] | None = None
    allreduce_s: Annotated[float, Meta(ge=0, le=1000000000000.0)] | None = None


class SampleReport(SampleValues, frozen=True, gc=False, kw_only=True, forbid_unknown_fields=True):
    """A whole `job.runtime_sample` event as read off the bus: `RuntimeSample`."""

    event_id: Annotated[str, Meta(pattern=CANONICAL_UUID)]
    type: Literal["job.runtime_sample"]
    schema_version: Annotated[int, Meta(ge=1, le=1)] = 1
    env: Annotated[str, Meta(pattern=ENV_NAME_PATTERN)]
    occurred_at: str
    source: Annotated[str, Meta(max_length=256)] = ""
    key: Annotated[str, Meta(max_length=512)] | None = None
    job: JobRef

    def __post_init__(self) -> None:
        # schemas.jobs.JobEvent._key_is_job
        if self.key is not None and self.key != self.job.uuid:
            raise ValueError("key must be the job's uuid")
        # schemas.jobs.RuntimeSample._grad_stats_paired
        if (self.grad_sqr is None) != (self.grad_var is None):
            raise ValueError("grad_sqr and grad_var come together")


class StoredSample(SampleValues, frozen=True, gc=False, kw_only=True):
    """What a job's state keeps of a runtime sample: its own fields, its id and time."""

    event_id: str
    at: datetime


_S = TypeVar("_S", bound=StoredSample)


def stored(cls: type[_S], of: SampleValues, event_id: str, at: datetime) -> _S:
    """A `cls` of the values of `of`, taken `at`, from the event `event_id` (a keyword
    per field: a tenth of the time a generic copy took, which cost more than the read)."""
    return cls(
        event_id=event_id,
        at=at,
        global_step=of.global_step,
        speed=of.speed,
        samples_per_s=of.samples_per_s,
        batch_size=of.batch_size,
        local_batch_size=of.local_batch_size,
        accumulation_steps=of.accumulation_steps,
        world_size=of.world_size,
        nodes=of.nodes,
        num_nodes=of.num_nodes,
        grad_sqr=of.grad_sqr,
        grad_var=of.grad_var,
        compute_s=of.compute_s,
        allreduce_s=of.allreduce_s,
    )
