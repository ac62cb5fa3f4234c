"""Codec properties: valid events round-trip; any bytes decode or fail with CodecError."""

from __future__ import annotations

import json
import string
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import (
    CodecError,
    ConfigChange,
    ConfigDocument,
    Event,
    JobMeta,
    NodeOOM,
    NodeResource,
    OOMKind,
    RuntimeSample,
    ScalePlan,
    decode,
    encode,
)
from schemas.bounds import (
    MAX_BATCH_SIZE,
    MAX_BYTES,
    MAX_CPU,
    MAX_DOCUMENT_VALUES,
    MAX_EVENT_BYTES,
    MAX_GRAD_STAT,
    MAX_LABELS,
    MAX_NODES,
    MAX_REPLICAS,
)
from schemas.codec import decode_obj
from schemas.dlq import DeadLetter, FailureKind
from schemas.events import EVENT_TYPES
from schemas.jobs import JobSubmitted, NodeRef, NodeUsage, RoleSpec
from schemas.plans import (
    MigrateNode,
    Node,
    NodeGroupResource,
    RescaleMode,
    RescalePhases,
    ScaleResult,
    ScaleStatus,
    TrainingRescaled,
)

envs = st.from_regex(r"\A[a-z][a-z0-9-]{0,30}\Z")
#: strings a valid event may hold: any but NUL, which Postgres cannot store
text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=30)
ident = st.text(alphabet=string.ascii_letters + string.digits + "-_.", min_size=1, max_size=40)
when = st.datetimes(
    min_value=datetime(2000, 1, 1),
    max_value=datetime(2100, 1, 1),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=8)), timezone(timedelta(hours=-5))]),
)
floats = st.floats(min_value=0, max_value=1e12, allow_nan=False, allow_infinity=False)
grad_stats = st.floats(min_value=0, max_value=MAX_GRAD_STAT, allow_nan=False, allow_infinity=False)
cores = st.floats(min_value=0, max_value=MAX_CPU, allow_nan=False, allow_infinity=False)
counts = st.integers(min_value=0, max_value=2**40)
roles = st.sampled_from(["worker", "ps", "chief", "evaluator", "learner", "collector"])

job_meta = st.builds(
    JobMeta,
    uuid=ident,
    name=text,
    user=text,
    group=text,
    cluster=text,
    scenario=text,
    labels=st.dictionaries(ident, text, max_size=3),
)
envelope: dict[str, Any] = {"env": envs, "occurred_at": when, "source": text}
node_ref = st.builds(NodeRef, type=roles, id=st.integers(0, 1000), name=text)
node_usage = st.builds(
    NodeUsage,
    type=roles,
    id=st.integers(0, 1000),
    cpu=cores,
    memory=counts,
    gpu_util=st.none() | st.floats(0, 1),
    gpu_memory=st.none() | counts,
    step_time=st.none() | floats,
)
resource = st.builds(NodeResource, cpu=cores, memory=counts, gpu_num=st.integers(0, 16))

samples_without_grad_stats = st.builds(
    RuntimeSample,
    job=job_meta,
    global_step=counts,
    speed=floats,
    samples_per_s=floats,
    batch_size=st.none() | st.integers(1, 1 << 20),
    nodes=st.lists(node_usage, max_size=4),
    num_nodes=st.none() | st.integers(1, MAX_NODES),
    compute_s=st.none() | floats,
    allreduce_s=st.none() | floats,
    **envelope,
)
ooms = st.builds(
    NodeOOM,
    job=job_meta,
    node=node_ref,
    kind=st.sampled_from(OOMKind),
    memory=st.none() | counts,
    **envelope,
)
scale_plans = st.builds(
    ScalePlan,
    job=job_meta,
    plan_id=ident,
    source_plan=st.none() | ident,
    node_group_resources=st.dictionaries(
        roles,
        st.builds(NodeGroupResource, count=st.integers(0, 64), node_resource=resource),
        max_size=3,
    ),
    launch_nodes=st.lists(
        st.builds(Node, type=roles, id=st.integers(0, 64), resource=resource), max_size=3
    ),
    remove_nodes=st.lists(node_ref, max_size=3),
    migrate_nodes=st.lists(st.builds(MigrateNode, node=node_ref, resource=resource), max_size=2),
    **envelope,
)


