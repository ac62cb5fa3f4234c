"""The CLI as a script runs it, on the real broker and Postgres: every command that lists or
describes prints JSON that parses (`--json`); `tail` and `job` follow the registry's real
env; `job submit` says when no operator runs the env; `ab run` with no broker answering
starts its own and takes --jobs."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.checkpoints.store import Batch as CheckpointBatch
from dlrover_events.checkpoints.store import CheckpointStore
from dlrover_events.cli.app import root_command
from dlrover_events.cli.reference import all_commands
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.experiments.store import Batch, ExperimentStore
from dlrover_events.runtime.embedded import free_port
from dlrover_events.runtime.fence import EnvFence
from dlrover_events.settings import Settings
from dlrover_events.store import create_pool, env_schema
from schemas import JobMeta, JobStarted
from schemas.checkpoints import CheckpointCommitted
from schemas.control import EnvMode
from schemas.experiments import ExperimentSpec, ExperimentSubmitted, TrialMetrics
from tests.conftest import REPO, EnvFactory, cli_environ
from tests.unit.experiments.documents import document

pytestmark = pytest.mark.integration

JOB = REPO / "examples" / "elastic" / "job.yaml"
#: Two small jobs of the Pollux applications (a workload CSV), for a quick A/B.
TRACE = """name,time,application,num_replicas,batch_size
ncf-0,5,ncf,1,32768
ncf-1,20,ncf,2,32768
ncf-2,40,ncf,1,32768
"""

#: Each command with --json, how a script calls it ({env}: an env made for the test, with
#: a local job `j` and an event), and how its output reads: one document, or JSON lines.
JSON_COMMANDS: dict[str, list[str]] = {
    "env list": ["env", "list", "--json"],
    "env history": ["env", "history", "{env}", "--json"],
    "env settings": ["env", "settings", "{env}", "--json"],
    "env topics": ["env", "topics", "{env}", "--json"],
    "evaluate": ["evaluate", "--env", "{env}", "--json"],
    "optimizers": ["optimizers", "--json"],
    "gateway-token list": ["gateway-token", "list", "--env", "{env}", "--json"],
    "settings list": ["settings", "list", "--json"],
    "metrics list": ["metrics", "list", "--json"],
    "job list": ["job", "list", "--platform", "local", "--env", "{env}", "--json"],
    "job describe": ["job", "describe", "{job}", "--platform", "local", "--env", "{env}", "--json"],
    "tail": ["tail", "--env", "{env}", "--from-beginning", "--limit", "1", "--json"],
    "experiment list": ["experiment", "list", "--env", "{env}", "--json"],
    "experiment describe": ["experiment", "describe", "sweep", "--env", "{env}", "--json"],
    "trial metrics": ["trial", "metrics", "sweep", "0", "--env", "{env}", "--json"],
    "checkpoint list": ["checkpoint", "list", "j", "--env", "{env}", "--json"],
    "model register": ["model", "register", "m", "--from", "j-1", "--env", "{env}", "--json"],
    "model list": ["model", "list", "--env", "{env}", "--json"],
    "model describe": ["model", "describe", "m", "--env", "{env}", "--json"],
    "model versions": ["model", "versions", "m", "--env", "{env}", "--json"],
    "ab run": [
        "ab", "run", "--trace", "{trace}", "--jobs", "2", "--arm", "static", "--arm",
        "still={static}", "--nodes", "1", "--speed", "max", "--timeout", "4m", "--out",
        "{out}", "--json",
    ],
}  # fmt: skip


def run(
    args: list[str], environ: dict[str, str], cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from dlrover_events.cli.app import main; main()", *args],
        env=environ,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_table_names_every_command_with_json() -> None:
    with_json = {
        " ".join(path)
        for path, command in all_commands(root_command())
        if any("--json" in p.opts for p in command.params)
    }
    assert with_json == set(JSON_COMMANDS)


async def test_every_json_output_parses(
    settings: Settings, pg_dsn: str, make_env: EnvFactory, tmp_path: Path
) -> None:
    env = (await make_env()).name
    environ = {**cli_environ(settings, pg_dsn), "DLROVER_EVENTS_DATA_DIR": str(tmp_path / "data")}
    async with Producer(settings) as producer:
        await producer.publish(JobStarted(env=env, job=JobMeta(uuid="j")))
    await _record_an_experiment(pg_dsn, env)
    await _record_a_checkpoint(pg_dsn, env)
    submitted = await asyncio.to_thread(
        run, ["job", "submit", str(JOB), "--platform", "local", "--env", env, "--queue"], environ
    )
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.split()[1].split("/")[1]
    (tmp_path / "trace.csv").write_text(TRACE)
    (tmp_path / "static.yaml").write_text("brain: false\n")
    # `ab run` with nothing answering where Kafka should be: it starts its own broker
    no_broker = {**environ, "DLROVER_EVENTS_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}"}
    given = {
        "env": env,
        "job": job,
        "trace": str(tmp_path / "trace.csv"),
        "static": str(tmp_path / "static.yaml"),
        "out": str(tmp_path / "ab"),
    }
    checks: dict[str, Callable[[Any], bool]] = {
        "env list": lambda d: env in {e["name"] for e in d},
        "env history": lambda d: d[0]["name"] == env and d[0]["change"] == "create",
        "env settings": lambda d: isinstance(d, dict),
        "env topics": lambda d: f"{env}.job.metrics" in {t["topic"] for t in d},
        "evaluate": lambda d: d["env"] == env and d["jobs"] == 1,
        "optimizers": lambda d: "goodput" in {o["name"] for o in d},
        "gateway-token list": lambda d: d == [],
        "settings list": lambda d: "DLROVER_EVENTS_PARTITIONS" in {v["variable"] for v in d},
        "metrics list": lambda d: all(m["name"].startswith("dlrover_events_") for m in d),
        "job list": lambda d: [j["metadata"]["name"] for j in d] == [job],
        "job describe": lambda d: d["job"]["metadata"]["name"] == job and d["pods"] == [],
        "tail": lambda d: d[0]["type"] == "job.started",
        "experiment list": lambda d: [e["name"] for e in d] == ["sweep"],
        "experiment describe": lambda d: d["name"] == "sweep" and d["trials"][0]["trial"] == 0,
        "trial metrics": lambda d: [m["step"] for m in d] == [3],
        "checkpoint list": lambda d: [c["checkpoint_id"] for c in d] == ["j-1"],
        "model register": lambda d: d["version"]["version"] == 1,
        "model list": lambda d: [m["name"] for m in d] == ["m"],
        "model describe": lambda d: d["version"]["checkpoint"]["checkpoint_id"] == "j-1",
        "model versions": lambda d: [v["version"] for v in d] == [1],
        "ab run": lambda d: (
            [a["name"] for a in d["arms"]] == ["static", "still"]
            and all(len(a["jobs"]) == 2 for a in d["arms"])
        ),
    }
    assert set(checks) == set(JSON_COMMANDS)
    for name, template in JSON_COMMANDS.items():
        args = [a.format(**given) for a in template]
        done = await asyncio.to_thread(run, args, no_broker if name == "ab run" else environ)
        assert done.returncode == 0, (name, done.stderr)
        if name == "tail":
            document: Any = [json.loads(line) for line in done.stdout.splitlines()]
        else:
            document = json.loads(done.stdout)
        assert checks[name](document), (name, document)
        if name == "ab run":
            assert "started an embedded broker" in done.stderr


async def _record_an_experiment(pg_dsn: str, env: str) -> None:
    """An experiment with one trial and one report in the env's tables, as the experiments
    recorder stores them."""
    spec = ExperimentSpec.model_validate(document("sweep")["spec"])
    batch = Batch()
    batch.add(ExperimentSubmitted(env=env, experiment="sweep", spec=spec))
    batch.add(
        TrialMetrics(env=env, experiment="sweep", trial=0, step=3, budget=3, metrics={"loss": 1.0})
    )
    pool = await create_pool(pg_dsn, env_schema(env), max_size=1)
    try:
        await ExperimentStore(pool).record(batch)
    finally:
        await pool.close()


async def _record_a_checkpoint(pg_dsn: str, env: str) -> None:
    """A checkpoint of job `j` in the env's catalog, as the checkpoints service stores it."""
    batch = CheckpointBatch()
    batch.add(
        CheckpointCommitted(
            env=env, job=JobMeta(uuid="j", name="j"), checkpoint_id="j-1", url="file:///ck/j/1",
            step=1, world_size=1, size_bytes=10, blocking_s=0.1, persist_s=0.2,
        )
    )  # fmt: skip
    pool = await create_pool(pg_dsn, env_schema(env), max_size=1)
    try:
        await CheckpointStore(pool).record(batch)
    finally:
        await pool.close()


