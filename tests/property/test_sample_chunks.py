"""A checkpoint writes a job's samples as chunks (`sample_write`) and reads them back
(`stored_samples`): whatever came between checkpoints, what is read back is the job's
window, and what is kept in Postgres stays bounded."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import example, given
from hypothesis import strategies as st

from schemas.jobs import JobMeta
from streams.brain.core.samples import Sample
from streams.brain.core.snapshot import ALL_CHUNKS, StoredSamples, sample_write, stored_samples
from streams.brain.core.state import MAX_SAMPLES, JobState

T0 = datetime(2026, 1, 1, tzinfo=UTC)
EMPTY = JobState(env="prod", job=JobMeta(uuid="job-1"))


def _samples(start: int, count: int) -> list[Sample]:
    return [
        Sample(event_id=f"s-{n}", at=T0 + timedelta(seconds=n), global_step=n)
        for n in range(start, start + count)
    ]


class _Table:
    """job_sample_chunks of one job, as the store's statements change it."""

    def __init__(self) -> None:
        self.chunks: dict[int, list[Sample]] = {}

    def apply(self, new: list[Sample], seq: int, keep_from: int) -> None:
        self.chunks = {q: s for q, s in self.chunks.items() if q >= keep_from}
        if new:
            self.chunks[seq] = new  # ON CONFLICT DO UPDATE

    def rows(self) -> list[tuple[int, list[Sample]]]:
        return sorted(self.chunks.items())


@given(st.lists(st.integers(min_value=0, max_value=2 * MAX_SAMPLES + 5), max_size=25))
@example([MAX_SAMPLES, MAX_SAMPLES // 2, MAX_SAMPLES // 2])  # the oldest chunk just unneeded
@example([3, 0, 1, 0, MAX_SAMPLES + 1, 2])
def test_the_window_reads_back_after_any_checkpoints(added: list[int]) -> None:
    table = _Table()
    stored: StoredSamples | None = None
    window: list[Sample] = []
    seen = 0
    for count in added:
        window = (window + _samples(seen, count))[-MAX_SAMPLES:]
        seen += count
        write = sample_write(window, stored, partition=2)
        table.apply(list(write.new), write.seq, write.keep_from)
        stored = write.stored
        state, read = stored_samples(EMPTY, 2, table.rows())
        assert state.samples == window
        # what a process that loads the job knows is what the writer knew
        assert read == stored
        # no chunk kept that the window does not need: without the oldest, it is short
        rows = table.rows()
        if len(rows) > 1:
            assert sum(len(s) for _, s in rows[1:]) < len(window)
        # a checkpoint with nothing new writes no chunk
        if write.stored is not None and count == 0:
            assert not write.new


def test_a_process_that_knows_nothing_replaces_every_chunk() -> None:
    table = _Table()
    table.apply(_samples(0, 5), 0, 0)
    table.apply(_samples(5, 5), 1, 0)  # written by another instance, say
    write = sample_write(_samples(3, 4), None, partition=0)
    assert write.keep_from == ALL_CHUNKS and list(write.new) == _samples(3, 4)
    table.apply(list(write.new), write.seq, write.keep_from)
    state, _ = stored_samples(EMPTY, 0, table.rows())
    assert state.samples == _samples(3, 4)


def test_samples_of_a_state_written_before_chunks_come_first() -> None:
    inline = EMPTY.model_copy(update={"samples": _samples(0, MAX_SAMPLES - 2)})
    state, stored = stored_samples(inline, 1, [(0, _samples(MAX_SAMPLES - 2, 4))])
    assert state.samples == _samples(2, MAX_SAMPLES)
    assert stored == StoredSamples(1, ((0, 4),), f"s-{MAX_SAMPLES + 1}")
    assert stored_samples(inline, 1, []) == (inline, None)
