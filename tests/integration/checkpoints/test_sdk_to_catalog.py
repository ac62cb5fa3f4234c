"""An SDK save reaches the catalog (issue 36, 5), on real parts: the example
``examples/train_mnist_like.py`` trains as a real torch process with its reporter on the
test broker; each checkpoint ``ElasticCheckpoint`` commits is a ``CheckpointCommitted`` on
``<env>.checkpoints`` and, through the checkpoints service, a row of the env's Postgres that
``checkpoint list`` shows. Retention deletes the older ones' directories from disk and keeps
the newest, and the job run again resumes from that one: the catalog's kept checkpoint is
what ``restore()`` loads."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dlrover_events.bus.topics import CHECKPOINTS
from dlrover_events.checkpoints.store import CheckpointStore
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.sdk.checkpoint_manifest import MANIFEST
from dlrover_events.settings import Settings
from dlrover_events.store import create_pool, env_schema
from schemas.checkpoints import CheckpointCommitted, CheckpointDeleted
from streams.checkpoints import service
from streams.checkpoints.service import CheckpointsSettings, Tally
from tests.conftest import REPO, EnvFactory, run_cli
from tests.integration.tap import Tap

pytestmark = pytest.mark.integration

EXAMPLE = REPO / "examples" / "train_mnist_like.py"
EVERY = 10


async def train(settings: Settings, env: str, job: str, root: Path, steps: int) -> dict[str, Any]:
    """The example to ``steps`` steps as a job's process: its summary line."""
    environ = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "DLROVER_EVENTS_JOB_ID": job,
        "DLROVER_EVENTS_ENV": env,
        "DLROVER_EVENTS_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
    }
    environ.pop("DLROVER_EVENTS_CHECKPOINT_DIR", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLE),
        f"--steps={steps}",
        "--batch-size=32",
        f"--checkpoint-every={EVERY}",
        f"--checkpoint={root}",
        "--interval-s=0.5",
        "--close-timeout-s=10",
        cwd=REPO,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 240)
    assert proc.returncode == 0, err.decode()[-3000:]
    summary: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    assert summary["dropped"] == 0, (summary, err.decode()[-2000:])
    return summary


async def test_a_checkpoint_the_sdk_commits_is_in_the_catalog_and_resumed_from(
    settings: Settings, pg_dsn: str, make_env: EnvFactory, tmp_path: Path
) -> None:
    env = (await make_env()).name
    job = f"mnist-{env}"
    root = tmp_path / "ck"
    tally = Tally()
    ctx = ServiceContext(settings, env, pg_dsn)
    # a job outside any experiment: the latest checkpoint of the job is kept, no other
    own = CheckpointsSettings(save_trial_latest=1, save_trial_best=0, save_experiment_best=0)
    checkpoints = asyncio.create_task(service.run(ctx, own, tally))
    tap = Tap(settings, env, (CHECKPOINTS,))
    await tap.start()
    pool = await create_pool(pg_dsn, env_schema(env), max_size=2)
    store = CheckpointStore(pool)

    async def kept(step: int) -> list[dict[str, Any]]:
        """The job's rows once the newest kept is ``step`` and retention is done with the
        older ones (they are rows of state ``deleted`` then)."""
        for _ in range(600):
            rows = await store.checkpoints(job=job)
            if [r["step"] for r in rows] == [step]:
                return rows
            await asyncio.sleep(0.2)
        pytest.fail(f"the job's checkpoints are {rows}, not step {step} alone")

    async def cli(*args: str) -> list[dict[str, Any]]:
        code, out, err = await run_cli(settings, pg_dsn, *args, "--env", env, "--json")
        assert code == 0, err
        rows: list[dict[str, Any]] = json.loads(out)
        return rows

    try:
        first = await train(settings, env, job, root, 30)
        assert (first["first_step"], first["steps"], first["saved_step"]) == (0, 30, 30)
        # every commit of rank 0 is an event, the last one among them (periodic saves that
        # found the previous one persisting were put off: not every multiple of EVERY)
        said = await tap.until(
            lambda: (
                {e.step: e for e in tap.of(CheckpointCommitted, job)}
                if any(e.step == 30 for e in tap.of(CheckpointCommitted, job))
                else None
            ),
            "the commit of step 30 on the checkpoints topic",
        )
        assert len(said) == first["saves"], (sorted(said), first)
        last = said[30]
        assert (last.job.uuid, last.world_size, last.experiment, last.trial) == (job, 1, None, None)
        assert last.checkpoint_id.startswith(job) and last.size_bytes > 0
        assert last.blocking_s is not None and last.persist_s is not None
        manifest = json.loads((root / "step-000000000030" / MANIFEST).read_text())
        assert (manifest["checkpoint_id"], manifest["step"]) == (last.checkpoint_id, 30)

        # the catalog's row, through `checkpoint list`: the kept one is the newest
        await kept(30)
        rows = await cli("checkpoint", "list", job)
        assert [(r["checkpoint_id"], r["step"]) for r in rows] == [(last.checkpoint_id, 30)]
        assert rows[0]["url"] == last.url and rows[0]["size_bytes"] == last.size_bytes
        assert (root / "step-000000000030" / MANIFEST).exists()

        # run again: it resumes from the catalog's kept checkpoint and commits the next
        again = await train(settings, env, job, root, 40)
        assert (again["first_step"], again["steps"], again["saved_step"]) == (30, 40, 40)
        said = await tap.until(
            lambda: (
                {e.step: e for e in tap.of(CheckpointCommitted, job)}
                if any(e.step == 40 for e in tap.of(CheckpointCommitted, job))
                else None
            ),
            "the commit of step 40",
        )
        assert len(said) == first["saves"] + again["saves"], (sorted(said), first, again)
        newest = said[40]
        await kept(40)
        rows = await cli("checkpoint", "list", job)
        assert [(r["checkpoint_id"], r["step"]) for r in rows] == [(newest.checkpoint_id, 40)]
        # the older ones (step 30 among them) are rows too, deleted by retention from disk
        older = {s: e.checkpoint_id for s, e in said.items() if s != 40}
        assert 30 in older
        await tap.until(
            lambda: {e.checkpoint_id for e in tap.of(CheckpointDeleted)} >= set(older.values()),
            "a CheckpointDeleted for each older checkpoint",
        )
        every = await cli("checkpoint", "list", job, "--all")
        states = {r["checkpoint_id"]: r["state"] for r in every}
        assert states == {newest.checkpoint_id: "kept", **dict.fromkeys(older.values(), "deleted")}
        for step in older:
            assert not (root / f"step-{step:012d}").exists(), step
        assert (root / "step-000000000040" / MANIFEST).exists()
        assert tally.committed == len(said)
        print(json.dumps({"saves": [first["saves"], again["saves"]], "steps": sorted(said)}))
    finally:
        await tap.stop()
        ctx.stop.set()
        await checkpoints
        await pool.close()
