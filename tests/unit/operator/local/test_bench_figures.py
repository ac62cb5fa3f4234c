"""The elastic bench's figures, from what workers print: time to the first step at the new
size, steps lost, and in place the phases and whether a warm spare came in."""

from __future__ import annotations

from typing import Any

import pytest

from handlers.operator.local.bench import resize_figures, summary


def restarted(t: float, size: int, step: int) -> dict[str, Any]:
    return {
        "event": "rescaled",
        "mode": "restart",
        "time": t,
        "world_size": size,
        "step": step,
        "rank": 0,
        "generation": 1,
        "at": {"first_step": t},
    }


def e(t: float, step: int) -> dict[str, Any]:
    return {"event": "exit", "time": t, "step": step}


def test_restart_seconds_to_the_first_step_at_the_new_size_and_the_steps_lost() -> None:
    lines = [restarted(1.0, 2, 0), e(14.0, 80), e(14.1, 80)]
    lines += [restarted(21.5, 3, 78), restarted(21.4, 3, 78)]
    got = resize_figures(lines, published=10.0, size=3)
    assert got == {"mode": "restart", "seconds": 11.4, "steps_lost": 2}


def test_a_checkpoint_of_the_last_step_loses_nothing() -> None:
    lines = [restarted(1.0, 3, 0), e(5.0, 40), restarted(9.0, 2, 40)]
    assert resize_figures(lines, published=4.0, size=2)["steps_lost"] == 0


def in_place(rank: int, first_step: float, generation: int = 4) -> dict[str, Any]:
    return {
        "event": "rescaled",
        "mode": "in_place",
        "time": first_step + 0.001,
        "world_size": 3,
        "rank": rank,
        "step": 200,
        "generation": generation,
        "steps_lost": 0,
        "joined": 1,
        "agreement_s": 0.1,
        "reform_s": 0.05,
        "state_transfer_s": 0.01,
        "first_step_s": 0.02,
        "at": {"sign": 10.3, "first_step": first_step},
    }


def joined(spare: bool) -> dict[str, Any]:
    return {
        "event": "membership",
        "time": 10.5,
        "generation": 4,
        "first_step": 200,
        "world_size": 3,
        "spare": spare,
    }


def test_in_place_phases_come_from_rank_0_and_the_delivery_from_the_plan() -> None:
    lines = [in_place(1, 10.6), in_place(0, 10.7), in_place(2, 10.65), joined(True)]
    got = resize_figures(lines, published=10.0, size=3)
    assert got["mode"] == "in_place" and got["seconds"] == 0.6  # the first rank done
    assert got["steps_lost"] == 0 and got["warm"] is True
    assert got["phases"] == {
        "plan_delivery_s": 0.3,
        "agreement_s": 0.1,
        "reform_s": 0.05,
        "state_transfer_s": 0.01,
        "first_step_s": 0.02,
    }
    cold = resize_figures([in_place(0, 10.7), joined(False)], published=10.0, size=3)
    assert cold["warm"] is False
    shrink = resize_figures([{**in_place(0, 10.7), "joined": 0}], published=10.0, size=3)
    assert "warm" not in shrink


def test_no_step_at_the_size_is_an_error() -> None:
    with pytest.raises(ValueError, match="no first step"):
        resize_figures([in_place(0, 5.0)], published=10.0, size=3)


def test_medians_per_kind() -> None:
    figures = [
        {"kind": "grow", "seconds": s, "steps_lost": 0, "warm": True, "phases": {"reform_s": r}}
        for s, r in ((1.0, 0.1), (3.0, 0.3), (2.0, 0.2))
    ] + [{"kind": "shrink", "seconds": 12.0, "steps_lost": 4}]
    got = summary(figures)
    assert got["grow"]["median_s"] == 2.0 and got["grow"]["max_s"] == 3.0
    assert got["grow"]["warm"] == 3 and got["grow"]["phases_median_s"]["reform_s"] == 0.2
    assert got["grow"]["phases_median_s"]["agreement_s"] is None
    assert got["shrink"] == {
        "plans": 1,
        "median_s": 12.0,
        "max_s": 12.0,
        "steps_lost_median": 4,
        "steps_lost_max": 4,
    }
