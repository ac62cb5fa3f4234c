"""The brain reads runtime samples two ways (`streams.brain.core.inputs`): on the same
records both give the same job states, plans, dead letters and counters."""

from __future__ import annotations

import os
from dataclasses import dataclass

import orjson
import pytest

from schemas import encode
from schemas.envelope import Event
from schemas.plans import OptimizePlan, ScalePlan
from streams.brain.bench.run import Workload
from streams.brain.core.inputs import SampleDecode
from streams.brain.core.processor import BrainProcessor
from streams.brain.core.samples import read_sample
from tests.conftest import SAMPLE_DECODE_VAR
from tests.unit.brain.builders import ENV, T0, Rec


def _odd_but_valid(event: Event) -> bytes:
    """A sample the fast read leaves to pydantic, valid all the same: an upper-case id
    and a timestamp without seconds."""
    doc = orjson.loads(encode(event))
    doc["event_id"] = doc["event_id"].upper()
    doc["occurred_at"] = doc["occurred_at"][:16] + "Z"
    return orjson.dumps(doc)


def _invalid(event: Event) -> bytes:
    doc = orjson.loads(encode(event))
    doc["nodes"][0]["memory"] = 2**62  # past the contract's bound (2**48)
    return orjson.dumps(doc)


def _records() -> list[Rec]:
    workload = Workload(ENV, jobs=6, start=T0)
    events = workload.lifecycle() + workload.round_robin(900, oom_every=25)
    values = []
    for n, event in enumerate(events):
        value = encode(event)
        if event.type == "job.runtime_sample" and n % 40 == 7:
            value = _odd_but_valid(event)
        elif event.type == "job.runtime_sample" and n % 97 == 11:
            value = _invalid(event)
        values.append((event, value))
    partitions = {f"bench-job-{j}": j % 3 for j in range(6)}
    offsets = [0, 0, 0]
    out = []
    for event, value in values:
        assert event.key is not None
        partition = partitions[event.key]
        topic = f"{ENV}.job.metrics" if event.type == "job.runtime_sample" else f"{ENV}.job.events"
        out.append(Rec(topic, partition, offsets[partition], event.key.encode(), value))
        offsets[partition] += 1
    return out


@dataclass
class _Run:
    plans: list[bytes]
    letters: list[tuple[str, str, int]]
    states: dict[str, bytes]
    counters: dict[str, int]


def _run(way: SampleDecode, records: list[Rec]) -> _Run:
    processor = BrainProcessor(ENV, f"{ENV}.brain", sample_decode=way)
    plans: list[OptimizePlan | ScalePlan] = []
    letters = []
    for start in range(0, len(records), 128):
        out = processor.process(records[start : start + 128])
        plans += out.plans
        letters += [(str(d.error_kind), d.error, d.offset) for d in out.letters]
    return _Run(
        plans=[encode(plan) for plan in plans],
        letters=letters,
        states={uuid: state.model_dump_json().encode() for uuid, state in processor.states.items()},
        counters=dict(vars(processor.counters)),
    )


def test_both_ways_give_the_same_states_plans_and_dead_letters() -> None:
    records = _records()
    fast, slow = _run("fast", records), _run("pydantic", records)
    assert fast.plans == slow.plans
    assert fast.letters == slow.letters
    assert fast.states == slow.states
    assert fast.counters == slow.counters
    # the comparison has something in it: plans, dead letters, samples read either way
    assert len(fast.plans) > 20 and fast.counters["scale_plans"] > 5
    assert len(fast.letters) >= 5
    taken = sum(read_sample(r.value) is not None for r in records)
    samples = sum(r.topic.endswith("job.metrics") for r in records)
    assert 0 < samples - taken < samples // 10  # most read the fast way, some left to pydantic


def test_processors_read_the_way_the_run_asks(pytestconfig: pytest.Config) -> None:
    """`pytest --sample-decode pydantic` (or the brain's own setting in the environment)
    runs the suite's brains the pydantic way."""
    asked = pytestconfig.getoption("--sample-decode") or os.environ.get(SAMPLE_DECODE_VAR)
    assert BrainProcessor(ENV, f"{ENV}.brain").sample_decode == (asked or "fast")
