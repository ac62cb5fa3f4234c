"""The brain's fast read of runtime samples never accepts what pydantic refuses, and what
it accepts reads exactly as pydantic reads it."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from schemas.bounds import (
    MAX_BYTES,
    MAX_CPU,
    MAX_GRAD_STAT,
    MAX_LABEL_CHARS,
    MAX_LABELS,
    MAX_NODE_ID,
    MAX_NODES,
    MAX_RATE,
)
from schemas.codec import CodecError, decode
from schemas.events import AnyEvent
from schemas.jobs import JobMeta, NodeUsage, RuntimeSample
from streams.brain.core.inputs import SAMPLE_DECODES, InputReader, SampleDecode, input_reader
from streams.brain.core.samples import SampleRead, job_meta, read_sample, sample_of
from streams.brain.core.state import JobState

_EVENT: TypeAdapter[Any] = TypeAdapter(AnyEvent)

numbers: st.SearchStrategy[Any] = st.one_of(
    st.integers(min_value=-5, max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, 1, -1, 0.5, 1.0, -0.0, 1e308, 2**63, 2**64]),
    # at and past the contract's bounds
    st.sampled_from([MAX_BYTES, MAX_BYTES + 1, MAX_CPU, MAX_CPU * 2, MAX_RATE, MAX_RATE * 2]),
    st.sampled_from([2**63 - 1, 10**30, MAX_NODE_ID, MAX_NODE_ID + 1]),
    # json.dumps writes these as NaN, Infinity and -Infinity, which no JSON allows
    st.sampled_from([float("nan"), float("inf"), float("-inf")]),
)
odd: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=8),
    st.sampled_from(["1", "1.5", "", "nan", [], {}]),
    numbers,
)
timestamps = st.one_of(
    st.datetimes(
        min_value=datetime(1, 1, 2),
        max_value=datetime(9999, 12, 30),
        timezones=st.sampled_from(
            [UTC, timezone(timedelta(hours=8)), timezone(timedelta(hours=-5, minutes=-30))]
        ),
    ).map(lambda d: d.isoformat()),
    st.sampled_from(
        [
            "2026-01-01T00:00:00Z",
            "2026-01-01t00:00:00z",
            "2026-01-01 00:00:00Z",
            "2026-01-01T00:00:00.1234567Z",
            "2026-01-01T00:00:00.9999996Z",
            "2026-01-01T00:00:60Z",
            "2026-01-01T00:00Z",
            "2026-01-01T00:00:00+0100",
            "2026-01-01T00:00:00-00:00",
            "2026-01-01T00:00:00+23:59",
            "2026-01-01T00:00:00+24:00",
            "2026-01-01T00:00:00+01:75",
            "2026-02-30T00:00:00Z",
            "2026-01-01T00:00:00",
            "2026-01-01T00:00:00Z\n",
            "1700000000",
        ]
    ),
    st.integers(min_value=0, max_value=2**40),
)
event_ids = st.one_of(
    st.uuids().map(str),
    st.uuids().map(lambda u: str(u).upper()),
    st.uuids().map(lambda u: u.hex),
    st.uuids().map(lambda u: "{" + str(u) + "}"),
    st.uuids().map(lambda u: str(u) + "\n"),
    st.text(max_size=40),
)
envs = st.one_of(
    st.from_regex(r"\A[a-z][a-z0-9-]{0,30}\Z"),
    st.sampled_from(["prod\n", "Prod", "a" * 32, "-x", ""]),
    st.text(max_size=33),
)


#: values within the contract's bounds (`schemas.bounds`)
valid_numbers = st.floats(min_value=0, max_value=MAX_RATE, allow_nan=False, allow_infinity=False)
valid_cores = st.floats(min_value=0, max_value=MAX_CPU, allow_nan=False, allow_infinity=False)


@st.composite
def nodes(draw: st.DrawFn) -> dict[str, Any]:
    node: dict[str, Any] = {
        "type": draw(st.sampled_from(["worker", "ps", "chief"])),
        "id": draw(st.integers(min_value=0, max_value=64)),
    }
    fields: dict[str, st.SearchStrategy[Any]] = {
        "cpu": valid_cores,
        "memory": st.integers(min_value=0, max_value=MAX_BYTES),
        "gpu_util": st.floats(min_value=0, max_value=1),
        "gpu_memory": st.integers(min_value=0, max_value=MAX_BYTES),
        "step_time": valid_numbers,
    }
    for name, values in fields.items():
        if draw(st.booleans()):
            node[name] = draw(st.one_of(values, st.none()))
    return node


@st.composite
def valid_reports(draw: st.DrawFn) -> dict[str, Any]:
    job: dict[str, Any] = {"uuid": draw(st.sampled_from(["job-1", "j", "x" * 256]))}
    if draw(st.booleans()):
        job["scenario"] = draw(st.text(max_size=5))
    if draw(st.booleans()):
        job["labels"] = draw(st.dictionaries(st.text(max_size=3), st.text(max_size=3)))
    doc: dict[str, Any] = {
        "event_id": str(draw(st.uuids())),
        "type": "job.runtime_sample",
        "env": draw(st.from_regex(r"\A[a-z][a-z0-9-]{0,30}\Z")),
        "occurred_at": draw(timestamps.filter(lambda t: isinstance(t, str) and "+" in t)),
        "job": job,
        "global_step": draw(st.integers(min_value=0, max_value=10**9)),
    }
    optional: dict[str, st.SearchStrategy[Any]] = {
        "schema_version": st.just(1),
        "source": st.text(max_size=5),
        "key": st.sampled_from([job["uuid"], None]),
        "speed": valid_numbers,
        "samples_per_s": valid_numbers,
        "batch_size": st.one_of(st.integers(1, 4096), st.none()),
        "local_batch_size": st.one_of(st.integers(1, 512), st.none()),
        "accumulation_steps": st.integers(1, 16),
        "nodes": st.lists(nodes(), max_size=4),
        "num_nodes": st.one_of(st.integers(1, MAX_NODES), st.none()),
        "compute_s": st.one_of(valid_numbers, st.none()),
        "allreduce_s": st.one_of(valid_numbers, st.none()),
    }
    for name, values in optional.items():
        if draw(st.booleans()):
            doc[name] = draw(values)
    if draw(st.booleans()):  # the gradient statistics come together
        stat = st.floats(min_value=0, max_value=MAX_GRAD_STAT, allow_nan=False)
        doc["grad_sqr"], doc["grad_var"] = draw(stat), draw(stat)
    return doc


#: per field, values around and beyond what the contract allows
MUTATIONS: dict[str, st.SearchStrategy[Any]] = {
    "event_id": event_ids,
    "type": st.sampled_from(["job.started", "x", "", None]),
    "schema_version": st.sampled_from([2, 0, "1", 1.0, True, None]),
    "env": envs,
    "occurred_at": timestamps,
    "source": st.sampled_from(["s" * 256, "s" * 257, None, 1]),
    "key": st.sampled_from(["other", "k" * 513, "", 1]),
    "global_step": st.one_of(st.integers(min_value=-1, max_value=2**70), odd),
    "speed": odd,
    "samples_per_s": odd,
    "batch_size": st.one_of(st.integers(-1, 1), odd),
    "local_batch_size": st.one_of(st.integers(-1, 1), odd),
    "accumulation_steps": st.one_of(st.integers(-1, 1), odd),
    "nodes": st.one_of(odd, st.lists(odd, max_size=2)),
    "num_nodes": st.one_of(st.integers(-1, 1), st.just(MAX_NODES + 1), odd),
    "grad_sqr": st.one_of(st.just(MAX_GRAD_STAT * 10), odd),
    "grad_var": st.one_of(st.just(-1.0), odd),
    "compute_s": odd,
    "allreduce_s": odd,
    "job": st.sampled_from(
        [
            {"uuid": ""},
            {"uuid": "x" * 257},
            {"uuid": "j", "labels": 1},
            {},
            {"uuid": "j\x00"},
            {"uuid": "j", "user": "\x00"},
            {"uuid": "j", "labels": {"a\x00": "b"}},
            {"uuid": "j", "labels": {"a": "x" * (MAX_LABEL_CHARS + 1)}},
            {"uuid": "j", "labels": {str(i): "" for i in range(MAX_LABELS + 1)}},
        ]
    ),
}
NODE_MUTATIONS: dict[str, st.SearchStrategy[Any]] = {
    "type": st.sampled_from(["", None, 1, "worker\x00"]),
    "id": st.one_of(st.integers(min_value=-2, max_value=2**70), odd),
    "cpu": odd,
    "memory": odd,
    "gpu_util": st.one_of(st.floats(min_value=-1, max_value=2), odd),
    "gpu_memory": odd,
    "step_time": odd,
    "extra": st.just(1),
}


@st.composite
def reports(draw: st.DrawFn) -> dict[str, Any]:
    """Valid runtime samples, and ones with one thing wrong or odd."""
    doc = draw(valid_reports())
    match draw(st.sampled_from(["none", "field", "node", "missing", "extra"])):
        case "field":
            name = draw(st.sampled_from(sorted(MUTATIONS)))
            doc[name] = draw(MUTATIONS[name])
        case "node":
            node = draw(nodes())
            name = draw(st.sampled_from(sorted(NODE_MUTATIONS)))
            node[name] = draw(NODE_MUTATIONS[name])
            doc["nodes"] = [*doc.get("nodes", []), node]
        case "missing":
            del doc[draw(st.sampled_from(sorted(doc)))]
        case "extra":
            doc["unexpected"] = True
    return doc


def _pydantic(raw: bytes) -> Any:
    """The event as the contract's decoder reads it (strict, bounded), None if refused."""
    try:
        return decode(raw)
    except CodecError:
        return None