@st.composite
def samples_with_grad_stats(draw: st.DrawFn) -> RuntimeSample:
    """Samples, half of them with the gradient statistics (both: one needs the other)."""
    sample = draw(samples_without_grad_stats)
    if not draw(st.booleans()):
        return sample
    stats = {"grad_sqr": draw(grad_stats), "grad_var": draw(grad_stats)}
    return RuntimeSample.model_validate({**sample.model_dump(), **stats})


samples = samples_with_grad_stats()
batch_sizes = st.integers(1, MAX_BATCH_SIZE)


@st.composite
def submissions(draw: st.DrawFn) -> JobSubmitted:
    """Submissions with batch limits: each maximum at or above what it bounds."""
    smallest = draw(st.none() | batch_sizes)
    initial = draw(st.none() | st.integers(smallest or 1, MAX_BATCH_SIZE))
    low = draw(st.none() | batch_sizes)
    role = st.builds(
        RoleSpec,
        replicas=st.integers(0, 64),
        min_replicas=st.none() | st.integers(0, 8),
        max_replicas=st.none() | st.integers(8, MAX_REPLICAS),
    )
    return JobSubmitted(
        job=draw(job_meta),
        roles=draw(st.dictionaries(roles, role, max_size=2)),
        min_batch_size=smallest,
        batch_size=initial,
        max_batch_size=draw(st.none() | st.integers(initial or smallest or 1, MAX_BATCH_SIZE)),
        min_local_batch_size=low,
        max_local_batch_size=draw(st.none() | st.integers(low or 1, MAX_BATCH_SIZE)),
        adaptive_batch_size=draw(st.booleans()),
        **{name: draw(values) for name, values in envelope.items()},
    )


scalars = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=10),
    st.integers(-1000, 1000),
    st.booleans(),
)
documents = st.builds(
    ConfigDocument,
    name=st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,20}\Z"),
    include=st.dictionaries(ident, scalars | st.lists(scalars, max_size=3), max_size=3),
    exclude=st.dictionaries(ident, scalars, max_size=2),
    configure=st.dictionaries(ident, scalars, max_size=4),
    priority=st.integers(-10, 10),
    version=st.integers(1, 100),
)
changes = documents.flatmap(
    lambda d: st.builds(
        ConfigChange,
        op=st.just("upsert"),
        name=st.just(d.name),
        version=st.just(d.version),
        document=st.just(d),
        **envelope,
    )
)
letters = st.builds(
    DeadLetter,
    original_topic=ident,
    partition=st.integers(0, 100),
    offset=counts,
    original_key=st.none() | st.binary(max_size=20).map(DeadLetter.b64),
    original_value=st.none() | st.binary(max_size=50).map(DeadLetter.b64),
    error_kind=st.sampled_from(FailureKind),
    error=text,
    **envelope,
)
seconds = st.none() | floats
rescales = st.builds(
    TrainingRescaled,
    job=job_meta,
    mode=st.sampled_from(RescaleMode),
    plan_id=st.none() | ident,
    node=node_ref,
    world_size_before=st.none() | st.integers(0, MAX_REPLICAS),
    world_size=st.integers(0, MAX_REPLICAS),
    global_step=counts,
    steps_lost=st.none() | st.integers(0, 10),
    reason=text,
    phases=st.builds(
        RescalePhases,
        plan_delivery_s=seconds,
        agreement_s=seconds,
        reform_s=seconds,
        state_transfer_s=seconds,
        first_step_s=seconds,
        total_s=seconds,
    ),
    **envelope,
)
applied_results = st.builds(
    ScaleResult,
    job=job_meta,
    plan_id=ident,
    status=st.just(ScaleStatus.APPLIED),
    rescale_mode=st.none() | st.sampled_from(RescaleMode),
    **envelope,
)
any_event = st.one_of(
    samples, submissions(), ooms, scale_plans, changes, letters, rescales, applied_results
)


