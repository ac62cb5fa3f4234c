"""`ab run --from ENV` end to end with production jobs whose applications have no traces:
each is simulated from the samples it measured in the source env, in every arm.

The source env holds what a real env would: a submission, first-phase samples at two
worker counts, the source brain's first ScalePlan, later samples and the completion. The
arms get the submission and the first phase only (the replay's default); their simulator
fits each job's step time from those samples as the brain's scheduler fits it, and runs
the job for the `total_steps` its submission states, or, when it states none, for the
steps it had made at its last sample in the source (which the replay carries).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.domain.step_time import PerfParams
from dlrover_events.settings import Settings
from handlers.simulator.job import DEFAULT_RESTART_DELAY
from handlers.simulator.measured import SOURCE_STEPS, measure
from schemas.envelope import Event
from schemas.jobs import (
    JobCompleted,
    JobMeta,
    JobStarted,
    JobSubmitted,
    RoleSpec,
    RuntimeSample,
)
from schemas.plans import NodeGroupResource, ScalePlan
from tests.conftest import EnvFactory, cli_environ

pytestmark = pytest.mark.integration

T0 = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)


class Job:
    """One production job of a made-up application and the model its samples follow."""

    def __init__(self, name: str, app: str, at: float, steps: int | None, true: PerfParams) -> None:
        self.name, self.app, self.at, self.steps, self.true = name, app, at, steps, true
        self.meta = JobMeta(uuid=name, name=name, app=app)

    def submitted(self, env: str) -> JobSubmitted:
        return JobSubmitted(
            env=env,
            job=self.meta,
            source="operator",
            occurred_at=T0 + timedelta(seconds=self.at),
            application=self.app,
            batch_size=64,
            roles={"worker": RoleSpec(replicas=2, gpu_num=1)},
            config={} if self.steps is None else {"total_steps": self.steps},
        )

    def sample(self, env: str, after: float, workers: int, step: int) -> RuntimeSample:
        local = 64 // workers
        return RuntimeSample(
            env=env,
            job=self.meta,
            source="sdk",
            occurred_at=T0 + timedelta(seconds=self.at + after),
            global_step=step,
            speed=1 / self.true.step_time(1, workers, local, 1),
            samples_per_s=64 / self.true.step_time(1, workers, local, 1),
            batch_size=64,
            local_batch_size=local,
            world_size=workers,
            num_nodes=1,
            allreduce_s=self.true.network_time(1, workers),
        )

    def first_phase(self, env: str) -> list[RuntimeSample]:
        """Its samples before the source brain's first plan: at 2 workers, then 4."""
        return [
            *(self.sample(env, 30.0 * (i + 1), 2, 20 * i) for i in range(3)),
            *(self.sample(env, 120.0 + 30 * i, 4, 60 + 30 * i) for i in range(3)),
        ]

    def history(self, env: str) -> list[Event]:
        """What the real env saw of the job, in order."""
        first_phase = self.first_phase(env)
        plan = ScalePlan(
            env=env,
            job=self.meta,
            source="brain",
            occurred_at=T0 + timedelta(seconds=self.at + 200),
            plan_id=f"{self.name}-p1",
            node_group_resources={"worker": NodeGroupResource(count=8)},
        )
        # After the source brain's plan: not the job's first phase, never replayed.
        later = [self.sample(env, 230.0 + 30 * i, 8, 200 + 50 * i) for i in range(3)]
        done = JobCompleted(
            env=env, job=self.meta, source="operator", occurred_at=T0 + timedelta(hours=2)
        )
        started = JobStarted(env=env, job=self.meta, source="operator")
        return [self.submitted(env), started, *first_phase, plan, *later, done]


JOBS = [
    Job("ranker-1", "acme-ranker", 0.0, 1500, PerfParams(0.05, 0.01, alpha_r=0.1, beta_r=0.02)),
    Job("embed-2", "acme-embedder", 120.0, 1200, PerfParams(0.2, 0.002, alpha_r=0.05)),
    Job("ctr-3", "acme-ctr", 300.0, 2000, PerfParams(0.02, 0.004, alpha_r=0.02, beta_r=0.01)),
    # States no length: it trains as far as its last sample in the source went (step 300).
    Job("notes-4", "acme-notes", 400.0, None, PerfParams(0.3, 0.01, alpha_r=0.2)),
]


def work(job: Job, env: str) -> int:
    """The steps the job must make in an arm."""
    if job.steps is not None:
        return job.steps
    return max(e.global_step for e in job.history(env) if isinstance(e, RuntimeSample))


async def test_ab_run_from_an_env_simulates_untraced_jobs_from_their_samples(
    settings: Settings, pg_dsn: str, make_env: EnvFactory, tmp_path: Path
) -> None:
    source = (await make_env()).name
    async with Producer(settings) as producer:
        for job in JOBS:
            await producer.publish_many(job.history(source))
    static = tmp_path / "static.yaml"
    static.write_text("brain: false\n")
    out = tmp_path / "report"
    cli = str(Path(sys.executable).parent / "dlrover-events")
    arms = ["--arm", f"static={static}", "--arm", "brain="]
    cluster = ["--nodes", "2", "--gpus", "4", "--timeout", "400"]
    done = await asyncio.to_thread(
        subprocess.run,
        [cli, "ab", "run", "--from", source, *arms, *cluster, "--out", str(out)],
        env=cli_environ(settings, pg_dsn),
        capture_output=True,
        text=True,
        timeout=500,
        check=False,
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["source"] == source
    assert [a["name"] for a in summary["arms"]] == ["static", "brain"]
    for arm in summary["arms"]:
        # Every job ran to completion (a failed one, "not simulable" say, has no JCT).
        assert set(arm["jobs"]) == {j.name for j in JOBS}, arm
        assert arm["jobs_unfinished"] == 0
    static_jct, brain_jct = (summary["arms"][i]["jobs"] for i in (0, 1))
    for job in JOBS:
        # Static: the job keeps its 2 workers (on one node: 8 GPUs of 8 in all, so no
        # wait) and steps at what it measured there, after one start.
        measured_step = job.true.step_time(1, 2, 32, 1)
        steps = work(job, source)
        assert static_jct[job.name] == pytest.approx(
            DEFAULT_RESTART_DELAY + steps * measured_step, rel=1e-4
        )
        # With the brain: whatever it planned, the job made its steps at step times the
        # fit of its own samples gives, never faster than the fastest of them on 8 GPUs.
        submitted = job.submitted(source)
        if job.steps is None:
            submitted.config[SOURCE_STEPS] = steps
        model = measure(submitted, job.first_phase(source))
        fastest = min(
            model.step_time(placement, local).iteration_time(accumulation)
            for workers in range(1, 9)
            for placement in [(workers,) if workers <= 4 else (4, workers - 4)]
            for local, accumulation in [model.split_batch(64, workers)]
        )
        assert brain_jct[job.name] >= DEFAULT_RESTART_DELAY + steps * fastest - 1e-3
