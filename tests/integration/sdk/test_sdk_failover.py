"""Failover as a running job sees it: after ``env promote`` its samples go to the new real env.

On the session's real broker and Postgres: a job reporting to the real env is promoted
away from while it trains; the events it made before the switch are in the old env's
topic, those after in the new one's, each exactly once. A job pinned to a virtual env, and
one pinned to the real env on purpose, stay where they were.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from dlrover_events.bus.topic_reader import read_topic
from dlrover_events.bus.topics import JOB_METRICS, topic
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.sdk import JobIdentity, Reporter
from dlrover_events.sdk.follow_real import FollowReal
from dlrover_events.settings import Settings
from schemas.codec import decode
from schemas.control import EnvMode
from schemas.jobs import JobMeta, RuntimeSample
from tests.conftest import EnvFactory

pytestmark = pytest.mark.integration


def train(reporters: list[Reporter], stop: threading.Event) -> None:
    while not stop.is_set():
        for r in reporters:
            r.step(samples=4)
        time.sleep(0.002)


async def samples_of(settings: Settings, env: str, job: str) -> dict[str, RuntimeSample]:
    records = await read_topic(settings, topic(env, JOB_METRICS), timeout_s=10)
    events = [decode(r.value) for r in records]
    return {e.event_id: e for e in events if isinstance(e, RuntimeSample) and e.key == job}


async def wait_for(what: str, predicate: object, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not within {timeout_s:.0f}s: {what}"
        await asyncio.sleep(0.05)


async def test_a_running_job_follows_the_promotion_and_pinned_jobs_stay(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    registry = EnvRegistry(settings, pg_dsn)
    old = await registry.real() or await make_env(mode=EnvMode.REAL)
    standby = await make_env()
    shadow = await make_env()

    def reporter(job: str, env: str, follow: FollowReal | None = None) -> Reporter:
        return Reporter(
            JobIdentity(job=JobMeta(uuid=job), env=env),
            settings=settings,
            interval_s=0.02,
            send_timeout_s=2.0,
            follow_real=follow,
        )

    follows = reporter(f"follows-{standby.name}", old.name)
    virtual = reporter(f"virtual-{standby.name}", shadow.name)
    pinned = reporter(f"pinned-{standby.name}", old.name, FollowReal.NEVER)
    reporters = [follows, virtual, pinned]
    stop = threading.Event()
    trainer = threading.Thread(target=train, args=(reporters, stop))
    for r in reporters:
        r.start()
    trainer.start()
    try:
        await wait_for("samples before the promotion", lambda: follows.stats().published >= 5)
        # Training goes on through the promotion: events are in flight as it lands.
        await registry.promote(standby.name, reason="sdk failover test")
        await wait_for("the reporter to follow", lambda: follows.stats().env == standby.name)
        switched_at = follows.stats().samples
        await wait_for(
            "samples after the switch", lambda: follows.stats().published >= switched_at + 5
        )
    finally:
        stop.set()
        trainer.join()
        finals = [await asyncio.to_thread(r.close, 10.0) for r in reporters]
        await registry.promote(old.name, reason="back")  # leave the session's real env as found

    final = finals[0]
    assert final.dropped == 0 and final.published == final.samples
    on_old = await samples_of(settings, old.name, f"follows-{standby.name}")
    on_new = await samples_of(settings, standby.name, f"follows-{standby.name}")
    # Each sample exactly once, in one env only, and the env its envelope names.
    assert not on_old.keys() & on_new.keys()
    assert len(on_old) + len(on_new) == final.samples
    assert {e.env for e in on_old.values()} == {old.name}
    assert {e.env for e in on_new.values()} == {standby.name}
    # A clean cut: everything before the switch in the old env, everything after in the new.
    assert max(e.global_step for e in on_old.values()) < min(e.global_step for e in on_new.values())
    assert len(on_new) >= 5

    for r, env, final_ in ((virtual, shadow.name, finals[1]), (pinned, old.name, finals[2])):
        job = r.identity.job.uuid
        assert final_.env == env and final_.dropped == 0
        assert len(await samples_of(settings, env, job)) == final_.samples
        assert await samples_of(settings, standby.name, job) == {}
