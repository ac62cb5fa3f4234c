"""A brain SIGKILLed several times mid-stream decides what a brain that ran in one go
decides: the same plan ids with the same bodies, none lost; and brains that fetch 1, 7,
500 or 5,000 records at a time decide the same plans, byte for byte.

What the brain decides for a job depends on how its `job.metrics` and `job.events`
interleave; each restart reads a backlog cut into other fetch batches than the live run
read. The merge by event time (streams/brain/core/merge.py) makes the order a function of the
records, so the plans are too. Each killed brain fetches another number of records at a
time (1, 7, 500, 5,000 in turn), so the run crosses batch boundaries of every size.
"""

from __future__ import annotations

import asyncio
import random
import signal
import sys

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import BRAIN_PLANS, JOB_EVENTS, JOB_METRICS, SCALE_PLANS, topic
from dlrover_events.settings import Settings
from schemas import encode
from schemas.envelope import Event
from schemas.jobs import JobMeta, RuntimeSample
from streams.brain.runtime.app import Brain
from tests.conftest import REPO, EnvFactory
from tests.integration.brain.workload import job_events, plans_on, wait_for

pytestmark = pytest.mark.integration

JOBS = 6
PER_JOB = 50
KILLS = 4
SEED = 15
#: records per fetch: the killed brains take them in turn
BATCHES = (1, 7, 500, 5000)


def _input(env: str) -> list[Event]:
    """Jobs whose samples go to job.metrics and whose lifecycle and OOMs go to
    job.events, interleaved in time; OOMs every 5th report, on rotating nodes."""
    per_job = [
        job_events(env, JobMeta(uuid=f"job-{j}"), PER_JOB + 3 * j, oom_every=5) for j in range(JOBS)
    ]
    return [e for i in range(PER_JOB + 3 * JOBS) for job in per_job for e in job[i : i + 1]]


async def _publish(settings: Settings, env: str, events: list[Event]) -> None:
    async with Producer(settings) as producer:
        for event in events:
            assert event.key is not None
            name = JOB_METRICS if isinstance(event, RuntimeSample) else JOB_EVENTS
            await producer.send_raw(topic(env, name), encode(event), event.key.encode())


async def _run_to_end(
    settings: Settings, env: str, pg_dsn: str, total: int, batch_max: int | None = None
) -> None:
    brain = Brain(settings, env, pg_dsn, batch_max=batch_max)
    await brain.start()
    try:
        await wait_for(
            lambda: sum(brain.processor.offsets.values()) >= total,
            timeout_s=60,
            what=f"the brain of {env} to read all {total} records",
        )
    finally:
        await brain.stop()


async def _plans(settings: Settings, env: str) -> dict[str, set[str]]:
    """Each plan id with the bodies published under it (the env's name made neutral)."""
    out: dict[str, set[str]] = {}
    for name in (BRAIN_PLANS, SCALE_PLANS):
        for plan in await plans_on(settings, topic(env, name)):
            body = encode(plan).decode().replace(env, "<env>")
            out.setdefault(plan.plan_id, set()).add(body)
    return out


async def test_a_brain_killed_mid_stream_decides_what_one_run_decides(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    live = (await make_env(partitions=2)).name
    killed = (await make_env(partitions=2)).name
    events = _input(live)
    total = len(events)
    await _publish(settings, live, events)
    # the same records (same event ids, so the same plan ids) in the other env
    await _publish(settings, killed, [e.model_copy(update={"env": killed}) for e in events])

    await _run_to_end(settings, live, pg_dsn, total)
    want = await _plans(settings, live)
    assert len(want) > 20, "the input should make plans"

    points = sorted(random.Random(SEED).sample(range(total // 10, 9 * total // 10), KILLS))
    for kill, die_at in enumerate(points):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.integration.brain.kill_brain",
            settings.bootstrap_servers,
            pg_dsn,
            killed,
            str(die_at),
            str(BATCHES[kill % len(BATCHES)]),
            cwd=REPO,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            async with asyncio.timeout(60):
                out, _ = await proc.communicate()
        except TimeoutError:
            raise AssertionError(f"the brain did not reach offset {die_at} in 60 s") from None
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.returncode == -signal.SIGKILL, out.decode()
    await _run_to_end(settings, killed, pg_dsn, total)

    got = await _plans(settings, killed)
    assert set(got) - set(want) == set(), "plans the run in one go did not make"
    assert set(want) - set(got) == set(), "plans lost"
    differ = {p for p in want if got[p] != want[p]}
    assert differ == set(), f"{len(differ)} plans with another body"


async def test_fetches_of_1_7_500_and_5000_records_make_the_same_plans(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    envs = {size: (await make_env(partitions=2)).name for size in BATCHES}
    events = _input(envs[BATCHES[0]])
    total = len(events)
    for env in envs.values():
        await _publish(settings, env, [e.model_copy(update={"env": env}) for e in events])
    plans: dict[int, dict[str, set[str]]] = {}
    for size, env in envs.items():
        await _run_to_end(settings, env, pg_dsn, total, batch_max=size)
        plans[size] = await _plans(settings, env)
    assert len(plans[BATCHES[0]]) > 20, "the input should make plans"
    for size in BATCHES[1:]:
        assert plans[size] == plans[BATCHES[0]], f"fetches of {size} records decided otherwise"
