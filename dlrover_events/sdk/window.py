"""From step records to a sample's numbers: pure arithmetic, no clock and no thread.

Speed comes from the step sequence numbers, not from counting records, so a record the
bounded step deque overwrote costs precision of the samples/s average only, never a step.
"""

from __future__ import annotations

from dataclasses import dataclass

#: (sequence number, perf_counter at the end of the step, caller's global step, samples)
StepRecord = tuple[int, float, int | None, int | None]


@dataclass(frozen=True)
class WindowStats:
    steps: int
    elapsed_s: float
    global_step: int
    #: mean samples per step over the window, when the caller gave sample counts.
    samples_per_step: float | None

    @property
    def speed(self) -> float:
        return self.steps / self.elapsed_s

    @property
    def step_time(self) -> float:
        return self.elapsed_s / self.steps


class StepWindow:
    """The steps since the last cut. The first step's end starts the clock: the time
    before it (building the model, loading data) is set-up, not training."""

    def __init__(self) -> None:
        self._seq0: int | None = None
        self._t0 = 0.0
        self._last_seq = 0
        self._last_t = 0.0
        self._offset = 0
        self._samples = 0
        self._sampled = 0
        #: records overwritten in the step deque before they were read.
        self.lost = 0
        self.global_step = 0

    def add(self, record: StepRecord) -> None:
        seq, t, global_step, samples = record
        if global_step is not None:
            # The caller's numbering wins, and later steps without one continue from it.
            self._offset = global_step - seq
        self.global_step = max(seq + self._offset, 0)
        if self._seq0 is None:
            self._seq0, self._t0 = seq, t
            self.lost += seq - 1
        else:
            self.lost += max(seq - self._last_seq - 1, 0)
            if samples is not None:
                self._samples += samples
                self._sampled += 1
        self._last_seq, self._last_t = seq, t

    def cut(self) -> WindowStats | None:
        """The window so far, and a new one from its last step; None if too few steps."""
        if self._seq0 is None:
            return None
        steps = self._last_seq - self._seq0
        elapsed = self._last_t - self._t0
        if steps <= 0 or elapsed <= 0:
            return None
        per_step = self._samples / self._sampled if self._sampled else None
        self._seq0, self._t0 = self._last_seq, self._last_t
        self._samples = self._sampled = 0
        return WindowStats(steps, elapsed, self.global_step, per_step)
