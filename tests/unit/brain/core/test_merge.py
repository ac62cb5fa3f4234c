"""The brain's input merge: the release order is a function of the records, not of how
they were fetched."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from streams.brain.core.merge import TP, Fetch, Merge, event_time


@dataclass(frozen=True)
class Rec:
    topic: str
    partition: int
    offset: int
    at: float


def _merge(max_idle_s: float = 1e9, max_buffered: int = 10**9) -> Merge[Rec]:
    return Merge(lambda r: r.at, max_idle_s=max_idle_s, max_buffered=max_buffered)


def greedy(logs: dict[TP, list[Rec]]) -> list[Rec]:
    """The reference: every partition read whole, the smallest head first."""
    pos = dict.fromkeys(logs, 0)
    out = []
    while True:
        heads = [
            (logs[tp][i].at, tp[0], tp[1], logs[tp][i].offset)
            for tp, i in pos.items()
            if i < len(logs[tp])
        ]
        if not heads:
            return out
        _, topic, part, _ = min(heads)
        out.append(logs[(topic, part)][pos[(topic, part)]])
        pos[(topic, part)] += 1


TPS = [("m", 0), ("m", 1), ("e", 0), ("r", 0)]

logs_strategy = st.fixed_dictionaries(
    {tp: st.lists(st.integers(0, 20), max_size=12) for tp in TPS}
).map(
    lambda times: {
        tp: [Rec(tp[0], tp[1], i, float(t)) for i, t in enumerate(ts)] for tp, ts in times.items()
    }
)


@settings(max_examples=300, deadline=None)
@given(logs=logs_strategy, data=st.data())
def test_any_fetch_batching_gives_the_greedy_order(
    logs: dict[TP, list[Rec]], data: st.DataObject
) -> None:
    merge = _merge()
    merge.assign(logs)
    handed = dict.fromkeys(logs, 0)
    # the high watermark is known only once a partition was fetched
    known: set[TP] = set()
    out: list[Rec] = []

    def fetch() -> dict[TP, Fetch]:
        return {tp: Fetch(handed[tp], len(logs[tp]) if tp in known else None) for tp in logs}

    steps = data.draw(st.lists(st.tuples(st.sampled_from(TPS), st.integers(0, 12)), max_size=30))
    # then whatever is left, partition by partition
    steps += [(tp, len(logs[tp])) for tp in TPS]
    for tp, n in steps:
        known.add(tp)
        n = min(n, len(logs[tp]) - handed[tp])
        merge.add(logs[tp][handed[tp] : handed[tp] + n])
        handed[tp] += n
        out.extend(merge.release(fetch(), now=0.0))
    assert out == greedy(logs)
    assert merge.buffered == 0 and merge.forced == 0


@settings(max_examples=200, deadline=None)
@given(logs=logs_strategy, data=st.data())
def test_a_restart_from_any_released_prefix_continues_the_same_order(
    logs: dict[TP, list[Rec]], data: st.DataObject
) -> None:
    """A checkpoint covers a prefix of the released order; resuming each partition after
    what it covers gives the rest of the order."""
    whole = greedy(logs)
    cut = data.draw(st.integers(0, len(whole)))
    done: dict[TP, int] = {}
    for r in whole[:cut]:
        done[(r.topic, r.partition)] = r.offset + 1
    rest = {tp: recs[done.get(tp, 0) :] for tp, recs in logs.items()}
    merge = _merge()
    merge.assign(logs)
    for recs in rest.values():
        merge.add(recs)
    ends = {tp: Fetch(len(recs), len(recs)) for tp, recs in logs.items()}
    assert whole[:cut] + merge.release(ends, now=0.0) == whole


def test_nothing_leaves_while_a_lagging_partition_has_nothing_buffered() -> None:
    merge = _merge()
    merge.assign([("m", 0), ("e", 0)])
    merge.add([Rec("m", 0, 0, 5.0)])
    # e/0 has records in the log (highwater 1) that were not fetched yet
    assert merge.release({("m", 0): Fetch(1, 1), ("e", 0): Fetch(0, 1)}, now=0.0) == []
    # unknown highwater: the same
    assert merge.release({("m", 0): Fetch(1, 1)}, now=0.0) == []
    merge.add([Rec("e", 0, 0, 1.0)])
    got = merge.release({("m", 0): Fetch(1, 1), ("e", 0): Fetch(1, 1)}, now=0.0)
    assert [(r.topic, r.at) for r in got] == [("e", 1.0), ("m", 5.0)]


def test_a_stalled_partition_holds_the_others_only_for_max_idle() -> None:
    merge = _merge(max_idle_s=2.0)
    merge.assign([("m", 0), ("e", 0)])
    merge.add([Rec("m", 0, 0, 5.0)])
    lagging = {("m", 0): Fetch(1, 1), ("e", 0): Fetch(0, 3)}
    assert merge.release(lagging, now=10.0) == []
    assert merge.release(lagging, now=11.9) == []
    assert [r.offset for r in merge.release(lagging, now=12.0)] == [0]
    assert merge.stalled == {("e", 0)}
    # it delivers: waiting starts anew once it has nothing buffered again
    merge.add([Rec("e", 0, 0, 1.0)])
    assert len(merge.release({("m", 0): Fetch(1, 1), ("e", 0): Fetch(1, 3)}, now=13.0)) == 1
    merge.add([Rec("m", 0, 1, 6.0)])
    assert merge.release({("m", 0): Fetch(2, 2), ("e", 0): Fetch(1, 3)}, now=13.5) == []


def test_an_overfull_buffer_releases_past_a_lagging_partition() -> None:
    merge = _merge(max_buffered=3)
    merge.assign([("m", 0), ("e", 0)])
    merge.add([Rec("m", 0, i, float(i)) for i in range(5)])
    got = merge.release({("m", 0): Fetch(5, 5), ("e", 0): Fetch(0, 9)}, now=0.0)
    assert [r.offset for r in got] == [0, 1]
    assert merge.buffered == 3 and merge.forced == 2


def test_a_release_says_when_its_oldest_record_was_fetched() -> None:
    merge = _merge()
    merge.assign([("m", 0), ("e", 0)])
    merge.add([Rec("m", 0, 0, 5.0)], now=100.0)
    assert merge.release({("m", 0): Fetch(1, 1)}, now=101.0) == []
    assert merge.released_since is None
    merge.add([Rec("e", 0, 0, 9.0)], now=102.0)
    ends = {("m", 0): Fetch(1, 1), ("e", 0): Fetch(1, 1)}
    assert len(merge.release(ends, now=103.0)) == 2
    assert merge.released_since == 100.0


def test_revoked_partitions_are_dropped_unreleased() -> None:
    merge = _merge()
    merge.assign([("m", 0), ("m", 1)])
    merge.add([Rec("m", 0, 0, 1.0), Rec("m", 1, 0, 2.0), Rec("x", 0, 0, 0.0)])
    assert merge.buffered == 2  # not assigned: ignored
    assert merge.assign([("m", 1)]) == 1
    assert merge.release({("m", 1): Fetch(1, 1)}, now=0.0) == [Rec("m", 1, 0, 2.0)]


def test_event_time_reads_the_envelope_without_decoding() -> None:
    assert event_time(b'{"type":"x","occurred_at":"2026-03-01T00:00:15Z"}') == 1772323215.0
    assert event_time(b'{"occurred_at" : "2026-03-01T01:00:15+01:00"}') == 1772323215.0
    unterminated = b'{"occurred_at":"2026-03-01T00:00:15Z'
    too_long = b'{"occurred_at":"' + b"9" * 100 + b'"}'
    bad_ones = (b'{"occurred_at":"yesterday"}', b'{"occurred_at":"2026-03-01"}')
    for bad in (None, b"", b"{}", unterminated, too_long, *bad_ones):
        assert event_time(bad) == float("-inf")