@settings(max_examples=1000, suppress_health_check=[HealthCheck.too_slow])
@given(reports())
def test_what_the_fast_read_accepts_pydantic_accepts_alike(doc: dict[str, Any]) -> None:
    _check(json.dumps(doc).encode())


@settings(max_examples=200)
@given(st.binary(max_size=64))
@example(b'{"type": "job.runtime_sample"}')
@example(b"")
def test_any_bytes_are_read_or_left_to_pydantic(raw: bytes) -> None:
    fast = read_sample(raw)
    assert fast is None or _pydantic(raw) is not None


def test_the_samples_producers_send_take_the_fast_read() -> None:
    event = RuntimeSample(
        env="prod",
        job=JobMeta(uuid="job-1", scenario="s"),
        global_step=10,
        speed=1.5,
        local_batch_size=32,
        nodes=[NodeUsage(type="worker", id=0, cpu=2, memory=3, step_time=0.5)],
    )
    fast = read_sample(event.model_dump_json().encode())
    assert fast is not None
    assert fast.sample == sample_of(event)
    assert job_meta(fast.job) == event.job


def test_a_state_with_samples_reads_back_from_its_json() -> None:
    event = RuntimeSample(
        env="prod",
        job=JobMeta(uuid="job-1"),
        event_id=uuid.UUID(int=1),
        global_step=1,
        nodes=[NodeUsage(type="worker", id=0, gpu_util=0.5)],
    )
    state = JobState(env="prod", job=event.job, samples=[sample_of(event)])
    assert JobState.model_validate_json(state.model_dump_json()) == state
    assert JobState.model_validate(state.model_dump()) == state
    bad = orjson.loads(state.model_dump_json())
    bad["samples"][0]["nodes"][0]["id"] = -1
    try:
        JobState.model_validate(bad)
    except ValidationError as exc:
        assert "samples.0" in str(exc) and "invalid sample" in str(exc)
    else:
        raise AssertionError("a sample with a negative node id was accepted")


