"""Retention on real Postgres: finished jobs past the retention are cut to tombstones with
their sample chunks deleted, tombstones past their own bound are deleted, nothing else is
touched, and a brain loading the checkpoint afterwards ignores a pruned job's late
events instead of starting it again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore, connect, env_schema, prepare_env
from dlrover_events.store.database import quote_ident
from schemas import encode
from schemas.env_settings import BrainSettings
from schemas.jobs import JobCompleted, JobMeta, JobStarted
from streams.brain.core.folds import fold
from streams.brain.core.policy import Policy
from streams.brain.core.processor import BrainProcessor
from streams.brain.core.sample_structs import JobRef
from streams.brain.core.samples import Sample, SampleRead
from streams.brain.core.snapshot import Snapshot
from streams.brain.core.state import JobState, JobStatus
from streams.brain.runtime.app import Brain
from streams.brain.runtime.checkpoint import BrainStore
from streams.brain.runtime.retention import Pruned, Pruner, prune
from tests.conftest import EnvFactory, unique_env
from tests.unit.brain.builders import Rec

pytestmark = pytest.mark.integration

T0 = datetime(2026, 1, 1, tzinfo=UTC)
DAY = timedelta(days=1)
MINE, OTHER = 1, 2
TOPIC = "t"
RULES = BrainSettings(retention_s=7 * 86400, tombstone_s=30 * 86400, max_tombstones=100)


@pytest.fixture
async def store(pg_dsn: str) -> AsyncIterator[EnvStore]:
    """An env's schema, migrated, without a broker or the env registry."""
    env = unique_env("ret")
    conn = await connect(pg_dsn)
    try:
        await conn.execute(f"CREATE SCHEMA {quote_ident(env_schema(env))}")
    finally:
        await conn.close()
    await prepare_env(pg_dsn, env)
    async with await EnvStore.open(pg_dsn, env) as opened:
        yield opened
    conn = await connect(pg_dsn)
    try:
        await conn.execute(f"DROP SCHEMA {quote_ident(env_schema(env))} CASCADE")
    finally:
        await conn.close()


def job(env: str, uuid: str, samples: int, ended: datetime | None) -> JobState:
    """A job with `samples` samples, finished at `ended` (running if None)."""
    state = JobState(env=env, job=JobMeta(uuid=uuid, scenario="s"))
    for n in range(samples):
        at = T0 + timedelta(seconds=15 * n)
        read = SampleRead(
            env=env,
            job=JobRef(uuid=uuid),
            occurred_at=at,
            sample=Sample(event_id=f"{uuid}-s{n}", at=at, global_step=n),
        )
        folded = fold(state, read)
        assert folded is not None
        state = folded
    if ended is not None:
        state = state.model_copy(update={"status": JobStatus.COMPLETED, "completed_at": ended})
    return state


async def rows(store: EnvStore) -> dict[str, JobState]:
    found = await store.fetch("SELECT job_uuid, state::text AS state FROM job_states")
    return {r["job_uuid"]: JobState.model_validate_json(r["state"]) for r in found}


async def chunks(store: EnvStore) -> set[str]:
    found = await store.fetch("SELECT DISTINCT job_uuid FROM job_sample_chunks")
    return {r["job_uuid"] for r in found}


async def test_prune_cuts_old_finished_jobs_to_tombstones_and_deletes_old_tombstones(
    store: EnvStore,
) -> None:
    env = store.env
    now = T0 + 100 * DAY
    states = {
        "running": (MINE, job(env, "running", 5, None)),
        "recent": (MINE, job(env, "recent", 5, now - 6 * DAY)),
        "old": (MINE, job(env, "old", 5, now - 8 * DAY)),
        "ancient": (MINE, job(env, "ancient", 5, now - 40 * DAY)),
        "other-old": (OTHER, job(env, "other-old", 5, now - 8 * DAY)),  # not this brain's
    }
    await BrainStore(store).save(Snapshot(states=states))
    assert await chunks(store) == set(states)

    chosen, done = await prune(store, [MINE], now, RULES)
    assert (chosen.tombstone, chosen.delete) == (("old",), ("ancient",))
    assert done == Pruned(tombstones=1, deleted=1)
    after = await rows(store)
    assert set(after) == {"running", "recent", "old", "other-old"}
    assert await chunks(store) == {"running", "recent", "other-old"}
    for untouched in ("running", "recent", "other-old"):  # as they were, samples aside
        assert after[untouched] == states[untouched][1].model_copy(update={"samples": []})
    tombstone = after["old"]
    assert tombstone == JobState(
        env=env,
        job=JobMeta(uuid="old", scenario="s"),
        status=JobStatus.COMPLETED,
        completed_at=now - 8 * DAY,
        pruned_at=now,
    )

    # again at the same time: nothing more; once 30 more days have passed, it goes too
    chosen, done = await prune(store, [MINE], now, RULES)
    assert not chosen and done == Pruned()
    chosen, done = await prune(store, [MINE], now + 30 * DAY, RULES)
    assert chosen.delete == ("old",) and chosen.tombstone == ("recent",)
    assert set(await rows(store)) == {"running", "recent", "other-old"}


