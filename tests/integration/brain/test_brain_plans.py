"""The brain on the real broker and Postgres: samples and an OOM in, the host-OOM plan and
its ScalePlan out (on the topics and in the env's tables), bad input dead-lettered, and a
restarted brain that resumes from its checkpoint instead of starting over."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import streams.brain.runtime.app as brain_app
from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topic_reader import read_topic
from dlrover_events.bus.topics import BRAIN_PLANS, DLQ, JOB_EVENTS, SCALE_PLANS, topic
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from schemas import decode
from schemas.config import ConfigChange, ConfigDocument
from schemas.dlq import DeadLetter, FailureKind
from schemas.jobs import JobMeta, JobStarted
from schemas.plans import OptimizePlan, ScalePlan
from streams.brain.core.optimizers.numeric import GiB
from streams.brain.core.planner import plan_id
from streams.brain.core.processor import Output
from streams.brain.core.state import JobState, JobStatus
from streams.brain.runtime.app import Brain
from tests.conftest import EnvFactory
from tests.integration.brain.workload import oom, plans_on, sample, submitted, wait_for

pytestmark = pytest.mark.integration


def handled(brain: Brain) -> int:
    c = brain.processor.counters
    return c.processed + c.dead_lettered + c.ignored + c.skipped


async def test_oom_gives_host_oom_plan_and_scale_plan(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    env = (await make_env()).name
    job = JobMeta(uuid="job-oom")
    the_oom = oom(env, job, 3, node=1)
    events = [
        submitted(env, job, workers=2),
        JobStarted(env=env, job=job),
        *(sample(env, job, i, workers=2) for i in range(3)),
        the_oom,
    ]
    async with Producer(settings) as producer:
        await producer.publish_many(events)
        await producer.send_raw(topic(env, JOB_EVENTS), b"{not json", job.uuid.encode())

    brain = Brain(settings, env, pg_dsn, checkpoint_every_s=0.2)
    await brain.start()
    try:
        await wait_for(lambda: handled(brain) >= len(events) + 1, what="the brain")
    finally:
        await brain.stop()

    optimize = await plans_on(settings, topic(env, BRAIN_PLANS))
    host_oom = [p for p in optimize if isinstance(p, OptimizePlan) and p.optimizer == "host-oom"]
    assert len(host_oom) == 1, optimize
    plan = host_oom[0]
    assert plan.caused_by == str(the_oom.event_id)
    assert plan.plan_id == plan_id(job.uuid, str(the_oom.event_id), "optimize")
    assert plan.reason == "host-oom: host OOM: worker-1 -> 24 GiB"
    # 16 GiB x 2, at most 8 GiB a step: 24 GiB, within the 64 GiB cap
    assert plan.resource.node_resources["worker-1"].memory == 24 * GiB
    assert set(plan.resource.node_resources) == {"worker-1"}  # never for nodes that did not OOM

    scales = [
        p
        for p in await plans_on(settings, topic(env, SCALE_PLANS))
        if isinstance(p, ScalePlan) and p.source_plan == plan.plan_id
    ]
    assert len(scales) == 1
    scale = scales[0]
    assert scale.plan_id == plan_id(job.uuid, str(the_oom.event_id), "scale")
    assert scale.key == job.uuid
    assert [(m.node.type, m.node.id, m.resource.memory) for m in scale.migrate_nodes] == [
        ("worker", 1, 24 * GiB)
    ]

    letters = [decode(r.value) for r in await read_topic(settings, topic(env, DLQ))]
    assert len(letters) == 1
    letter = letters[0]
    assert isinstance(letter, DeadLetter)
    assert letter.error_kind == FailureKind.MALFORMED
    assert letter.value_bytes() == b"{not json"
    assert letter.consumer_group == f"{env}.brain"

    async with await EnvStore.open(pg_dsn, env) as store:
        rows = await store.fetch("SELECT * FROM plans WHERE plan_id = $1", plan.plan_id)
        assert [(r["optimizer"], r["reason"], r["caused_by"]) for r in rows] == [
            ("host-oom", plan.reason, str(the_oom.event_id))
        ]
        rows = await store.fetch("SELECT * FROM scale_plans WHERE plan_id = $1", scale.plan_id)
        assert [r["source_plan"] for r in rows] == [plan.plan_id]
        rows = await store.fetch("SELECT state::text AS s FROM job_states")
        assert len(rows) == 1
        state = JobState.model_validate_json(rows[0]["s"])
        assert [r.handled for r in state.ooms["worker-1"]] == [True]
        offsets = await store.fetch(
            "SELECT topic, sum(next_offset) AS n FROM brain_offsets GROUP BY topic"
        )
        by_topic = {r["topic"]: r["n"] for r in offsets}
        assert by_topic[topic(env, JOB_EVENTS)] == 4  # submitted, started, OOM, the bad one


async def test_restarted_brain_resumes_from_its_checkpoint(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    env = (await make_env()).name
    job = JobMeta(uuid="job-resume")
    first = oom(env, job, 1, node=0)
    async with Producer(settings) as producer:
        await producer.publish_many(
            [submitted(env, job, workers=2), JobStarted(env=env, job=job), first]
        )
    brain = Brain(settings, env, pg_dsn)
    await brain.start()
    try:
        await wait_for(lambda: handled(brain) >= 3, what="the first brain")
    finally:
        await brain.stop()  # the final checkpoint

    # The same OOM again (a replaying producer) and a new OOM on the other node.
    second = oom(env, job, 2, node=1)
    async with Producer(settings) as producer:
        await producer.publish_many([first, second])
    brain = Brain(settings, env, pg_dsn)
    await brain.start()
    try:
        await wait_for(lambda: handled(brain) >= 2, what="the restarted brain")
        # it read only what came after the checkpoint, and knew the job without a replay:
        # the job's start and its first OOM came from the checkpoint, not from the topic
        assert brain.processor.counters.processed == 2
        state = brain.processor.states[job.uuid]
        assert state.status == JobStatus.RUNNING
        assert {k: [r.handled for r in rs] for k, rs in state.ooms.items()} == {
            "worker-0": [True],
            "worker-1": [True],
        }
    finally:
        await brain.stop()

    plans = [
        p
        for p in await plans_on(settings, topic(env, BRAIN_PLANS))
        if isinstance(p, OptimizePlan) and p.optimizer == "host-oom"
    ]
    assert [p.caused_by for p in plans] == [str(first.event_id), str(second.event_id)]


async def test_the_config_service_names_a_jobs_optimizer(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    """A document for alice's jobs names an optimizer the brain does not know: her job's
    decisions fail with that name (so the router read the document), bob's do not."""
    env = (await make_env()).name
    doc = ConfigDocument(
        name="alice", include={"user": "alice"}, configure={"optimizer": "no-such-optimizer"}
    )
    alice, bob = JobMeta(uuid="job-alice", user="alice"), JobMeta(uuid="job-bob", user="bob")
    events = [
        e
        for job in (alice, bob)
        for e in (submitted(env, job, workers=2), JobStarted(env=env, job=job))
    ]
    async with Producer(settings) as producer:
        await producer.publish(
            ConfigChange(env=env, op="upsert", name="alice", version=1, document=doc)
        )
        await producer.publish_many(events)

    brain = Brain(settings, env, pg_dsn)
    await brain.start()
    try:
        await wait_for(lambda: handled(brain) >= len(events), what="the brain")
    finally:
        await brain.stop()

    letters = [decode(r.value) for r in await read_topic(settings, topic(env, DLQ))]
    assert [letter.key for letter in letters] == ["job-alice"]
    assert isinstance(letters[0], DeadLetter)
    assert letters[0].error.startswith(
        "brain: unknown_optimizer: unknown optimizer 'no-such-optimizer'; known: goodput"
    )
    # both were decided on: bob's without an error
    assert brain.processor.counters.decisions >= 4 and brain.processor.counters.errors >= 1