def _check(raw: bytes) -> None:
    fast = read_sample(raw)
    if fast is None:
        return
    event = _pydantic(raw)
    assert isinstance(event, RuntimeSample), f"fast read accepted what pydantic refuses: {raw!r}"
    assert fast.env == event.env
    assert job_meta(fast.job) == event.job
    assert fast.occurred_at == event.occurred_at
    assert fast.occurred_at.utcoffset() == event.occurred_at.utcoffset()
    assert fast.sample == sample_of(event)
    assert fast.event_id == str(event.event_id)


_BASE: dict[str, Any] = {
    "event_id": "0b6f2f7e-3c1a-4b8e-9d2c-5f4e3a2b1c0d",
    "type": "job.runtime_sample",
    "env": "prod",
    "occurred_at": "2026-01-01T00:00:00.5+00:00",
    "key": "job-1",
    "job": {"uuid": "job-1", "labels": {"a": "b"}},
    "global_step": 3,
    "speed": 1.5,
    "nodes": [{"type": "worker", "id": 0, "cpu": 1, "gpu_util": 0.5, "step_time": 0.2}],
}
_ODD_VALUES: list[Any] = [None, True, "1", 1.0, -1, 0, 1.5, 2**64, 2**70, [], {}, ""]
_NON_FINITE: list[Any] = [float("nan"), float("inf"), float("-inf")]
#: past the contract's bounds: the poison pills of issue 15
_PILLS: list[tuple[str, Any]] = [
    *((name, v) for name in ("speed", "samples_per_s") for v in _NON_FINITE),
    *(("global_step", v) for v in [-1, 2**63, float("nan"), True]),
    ("speed", -0.5),
    ("speed", MAX_RATE * 10),
    ("nodes", [{"type": "worker", "id": i} for i in range(MAX_NODES + 1)]),
    ("source", "s\x00"),
    ("job", {"uuid": "job-1\x00"}),
    ("job", {"uuid": "job-1", "name": "\x00"}),
    ("job", {"uuid": "job-1", "labels": {"a": "b\x00"}}),
    *((f"node.{name}", v) for name in ("memory", "gpu_memory") for v in [10**30, MAX_BYTES + 1]),
    *(("node.cpu", v) for v in [*_NON_FINITE, MAX_CPU + 1, 1e300]),
    *(("node.step_time", v) for v in _NON_FINITE),
    ("node.id", MAX_NODE_ID + 1),
    ("node.type", "worker\x00"),
]
_CASES: list[tuple[str, Any]] = [
    *(("event_id", v) for v in [_BASE["event_id"].upper(), _BASE["event_id"].replace("-", "")]),
    *(("event_id", v) for v in ["{" + _BASE["event_id"] + "}", _BASE["event_id"] + "\n", "x"]),
    *(("schema_version", v) for v in [2, 0, "1", 1.0, True]),
    *(("env", v) for v in ["prod\n", "Prod", "a" * 31, "a" * 32, "-x", ""]),
    *(("occurred_at", v) for v in [1700000000, "2026-01-01T00:00:00.1234567Z", "2026-01-01"]),
    *(("occurred_at", v) for v in ["2026-01-01T00:00:00", "2026-01-01 00:00:00Z", "x"]),
    *(("key", v) for v in ["other", None, "k" * 513]),
    *(("source", v) for v in ["s" * 256, "s" * 257]),
    *(("job", v) for v in [{"uuid": ""}, {"uuid": "x" * 257}, {"uuid": "job-1", "labels": 1}]),
    *((name, v) for name in ("global_step", "speed", "samples_per_s") for v in _ODD_VALUES),
    *((name, v) for name in ("batch_size", "local_batch_size") for v in _ODD_VALUES),
    *(("accumulation_steps", v) for v in _ODD_VALUES),
    ("unexpected", 1),
    *((f"node.{name}", v) for name in ("id", "cpu", "memory", "gpu_memory") for v in _ODD_VALUES),
    *((f"node.{name}", v) for name in ("gpu_util", "step_time", "type") for v in _ODD_VALUES),
    ("node.gpu_util", 1.0000001),
    ("node.extra", 1),
    *_PILLS,
]