async def test_job_submit_says_when_no_operator_runs_the_env(
    settings: Settings, pg_dsn: str, make_env: EnvFactory, tmp_path: Path
) -> None:
    env = (await make_env(mode=EnvMode.VIRTUAL)).name
    environ = {**cli_environ(settings, pg_dsn), "DLROVER_EVENTS_DATA_DIR": str(tmp_path)}
    submit = ["job", "submit", str(JOB), "--platform", "local", "--env", env]
    done = await asyncio.to_thread(run, submit, environ)
    assert done.returncode == 2, done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: no operator runs env '{env}'"), lines
    assert not (tmp_path / "local").exists(), "a refused job was created"
    # an operator runs it (as `up` and `operator --env` do: fenced, its service's lock held)
    async with EnvFence(settings, pg_dsn, env, asyncio.Event(), services=("local",)):
        done = await asyncio.to_thread(run, submit, environ)
    assert done.returncode == 0, done.stderr
    assert "created" in done.stdout
    other = ["job", "submit", str(JOB), "--platform", "local", "--env", "no-such-env"]
    done = await asyncio.to_thread(run, other, environ)
    assert done.returncode == 2 and "no env named 'no-such-env'" in done.stderr


async def test_tail_follows_the_real_env_of_the_registry(
    own_settings: Settings, own_pg: str, tmp_path: Path
) -> None:
    """Without --env, `tail` follows the env that is real now (after `env promote`, the new
    one), not DLROVER_EVENTS_DEFAULT_ENV."""
    registry = EnvRegistry(own_settings, own_pg)
    first = (await registry.create("first", EnvMode.REAL)).name
    second = (await registry.create("second", EnvMode.VIRTUAL)).name
    async with Producer(own_settings) as producer:
        await producer.publish(JobStarted(env=first, job=JobMeta(uuid="in-first")))
        await producer.publish(JobStarted(env=second, job=JobMeta(uuid="in-second")))
    environ = {**cli_environ(own_settings, own_pg), "DLROVER_EVENTS_DEFAULT_ENV": "elsewhere"}
    tail = ["tail", "--from-beginning", "--limit", "1", "--json"]

    def followed() -> str:
        done = run(tail, environ, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        return str(json.loads(done.stdout)["key"])

    assert await asyncio.to_thread(followed) == "in-first"
    await registry.promote(second, reason="test")
    assert await asyncio.to_thread(followed) == "in-second"
