"""Step records -> a sample's speed, step time and samples per step."""

from __future__ import annotations

import pytest

from dlrover_events.sdk.window import StepWindow


def test_speed_counts_steps_between_the_first_and_last_record() -> None:
    w = StepWindow()
    assert w.cut() is None
    for seq in range(1, 6):  # steps end at t = 10.0, 10.5, ... 12.0
        w.add((seq, 10.0 + 0.5 * (seq - 1), None, 32))
    stats = w.cut()
    assert stats is not None
    assert stats.steps == 4 and stats.elapsed_s == pytest.approx(2.0)
    assert stats.speed == pytest.approx(2.0) and stats.step_time == pytest.approx(0.5)
    assert stats.samples_per_step == 32
    assert stats.global_step == 5


def test_next_window_starts_at_the_last_step_of_the_previous() -> None:
    w = StepWindow()
    for seq in range(1, 4):
        w.add((seq, float(seq), None, None))
    assert w.cut() is not None
    assert w.cut() is None  # no new step: no sample
    w.add((4, 5.0, None, None))
    stats = w.cut()
    assert stats is not None
    assert (stats.steps, stats.elapsed_s, stats.samples_per_step) == (1, 2.0, None)


def test_lost_records_cost_no_steps() -> None:
    w = StepWindow()
    w.add((1, 0.0, None, 10))
    w.add((2, 1.0, None, 10))
    w.add((9, 8.0, None, 10))  # records 3..8 were overwritten
    stats = w.cut()
    assert stats is not None
    assert stats.steps == 8 and stats.speed == pytest.approx(1.0)
    assert w.lost == 6
    assert stats.samples_per_step == 10


def test_callers_global_step_is_followed() -> None:
    w = StepWindow()
    w.add((1, 0.0, 1000, None))
    w.add((2, 1.0, None, None))
    w.add((3, 2.0, None, None))
    stats = w.cut()
    assert stats is not None and stats.global_step == 1002
