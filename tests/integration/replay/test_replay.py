"""Replay on the real broker: exact per-key order and count, first phase, resume, trace."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topic_reader import read_topic
from dlrover_events.bus.topics import JOB_EVENTS, JOB_METRICS, topic
from dlrover_events.settings import Settings
from schemas import JobMeta, JobStarted, JobSubmitted, ScalePlan, decode
from streams.replay.copier import Replay
from streams.replay.core import Selection
from streams.replay.trace import replay_trace
from tests.conftest import REPO, EnvFactory
from tests.integration.test_bus import sample

pytestmark = pytest.mark.integration

ALL = Selection(types=("*",), first_phase_only=False)


async def keyed(settings: Settings, env: str, name: str) -> dict[bytes, list[bytes]]:
    by_key: dict[bytes, list[bytes]] = defaultdict(list)
    for r in await read_topic(settings, topic(env, name)):
        event = decode(r.value)
        assert event.env == env
        by_key[r.key].append(event.event_id.bytes)
    return by_key


async def fill_source(settings: Settings, env: str, jobs: int = 8, steps: int = 30) -> None:
    async with Producer(settings) as producer:
        for j in range(jobs):
            await producer.publish(JobSubmitted(env=env, job=JobMeta(uuid=f"job-{j}")))
        await producer.publish_many(
            sample(env, f"job-{j}", s) for s in range(steps) for j in range(jobs)
        )
        await producer.publish_many(
            JobStarted(env=env, job=JobMeta(uuid=f"job-{j}")) for j in range(jobs)
        )
        await producer.send_raw(topic(env, JOB_EVENTS), b"not an event", b"job-0")


async def test_replay_preserves_per_key_order_and_count_exactly(
    settings: Settings, make_env: EnvFactory
) -> None:
    source, target = (await make_env()).name, (await make_env()).name
    await fill_source(settings, source)
    report = await Replay(settings, source, target, selection=ALL).run()
    assert report.copied == 8 + 8 * 30 + 8 + 1
    for name in (JOB_EVENTS, JOB_METRICS):
        src = await keyed_or_raw(settings, source, name)
        dst = await keyed_or_raw(settings, target, name)
        assert dst == src, name


async def keyed_or_raw(settings: Settings, env: str, name: str) -> dict[bytes, list[object]]:
    """Per key, the sequence of event ids (or raw bytes for undecodable records)."""
    by_key: dict[bytes, list[object]] = defaultdict(list)
    for r in await read_topic(settings, topic(env, name)):
        try:
            by_key[r.key].append(decode(r.value).event_id)
        except Exception:
            by_key[r.key].append(r.value)
    return dict(by_key)


async def test_default_replay_copies_arrivals_and_first_phase_only(
    settings: Settings, make_env: EnvFactory
) -> None:
    source, target = (await make_env()).name, (await make_env()).name
    job = JobMeta(uuid="job-1")
    async with Producer(settings) as producer:
        await producer.publish(JobSubmitted(env=source, job=job))
        await producer.publish_many(sample(source, "job-1", s) for s in range(5))
        await producer.publish(ScalePlan(env=source, job=job, plan_id="p-1"))
        await producer.publish_many(sample(source, "job-1", s) for s in range(5, 10))
        await producer.publish(JobStarted(env=source, job=job))  # an outcome: not copied
    report = await Replay(settings, source, target).run()
    metrics = [decode(r.value) for r in await read_topic(settings, topic(target, JOB_METRICS))]
    assert [m.global_step for m in metrics] == [0, 1, 2, 3, 4]  # type: ignore[attr-defined]
    events = [decode(r.value).type for r in await read_topic(settings, topic(target, JOB_EVENTS))]
    assert events == ["job.submitted"]
    assert report.skipped == 5 + 1


async def test_a_stopped_replay_resumes_without_loss_or_duplicates(
    settings: Settings, make_env: EnvFactory
) -> None:
    source, target = (await make_env()).name, (await make_env()).name
    await fill_source(settings, source, jobs=4, steps=25)
    first = await Replay(settings, source, target, selection=ALL, max_records=40).run()
    assert first.read == 40
    second = await Replay(settings, source, target, selection=ALL).run()
    assert first.copied + second.copied == 4 + 4 * 25 + 4 + 1
    for name in (JOB_EVENTS, JOB_METRICS):
        assert await keyed_or_raw(settings, target, name) == await keyed_or_raw(
            settings, source, name
        )


async def test_trace_replay_submits_every_job_of_the_workload(
    settings: Settings, make_env: EnvFactory
) -> None:
    target = (await make_env()).name
    trace = REPO / "handlers" / "simulator" / "data" / "pollux" / "workloads" / "workload-6.csv"
    report = await replay_trace(settings, Path(trace), target)
    rows = trace.read_text().strip().splitlines()[1:]
    assert report.copied == len(rows) == 160
    submitted = [decode(r.value) for r in await read_topic(settings, topic(target, JOB_EVENTS))]
    assert len(submitted) == 160
    assert all(isinstance(e, JobSubmitted) and e.env == target for e in submitted)
    assert {e.job.uuid for e in submitted} == {row.split(",")[0] for row in rows}  # type: ignore[attr-defined]
