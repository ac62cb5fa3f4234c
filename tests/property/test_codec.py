"""Codec properties: valid events round-trip; any bytes decode or fail with CodecError."""

from __future__ import annotations

import string
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import orjson
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
from schemas.dlq import DeadLetter, FailureKind
from schemas.events import EVENT_TYPES
from schemas.jobs import NodeRef, NodeUsage
from schemas.plans import MigrateNode, Node, NodeGroupResource

envs = st.from_regex(r"\A[a-z][a-z0-9-]{0,30}\Z")
text = st.text(max_size=30)
ident = st.text(alphabet=string.ascii_letters + string.digits + "-_.", min_size=1, max_size=40)
when = st.datetimes(
    min_value=datetime(2000, 1, 1),
    max_value=datetime(2100, 1, 1),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=8)), timezone(timedelta(hours=-5))]),
)
floats = st.floats(min_value=0, max_value=1e12, allow_nan=False, allow_infinity=False)
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
    cpu=floats,
    memory=counts,
    gpu_util=st.none() | st.floats(0, 1),
    gpu_memory=st.none() | counts,
    step_time=st.none() | floats,
)
resource = st.builds(NodeResource, cpu=floats, memory=counts, gpu_num=st.integers(0, 16))

samples = st.builds(
    RuntimeSample,
    job=job_meta,
    global_step=counts,
    speed=floats,
    samples_per_s=floats,
    batch_size=st.none() | st.integers(1, 1 << 20),
    nodes=st.lists(node_usage, max_size=4),
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
scalars = st.one_of(st.text(max_size=10), st.integers(-1000, 1000), st.booleans())
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
any_event = st.one_of(samples, ooms, scale_plans, changes, letters)


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