@given(any_event)
def test_any_valid_event_round_trips(event: Event) -> None:
    decoded = decode(encode(event))
    assert decoded == event
    assert type(decoded) is type(event)


@given(st.binary(max_size=300))
def test_any_bytes_decode_or_fail_with_a_codec_error(data: bytes) -> None:
    try:
        event = decode(data)
    except CodecError as err:
        assert err.kind in FailureKind
        assert str(err)
    else:
        assert isinstance(event, Event)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)  # what JSON producers can send
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300)
@given(any_event, st.sampled_from(["drop", "retype", "garble"]), st.data())
def test_mutated_events_decode_or_fail_cleanly(event: Event, how: str, data: st.DataObject) -> None:
    obj = orjson.loads(encode(event))
    field = data.draw(st.sampled_from(sorted(obj)))
    if how == "drop":
        del obj[field]
    elif how == "retype":
        obj[field] = data.draw(json_values)
    else:
        obj[data.draw(st.text(max_size=10))] = data.draw(json_values)
    try:
        decoded = decode(orjson.dumps(obj))
    except CodecError:
        return
    assert isinstance(decoded, Event)


@given(st.sampled_from(sorted(EVENT_TYPES)), json_values)
def test_arbitrary_json_with_a_known_type_decodes_or_fails_cleanly(
    type_name: str, payload: object
) -> None:
    obj = {"type": type_name, "env": "prod", "payload": payload}
    try:
        decode(orjson.dumps(obj))
    except CodecError as err:
        assert err.kind in {FailureKind.INVALID, FailureKind.UNSUPPORTED_VERSION}


