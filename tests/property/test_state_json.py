"""A checkpoint writes job states with `state_json`: the same JSON value as pydantic's
`model_dump_json`, and it reads back as the same state."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from schemas.bounds import MAX_BYTES, MAX_CPU, MAX_RATE
from schemas.jobs import JobMeta
from streams.brain.core.folds import fold
from streams.brain.core.sample_structs import JobRef, NodeUse
from streams.brain.core.samples import Sample, SampleRead
from streams.brain.core.state import JobState
from streams.brain.core.state_json import state_json

#: values within the contract's bounds (`schemas.bounds`), which a state read back checks
floats = st.floats(min_value=0, max_value=MAX_RATE, allow_nan=False, allow_infinity=False)
cores = st.floats(min_value=0, max_value=MAX_CPU, allow_nan=False, allow_infinity=False)
zones = st.sampled_from(
    [UTC, timezone(timedelta(hours=8)), timezone(timedelta(hours=-5, minutes=-30))]
)
uses = st.builds(
    NodeUse,
    type=st.sampled_from(["worker", "ps", "chief"]),
    id=st.integers(min_value=0, max_value=64),
    cpu=cores,
    memory=st.integers(min_value=0, max_value=MAX_BYTES),
    gpu_util=st.one_of(st.none(), st.floats(min_value=0, max_value=1)),
    gpu_memory=st.one_of(st.none(), st.integers(min_value=0, max_value=MAX_BYTES)),
    step_time=st.one_of(st.none(), floats),
)
samples = st.builds(
    Sample,
    event_id=st.uuids().map(str),
    at=st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=zones),
    global_step=st.integers(min_value=0, max_value=10**12),
    speed=floats,
    samples_per_s=floats,
    batch_size=st.one_of(st.none(), st.integers(1, 4096)),
    local_batch_size=st.one_of(st.none(), st.integers(1, 512)),
    accumulation_steps=st.integers(1, 16),
    nodes=st.lists(uses, max_size=4).map(tuple),
)


@given(
    st.lists(samples, max_size=8),
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8),
)
def test_state_json_is_pydantics_json_and_reads_back(items: list[Sample], scenario: str) -> None:
    state = JobState(env="prod", job=JobMeta(uuid="job-1", scenario=scenario))
    for sample in items:
        read = SampleRead(
            env="prod", job=JobRef(uuid="job-1"), occurred_at=sample.at, sample=sample
        )
        folded = fold(state, read)
        assert folded is not None
        state = folded
    written = state_json(state)
    assert json.loads(written) == json.loads(state.model_dump_json())
    assert JobState.model_validate_json(written) == state


def test_a_state_without_samples() -> None:
    state = JobState(env="prod", job=JobMeta(uuid="job-1"))
    assert json.loads(state_json(state)) == json.loads(state.model_dump_json())


_BAD_SAMPLE_VALUES = {
    "speed": ["NaN", "Infinity", "-1", "-0.5", "1e400", "true"],
    "samples_per_s": ["NaN", "-1", "-Infinity"],
    "global_step": ["NaN", "-1", "1.5", "9223372036854775808", "true"],
}


@given(
    st.sampled_from(sorted(_BAD_SAMPLE_VALUES)).flatmap(
        lambda name: st.tuples(st.just(name), st.sampled_from(_BAD_SAMPLE_VALUES[name]))
    )
)
def test_a_state_with_a_sample_the_contract_refuses_does_not_read_back(
    bad: tuple[str, str],
) -> None:
    """What the fast sample read refuses (NaN, negative or infinite speeds and steps), a
    state's samples refuse too: a state file or checkpoint cannot bring them in."""
    name, raw = bad
    state = JobState(env="prod", job=JobMeta(uuid="job-1"))
    read = SampleRead(
        env="prod",
        job=JobRef(uuid="job-1"),
        occurred_at=datetime(2026, 1, 1, tzinfo=UTC),
        sample=Sample(event_id="s-1", at=datetime(2026, 1, 1, tzinfo=UTC), global_step=1),
    )
    folded = fold(state, read)
    assert folded is not None
    doc = json.loads(state_json(folded))
    doc["samples"][0][name] = "__BAD__"
    text = json.dumps(doc).replace('"__BAD__"', raw)
    try:
        JobState.model_validate_json(text)
    except ValidationError as err:
        assert "samples" in str(err)
    else:
        raise AssertionError(f"a sample with {name} {raw} was read back")
