"""Leader election's pure rules (handlers/operator/kube/lease.py) and the fence on the
platform's writes: who may take a lease when, what is written, and that a leader's own
deadline always falls before any other replica may take over."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover_events.errors import UserError
from handlers.operator.kube.lease import (
    LeaseRecord,
    Seen,
    Timing,
    may_take,
    observe,
    released,
    taken,
)
from handlers.operator.kube.runner import kube_settings
from handlers.operator.local.cluster import LocalCluster
from handlers.operator.platform.bodies import JobSpecChange, JobView, NewPod
from handlers.operator.platform.errors import NotLeader
from handlers.operator.platform.fencing import FencedPlatform

TIMING = Timing(lease_duration_s=15, renew_deadline_s=10, retry_period_s=2)
AT = datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def record(holder: str = "a", version: str = "1", duration: int | None = 15) -> LeaseRecord:
    return LeaseRecord(
        holder=holder,
        duration_s=duration,
        transitions=3,
        acquire_time="2025-01-01T00:00:00.000000Z",
        resource_version=version,
    )


def test_a_record_is_read_from_the_lease_object() -> None:
    obj = {
        "metadata": {"name": "l", "resourceVersion": "42"},
        "spec": {
            "holderIdentity": "op-a",
            "leaseDurationSeconds": 3,
            "leaseTransitions": 2,
            "acquireTime": "2025-01-01T00:00:00.000000Z",
            "renewTime": "2025-01-01T00:00:01.000000Z",
        },
    }
    assert LeaseRecord.of(obj) == LeaseRecord("op-a", 3, 2, "2025-01-01T00:00:00.000000Z", "42")
    assert LeaseRecord.of({"metadata": {"resourceVersion": "1"}}) == LeaseRecord(
        "", None, 0, None, "1"
    )


def test_an_unchanged_record_keeps_the_time_it_was_first_seen() -> None:
    seen = observe(None, record(version="1"), 100.0)
    assert observe(seen, record(version="1"), 107.0) == Seen(record(version="1"), 100.0)
    assert observe(seen, record(version="2"), 107.0) == Seen(record(version="2"), 107.0)


def test_who_may_take_the_lease() -> None:
    held = observe(None, record("a", duration=15), 100.0)
    assert may_take(held, "a", 100.0, TIMING), "the holder renews"
    assert not may_take(held, "b", 114.9, TIMING), "not before the holder's duration"
    assert may_take(held, "b", 115.0, TIMING)
    # the holder's promise counts, not the candidate's own setting
    short = observe(None, record("a", duration=3), 100.0)
    assert may_take(short, "b", 103.0, TIMING) and not may_take(short, "b", 102.9, TIMING)
    # a released lease (no holder) is taken at once
    assert may_take(observe(None, record(""), 100.0), "b", 100.0, TIMING)


def test_the_spec_written_to_take_renew_and_release() -> None:
    first = taken(None, "b", AT, TIMING)
    assert first == {
        "holderIdentity": "b",
        "leaseDurationSeconds": 15,
        "acquireTime": "2025-01-02T03:04:05.678901Z",
        "renewTime": "2025-01-02T03:04:05.678901Z",
        "leaseTransitions": 0,
    }
    over = taken(record("a"), "b", AT, TIMING)
    assert over["leaseTransitions"] == 4 and over["acquireTime"] == "2025-01-02T03:04:05.678901Z"
    renewed = taken(record("b"), "b", AT, TIMING)
    assert renewed["leaseTransitions"] == 3
    assert renewed["acquireTime"] == "2025-01-01T00:00:00.000000Z", "kept on renewal"
    gone = released(record("b"), AT)
    assert gone["holderIdentity"] is None and gone["leaseDurationSeconds"] == 1


@given(
    start=st.floats(0, 1e6),
    flight=st.floats(0, 30),
    read_later=st.floats(0, 30),
    lease=st.integers(1, 60),
    ratio=st.floats(0.05, 0.95),
)
def test_a_leader_stops_before_anyone_may_take_over(
    start: float, flight: float, read_later: float, lease: int, ratio: float
) -> None:
    """The leader's last renewal starts at ``start`` and holds until start + renew
    deadline; its write lands ``flight`` later and a candidate reads it ``read_later``
    after that: the first moment the candidate may take over is after that deadline."""
    renew = lease * ratio
    timing = Timing(lease, renew, renew / 2)
    held_until = start + timing.renew_deadline_s
    seen = observe(None, record("a", duration=lease), start + flight + read_later)
    earliest = seen.since + lease
    assert not may_take(seen, "b", held_until, timing)
    assert earliest > held_until
    assert may_take(seen, "b", earliest, timing)


@pytest.mark.parametrize(
    ("durations", "says"),
    [
        ((15, 15.0, 2.0), "retry period < renew deadline < lease duration"),
        ((15, 10.0, 10.0), "retry period < renew deadline < lease duration"),
        ((15, 10.0, 0.0), "retry period < renew deadline < lease duration"),
    ],
)
def test_lease_durations_must_nest(durations: tuple[int, float, float], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Timing(*durations)
    lease, renew, retry = durations
    with pytest.raises(UserError, match="operator option"):
        kube_settings(
            {
                "lease_duration_seconds": lease,
                "renew_deadline_seconds": renew,
                "retry_period_seconds": retry,
            }
        )


def test_the_settings_give_the_lease_timing() -> None:
    conf = kube_settings(
        {"lease_duration_seconds": 3, "renew_deadline_seconds": 2, "retry_period_seconds": 0.5}
    )
    assert conf.leader_elect and conf.lease_name == "dlrover-events-operator"
    assert conf.lease_timing() == Timing(3, 2.0, 0.5)


async def test_a_fenced_platform_refuses_writes_once_the_lease_is_lost(tmp_path: Path) -> None:
    leading = [True]
    platform = FencedPlatform(LocalCluster(tmp_path), lambda: leading[0])
    body = {
        "apiVersion": "dlrover-events.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "j"},
        "spec": {
            "roles": {
                "worker": {
                    "replicas": 1,
                    "template": {"spec": {"containers": [{"name": "m", "image": "i"}]}},
                }
            }
        },
    }
    job = await platform.submit_job(body)
    leading[0] = False
    change = JobSpecChange(job.resource_version, ("p1",), replicas={"worker": 2})
    with pytest.raises(NotLeader, match="change job j refused"):
        await platform.change_job(job, change)
    with pytest.raises(NotLeader, match="create pod j-worker-0 refused"):
        await platform.create_pod(job, NewPod("worker", 0, 0, job.roles["worker"].resources), "e")
    with pytest.raises(NotLeader):
        await platform.delete_job("j")
    got = await platform.get_job("j")  # reads pass
    assert isinstance(got, JobView) and got.roles["worker"].replicas == 1
    assert await platform.list_pods("j") == ([], "0")
