"""`dlrover-events experiment` and `trial metrics` as a script runs them, on the real broker
and Postgres with the experiments recorder running: create publishes the document and
refuses a name the env has; list, describe and trial metrics read the recorder's tables
(as tables, and as JSON); pause, activate and kill publish their action and the status
follows; mistakes are one line."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topic_reader import read_topic
from dlrover_events.bus.topics import EXPERIMENTS, topic
from dlrover_events.experiments.store import ExperimentStore
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from dlrover_events.store import create_pool, env_schema
from schemas.codec import decode
from schemas.experiments import DecisionKind, ExperimentAction, ExperimentSubmitted
from streams.searcher import recorder
from tests.conftest import EnvFactory, run_cli
from tests.integration.experiments.test_recorder import report, told
from tests.unit.experiments.documents import document

pytestmark = pytest.mark.integration


async def test_experiments_from_a_terminal(
    settings: Settings, pg_dsn: str, make_env: EnvFactory, tmp_path: Path
) -> None:
    env = (await make_env()).name
    ctx = ServiceContext(settings, env, pg_dsn)
    recording = asyncio.create_task(recorder.run(ctx))
    pool = await create_pool(pg_dsn, env_schema(env), max_size=1)
    store = ExperimentStore(pool)

    async def cli(*args: str) -> tuple[int, str, str]:
        return await run_cli(settings, pg_dsn, *args)

    async def until(ok: Callable[[], Any]) -> None:
        async with asyncio.timeout(30):
            while True:
                if await ok():
                    return
                await asyncio.sleep(0.1)

    try:
        path = tmp_path / "sweep.yaml"
        path.write_text(yaml.safe_dump(document("cli-sweep")))
        code, out, err = await cli("experiment", "create", str(path), "--env", env)
        assert code == 0, err
        assert out.strip() == f"experiment cli-sweep submitted to {env}.experiments"
        records = await read_topic(settings, topic(env, EXPERIMENTS))
        [submitted] = [decode(r.value) for r in records]
        assert isinstance(submitted, ExperimentSubmitted) and submitted.source == "cli"
        assert submitted.spec.searcher.name == "asha"
        await until(lambda: store.exists("cli-sweep"))
        code, out, err = await cli("experiment", "create", str(path), "--env", env)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1, err
        assert f"env {env} already has an experiment named 'cli-sweep' (active)" in lines[0]

        async with Producer(settings) as producer:
            await producer.publish_many(
                [
                    told(env, "cli-sweep", 0, DecisionKind.CREATE, 0, hparams={"lr": 0.1},
                         budget=50, rung=0),
                    told(env, "cli-sweep", 1, DecisionKind.CREATE, 1, hparams={"lr": 0.3},
                         budget=50, rung=0),
                    told(env, "cli-sweep", 2, DecisionKind.PAUSE, 1, rung=0,
                         reason="below the top 1/4 of rung 0"),
                    report(env, "cli-sweep", 0, 10, 1.5),
                    report(env, "cli-sweep", 0, 50, 0.4, validation=True),
                    report(env, "cli-sweep", 1, 50, 0.9, validation=True),
                ]
            )  # fmt: skip
        await until(lambda: store.trial_metrics("cli-sweep", 1))

        code, out, err = await cli("experiment", "list", "--env", env, "--json")
        assert code == 0, err
        [row] = json.loads(out)
        assert (row["name"], row["status"], row["trials"], row["best_trial"]) == (
            "cli-sweep",
            "active",
            2,
            0,
        )
        code, out, err = await cli("experiment", "list", "--env", env)
        assert code == 0 and "cli-sweep" in out and "0.4 (trial" in out, out + err

        code, out, err = await cli("experiment", "describe", "cli-sweep", "--env", env, "--json")
        assert code == 0, err
        seen = json.loads(out)
        assert seen["best_trial"]["trial"] == 0 and seen["trials"][1]["status"] == "paused"
        code, out, err = await cli("experiment", "describe", "cli-sweep", "--env", env)
        assert code == 0, err
        assert "best:      trial 0: 0.4 (lr=0.1)" in out
        assert "rung 0: budget 50, trials 0, 1" in out
        assert "#2 trial 1 pause (rung 0): below the top 1/4 of rung 0" in out

        code, out, err = await cli("trial", "metrics", "cli-sweep", "0", "--env", env, "--json")
        assert code == 0, err
        assert [(m["step"], m["validation"]) for m in json.loads(out)] == [(10, False), (50, True)]
        code, out, err = await cli("trial", "metrics", "cli-sweep", "0", "--env", env)
        assert code == 0 and "validation" in out and "val_loss" in out, out + err

        code, out, err = await cli("experiment", "pause", "cli-sweep", "--env", env)
        assert code == 0 and "pause of experiment cli-sweep published" in out, err
        await until(lambda: _status(store, "paused"))
        code, out, err = await cli(
            "experiment", "kill", "cli-sweep", "--env", env, "--reason", "enough"
        )
        assert code == 0, err
        await until(lambda: _status(store, "killed"))
        actions = [decode(r.value) for r in await read_topic(settings, topic(env, EXPERIMENTS))]
        assert [(a.action.value, a.reason) for a in actions if isinstance(a, ExperimentAction)] == [
            ("pause", ""),
            ("kill", "enough"),
        ]
        for args in (
            ("experiment", "activate", "cli-sweep"),
            ("experiment", "describe", "nope"),
            ("trial", "metrics", "nope", "0"),
        ):
            code, out, err = await cli(*args, "--env", env)
            lines = err.strip().splitlines()
            assert code == 2 and len(lines) == 1 and "Traceback" not in err, (args, err)
        assert (
            "is killed: there is nothing to activate"
            in (await cli("experiment", "activate", "cli-sweep", "--env", env))[2]
        )
        code, out, err = await cli("experiment", "list", "--env", "no-such-env")
        assert code == 2 and "no env named 'no-such-env'" in err

        code, out, err = await cli("experiment", "searchers")
        assert code == 0 and {line.split()[0] for line in out.splitlines()} >= {
            "grid",
            "random",
            "asha",
        }
    finally:
        ctx.stop.set()
        await recording
        await pool.close()


async def _status(store: ExperimentStore, status: str) -> bool:
    return (await store.status("cli-sweep")).value == status