def _numbers(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths to the numbers (not booleans) in a JSON value."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _numbers(v, (*path, k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _numbers(v, (*path, i))]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return [path]
    return []


def _set(obj: Any, path: tuple[Any, ...], value: Any) -> None:
    for step in path[:-1]:
        obj = obj[step]
    obj[path[-1]] = value


@settings(max_examples=300)
@given(st.one_of(samples, submissions(), ooms, scale_plans), st.data())
def test_no_number_is_read_from_a_boolean_or_a_string(event: Event, data: st.DataObject) -> None:
    """Strict decoding: `true` is not step 1, `"1"` is not version 1, for every consumer.
    (Every number of these events is a typed field: no free-form document holds one.)"""
    obj = orjson.loads(encode(event))
    path = data.draw(st.sampled_from(_numbers(obj)))
    value = obj
    for step in path:
        value = value[step]
    _set(obj, path, data.draw(st.sampled_from([True, False, str(value), f"{value}"])))
    with pytest.raises(CodecError) as caught:
        decode(orjson.dumps(obj))
    assert caught.value.kind == FailureKind.INVALID
    with pytest.raises(CodecError):
        decode_obj(obj)


@given(samples, st.sampled_from([12345, 1.7e9, 0]))
def test_no_timestamp_is_read_from_a_number(event: Event, when: float) -> None:
    obj = orjson.loads(encode(event))
    obj["occurred_at"] = when
    with pytest.raises(CodecError, match="occurred_at"):
        decode(orjson.dumps(obj))


_SAMPLE = {
    "type": "job.runtime_sample",
    "env": "prod",
    "occurred_at": "2026-01-01T00:00:00Z",
    "job": {"uuid": "job-1"},
    "global_step": 1,
    "nodes": [{"type": "worker", "id": 0, "memory": 1}],
}
_SUBMITTED = {
    "type": "job.submitted",
    "env": "prod",
    "job": {"uuid": "job-1"},
    "roles": {"worker": {"replicas": 2}},
}
_SAMPLE_MEASURED = {
    **_SAMPLE,
    "num_nodes": 2,
    "grad_sqr": 0.5,
    "grad_var": 40.0,
    "compute_s": 0.2,
    "allreduce_s": 0.05,
}
_SUBMITTED_LIMITS = {
    **_SUBMITTED,
    "batch_size": 64,
    "max_batch_size": 1024,
    "min_local_batch_size": 8,
    "max_local_batch_size": 128,
    "adaptive_batch_size": True,
}
#: (a valid event, a path in it, a value past the contract, what the reason says)
_POISON: list[tuple[dict[str, Any], tuple[Any, ...], Any, str]] = [
    (_SAMPLE, ("nodes", 0, "memory"), 10**30, f"less than or equal to {MAX_BYTES}"),
    (_SAMPLE, ("nodes", 0, "memory"), MAX_BYTES + 1, f"less than or equal to {MAX_BYTES}"),
    (_SAMPLE, ("nodes", 0, "gpu_memory"), 2**63, f"less than or equal to {MAX_BYTES}"),
    (_SAMPLE, ("nodes", 0, "cpu"), 1e300, f"less than or equal to {MAX_CPU:.0f}"),
    (_SAMPLE, ("global_step",), 2**63, f"less than or equal to {2**63 - 1}"),
    (_SAMPLE, ("global_step",), True, "valid integer"),
    (_SAMPLE, ("schema_version",), "1", "valid integer"),
    (_SAMPLE, ("speed",), -1, "greater than or equal to 0"),
    (_SAMPLE, ("job", "user"), "a\x00b", "NUL"),
    (_SAMPLE, ("job", "labels"), {"a\x00": "b"}, "NUL"),
    (_SAMPLE, ("nodes",), [{"type": "worker", "id": i} for i in range(MAX_NODES + 1)], "10000"),
    (_SUBMITTED, ("roles", "worker", "replicas"), 10**30, f"less than or equal to {MAX_REPLICAS}"),
    (_SUBMITTED, ("roles", "worker", "max_replicas"), MAX_REPLICAS + 1, str(MAX_REPLICAS)),
    (_SUBMITTED, ("config",), {"a": ["b\x00"]}, "NUL"),
    (_SUBMITTED, ("config",), {"steps": 10**30}, "int64"),
    (_SUBMITTED, ("config",), {"n": list(range(MAX_DOCUMENT_VALUES))}, "more than"),
    (_SUBMITTED, ("job", "labels"), {str(i): "" for i in range(MAX_LABELS + 1)}, "at most"),
    # what jobs report for a cluster scheduler (issue 18)
    (_SAMPLE_MEASURED, ("num_nodes",), MAX_NODES + 1, f"less than or equal to {MAX_NODES}"),
    (_SAMPLE_MEASURED, ("num_nodes",), 0, "greater than or equal to 1"),
    (_SAMPLE_MEASURED, ("grad_sqr",), 1e101, f"at most {MAX_GRAD_STAT:g}"),
    (_SAMPLE_MEASURED, ("grad_var",), 1e300, f"at most {MAX_GRAD_STAT:g}"),
    (_SAMPLE_MEASURED, ("grad_var",), -1.0, "greater than or equal to 0"),
    (_SAMPLE_MEASURED, ("grad_var",), None, "both or neither"),
    (_SAMPLE, ("grad_sqr",), 1.0, "both or neither"),
    (_SAMPLE_MEASURED, ("compute_s",), -0.1, "greater than or equal to 0"),
    (_SAMPLE_MEASURED, ("allreduce_s",), 1e13, "less than or equal to 1"),
    (_SUBMITTED_LIMITS, ("max_batch_size",), MAX_BATCH_SIZE + 1, str(MAX_BATCH_SIZE)),
    (_SUBMITTED_LIMITS, ("max_local_batch_size",), 2**63, str(MAX_BATCH_SIZE)),
    (_SUBMITTED_LIMITS, ("min_local_batch_size",), 0, "greater than or equal to 1"),
    (_SUBMITTED_LIMITS, ("max_batch_size",), 32, "batch_size 64 must be <= max_batch_size 32"),
    (_SUBMITTED_LIMITS, ("max_local_batch_size",), 4, "min_local_batch_size 8 must be <="),
    (_SUBMITTED_LIMITS, ("min_batch_size",), 128, "min_batch_size 128 must be <= batch_size 64"),
    (_SUBMITTED_LIMITS, ("min_batch_size",), 0, "greater than or equal to 1"),
    (_SUBMITTED_LIMITS, ("adaptive_batch_size",), 1, "valid boolean"),
]


@pytest.mark.parametrize(("valid", "path", "value", "reason"), _POISON)
def test_a_value_past_the_contract_is_refused_with_the_bound(
    valid: dict[str, Any], path: tuple[Any, ...], value: Any, reason: str
) -> None:
    decode(orjson.dumps(valid))  # valid as it is
    obj = orjson.loads(orjson.dumps(valid))
    _set(obj, path, value)
    raw = json.dumps(obj).encode()  # (orjson holds no integer beyond 64 bits)
    with pytest.raises(CodecError) as caught:
        decode(raw)
    assert caught.value.kind == FailureKind.INVALID
    assert reason in caught.value.message


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-Infinity", b"1e400"])
def test_no_number_that_json_cannot_hold_is_accepted(number: bytes) -> None:
    raw = orjson.dumps(_SAMPLE).replace(b'"global_step":1', b'"global_step":1,"speed":' + number)
    with pytest.raises(CodecError):
        decode(raw)


def test_an_event_larger_than_the_bus_bound_is_refused() -> None:
    obj = {**_SAMPLE, "source": "s" * MAX_EVENT_BYTES}
    with pytest.raises(CodecError, match=str(MAX_EVENT_BYTES)):
        decode(orjson.dumps(obj))


def test_events_without_what_jobs_now_report_stay_valid() -> None:
    """Producers from before issue 18 send none of the new fields: their events read as
    before, the new fields unset."""
    sample = decode(orjson.dumps(_SAMPLE))
    assert isinstance(sample, RuntimeSample)
    assert (sample.num_nodes, sample.grad_sqr, sample.grad_var) == (None, None, None)
    assert (sample.compute_s, sample.allreduce_s) == (None, None)
    submitted = decode(orjson.dumps(_SUBMITTED))
    assert isinstance(submitted, JobSubmitted)
    assert submitted.max_batch_size is None and submitted.adaptive_batch_size is False
    assert (submitted.min_local_batch_size, submitted.max_local_batch_size) == (None, None)


def test_what_jobs_report_reads_back_as_sent() -> None:
    sample = decode(orjson.dumps(_SAMPLE_MEASURED))
    assert isinstance(sample, RuntimeSample)
    assert (sample.num_nodes, sample.grad_sqr, sample.grad_var) == (2, 0.5, 40.0)
    assert (sample.compute_s, sample.allreduce_s) == (0.2, 0.05)
    submitted = decode(orjson.dumps(_SUBMITTED_LIMITS))
    assert isinstance(submitted, JobSubmitted)
    assert (submitted.batch_size, submitted.max_batch_size) == (64, 1024)
    assert (submitted.min_local_batch_size, submitted.max_local_batch_size) == (8, 128)
    assert submitted.adaptive_batch_size is True


def test_a_sample_without_the_new_fields_encodes_as_before() -> None:
    """Unset, they are left out of the JSON: such samples are the bytes they were before
    the fields existed, and so keep the brain's fast read (`streams/brain/core/samples.py`
    refuses any field it was not built with)."""
    event = RuntimeSample(env="prod", job=JobMeta(uuid="job-1"), global_step=1)
    written = orjson.loads(encode(event))
    assert not {"num_nodes", "grad_sqr", "grad_var", "compute_s", "allreduce_s"} & set(written)
    assert decode(encode(event)) == event
