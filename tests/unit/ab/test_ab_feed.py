"""Which A/B arms are fed at their simulated speed once their services are ready, and how
many jobs the input submits (known before any arm's env holds them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlrover_events.errors import UserError
from dlrover_events.settings import Settings
from schemas.jobs import JobCompleted, JobMeta, JobSubmitted
from streams.ab.arms import Arm
from streams.ab.runner import ABTest, ArmCluster, count_submissions

BRAIN = Arm("b", {})
STATIC = Arm("s", {"brain": False})


def _test(cluster: ArmCluster) -> ABTest:
    return ABTest(Settings(), "", [BRAIN, STATIC], cluster=cluster)


def test_lockstep_arms_and_arms_without_a_brain_are_fed_before_they_start() -> None:
    test = _test(ArmCluster(2, 4))  # lockstep: the default
    assert test.feed_speed(BRAIN) is None
    assert test.feed_speed(STATIC) is None


def test_a_brain_out_of_lockstep_is_fed_at_its_simulated_speed() -> None:
    test = _test(ArmCluster(2, 4, speed=200.0, lockstep=False))
    assert test.feed_speed(BRAIN) == 200.0
    assert test.feed_speed(STATIC) is None  # nothing on its side decides on event time


def test_an_arm_that_leaves_lockstep_itself_is_paced_at_its_own_speed() -> None:
    test = _test(ArmCluster(2, 4, speed=100.0))
    assert test.feed_speed(Arm("w", {"operator": {"lockstep": False}})) == 100.0
    assert test.feed_speed(Arm("v", {"operator": {"lockstep": False, "speed": 50}})) == 50.0
    # as fast as possible: no speed to pace at, fed whole as before
    assert test.feed_speed(Arm("f", {"operator": {"lockstep": False, "fast": True}})) is None
    assert _test(ArmCluster(2, 4, speed=None, lockstep=False)).feed_speed(BRAIN) is None


def test_submissions_count_jobs_once_and_nothing_else() -> None:
    def submitted(name: str) -> JobSubmitted:
        return JobSubmitted(env="e", job=JobMeta(uuid=name, name=name), source="trace")

    done = JobCompleted(env="e", job=JobMeta(uuid="a", name="a"), source="operator")
    assert count_submissions([submitted("a"), submitted("b"), submitted("a"), done]) == 2
    assert count_submissions([]) == 0


async def test_a_trace_is_counted_from_its_adapter(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(
        "name,time,application,num_replicas,batch_size\nncf-0,0,ncf,1,32768\nncf-1,30,ncf,2,32768\n"
    )
    test = ABTest(Settings(), "", [BRAIN], trace=trace)
    assert await test._submissions() == 2
    trace.write_text("not,a,trace\n1,2,3\n")
    with pytest.raises(UserError, match="cannot read"):
        await test._submissions()
