"""One job's memo: what the brain derives from the job's samples, made once per sample.

A job keeps its last 60 samples and the brain reads all of them at every decision (the
straggler detector, goodput's step-time observations) and checks each new sample against
them (a replayed sample is not folded twice). A sample never changes, so what is derived
from it can be kept while the job keeps the sample.

The memo belongs to one job of one processor (`BrainProcessor` holds it in the job's
entry) and goes with the job: nothing is shared between jobs, processors or brains of one
process. The fold tells it which samples came and went, so it numbers the job's samples
in the order they were folded: a `DerivedSeries` of values derived from each sample follows the
job's samples by those numbers, and a decision derives only the samples folded since the
last one and drops what the fold dropped, without reading the others again (each read of
a sample or of a value kept for it is a cache miss among every other job's). Samples of a
list the folds did not make (a state the processor did not keep, tests) are looked up by
event id in tables that hold the sample each value was made of, so a value is only ever
given back for an equal sample. The pure functions that use a memo take it as an
argument; without one they compute the same values afresh.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any, Generic, TypeVar, cast

from streams.brain.core.samples import Sample

A = TypeVar("A", bound=Hashable)
#: Values one table holds at most: a job keeps 60 samples, and folds drop what they
#: drop; only samples of steps the processor did not keep (a failed step) are left over.
TABLE_LIMIT = 256
#: Series and tables one memo holds at most, the least recently made dropped first: an
#: optimizer's arguments (a role, what the job's state says of its batch) change rarely,
#: and a series of arguments no longer asked for is dead weight.
SERIES_LIMIT = 8
V = TypeVar("V")
K = TypeVar("K", bound=Hashable)


class DerivedSeries(Generic[V, K]):
    """The values derived from a run of a job's samples, in sample order (a sample that
    gives None gives nothing), and how many of them have each key.

    Made afresh by `extend` over every sample, or kept by the job's memo in step with its
    samples: `extend` with the samples folded since, `drop` those the fold dropped. Read
    `values` and `counts`, never change them: the memo hands the same series out again.
    """

    __slots__ = ("_key", "_marks", "counts", "values")

    def __init__(self, key: Callable[[V], K] | None = None) -> None:
        self.values: list[V] = []
        #: values by their key (none without a key function): how many scales, kinds...
        self.counts: dict[K, int] = {}
        self._key = key
        #: per sample covered, in order: 1 when it gave a value, else 0
        self._marks = bytearray()

    def __len__(self) -> int:
        """Samples covered (not values)."""
        return len(self._marks)

    def extend(self, derived: Iterable[V | None]) -> None:
        """Cover the next samples, given what was derived from each."""
        marks, values, counts, key = self._marks, self.values, self.counts, self._key
        for value in derived:
            if value is None:
                marks.append(0)
                continue
            marks.append(1)
            values.append(value)
            if key is not None:
                k = key(value)
                counts[k] = counts.get(k, 0) + 1

    def drop(self, samples: int) -> None:
        """No longer cover the first `samples` covered."""
        gone = self._marks.count(1, 0, samples)
        if gone and self._key is not None:
            counts, key = self.counts, self._key
            for value in self.values[:gone]:
                k = key(value)
                left = counts[k] - 1
                if left:
                    counts[k] = left
                else:
                    del counts[k]
        del self.values[:gone]
        del self._marks[:samples]


class _Followed(DerivedSeries[V, K]):
    """A series the memo keeps: `first` is the number of the first sample it covers,
    `epoch` the run of folds it belongs to."""

    __slots__ = ("epoch", "first")

    def __init__(self, key: Callable[[V], K] | None, first: int, epoch: int) -> None:
        super().__init__(key)
        self.first = first
        self.epoch = epoch


class SampleMemo:
    """The event ids of the job's samples (for the fold's duplicate check), the numbers
    of its samples, and values derived from single samples: series and tables, each
    named by what it derives and its arguments.

    The fold keeps it in step with the samples it folds: `ids_of` gives the ids of a
    sample list and `keep` records them for the list the fold made, so each fold touches
    only the samples that come and go. A list that is not the one last recorded (the
    processor kept an older state after a failed step) is counted afresh, never trusted,
    and begins a new numbering (an `epoch`).
    """

    __slots__ = ("_epoch", "_first", "_following", "_ids", "_samples", "_series", "_tables")

    def __init__(self) -> None:
        #: the sample list the last fold made (its ids in `_ids`); None while a fold holds
        #: the ids, so that a fold that never gave them back is not trusted
        self._samples: list[Sample] | None = None
        self._ids: set[str] = set()
        #: whether the fold under way started from `_samples`
        self._following = False
        #: the number of `_samples[0]` among the samples folded in this epoch
        self._first = 0
        self._epoch = 0
        self._series: dict[Hashable, _Followed[Any, Any]] = {}
        self._tables: dict[Hashable, dict[str, tuple[Sample, Any]]] = {}

    # -- the fold's duplicate check and the samples' numbers ----------------------------

    def ids_of(self, samples: Sequence[Sample]) -> set[str]:
        """The event ids of `samples`, the job's samples now; the caller may change the
        set it gets and must `keep` it (or lose it)."""
        if samples is self._samples:
            ids, self._ids, self._samples = self._ids, set(), None
            self._following = True
            return ids
        self._following = False
        return {s.event_id for s in samples}

    def keep(self, samples: list[Sample], ids: set[str], dropped: Sequence[Sample]) -> None:
        """Record `ids` as those of `samples`, the job's samples after a fold that
        dropped `dropped` from the front of those it started from (whose derived values
        go with them) and appended what it appended."""
        if self._following:
            self._first += len(dropped)
        else:  # numbered afresh: the series start again
            self._epoch += 1
            self._first = 0
        self._following = False
        self._samples = samples
        self._ids = ids
        if dropped and self._tables:
            for table in self._tables.values():
                for sample in dropped:
                    table.pop(sample.event_id, None)

    # -- values derived from each of the job's samples, in order -------------------------

    def series(
        self,
        name: str,
        args: A,
        samples: list[Sample],
        derive: Callable[[Sample, A], V | None],
        key: Callable[[V], K] | None = None,
    ) -> DerivedSeries[V, K]:
        """The series of `derive(sample, args)` over `samples`, the job's samples (read
        it, never change it). `name` with `args` must say everything `derive` and `key`
        depend on besides the sample. For the list the last fold made, only the samples
        folded since the last call are derived; any other list gets a series of its own,
        through the tables."""
        if samples is not self._samples:
            fresh: DerivedSeries[V, K] = DerivedSeries(key)
            fresh.extend(self.derived_all(name, args, samples, derive))
            return fresh
        table = (name, args)
        series = self._series.get(table)
        if series is None or series.epoch != self._epoch:
            series = self._series[table] = _Followed(key, self._first, self._epoch)
            _bound(self._series)
        behind = self._first - series.first
        if behind:
            series.drop(behind)  # all it covers, at most
            series.first = self._first
        covered = len(series)
        if covered > len(samples):  # never: folds append and drop from the front only
            series = self._series[table] = _Followed(key, self._first, self._epoch)
            covered = 0
        if covered < len(samples):
            series.extend([derive(s, args) for s in samples[covered:]])
        return series

    # -- values derived from one sample -------------------------------------------------

    def derived(self, name: str, args: A, sample: Sample, derive: Callable[[Sample, A], V]) -> V:
        """`derive(sample, args)`, made once per sample while the job keeps it. `name`
        with `args` must say everything `derive` depends on besides the sample."""
        table = self._table((name, args))
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
        table = self._table((name, args))
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

    def _table(self, name: Hashable) -> dict[str, tuple[Sample, Any]]:
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = {}
            _bound(self._tables)
        return table

    def __len__(self) -> int:
        """Derived values held (for tests and bounds: at most the job's samples per
        table and per series)."""
        return sum(len(table) for table in self._tables.values()) + sum(
            len(series) for series in self._series.values()
        )


def _bound(held: dict[Hashable, Any]) -> None:
    """At most SERIES_LIMIT entries in `held`, the oldest made dropped first."""
    while len(held) > SERIES_LIMIT:
        del held[next(iter(held))]


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


def series(
    memo: SampleMemo | None,
    name: str,
    args: A,
    samples: list[Sample],
    derive: Callable[[Sample, A], V | None],
    key: Callable[[V], K] | None = None,
) -> DerivedSeries[V, K]:
    """The series of `derive(sample, args)` over `samples`: kept in `memo` when there is
    one, else made afresh."""
    if memo is None:
        fresh: DerivedSeries[V, K] = DerivedSeries(key)
        fresh.extend([derive(sample, args) for sample in samples])
        return fresh
    return memo.series(name, args, samples, derive, key)
