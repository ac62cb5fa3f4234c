"""The brain's checkpoint on real Postgres: a job's samples go apart from its state, as
chunks of what is new, and read back as the job's window whoever wrote them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from schemas.jobs import JobCompleted, JobFailed, JobMeta, JobStarted, JobSubmitted
from streams.brain.core.folds import fold
from streams.brain.core.processor import BrainProcessor
from streams.brain.core.sample_structs import JobRef
from streams.brain.core.samples import Sample, SampleRead
from streams.brain.core.snapshot import Loaded, Snapshot
from streams.brain.core.state import MAX_SAMPLES, JobState
from streams.brain.core.state_json import state_json
from streams.brain.runtime.app import Brain
from streams.brain.runtime.checkpoint import BrainStore
from tests.conftest import EnvFactory
from tests.integration.brain.workload import sample, submitted, wait_for

pytestmark = pytest.mark.integration

T0 = datetime(2026, 1, 1, tzinfo=UTC)
JOB = "job-1"
PARTITION = 1
TOPICS = ["t"]
HISTORY = 50


def _more(state: JobState, count: int) -> JobState:
    """`count` more runtime samples of the job, folded as the processor folds them."""
    seen = len(state.samples) and int(state.samples[-1].event_id.split("-")[1]) + 1
    for n in range(seen, seen + count):
        at = T0 + timedelta(seconds=15 * n)
        sample = Sample(event_id=f"s-{n}", at=at, global_step=n)
        read = SampleRead(env=state.env, job=JobRef(uuid=JOB), occurred_at=at, sample=sample)
        folded = fold(state, read)
        assert folded is not None
        state = folded
    return state


async def _load(brain: BrainStore) -> Loaded:
    return await brain.load([PARTITION], TOPICS, history_per_scenario=HISTORY)


async def _loaded(store: EnvStore) -> JobState:
    partition, state = (await _load(BrainStore(store))).states[JOB]
    assert partition == PARTITION
    return state


async def _chunk_sizes(store: EnvStore) -> list[int]:
    rows = await store.fetch(
        "SELECT jsonb_array_length(samples) AS n FROM job_sample_chunks ORDER BY seq"
    )
    return [r["n"] for r in rows]


def _snapshot(state: JobState, offset: int = 0) -> Snapshot:
    return Snapshot(states={JOB: (PARTITION, state)}, offsets={("t", PARTITION): offset})


async def test_each_checkpoint_writes_only_the_new_samples(
    pg_dsn: str, make_env: EnvFactory
) -> None:
    env = (await make_env()).name
    state = JobState(env=env, job=JobMeta(uuid=JOB))
    async with await EnvStore.open(pg_dsn, env) as store:
        brain = BrainStore(store)
        for count, chunks in (
            (5, [5]),
            (0, [5]),  # nothing new: nothing written
            (30, [5, 30]),
            (MAX_SAMPLES - 35, [5, 30, MAX_SAMPLES - 35]),
            (1, [5, 30, MAX_SAMPLES - 35, 1]),  # the window still needs 4 of the first
            (4, [30, MAX_SAMPLES - 35, 1, 4]),  # ... and now none of them
            (MAX_SAMPLES + 7, [MAX_SAMPLES]),  # more than the window: written whole
        ):
            state = _more(state, count)
            await brain.save(_snapshot(state))
            assert await _chunk_sizes(store) == chunks
            assert await _loaded(store) == state
        assert len(state.samples) == MAX_SAMPLES
        inline = await store.pool.fetchval("SELECT state ? 'samples' FROM job_states")
        assert inline is False


async def test_a_checkpoint_from_before_chunks_reads_back_and_moves_to_chunks(
    pg_dsn: str, make_env: EnvFactory
) -> None:
    env = (await make_env()).name
    state = _more(JobState(env=env, job=JobMeta(uuid=JOB)), 10)
    async with await EnvStore.open(pg_dsn, env) as store:
        await store.pool.execute(
            "INSERT INTO job_states (job_uuid, partition, state) VALUES ($1, $2, $3::text::jsonb)",
            JOB,
            PARTITION,
            state_json(state),
        )
        brain = BrainStore(store)
        assert (await brain.load([PARTITION], TOPICS, history_per_scenario=HISTORY)).states[JOB][
            1
        ] == state
        state = _more(state, 2)
        await brain.save(_snapshot(state))
        assert await _chunk_sizes(store) == [12]
        assert await _loaded(store) == state


async def test_instances_taking_turns_at_a_job_keep_its_window(
    pg_dsn: str, make_env: EnvFactory
) -> None:
    """A partition that moves to another brain and back: each resumes from what
    Postgres holds, not from what it wrote itself the last time it had the job."""
    env = (await make_env()).name
    state = JobState(env=env, job=JobMeta(uuid=JOB))
    async with await EnvStore.open(pg_dsn, env) as store:
        first, second = BrainStore(store), BrainStore(store)
        state = _more(state, 20)
        await first.save(_snapshot(state))
        for owner, count in ((second, 25), (first, 3), (second, 50), (first, 1)):
            first.forget([PARTITION])  # revoked from the one, assigned to the other
            resumed = (await owner.load([PARTITION], TOPICS, history_per_scenario=HISTORY)).states[
                JOB
            ][1]
            assert resumed == state
            state = _more(resumed, count)
            await owner.save(_snapshot(state))
        assert await _loaded(store) == state
        assert sum(await _chunk_sizes(store)) < len(state.samples) + MAX_SAMPLES


def _ended(env: str, n: int, scenario: str, *, failed: bool = False) -> JobState:
    """A job of `scenario` that ran and then completed (or failed) `n` minutes after T0."""
    how = "failed" if failed else "ended"
    job = JobMeta(uuid=f"{how}-{scenario or 'none'}-{n}", scenario=scenario)
    state: JobState | None = None
    end = JobFailed if failed else JobCompleted
    for event in (
        JobSubmitted(env=env, job=job, occurred_at=T0),
        JobStarted(env=env, job=job, occurred_at=T0),
        end(env=env, job=job, occurred_at=T0 + timedelta(minutes=n)),
    ):
        state = fold(state, event)
    assert state is not None
    return state


async def test_a_load_reads_whole_only_running_jobs_and_the_history(
    pg_dsn: str, make_env: EnvFactory
) -> None:
    """Finished jobs are named, not read, except the newest completed ones of each scenario
    (the history-based optimizers' history), remembered oldest first as when they ended."""
    env = (await make_env()).name
    running = _more(JobState(env=env, job=JobMeta(uuid=JOB, scenario="a")), 3)
    # completed in an order that is not their end times' order
    ended = [_ended(env, n, "a") for n in reversed(range(HISTORY + 10))]
    ended += [_ended(env, n, "b") for n in range(3)]
    ended += [_ended(env, n, "") for n in range(2)]  # no scenario: no history
    ended += [_ended(env, n, "a", failed=True) for n in range(4)]
    states = {s.job.uuid: (PARTITION, s) for s in [running, *ended]}
    assert len(states) == 1 + len(ended)
    async with await EnvStore.open(pg_dsn, env) as store:
        await BrainStore(store).save(Snapshot(states=states))
        loaded = await _load(BrainStore(store))

    newest_a = [f"ended-a-{n}" for n in range(10, HISTORY + 10)]
    newest_b = [f"ended-b-{n}" for n in range(3)]
    assert list(loaded.states) == [JOB, *newest_b, *newest_a]  # running, then by end time
    assert loaded.states[JOB] == (PARTITION, running)
    assert loaded.finished == {s.job.uuid: PARTITION for s in ended}

    processor = BrainProcessor(env, "g")
    processor.install([PARTITION], loaded)
    assert set(processor.states) == {JOB}
    assert set(processor.finished) == {s.job.uuid for s in ended}
    assert [s.job.uuid for s in processor._history["a"]] == newest_a
    assert [s.job.uuid for s in processor._history["b"]] == newest_b


async def test_a_brain_gives_an_older_env_the_tables_it_writes(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    """An env made before job_sample_chunks existed gets it when its brain starts, and
    the brain checkpoints into it."""
    env = (await make_env()).name
    async with await EnvStore.open(pg_dsn, env) as store:
        await store.pool.execute(
            "DROP TABLE job_sample_chunks; DELETE FROM schema_migrations WHERE version = 4"
        )
        assert "job_sample_chunks" not in await store.tables()
        brain = Brain(settings, env, pg_dsn, checkpoint_every_s=3600)
        await brain.start()
        try:
            assert "job_sample_chunks" in await store.tables()
            job = JobMeta(uuid=JOB)
            async with Producer(settings) as producer:
                await producer.publish_many(
                    [submitted(env, job), *(sample(env, job, i) for i in range(3))]
                )
            await wait_for(lambda: brain.processor.counters.processed >= 4, what="the samples")
            await brain.checkpoint()
            assert await _chunk_sizes(store) == [3]
        finally:
            await brain.stop()
