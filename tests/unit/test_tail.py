from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover_events.bus.tail import Filter, format_json, format_text, parse_since, read_line
from schemas import JobMeta, NodeOOM, OOMKind, RuntimeSample, encode
from schemas.jobs import NodeRef

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "ago"),
    [("30s", 30), ("10m", 600), ("2h", 7200), ("1d", 86400), ("1.5h", 5400), ("500ms", 0.5)],
)
def test_since_durations(text: str, ago: float) -> None:
    assert parse_since(text, NOW) == NOW - timedelta(seconds=ago)


def test_since_iso_times_default_to_utc() -> None:
    assert parse_since("2026-11-21T09:00:00", NOW) == datetime(2026, 11, 21, 9, tzinfo=UTC)
    assert parse_since("2026-11-21T09:00:00+01:00", NOW) == datetime(2026, 11, 21, 8, tzinfo=UTC)


@given(st.text(max_size=40))
def test_since_parses_or_says_what_it_wants(text: str) -> None:
    try:
        when = parse_since(text, NOW)
    except ValueError as err:
        assert "expected a duration" in str(err)
    else:
        assert when.tzinfo is not None


def test_lines_are_readable_and_filterable() -> None:
    job = JobMeta(uuid="job-7")
    oom = NodeOOM(env="prod", job=job, node=NodeRef(type="worker", id=3), kind=OOMKind.HOST_MEMORY)
    line = read_line("prod.job.events", 1, 42, encode(oom))
    text = format_text(line)
    assert "prod.job.events[1]@42" in text
    assert "node.oom" in text and "job-7" in text and "worker-3 OOM (host_memory)" in text
    assert Filter(job="job-7").accepts(oom)
    assert not Filter(job="job-8").accepts(oom)
    assert Filter(type_pattern="node.*").accepts(oom)
    assert not Filter(type_pattern="job.*").accepts(oom)
    sample = RuntimeSample(env="prod", job=job, global_step=5, speed=2.0)
    assert orjson.loads(format_json(read_line("t", 0, 0, encode(sample))))["global_step"] == 5


def test_unreadable_messages_are_shown_not_raised() -> None:
    line = read_line("prod.job.events", 0, 9, b"\xff\xfe")
    assert line.event is None
    assert "UNREADABLE malformed" in format_text(line)
    assert orjson.loads(format_json(line))["error"].startswith("malformed")


def test_a_plan_line_shows_what_changes_and_not_the_unchanged_zeros() -> None:
    from schemas import NodeGroupResource, NodeResource, OptimizePlan, ResourcePlan

    plan = OptimizePlan(
        env="prod",
        job=JobMeta(uuid="j"),
        plan_id="p",
        stage="running",
        optimizer="worker-resource",
        reason="from use",
        resource=ResourcePlan(
            node_group_resources={
                "worker": NodeGroupResource(node_resource=NodeResource(cpu=2, memory=3 * 2**30)),
                "ps": NodeGroupResource(count=4),
            }
        ),
    )
    text = format_text(read_line("prod.brain.plans", 0, 0, encode(plan)))
    assert "[worker-resource] from use (worker: cpu 2, memory 3 GiB; ps: 4 replicas)" in text
    assert "worker=0" not in text


def test_a_job_request_and_its_answer_say_who_asked_what_and_what_became_of_it() -> None:
    from schemas import JobRequest, JobRequestResult, JobRequestStatus

    asked = JobRequest(
        env="prod",
        source="searcher",
        request_id="r-1",
        name="trial-1",
        document={},
        reason="lr 0.1",
        owner="sweep",
    )
    text = format_text(read_line("prod.job.requests", 0, 0, encode(asked)))
    assert "request=r-1 job=trial-1 from searcher for sweep: lr 0.1" in text
    answer = JobRequestResult(
        env="prod",
        request_id="r-1",
        name="trial-1",
        status=JobRequestStatus.REFUSED,
        reason="invalid job: no roles",
    )
    text = format_text(read_line("prod.job.requests", 0, 1, encode(answer)))
    assert "request=r-1 refused invalid job: no roles" in text


def test_a_capacity_report_says_what_the_platform_has_and_can_apply() -> None:
    from schemas.cluster import CapacityReported, HostCapacity, PlatformCapabilities

    local = PlatformCapabilities(spares=True, suspend=True)
    uncounted = CapacityReported(
        env="prod", platform="local", hosts_counted=False, capabilities=local
    )
    text = format_text(read_line("prod.cluster.capacity", 0, 0, encode(uncounted)))
    assert text.endswith(
        "local: hosts not counted; can: spares, suspend, migrates nodes; "
        "cannot: GPU types, replaces the rendezvous host"
    )
    hosts = [HostCapacity(name="a", gpus=8), HostCapacity(name="b", gpus=8, schedulable=False)]
    counted = CapacityReported(env="prod", platform="kubernetes", hosts=hosts)
    text = format_text(read_line("prod.cluster.capacity", 0, 1, encode(counted)))
    assert text.endswith("kubernetes: 8 GPUs on 1 of 2 hosts")
