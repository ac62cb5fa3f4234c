"""A revocation never waits for good on a brain stuck on its broker (issue 37: after kill -9
of `up`'s broker, a standalone brain hung in a revoke, `_checkpoint_held` waiting for its
locks, and its operator waited for its BarrierAck for good).

A revocation checkpoints with the stream held: it takes the checkpoint's lock and the
stream's, and waits for the courier to publish what was decided. Whoever holds them may be
waiting on a broker that died: a checkpoint holds both while it waits for the courier, the
courier retries a publication until the broker is back, and until then faust's rebalance,
and every member of the group, waits for the revocation.

The moment the hang needs is not one a live kill hits on cue (the restarted broker answers
the courier before the rebalance is done, in every try here), so the test makes it: a
brain whose publications stop returning once asked (`_publish`, the courier's one step,
stands for a broker that took them and died) while a second brain joins its group, a real
rebalance on the real broker. Before the fix, the first brain's revocation waited for good
(with it the second brain's assignment). Now it gives up within `REVOKE_WAIT_S`, says so,
and asks to be started again (`rewind`, what `brain` and `up` do); the second brain then
publishes the plans the first one never did, and decides a new job."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

import streams.brain.runtime.app as brain_app
from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import JOB_EVENTS, SCALE_PLANS, topic
from dlrover_events.settings import Settings
from schemas import encode
from schemas.jobs import JobMeta
from streams.brain.core.processor import Output
from streams.brain.runtime.app import Brain
from tests.conftest import EnvFactory
from tests.integration.brain.workload import expected_plans, job_events, plans_on

pytestmark = pytest.mark.integration

#: generous: a loaded 2-core machine, a group formed twice
WAIT_S = 180.0


class _BrokerGone(Brain):
    """A brain whose publications never return once `gone` is set (a broker that died
    under its courier); `revoked_once`: a revocation of its returned."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gone = asyncio.Event()
        self.stuck = asyncio.Event()
        self.revoked_once = asyncio.Event()

    async def _publish(self, out: Output) -> None:
        if self.gone.is_set():
            self.stuck.set()
            await asyncio.Event().wait()  # for good (cancelled when the brain stops)
        await super()._publish(out)

    async def _on_revoked(self, sender: Any, *args: Any, **kwargs: Any) -> None:
        await super()._on_revoked(sender, *args, **kwargs)
        if args and args[0]:
            self.revoked_once.set()


async def _publish(settings: Settings, env: str, job: str) -> set[str]:
    """One job's events; the ScalePlan ids they make."""
    events = job_events(env, JobMeta(uuid=job), 20)
    async with Producer(settings) as producer:
        for event in events:
            assert event.key is not None
            await producer.send_raw(topic(env, JOB_EVENTS), encode(event), event.key.encode())
    _, scale = expected_plans(events)
    assert scale
    return scale


async def _published(settings: Settings, env: str, want: set[str], what: str) -> set[str]:
    """Wait until every plan of `want` is on the env's scale plans; all of them there."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while True:
        got = {p.plan_id for p in await plans_on(settings, topic(env, SCALE_PLANS))}
        if want <= got:
            return got
        if loop.time() > deadline:
            raise AssertionError(f"{what}: {len(want - got)} of {len(want)} plans missing")
        await asyncio.sleep(0.5)


async def test_a_revocation_gives_up_on_a_brain_stuck_on_its_broker(
    settings: Settings,
    pg_dsn: str,
    make_env: EnvFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(brain_app, "REVOKE_WAIT_S", 5.0)  # (the default is 30 s)
    caplog.set_level(logging.WARNING, logger="streams.brain")
    env = (await make_env(partitions=2)).name
    first = _BrokerGone(settings, env, pg_dsn, checkpoint_every_s=0.5)
    second: Brain | None = None
    joining: asyncio.Task[None] | None = None
    stopped = False
    await first.start()
    try:
        before = await _publish(settings, env, "job-before")
        await _published(settings, env, before, "the first brain, before")
        # its broker dies under its courier as it publishes the next job's plans
        first.gone.set()
        unpublished = await _publish(settings, env, "job-stuck")
        await asyncio.wait_for(first.stuck.wait(), WAIT_S)
        # a member joins: the group rebalances, and the first brain's revocation begins
        # (faust's start of the second brain waits for the rebalance, and so for it)
        second = Brain(settings, env, pg_dsn, checkpoint_every_s=0.5)
        joining = asyncio.create_task(second.start())
        # it ends: without a checkpoint, the first brain asking to be started again
        try:
            await asyncio.wait_for(first.revoked_once.wait(), WAIT_S)
        except TimeoutError:
            raise AssertionError(
                f"the first brain's revocation did not end within {WAIT_S:g} s: the group's "
                "rebalance, and the second brain's start, wait for it"
            ) from None
        await joining
        assert first.rewind.is_set() and first.halted
        said = [r.getMessage() for r in caplog.records if "took over" in r.getMessage()]
        assert any(f"brain of {env}: handing partitions" in m for m in said), said
        await first.stop()  # what `brain` and `up` do then (and start it again)
        stopped = True

        # the second brain resumes from the last checkpoint: what the first one decided
        # and never published is published now, and a new job is decided
        await _published(settings, env, unpublished, "the plans the first brain never published")
        after = await _publish(settings, env, "job-after")
        got = await _published(settings, env, after, "the second brain, after")
        assert got == before | unpublished | after
    finally:
        if not stopped:
            await first.stop()
        if joining is not None and not joining.done():
            joining.cancel()  # (a failed run: its start never ended)
        elif second is not None:
            await second.stop()
