"""A brain killed with SIGKILL mid-stream and restarted: no plan id lost, none twice.

The killed brain had checkpointed part of its input, published plans after that
checkpoint, and left input unread. The restarted one resumes from the checkpoint, decides
the events after it again (same causes, same plan ids), does not publish again what the
dead one already had, and decides the rest. The oracle is the pure core run over the same
events without broker or database. All events of a job go to one topic here so that
their order, and so every decision, is the same in both runs.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections import Counter

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import BRAIN_PLANS, JOB_EVENTS, SCALE_PLANS, topic
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from schemas import encode
from schemas.jobs import JobMeta
from streams.brain.runtime.app import Brain
from tests.conftest import REPO, EnvFactory
from tests.integration.brain.workload import expected_plans, job_events, plans_on, wait_for

pytestmark = pytest.mark.integration

JOBS = 6
PER_JOB = 60


async def test_killed_brain_restarts_without_lost_or_duplicated_plans(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    env = (await make_env()).name
    per_job = [job_events(env, JobMeta(uuid=f"job-{j}"), PER_JOB) for j in range(JOBS)]
    events = [e for i in range(PER_JOB + 2) for job in per_job for e in job[i : i + 1]]
    want_optimize, want_scale = expected_plans(events)
    assert want_optimize and want_scale
    async with Producer(settings) as producer:
        for event in events:
            assert event.key is not None
            await producer.send_raw(topic(env, JOB_EVENTS), encode(event), event.key.encode())

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.integration.brain.crash_brain",
        settings.bootstrap_servers,
        pg_dsn,
        env,
        str(len(events) // 3),
        str(2 * len(events) // 3),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(120):
            while not any(line.startswith("paused at") for line in lines):
                raw = await proc.stdout.readline()
                assert raw, "the brain exited early:\n" + "".join(lines)
                lines.append(raw.decode())
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    assert any(line.startswith("checkpointed at") for line in lines), lines

    died_with = await plans_on(settings, topic(env, SCALE_PLANS))
    assert died_with, "the killed brain should have published plans"
    async with await EnvStore.open(pg_dsn, env) as store:
        recorded = await store.fetch("SELECT plan_id FROM scale_plans")
    # plans after the checkpoint were published but not recorded: the crash lost that part
    assert len(recorded) < len(died_with)

    brain = Brain(settings, env, pg_dsn)
    await brain.start()
    try:
        await wait_for(
            lambda: (
                sum(
                    n
                    for (t, _), n in brain.processor.offsets.items()
                    if t == topic(env, JOB_EVENTS)
                )
                >= len(events)
            ),
            timeout_s=120,
            what="the restarted brain to read every event",
        )
    finally:
        await brain.stop()

    for name, want, table in (
        (BRAIN_PLANS, want_optimize, "plans"),
        (SCALE_PLANS, want_scale, "scale_plans"),
    ):
        on_topic = Counter(p.plan_id for p in await plans_on(settings, topic(env, name)))
        assert {k: n for k, n in on_topic.items() if n > 1} == {}, f"duplicated on {name}"
        assert set(on_topic) == want, f"lost or unexpected on {name}"
        async with await EnvStore.open(pg_dsn, env) as store:
            rows = await store.fetch(f"SELECT plan_id FROM {table}")
        assert sorted(r["plan_id"] for r in rows) == sorted(want), f"{table} differs"
    assert brain.republish_skipped > 0  # it did meet plans the dead brain had published
