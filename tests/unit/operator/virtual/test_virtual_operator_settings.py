"""A running virtual operator takes a change of its env's settings: the pace at once, the
simulated time going on from where it is; what made the simulated cluster stays."""

from __future__ import annotations

import logging

import pytest

from dlrover_events.settings import Settings
from handlers.operator.virtual.operator import VirtualOperator
from handlers.operator.virtual.settings import VirtualSettings


def _operator(**options: object) -> VirtualOperator:
    return VirtualOperator(Settings(), "sim", "postgresql://unused", VirtualSettings(**options))


def test_the_pace_is_taken_at_once() -> None:
    operator = _operator(speed=1.0)
    before = operator.clock.now()
    assert before is not None
    operator.take_settings(VirtualSettings(speed=50.0, max_sleep=0.1), 2)
    assert operator.options.speed == 50.0 and operator.options.max_sleep == 0.1
    assert operator.clock.speed == 50.0
    now = operator.clock.now()
    assert now is not None and now >= before  # simulated time goes on, never back
    operator.take_settings(VirtualSettings(speed=50.0, fast=True), 3)
    assert operator.clock.fast and operator.options.fast
    operator.take_settings(VirtualSettings(speed=2.0), 4)
    assert operator.clock.speed == 2.0 and not operator.options.fast


def test_what_made_the_cluster_stays(caplog: pytest.LogCaptureFixture) -> None:
    operator = _operator(nodes=16, speed=1.0)
    with caplog.at_level(logging.WARNING):
        operator.take_settings(VirtualSettings(nodes=32, admission="brain", speed=3.0), 2)
    assert operator.options.nodes == 16 and operator.options.admission == "cluster"
    assert operator.options.speed == 3.0
    assert "keeps its operator.admission, operator.nodes" in caplog.text


def test_lockstep_keeps_its_clock() -> None:
    operator = _operator(lockstep=True)
    clock = operator.clock
    operator.take_settings(VirtualSettings(lockstep=True, speed=9.0), 2)
    assert operator.clock is clock  # a lockstep clock moves a tick at a time, at no speed
    assert operator.options.speed == 9.0  # (kept in the options; lockstep ignores it)