async def test_a_restarted_brain_ignores_a_pruned_jobs_late_events(store: EnvStore) -> None:
    env = store.env
    done_at = T0 + DAY
    states = {
        "gone": (MINE, job(env, "gone", 3, done_at)),
        "live": (MINE, job(env, "live", 3, None)),
    }
    await BrainStore(store).save(Snapshot(states=states, offsets={(TOPIC, MINE): 10}))

    # the brain that pruned it: its clock is its event time, never the wall clock's future
    processor = BrainProcessor(env, "g", Policy(RULES))
    processor.install(
        [MINE], await BrainStore(store).load([MINE], [TOPIC], history_per_scenario=50)
    )
    pruner = Pruner(store, processor)
    wall = T0 + 365 * DAY
    assert await pruner.maybe_prune(wall) is None  # no event decided yet: no clock
    late = JobStarted(env=env, job=JobMeta(uuid="live"), occurred_at=done_at + 10 * DAY)
    processor.process([Rec(TOPIC, MINE, 10, b"live", encode(late))])
    assert await pruner.maybe_prune(wall) == Pruned(tombstones=1)  # as of T0 + 11 days
    assert await pruner.maybe_prune(wall) is None  # at most once per every_s
    assert "gone" not in await chunks(store)

    # a restart: the pruned job is loaded as finished, and its late events are ignored
    restarted = BrainProcessor(env, "g", Policy(RULES))
    loaded = await BrainStore(store).load([MINE], [TOPIC], history_per_scenario=50)
    assert loaded.finished == {"gone": MINE}
    restarted.install([MINE], loaded)
    assert "s" not in restarted._history  # a tombstone is no history
    for offset, event in enumerate(
        [
            JobStarted(env=env, job=JobMeta(uuid="gone"), occurred_at=done_at + 20 * DAY),
            JobCompleted(env=env, job=JobMeta(uuid="gone"), occurred_at=done_at + 20 * DAY),
        ],
        start=11,
    ):
        restarted.process([Rec(TOPIC, MINE, offset, b"gone", encode(event))])
    assert "gone" not in restarted.states and restarted.counters.late == 2
    assert restarted.snapshot().states == {}  # nothing of it is written again


async def test_a_failed_prune_is_logged_and_tried_again_not_raised(
    store: EnvStore, caplog: pytest.LogCaptureFixture
) -> None:
    processor = BrainProcessor(store.env, "g", Policy(BrainSettings(prune_every_s=1e-9)))
    processor.install([MINE], await BrainStore(store).load([MINE], [TOPIC], history_per_scenario=1))
    late = JobStarted(env=store.env, job=JobMeta(uuid="j"), occurred_at=T0)
    processor.process([Rec(TOPIC, MINE, 0, b"j", encode(late))])
    await store.pool.execute("ALTER TABLE job_states RENAME TO job_states_away")
    pruner = Pruner(store, processor)
    assert await pruner.maybe_prune() is None
    assert "retention: pruning finished jobs failed" in caplog.text
    await store.pool.execute("ALTER TABLE job_states_away RENAME TO job_states")
    assert await pruner.maybe_prune() == Pruned()  # the next one, once due, works


async def tombstone_of(store: EnvStore, uuid: str) -> JobState:
    while True:
        found = (await rows(store)).get(uuid)
        if found is not None and found.pruned_at is not None:
            return found
        await asyncio.sleep(0.2)


async def test_a_running_brain_prunes_at_its_checkpoints(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    """The brain's checkpoint loop runs the pruner: a job that finished longer ago (on
    the brain's event time) than the retention becomes a tombstone by itself."""
    env = (await make_env(partitions=1)).name
    done, later = JobMeta(uuid="done"), JobMeta(uuid="later")
    rules = BrainSettings(retention_s=60, tombstone_s=86400, max_tombstones=10, prune_every_s=0.1)
    async with Producer(settings) as producer:
        await producer.publish_many(
            [
                JobStarted(env=env, job=done, occurred_at=T0),
                JobCompleted(env=env, job=done, occurred_at=T0 + timedelta(seconds=1)),
                # the brain's clock moves past the retention with the next job's events
                JobStarted(env=env, job=later, occurred_at=T0 + DAY),
            ]
        )
    brain = Brain(settings, env, pg_dsn, policy=Policy(rules), checkpoint_every_s=0.2)
    await brain.start()
    try:
        async with await EnvStore.open(pg_dsn, env) as store, asyncio.timeout(30):
            found = await tombstone_of(store, "done")
        assert found.status == JobStatus.COMPLETED
        assert found.pruned_at == T0 + DAY  # the brain's event time, not the wall clock's
    finally:
        await brain.stop()
