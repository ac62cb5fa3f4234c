"""`bench ab` on the real broker and Postgres: a small lockstep A/B, and the shape of the
JSON it prints (what a tick's wall time is split into, per arm). No timings are asserted:
speed is the bench's to report, not a test's to check."""

from __future__ import annotations

import json

import pytest

from dlrover_events.settings import Settings
from streams.ab.arms import PRESETS, Arm
from streams.ab.bench import WORKLOAD, run_bench, split_per_tick, tick_walls

pytestmark = pytest.mark.integration


@pytest.mark.timeout(300)
async def test_the_bench_splits_a_lockstep_tick_and_digests_each_arm_s_jcts(
    settings: Settings,
) -> None:
    result = await run_bench(
        settings,
        jobs=3,
        arms=[Arm("static", PRESETS["static"]), Arm("tiresias", PRESETS["tiresias"])],
        runs=1,
        nodes=16,
        gpus=4,
        workload=WORKLOAD,
        progress=lambda line: None,
    )
    json.dumps(result)  # it is printed as one JSON line
    assert result["jobs"] == 3
    assert result["runs"] == 1
    assert {"load_1m", "bus_delay_ms_p50", "run_s_p50", "process_cpu_s_p50"} <= set(result)
    static, tiresias = result["arms"]["static"], result["arms"]["tiresias"]
    for arm in (static, tiresias):
        assert arm["unfinished"] == 0
        assert len(arm["jct_digests"]) == 1
    # the arm without a brain runs no lockstep ticks
    assert static["ticks"] == 0
    assert static["split_ms_per_tick"] == {}
    assert tiresias["ticks"] > 0
    assert tiresias["wall_per_tick_ms_p50"] is not None
    assert tiresias["wall_per_tick_ms_p90"] >= tiresias["wall_per_tick_ms_p50"]
    split = tiresias["split_ms_per_tick"]
    for phase in (
        "operator_simulate",
        "operator_checkpoint",
        "operator_publish",
        "operator_wait_acks",
        "brain_decide",
        "brain_publish",
        "brain_checkpoint",
        "wait_acks_bus",
    ):
        assert split[phase] >= 0, phase
    assert split["operator_wait_acks"] > 0


def test_tick_walls_are_between_consecutive_ticks_and_the_split_is_per_tick() -> None:
    assert tick_walls({1: 1000, 2: 1040, 3: 1100, 5: 1200}) == [0.04, 0.06]
    split = split_per_tick({"operator_wait_acks": 2.0, "brain_decide": 0.5}, ticks=100)
    assert split == {"operator_wait_acks": 20.0, "brain_decide": 5.0, "wait_acks_bus": 15.0}
    assert split_per_tick({"operator_wait_acks": 1.0}, ticks=0) == {}
