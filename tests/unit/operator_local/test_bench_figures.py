"""The elastic bench's figures, from what workers print: time to the new world, steps lost."""

from __future__ import annotations

from handlers.operator.local.bench import resize_figures


def m(t: float, size: int, first: int) -> dict[str, object]:
    return {"event": "membership", "time": t, "world_size": size, "first_step": first}


def e(t: float, step: int) -> dict[str, object]:
    return {"event": "exit", "time": t, "step": step}


def test_seconds_to_the_first_step_at_the_new_size_and_the_steps_lost() -> None:
    lines = [m(0.0, 2, 0), m(0.1, 2, 0), e(14.0, 80), e(14.1, 80), m(21.5, 3, 78), m(21.4, 3, 78)]
    seconds, lost = resize_figures(lines, published=10.0, size=3)
    assert round(seconds, 6) == 11.4
    assert lost == 2


def test_a_checkpoint_of_the_last_step_loses_nothing() -> None:
    lines = [m(0.0, 3, 0), e(5.0, 40), m(9.0, 2, 40)]
    assert resize_figures(lines, published=4.0, size=2) == (5.0, 0)
