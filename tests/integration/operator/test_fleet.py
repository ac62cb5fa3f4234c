"""The pure core the virtual operator drives (handlers/simulator/fleet.py): no broker, no
database. Kept beside the operator's tests because it exists for the operator."""

from __future__ import annotations

from datetime import timedelta

from handlers.simulator.cluster import Cluster
from handlers.simulator.fleet import VirtualCluster
from handlers.simulator.job import DEFAULT_ORIGIN
from schemas.jobs import (
    JobCompleted,
    JobEvent,
    JobFailed,
    JobMeta,
    JobSubmitted,
    NodeStarted,
    RoleSpec,
    RuntimeSample,
)
from schemas.plans import NodeGroupResource, ScalePlan, ScaleStatus


def submitted(
    name: str, replicas: int, application: str = "cifar10", at: float = 0.0
) -> JobSubmitted:
    """Submitted ``at`` simulated seconds (the fleet's default origin is time 0)."""
    return JobSubmitted(
        env="sim",
        occurred_at=DEFAULT_ORIGIN + timedelta(seconds=at),
        job=JobMeta(uuid=name, name=name, app=application),
        application=application,
        roles={"worker": RoleSpec(replicas=replicas, gpu_num=1)},
    )


def plan(job: str, plan_id: str, workers: int) -> ScalePlan:
    return ScalePlan(
        env="sim",
        job=JobMeta(uuid=job),
        plan_id=plan_id,
        node_group_resources={"worker": NodeGroupResource(count=workers)},
    )


def run_out(fleet: VirtualCluster) -> list[JobEvent]:
    events: list[JobEvent] = []
    for _ in range(100_000):
        step = fleet.step()
        if step is None:
            return events
        events.extend(step)
    raise AssertionError("the fleet never went quiet")


def test_a_waiting_gang_starts_the_moment_the_running_one_completes() -> None:
    fleet = VirtualCluster(Cluster(2, 4))
    first = fleet.submit(submitted("a", 4))
    assert len(first) == 4  # node.started for each worker of a
    assert fleet.submit(submitted("b", 8)) == []  # the whole cluster: it waits for a
    events = run_out(fleet)
    (done_a,) = [e for e in events if isinstance(e, JobCompleted) and e.key == "a"]
    started_b = [e for e in events if isinstance(e, NodeStarted) and e.key == "b"]
    assert len(started_b) == 8
    assert {e.occurred_at for e in started_b} == {done_a.occurred_at}
    assert [e.key for e in events if isinstance(e, JobCompleted)] == ["a", "b"]


def test_one_jump_and_many_small_steps_say_the_same() -> None:
    def events(steps: list[float]) -> list[tuple[str, str | None, object]]:
        fleet = VirtualCluster(Cluster(2, 4))
        fleet.submit(submitted("a", 2))
        fleet.submit(submitted("b", 8))
        out: list[JobEvent] = []
        for t in steps:
            out.extend(fleet.advance_to(t))
        return [(e.type, e.key, e.event_id) for e in out]

    horizon = 20_000.0
    jumped = events([horizon])
    stepped = events([horizon * i / 997 for i in range(1, 998)])
    assert jumped == stepped
    assert ("job.completed", "b", jumped[-1][2]) == jumped[-1]


def test_time_only_moves_forwards_and_events_carry_it() -> None:
    fleet = VirtualCluster(Cluster(1, 4), sample_interval=60.0)
    fleet.submit(submitted("a", 1))
    out = fleet.advance_to(600.0)
    assert fleet.clock == 600.0
    assert fleet.advance_to(100.0) == []
    assert fleet.clock == 600.0
    samples = [e for e in out if isinstance(e, RuntimeSample)]
    assert [e.occurred_at - fleet.origin for e in samples] == [
        timedelta(seconds=s) for s in range(60, 601, 60)
    ]


def test_nothing_to_do_is_said_so() -> None:
    fleet = VirtualCluster(Cluster(1, 4))
    assert fleet.step() is None
    assert fleet.next_event_at() is None
    fleet.submit(submitted("big", 8))  # never fits: fails instead of waiting forever
    assert fleet.step() is None


def test_plans_for_unknown_or_unsimulable_jobs_are_rejected() -> None:
    fleet = VirtualCluster(Cluster(1, 4))
    outcome = fleet.apply(plan("ghost", "p1", 2))
    assert outcome.status is ScaleStatus.REJECTED
    assert "unknown job 'ghost'" in outcome.reason
    (failed,) = fleet.submit(submitted("odd", 1, application="no-such-app"))
    assert isinstance(failed, JobFailed)
    assert "not simulable" in failed.reason
    assert fleet.submit(submitted("odd", 1, application="no-such-app")) == []
    outcome = fleet.apply(plan("odd", "p2", 2))
    assert outcome.status is ScaleStatus.REJECTED
    assert "not simulable" in outcome.reason


def test_a_submission_seen_twice_and_a_plan_applied_twice_change_nothing() -> None:
    fleet = VirtualCluster(Cluster(2, 4))
    fleet.submit(submitted("a", 1))
    assert fleet.submit(submitted("a", 1)) == []
    first = fleet.apply(plan("a", "up", 4))
    assert first.status is ScaleStatus.APPLIED
    assert len([e for e in first.events if isinstance(e, NodeStarted)]) == 3
    again = fleet.apply(plan("a", "up", 4))
    assert (again.status, again.reason, again.events) == (first.status, first.reason, [])
    assert fleet.observed("a")["worker"]["running"] == 4


def test_a_smaller_gang_makes_room_for_a_waiting_job_at_once() -> None:
    fleet = VirtualCluster(Cluster(1, 4))
    fleet.submit(submitted("a", 4, application="imagenet"))
    fleet.advance_to(100.0)
    assert fleet.submit(submitted("b", 2)) == []
    outcome = fleet.apply(plan("a", "down", 2))
    assert outcome.status is ScaleStatus.APPLIED
    started = {(e.key, e.node.id) for e in outcome.events if isinstance(e, NodeStarted)}
    assert started >= {("b", 0), ("b", 1)}


def test_a_submission_stamped_later_arrives_at_its_own_time() -> None:
    fleet = VirtualCluster(Cluster(2, 4))
    assert fleet.submit(submitted("late", 2, at=500.0)) == []  # not yet
    assert fleet.waiting_arrivals == 1
    assert fleet.next_event_at() == 500.0
    events = fleet.advance_to(499.0)
    assert not [e for e in events if e.key == "late"]
    events = fleet.advance_to(500.0)
    started = [e for e in events if isinstance(e, NodeStarted) and e.key == "late"]
    assert len(started) == 2
    assert {e.occurred_at for e in started} == {DEFAULT_ORIGIN + timedelta(seconds=500)}
    assert fleet.submit(submitted("late", 2, at=500.0)) == []  # seen before: nothing new


def test_an_unstarted_fleet_starts_at_its_earliest_submission_in_any_order() -> None:
    origins = set()
    for order in (["x", "y", "z"], ["z", "y", "x"], ["y", "z", "x"]):
        fleet = VirtualCluster(Cluster(2, 4), origin=None)
        at = {"x": 100.0, "y": 40.0, "z": 70.0}
        for name in order:
            assert fleet.submit(submitted(name, 1, at=at[name])) == []
        assert fleet.next_event_at() is None  # nothing moves before the clock starts
        started = fleet.start()
        origins.add(fleet.origin)
        assert [e.key for e in started if isinstance(e, NodeStarted)] == ["y"]
        assert fleet.next_event_at() == 30.0  # z arrives 30 s after y
    assert origins == {DEFAULT_ORIGIN + timedelta(seconds=40)}
