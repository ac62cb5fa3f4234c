"""The elastic example alone (world size 1) against the real broker: a plan's knobs switch
at a step boundary, the job confirms them once (training.applied), and the samples after
the switch report the new knobs and the world size; a rerun resumes from the checkpoint
without confirming again."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dlrover_events.sdk.identity import ENV_ENV, JOB_ID_ENV, RANK_ENV
from dlrover_events.settings import Settings
from schemas.jobs import RuntimeSample
from schemas.plans import TrainingApplied
from tests.conftest import REPO, EnvFactory
from tests.integration.sdk.test_sdk_live import create_topics, job_events

pytestmark = pytest.mark.integration

EXAMPLE = REPO / "examples" / "elastic" / "train_elastic.py"


async def run_example(environ: dict[str, str], *args: str) -> list[dict[str, Any]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLE),
        *args,
        env=environ,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()[-3000:]
    return [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]


async def test_knobs_switch_and_are_confirmed_once(
    settings: Settings, make_env: EnvFactory, tmp_path: Path
) -> None:
    env = (await make_env()).name
    await create_topics(settings, env)
    job = f"elastic-{env}"
    environ = {
        **os.environ,
        JOB_ID_ENV: job,
        ENV_ENV: env,
        RANK_ENV: "2",
        "DLROVER_EVENTS_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "DLROVER_EVENTS_GATEWAY_URL": "",
    }
    for name in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "MASTER_ADDR"):
        environ.pop(name, None)
    args = [
        "--steps=120",
        "--batch-size=16",
        "--interval-s=0.2",
        "--step-sleep-s=0.01",
        "--simulate-plan=40:local_batch_size=4",
        f"--checkpoint={tmp_path / 'job.pt'}",
        "--checkpoint-every=50",
        "--close-timeout-s=5",
    ]
    lines = await run_example(environ, *args)
    [membership] = [e for e in lines if e["event"] == "membership"]
    assert (membership["world_size"], membership["first_step"], membership["node"]) == (1, 0, 2)
    [switch] = [e for e in lines if e["event"] == "knobs"]
    assert (switch["step"], switch["local_batch_size"], switch["accumulation_steps"]) == (40, 4, 4)
    [summary] = [e for e in lines if e["event"] == "exit"]
    assert summary["step"] == 120 and summary["dropped"] == 0 and summary["saved_step"] == 120

    events = await job_events(settings, env, job)
    [applied] = [e for e in events if isinstance(e, TrainingApplied)]
    assert applied.plan_id == "simulated-40" and applied.global_step == 41
    assert applied.training == {"local_batch_size": 4, "accumulation_steps": 4}
    assert (applied.node.type, applied.node.id) == ("worker", 2)
    samples = sorted(
        (e for e in events if isinstance(e, RuntimeSample)), key=lambda s: s.global_step
    )
    assert samples and all(s.world_size == 1 for s in samples)
    assert samples[-1].global_step == 120
    assert (samples[-1].local_batch_size, samples[-1].accumulation_steps) == (4, 4)
    # The switch is made at the boundary after step 40, and the next samples report it
    # (Reporter.set_training): a sample cut there says step 40 with either knobs (one CI
    # run: the new ones); one of an earlier step was cut before it, one of a later step after.
    knobs = {s.global_step: (s.local_batch_size, s.accumulation_steps) for s in samples}
    assert {k for step, k in knobs.items() if step < 40} <= {(16, 1)}
    assert {k for step, k in knobs.items() if step > 40} <= {(4, 4)}
    assert knobs.get(40, (16, 1)) in {(16, 1), (4, 4)}

    # Again, with more steps: it resumes at 120 with the knobs in force, confirms nothing.
    lines = await run_example(environ, *[a.replace("120", "150") for a in args])
    [membership] = [e for e in lines if e["event"] == "membership"]
    assert membership["first_step"] == 120
    assert (membership["local_batch_size"], membership["accumulation_steps"]) == (4, 4)
    assert not [e for e in lines if e["event"] == "knobs"]
    events = await job_events(settings, env, job)
    assert len([e for e in events if isinstance(e, TrainingApplied)]) == 1