async def _oom_of_a_new_job(settings: Settings, env: str, uuid: str) -> JobMeta:
    """A job submitted with 2 workers and started, whose worker 0 runs out of memory."""
    job = JobMeta(uuid=uuid)
    async with Producer(settings) as producer:
        await producer.publish_many(
            [submitted(env, job, workers=2), JobStarted(env=env, job=job), oom(env, job, 1, node=0)]
        )
    return job


class _BrokenCourier(Brain):
    """A brain whose publishing fails for good once the OOM's plans are due (`_publish`
    raising what `_deliver`'s retries would not: a bug, the producer gone)."""

    async def _publish(self, out: Output) -> None:
        if out.plans:
            raise RuntimeError("the producer is gone")
        await super()._publish(out)


async def test_plans_not_published_are_never_checkpointed_and_stop_the_brain(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    env = (await make_env()).name
    job = await _oom_of_a_new_job(settings, env, "job-courier")
    brain = _BrokenCourier(settings, env, pg_dsn, checkpoint_every_s=3600)
    await brain.start()
    try:
        await wait_for(lambda: brain.processor.counters.scale_plans >= 1, what="the OOM's plans")
        with pytest.raises(RuntimeError, match="stopped publishing"):
            await brain.checkpoint()
        # more input: the brain stops rather than decide on without publishing
        async with Producer(settings) as producer:
            await producer.publish(sample(env, job, 5, workers=2))
        with pytest.raises(RuntimeError, match="crashed"):
            await asyncio.wait_for(brain.run_until(asyncio.Event()), timeout=60)
    finally:
        await brain.stop()
    async with await EnvStore.open(pg_dsn, env) as store:
        # nothing covers the batch with the plans: a restart decides it again
        assert await store.fetch("SELECT * FROM brain_offsets") == []
        assert await store.fetch("SELECT plan_id FROM scale_plans") == []
    assert await plans_on(settings, topic(env, SCALE_PLANS)) == []


class _HeldCourier(Brain):
    """A brain whose courier holds the first plans it has until let go (a broker slow
    to ack them)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.holding = asyncio.Event()
        self.let_go = asyncio.Event()

    async def _publish(self, out: Output) -> None:
        if out.plans:
            self.holding.set()
            await self.let_go.wait()
        await super()._publish(out)


async def test_a_checkpoint_holds_the_stream_until_the_courier_has_published(
    settings: Settings, pg_dsn: str, make_env: EnvFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The catch-up wait gives up (at once here); the checkpoint then holds the stream and
    waits for the courier, however long: its offsets never cover plans not published."""
    monkeypatch.setattr(brain_app, "CATCH_UP_S", 0.01)
    env = (await make_env()).name
    await _oom_of_a_new_job(settings, env, "job-held")
    brain = _HeldCourier(settings, env, pg_dsn, checkpoint_every_s=3600)
    await brain.start()
    try:
        await asyncio.wait_for(brain.holding.wait(), timeout=60)
        before = brain.checkpoints
        checkpoint = asyncio.create_task(brain.checkpoint())
        await asyncio.sleep(0.5)  # far longer than the catch-up wait, and than a save
        assert not checkpoint.done()
        async with await EnvStore.open(pg_dsn, env) as store:
            assert await store.fetch("SELECT * FROM brain_offsets") == []
        brain.let_go.set()
        await asyncio.wait_for(checkpoint, timeout=60)
        assert brain.checkpoints == before + 1
        async with await EnvStore.open(pg_dsn, env) as store:
            offsets = await store.fetch(
                "SELECT sum(next_offset) AS n FROM brain_offsets WHERE topic = $1",
                topic(env, JOB_EVENTS),
            )
            assert offsets[0]["n"] == 3  # submitted, started, the OOM
            recorded = {r["plan_id"] for r in await store.fetch("SELECT plan_id FROM plans")}
        # every plan the checkpoint recorded was on the topic before it
        published = {p.plan_id for p in await plans_on(settings, topic(env, BRAIN_PLANS))}
        assert recorded and recorded <= published
    finally:
        brain.let_go.set()
        await brain.stop()
