"""The checkpoint catalog, retention and the model registry on real parts: the tansu broker,
Postgres, the experiments recorder and the checkpoints service, and an S3 server (moto's
server mode) holding the checkpoints' files.

Jobs' CheckpointCommitted events are published as a job's rank 0 publishes them (the
SDK's side is tested on its own); the service records each once (a redelivered event adds
nothing), applies Determined's policy (the latest of each trial, the best of each trial
and of the experiment by the searcher's metric), deletes from S3 exactly what it no longer
keeps, says so with a CheckpointDeleted, and never deletes a checkpoint a model version
references. The best trial of the experiment is registered as a model version with
`model register --best`, and `model describe` shows its lineage: the job, trial and
experiment, the hyperparameters, the plans it trained under."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import CHECKPOINTS
from dlrover_events.checkpoints.store import CheckpointStore
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from dlrover_events.store import create_pool, env_schema
from schemas.checkpoints import CheckpointDeleted, DeletionReason
from schemas.experiments import DecisionKind, ExperimentSpec, ExperimentSubmitted
from streams.checkpoints import service
from streams.checkpoints.service import CheckpointsSettings, Tally
from streams.searcher import recorder
from tests.conftest import EnvFactory, run_cli
from tests.integration.checkpoints.conftest import BUCKET, S3, committed
from tests.integration.experiments.test_recorder import told
from tests.integration.tap import Tap
from tests.unit.experiments.documents import document

pytestmark = pytest.mark.integration

SWEEP = "ck-sweep"
#: trial -> (its learning rate, {step: validation loss at that checkpoint})
TRIALS = {0: (0.01, {10: 0.9, 20: 0.3, 30: 0.6}), 1: (0.1, {10: 0.5, 20: 0.4, 30: 0.8})}
#: the plan in force at each step of trial 0: p-a up to 20 at world size 4, then p-b at 2
PLANS = {10: ("p-a", 4), 20: ("p-a", 4), 30: ("p-b", 2)}


async def until(ok: Callable[[], Awaitable[Any]], what: str, within: float = 30) -> Any:
    try:
        async with asyncio.timeout(within):
            while True:
                if found := await ok():
                    return found
                await asyncio.sleep(0.1)
    except TimeoutError:
        pytest.fail(f"no {what} within {within:.0f} s")


async def test_catalog_retention_on_s3_and_the_registry(
    settings: Settings, pg_dsn: str, make_env: EnvFactory, s3: S3
) -> None:
    env = (await make_env()).name
    tally = Tally()
    own = CheckpointsSettings(
        save_experiment_best=1, save_trial_best=1, save_trial_latest=1, storage_options=s3.options
    )
    ctx = ServiceContext(settings, env, pg_dsn)
    checkpoints = asyncio.create_task(service.run(ctx, own, tally))
    recording = asyncio.create_task(recorder.run(ctx))
    pool = await create_pool(pg_dsn, env_schema(env), max_size=2)
    store = CheckpointStore(pool)
    tap = Tap(settings, env, (CHECKPOINTS,))
    await tap.start()

    async def cli(*args: str) -> tuple[int, str, str]:
        return await run_cli(settings, pg_dsn, *args, "--env", env)

    async def state_of(checkpoint_id: str) -> str:
        return str(await pool.fetchval(
            "SELECT state FROM checkpoints WHERE checkpoint_id = $1", checkpoint_id
        ))  # fmt: skip

    try:
        async with Producer(settings) as producer:
            # the experiment and its trials' hyperparameters, as the searcher told them
            spec = ExperimentSpec.model_validate(document(SWEEP)["spec"])
            await producer.publish_many(
                [
                    ExperimentSubmitted(env=env, experiment=SWEEP, spec=spec),
                    *(
                        told(env, SWEEP, t, DecisionKind.CREATE, t, hparams={"lr": lr},
                             budget=30, rung=0)
                        for t, (lr, _) in TRIALS.items()
                    ),
                ]
            )  # fmt: skip
            # retention ranks a trial's checkpoints by the experiment's metric: recorded first
            await until(
                lambda: pool.fetchval(
                    "SELECT spec IS NOT NULL FROM experiments WHERE name = $1", SWEEP
                ),
                "the experiment recorded",
            )

            # a job outside any experiment: its first checkpoint registered as a model
            # before its later ones come, so retention must keep it
            plain = "plain-job"
            url1 = f"s3://{BUCKET}/{plain}/step-1"
            size = s3.write_checkpoint(f"{plain}/step-1")
            first = committed(env, plain, 1, url=url1, size=size)
            await producer.publish(first)
            await until(lambda: store.checkpoints(job=plain), "the first checkpoint recorded")
            pinned = await store.register("plain-model", "plain-job-1", notes="pinned")
            assert pinned["version"]["checkpoint"]["url"] == url1
            for step in (2, 3):
                s3.write_checkpoint(f"{plain}/step-{step}")
                await producer.publish(
                    committed(env, plain, step, url=f"s3://{BUCKET}/{plain}/step-{step}")
                )

            # the trials' checkpoints, each with its validation loss and its plan
            for trial, (_, losses) in TRIALS.items():
                job = f"{SWEEP}-t{trial}"
                for step, loss in losses.items():
                    s3.write_checkpoint(f"{job}/step-{step}")
                    plan, world = PLANS[step] if trial == 0 else (None, 2)
                    await producer.publish(
                        committed(
                            env, job, step, url=f"s3://{BUCKET}/{job}/step-{step}",
                            experiment=SWEEP, trial=trial, metrics={"val_loss": loss},
                            plan_id=plan, world_size=world,
                        )
                    )  # fmt: skip
            # a redelivery (the same event again) and a retry (the same id) add nothing
            await producer.publish(first)
            await producer.publish(first.model_copy(update={"event_id": uuid.uuid4()}))

        # what retention no longer keeps: the older of the plain job's (not the pinned
        # one), the first of each trial (neither its latest nor its best)
        gone = {"plain-job-2", f"{SWEEP}-t0-10", f"{SWEEP}-t1-10"}
        deletions = await tap.until(
            lambda: {e.checkpoint_id for e in tap.of(CheckpointDeleted)} >= gone or None,
            "a CheckpointDeleted for every checkpoint retention drops",
        )
        assert deletions
        for checkpoint_id in gone:
            await until(
                lambda c=checkpoint_id: _is(state_of(c), "deleted"), f"{checkpoint_id} deleted"
            )
        said = {e.checkpoint_id: e for e in tap.of(CheckpointDeleted)}
        assert set(said) == gone, sorted(said)
        assert all(e.reason is DeletionReason.RETENTION for e in said.values())
        assert "not among the latest 1 of job uid-ck-sweep-t0" in said[f"{SWEEP}-t0-10"].detail
        # S3 holds exactly what is kept
        kept = {
            "plain-job/step-1": True, "plain-job/step-2": False, "plain-job/step-3": True,
            f"{SWEEP}-t0/step-10": False, f"{SWEEP}-t0/step-20": True, f"{SWEEP}-t0/step-30": True,
            f"{SWEEP}-t1/step-10": False, f"{SWEEP}-t1/step-20": True, f"{SWEEP}-t1/step-30": True,
        }  # fmt: skip
        assert {path: s3.exists(path) for path in kept} == kept
        # recorded once each: 3 + 6 checkpoints, the redelivered and retried ones ignored
        assert await pool.fetchval("SELECT count(*) FROM checkpoints") == 9
        assert tally.committed == 9

        # `checkpoint list`: a job's kept ones; an experiment's, the deleted ones too
        code, out, err = await cli("checkpoint", "list", f"{SWEEP}-t0", "--json")
        assert code == 0, err
        rows = json.loads(out)
        assert [r["step"] for r in rows] == [30, 20]
        assert rows[0]["plan_id"] == "p-b" and rows[0]["world_size"] == 2
        assert rows[1]["metrics"] == {"val_loss": 0.3} and rows[1]["blocking_s"] == 0.05
        rows = await store.checkpoints(experiment=SWEEP, include_deleted=True)
        states = {r["checkpoint_id"]: r["state"] for r in rows}
        assert states[f"{SWEEP}-t1-10"] == "deleted" and states[f"{SWEEP}-t1-20"] == "kept"

        # the best trial of the experiment as a model version, and its lineage
        code, out, err = await cli(
            "model", "register", "sweep-best", "--best", SWEEP,
            "--notes", "the best of the sweep", "--label", "candidate", "--label", "lr-sweep",
        )  # fmt: skip
        assert code == 0, err
        assert out.startswith(f"model sweep-best version 1: checkpoint {SWEEP}-t0-20 ("), out
        code, out, err = await cli("model", "describe", "sweep-best")
        assert code == 0, err
        for line in (
            "model sweep-best version 1 of 1",
            "  notes:       the best of the sweep",
            "  labels:      candidate, lr-sweep",
            f"  checkpoint:  {SWEEP}-t0-20 (kept) at s3://{BUCKET}/{SWEEP}-t0/step-20",
            f"  job:         {SWEEP}-t0 (uid-{SWEEP}-t0)",
            f"  experiment:  {SWEEP}, trial 0",
            "  searcher:    asha on val_loss (smaller is better)",
            "  hyperparameters: lr=0.01",
            "  metrics:     val_loss=0.3",
            "  plan in force: p-a",
            "    plan p-a: steps 10-20, world size 4",
        ):
            assert line in out.splitlines(), f"{line!r} not in:\n{out}"
        described = await store.describe("sweep-best")
        assert described["version"]["lineage"]["hyperparameters"] == {"lr": 0.01}
        assert {m["name"]: m["versions"] for m in await store.models()} == {
            "sweep-best": 1,
            "plain-model": 1,
        }
        # a deleted checkpoint cannot become a version: one line, exit 2
        code, out, err = await cli("model", "register", "m", "--from", f"{SWEEP}-t0-10")
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1, err
        assert f"checkpoint {SWEEP}-t0-10 is deleted by retention" in lines[0], err
    finally:
        await tap.stop()
        ctx.stop.set()
        await asyncio.gather(checkpoints, recording)
        await pool.close()


async def _is(value: Awaitable[str], expected: str) -> bool:
    return await value == expected


async def test_a_storage_that_fails_for_a_while(
    settings: Settings, pg_dsn: str, make_env: EnvFactory, s3: S3
) -> None:
    """S3 away while retention deletes: the checkpoint stays ``deleting``, nothing says it
    was deleted; S3 back: the deleter's next try removes it and says so."""
    env = (await make_env()).name
    tally = Tally()
    own = CheckpointsSettings(storage_options=s3.options, retry_s=0.5)
    ctx = ServiceContext(settings, env, pg_dsn)
    pool = await create_pool(pg_dsn, env_schema(env), max_size=2)
    job = "flaky-job"
    for step in (1, 2):
        s3.write_checkpoint(f"{job}/step-{step}")
    running = asyncio.create_task(service.run(ctx, own, tally))
    tap = Tap(settings, env, (CHECKPOINTS,))
    await tap.start()
    s3.stop()
    try:
        async with Producer(settings) as producer:
            for step in (1, 2):
                url = f"s3://{BUCKET}/{job}/step-{step}"
                await producer.publish(committed(env, job, step, url=url))

        async def failed_twice() -> bool:
            return tally.storage_failures >= 2

        await until(failed_twice, "two failed tries to delete")
        state = await pool.fetchval(
            "SELECT state FROM checkpoints WHERE checkpoint_id = $1", f"{job}-1"
        )
        assert state == "deleting"
        assert tap.of(CheckpointDeleted) == []
    finally:
        s3.start()
    try:
        said = await tap.until(lambda: tap.of(CheckpointDeleted), "the deletion, once S3 is back")
        assert [e.checkpoint_id for e in said] == [f"{job}-1"]
        await until(
            lambda: _is(
                pool.fetchval("SELECT state FROM checkpoints WHERE checkpoint_id = $1", f"{job}-1"),
                "deleted",
            ),
            "the row deleted",
        )
        assert (s3.exists(f"{job}/step-1"), s3.exists(f"{job}/step-2")) == (False, True)
    finally:
        await tap.stop()
        ctx.stop.set()
        await running
        await pool.close()
