"""What the brain's checkpoint holds, and what of a job's samples a checkpoint writes.

The processor hands a `Snapshot` to the runtime (`streams.brain.runtime.checkpoint` writes
it to the env's Postgres) and takes back what a load gives (`Loaded`); both are plain
data, so the processor stays free of the database. A job's runtime samples are most of
its state (60 of them, about 45 kB in JSON) and only a few are new at each checkpoint, so
they are written apart: the new ones as a chunk, and the chunks that fell out of the
window deleted (`sample_write` decides which).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from schemas.plans import OptimizePlan, ScalePlan
from streams.brain.core.samples import Sample
from streams.brain.core.state import MAX_SAMPLES, JobState

#: (topic, partition) -> next offset to process
Offsets = dict[tuple[str, int], int]


@dataclass
class Snapshot:
    """What one checkpoint writes: changed states with their partition, the next offsets
    of the inputs they include and of the outputs published so far, and new plans.

    States are immutable (folds return new ones), so holding them here is a consistent
    copy even while the processor goes on."""

    states: dict[str, tuple[int, JobState]] = field(default_factory=dict)
    offsets: Offsets = field(default_factory=dict)
    plans: list[OptimizePlan | ScalePlan] = field(default_factory=list)
    #: offsets to write as they are, not as the greatest of stored and new: those found
    #: beyond their log's end (a restarted broker). One also in `offsets` is written so.
    reset: Offsets = field(default_factory=dict)
    #: lockstep: the latest tick decided, per input partition (number) it covers
    ticks: dict[int, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.states or self.offsets or self.plans or self.reset or self.ticks)


@dataclass
class Loaded:
    """What a checkpoint gives back of some partitions: the states of the jobs that still
    run and of those the history-based optimizers read, the next offsets, and the
    partition of every finished job (whose late events are ignored)."""

    states: dict[str, tuple[int, JobState]]
    offsets: Offsets
    finished: dict[str, int] = field(default_factory=dict)
    #: lockstep: the latest tick decided, per partition (`Snapshot.ticks`)
    ticks: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StoredSamples:
    """What the env's Postgres holds of one job's samples, as far as this process wrote
    or read it: the job's chunks as (seq, samples in it), oldest first, and the id of the
    newest sample among them."""

    partition: int
    chunks: tuple[tuple[int, int], ...]
    last_id: str


#: `SampleWrite.keep_from` that deletes every chunk of the job
ALL_CHUNKS = 2**62


@dataclass(frozen=True)
class SampleWrite:
    """One job's samples in one checkpoint: delete its chunks below `keep_from`, then
    add `new` (if any) as chunk `seq`; `stored` is what Postgres holds after that."""

    new: Sequence[Sample]
    seq: int
    keep_from: int
    stored: StoredSamples | None


def sample_write(
    samples: Sequence[Sample], stored: StoredSamples | None, partition: int
) -> SampleWrite:
    """What to write of a job's `samples` (its state's window), given what is stored.

    The samples after the newest one stored are new; the oldest chunks go while the rest
    still holds the whole window. When the newest one stored has left the window (more
    new samples than the window holds) or nothing is known of what is stored, every chunk
    of the job is replaced by one with the whole window."""
    if stored is not None:
        found = next(
            (i for i in range(len(samples) - 1, -1, -1) if samples[i].event_id == stored.last_id),
            None,
        )
        if found is not None and stored.chunks:
            new = samples[found + 1 :]
            chunks = list(stored.chunks)
            seq = chunks[-1][0] + 1
            if new:
                chunks.append((seq, len(new)))
            held = sum(count for _, count in chunks)
            while len(chunks) > 1 and held - chunks[0][1] >= len(samples):
                held -= chunks.pop(0)[1]
            kept = StoredSamples(partition, tuple(chunks), samples[-1].event_id)
            return SampleWrite(new, seq, chunks[0][0], kept)
    if not samples:
        return SampleWrite((), 0, ALL_CHUNKS, None)
    whole = StoredSamples(partition, ((0, len(samples)),), samples[-1].event_id)
    return SampleWrite(samples, 0, ALL_CHUNKS, whole)


def stored_samples(
    state: JobState, partition: int, chunks: Sequence[tuple[int, Sequence[Sample]]]
) -> tuple[JobState, StoredSamples | None]:
    """A job's state read back with its chunks (seq order): its samples are the last
    ones of those its document holds (checkpoints from before chunks) and the chunks'."""
    if not chunks:
        return state, None
    window = [*state.samples]
    for _, samples in chunks:
        window.extend(samples)
    window = window[-MAX_SAMPLES:]
    if not window:
        return state.model_copy(update={"samples": window}), None
    known = tuple((seq, len(samples)) for seq, samples in chunks)
    stored = StoredSamples(partition, known, window[-1].event_id)
    return state.model_copy(update={"samples": window}), stored


def merge_offsets(into: Offsets, more: Mapping[tuple[str, int], int]) -> None:
    for tp, offset in more.items():
        if offset > into.get(tp, -1):
            into[tp] = offset
