"""One job's memo: what the brain derives from the job's samples, made once per sample.

A job keeps its last 60 samples and the brain reads all of them at every decision (the
straggler detector, goodput's step-time observations) and checks each new sample against
them (a replayed sample is not folded twice). A sample never changes, so what is derived
from it can be kept while the job keeps the sample.

The memo belongs to one job of one processor (`BrainProcessor` holds it in the job's
entry) and goes with the job: nothing is shared between jobs, processors or brains of one
process. Entries are keyed by the sample's event id, its name in the job's sequence of
samples (folds keep at most one sample per id), and hold the sample they were made of,
so a value is only ever given back for an equal sample. The pure functions that use a
memo take it as an argument; without one they compute the same values afresh.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar, cast

from streams.brain.samples import Sample

A = TypeVar("A", bound=Hashable)
#: Values one table holds at most: a job keeps 60 samples, and folds drop what they
#: drop; only samples of steps the processor did not keep (a failed step) are left over.
TABLE_LIMIT = 256
V = TypeVar("V")


class SampleMemo:
    """The event ids of the job's samples (for the fold's duplicate check) and values
    derived from single samples, each table named by what it derives and its arguments.

    The fold keeps it in step with the samples it folds: `ids_of` gives the ids of a
    sample list and `keep` records them for the list the fold made, so each fold touches
    only the samples that come and go. A list that is not the one last recorded (the
    processor kept an older state after a failed step) is counted afresh, never trusted.
    """

    __slots__ = ("_ids", "_length", "_newest", "_tables")

    def __init__(self) -> None:
        #: length and newest event id of the sample list `_ids` belongs to: folds only
        #: append (a new id) and drop from the front, so no other list of the job has both
        self._length = 0
        self._newest = ""
        self._ids: set[str] = set()
        self._tables: dict[Hashable, dict[str, tuple[Sample, Any]]] = {}

    # -- the fold's duplicate check -----------------------------------------------------

    def ids_of(self, samples: Sequence[Sample]) -> set[str]:
        """The event ids of `samples`, the job's samples now; the caller may change the
        set it gets and must `keep` it (or lose it)."""
        if samples and len(samples) == self._length and samples[-1].event_id == self._newest:
            ids, self._ids, self._length = self._ids, set(), 0
            return ids
        return {s.event_id for s in samples}

    def keep(self, samples: Sequence[Sample], ids: set[str], dropped: Sequence[Sample]) -> None:
        """Record `ids` as those of `samples`, the job's samples after a fold that
        dropped `dropped` (whose derived values go with them)."""
        self._ids = ids
        self._length = len(samples)
        self._newest = samples[-1].event_id if samples else ""
        if dropped and self._tables:
            for table in self._tables.values():
                for sample in dropped:
                    table.pop(sample.event_id, None)

    # -- values derived from one sample -------------------------------------------------

    def derived(self, name: str, args: A, sample: Sample, derive: Callable[[Sample, A], V]) -> V:
        """`derive(sample, args)`, made once per sample while the job keeps it. `name`
        with `args` must say everything `derive` depends on besides the sample."""
        key = (name, args)
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = {}
        hit = table.get(sample.event_id)
        if hit is not None and (hit[0] is sample or hit[0] == sample):
            return cast(V, hit[1])
        value = derive(sample, args)
        if len(table) >= TABLE_LIMIT:  # samples of steps the processor did not keep
            table.clear()
        table[sample.event_id] = (sample, value)
        return value

    def derived_all(
        self, name: str, args: A, samples: Sequence[Sample], derive: Callable[[Sample, A], V]
    ) -> list[V]:
        """`derived` of each of `samples`, in order (one lookup of the table for all)."""
        key = (name, args)
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = {}
        found: list[V] = []
        get, append = table.get, found.append
        for sample in samples:
            hit = get(sample.event_id)
            if hit is not None and (hit[0] is sample or hit[0] == sample):
                append(hit[1])
                continue
            value = derive(sample, args)
            if len(table) >= TABLE_LIMIT:
                table.clear()
            table[sample.event_id] = (sample, value)
            append(value)
        return found

    def __len__(self) -> int:
        """Derived values held (for tests and bounds: at most the job's samples per table)."""
        return sum(len(table) for table in self._tables.values())


def derived(
    memo: SampleMemo | None, name: str, args: A, sample: Sample, derive: Callable[[Sample, A], V]
) -> V:
    """`derive(sample, args)` through `memo` when there is one."""
    if memo is None:
        return derive(sample, args)
    return memo.derived(name, args, sample, derive)


def derived_all(
    memo: SampleMemo | None,
    name: str,
    args: A,
    samples: Sequence[Sample],
    derive: Callable[[Sample, A], V],
) -> list[V]:
    """`derive(sample, args)` of each of `samples`, through `memo` when there is one."""
    if memo is None:
        return [derive(sample, args) for sample in samples]
    return memo.derived_all(name, args, samples, derive)
