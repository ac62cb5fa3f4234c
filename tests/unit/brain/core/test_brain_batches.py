"""The brain decides the same whatever the batches its input comes in: the same plans,
byte for byte, the same dead letters with the same reasons, and the same states, from
fetches of 1, 7, 500 and 5,000 records and from batches of any sizes.

The input is read as the brain reads it (`streams.brain.runtime.app`): each fetch hands a
batch of records, partition after partition, to the merge of the input partitions
(`streams.brain.core.merge`), which releases what may be decided given where the fetch
stands, and the processor decides what it releases. Both are the pure core, so the
whole pipeline is run here without a broker over a workload of the bench's kind with
bad records, a job that ends and late reports of it among it.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import encode
from schemas.envelope import Event
from schemas.jobs import JobCompleted
from schemas.plans import OptimizeRequest
from streams.brain.bench.run import Workload
from streams.brain.bench.run import _key as event_key
from streams.brain.core.merge import Fetch, Merge, event_time
from streams.brain.core.processor import BrainProcessor
from tests.unit.brain.builders import ENV, T0, Rec

PARTITIONS = 2


def _workload(jobs: int, events: int, seed: int = 7) -> list[Event]:
    """Jobs that train and run out of memory (the bench's), one of which completes half
    way and reports on after its end, and requests for an optimizer that does not exist
    (dead letters of the router), in publication order."""
    load = Workload(ENV, jobs, seed=seed, start=T0)
    out: list[Event] = load.lifecycle()
    body = load.round_robin(events, oom_every=9)
    half = len(body) // 2
    done = load.meta(0)
    out += body[:half]
    out.append(JobCompleted(env=ENV, job=done, occurred_at=body[half].occurred_at))
    for j in range(1, jobs, 3):
        out.append(
            OptimizeRequest(
                env=ENV,
                job=load.meta(j),
                occurred_at=body[half].occurred_at + timedelta(seconds=1),
                stage="running",
                optimizer="no-such-optimizer",
            )
        )
    out += body[half:]
    return out


def _records(events: Sequence[Event]) -> dict[tuple[str, int], list[Rec]]:
    """The events in their topics' partitions (by key, as the producer places them), with
    a record that is no event, one of another env and an empty one among them."""
    logs: dict[tuple[str, int], list[Rec]] = {}

    def put(name: str, key: bytes, value: bytes | None) -> None:
        tp = (name, zlib.crc32(key) % PARTITIONS)
        log = logs.setdefault(tp, [])
        log.append(Rec(tp[0], tp[1], len(log), key, value))

    for n, event in enumerate(events):
        key = event_key(event)
        name = f"{ENV}.{event.topic}"
        put(name, key, encode(event))
        if n % 997 == 0:
            put(name, key, b"{not json")
            put(name, key, encode(event).replace(f'"env":"{ENV}"'.encode(), b'"env":"other"'))
        if n % 1999 == 0:
            put(name, key, None)
    return logs


def _fetches(
    logs: dict[tuple[str, int], list[Rec]], sizes: Iterator[int]
) -> Iterator[tuple[list[Rec], dict[tuple[str, int], Fetch]]]:
    """Batches as a consumer fetches them: up to the next size of records, partition
    after partition, starting each fetch at the next partition; with where it then stands
    on each (all of the logs are written: their ends are known)."""
    order = sorted(logs)
    position = dict.fromkeys(order, 0)
    start = 0
    while any(position[tp] < len(logs[tp]) for tp in order):
        left = next(sizes)
        batch: list[Rec] = []
        for i in range(len(order)):
            tp = order[(start + i) % len(order)]
            taken = logs[tp][position[tp] : position[tp] + left]
            batch += taken
            position[tp] += len(taken)
            left -= len(taken)
            if not left:
                break
        start += 1
        yield batch, {tp: Fetch(position[tp], len(logs[tp])) for tp in order}


def _decide(
    logs: dict[tuple[str, int], list[Rec]], sizes: Iterator[int]
) -> tuple[list[bytes], list[tuple[str, int, int, str, str]], dict[str, str]]:
    """Plans (encoded), dead letters (where from, and why) and the final job states of
    a processor fed by the merge, fetch after fetch."""
    processor = BrainProcessor(ENV, f"{ENV}.brain")
    merge: Merge[Rec] = Merge(lambda r: event_time(r.value))
    merge.assign(logs)
    plans: list[bytes] = []
    letters: list[tuple[str, int, int, str, str]] = []
    states: dict[str, str] = {}
    fetch: dict[tuple[str, int], Fetch] = {}
    fetched = _fetches(logs, sizes)
    while True:
        batch, fetch = next(fetched, ([], fetch))
        merge.add(batch)
        out = processor.process(merge.release(fetch, 0.0))
        plans += [encode(plan) for plan in out.plans]
        letters += [
            (d.original_topic, d.partition, d.offset, d.error_kind.value, d.error)
            for d in out.letters
        ]
        # a checkpoint between some batches: the snapshot changes nothing decided
        snap = processor.snapshot()
        states.update({u: state.model_dump_json() for u, (_, state) in snap.states.items()})
        if not batch and not merge.buffered:
            break
    return plans, letters, states


@pytest.fixture(scope="module")
def logs() -> dict[tuple[str, int], list[Rec]]:
    return _records(_workload(jobs=30, events=4_000))


@pytest.fixture(scope="module")
def one_by_one(
    logs: dict[tuple[str, int], list[Rec]],
) -> tuple[list[bytes], list[tuple[str, int, int, str, str]], dict[str, str]]:
    return _decide(logs, _always(1))


def _always(size: int) -> Iterator[int]:
    while True:
        yield size


def test_the_input_makes_plans_and_dead_letters(
    one_by_one: tuple[list[bytes], list[tuple[str, int, int, str, str]], dict[str, str]],
) -> None:
    plans, letters, states = one_by_one
    assert len(plans) > 100
    reasons = {kind for _, _, _, kind, _ in letters}
    assert {"malformed", "wrong_env", "handler"} <= reasons, reasons
    assert any("no-such-optimizer" in why for *_, why in letters)
    assert len(states) == 30


@pytest.mark.parametrize("size", [7, 500, 5000])
def test_fetches_of_any_size_decide_what_fetches_of_one_record_decide(
    logs: dict[tuple[str, int], list[Rec]],
    one_by_one: tuple[list[bytes], list[tuple[str, int, int, str, str]], dict[str, str]],
    size: int,
) -> None:
    plans, letters, states = _decide(logs, _always(size))
    want_plans, want_letters, want_states = one_by_one
    assert plans == want_plans
    assert letters == want_letters
    assert states == want_states


@settings(max_examples=15, deadline=None)
@given(
    jobs=st.integers(1, 12),
    seed=st.integers(0, 1000),
    sizes=st.lists(st.integers(1, 400), min_size=1, max_size=20),
)
def test_batches_of_changing_sizes_decide_the_same(jobs: int, seed: int, sizes: list[int]) -> None:
    logs = _records(_workload(jobs, events=40 * jobs, seed=seed))

    def cycle() -> Iterator[int]:
        while True:
            yield from sizes

    assert _decide(logs, cycle()) == _decide(logs, _always(10**9))