def test_each_odd_field_is_read_as_pydantic_reads_it_or_left_to_it() -> None:
    refused = 0
    for name, value in _CASES:
        doc = orjson.loads(orjson.dumps(_BASE))
        if name.startswith("node."):
            doc["nodes"][0][name.removeprefix("node.")] = value
        else:
            doc[name] = value
        if name == "job":
            del doc["key"]  # else the key alone refuses another job
        raw = json.dumps(doc).encode()  # (orjson holds no integer beyond 64 bits)
        _check(raw)
        refused += read_sample(raw) is None
    assert read_sample(orjson.dumps(_BASE)) is not None
    assert refused > len(_CASES) // 2  # most of them are invalid


@pytest.fixture(params=SAMPLE_DECODES)
def read_input(request: pytest.FixtureRequest) -> InputReader:
    """The brain's read of an input record, each way it reads samples."""
    way: SampleDecode = request.param
    return input_reader(way)


def test_the_brain_refuses_each_poison_pill(read_input: InputReader) -> None:
    """What the contract refuses (issue 15), the brain does not accept, whichever way it
    reads samples: each goes to `decode` and its dead letter with the reason."""
    pills: list[bytes] = []
    for name, value in _PILLS:
        doc = orjson.loads(orjson.dumps(_BASE))
        if name.startswith("node."):
            doc["nodes"][0][name.removeprefix("node.")] = value
        else:
            doc[name] = value
        if name == "job":
            del doc["key"]
        pills.append(json.dumps(doc).encode())
    base = orjson.dumps(_BASE)
    pills += [base.replace(b'"speed":1.5', b'"speed":' + t) for t in (b"1e400", b"-1e400")]
    pills.append(base.replace(b'"global_step":3', b'"global_step":1e400'))
    for raw in pills:
        assert read_sample(raw) is None, raw[:200]
        try:
            read_input(raw)
        except CodecError as err:
            assert err.message
        else:
            raise AssertionError(f"the brain accepted {raw[:200]!r}")


@pytest.mark.parametrize("way", SAMPLE_DECODES)
@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(doc=reports())
def test_the_brains_decode_accepts_what_decode_accepts(
    way: SampleDecode, doc: dict[str, Any]
) -> None:
    """The brain's read (the fast read, then one strict pydantic pass; or pydantic's
    alone) accepts an event exactly when `decode` does: one rule for every consumer. A
    runtime sample comes out in the brain's form either way."""
    raw = json.dumps(doc).encode()
    expected = _pydantic(raw)
    try:
        got = input_reader(way)(raw)
    except CodecError:
        assert expected is None, raw
        return
    assert expected is not None, f"the brain accepted what decode refuses: {raw!r}"
    assert isinstance(got, SampleRead) == isinstance(expected, RuntimeSample)
    made = {"event_id", "occurred_at"} - set(doc)  # defaults made anew at each read
    if isinstance(got, SampleRead):
        want = sample_of(expected)
        if made:
            want = msgspec.structs.replace(want, event_id=got.event_id, at=got.sample.at)
        assert got.sample == want
        assert job_meta(got.job) == expected.job
    else:
        assert got.model_dump(exclude=made) == expected.model_dump(exclude=made)
