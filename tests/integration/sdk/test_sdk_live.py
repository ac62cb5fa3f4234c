"""The SDK against real tansu brokers: the example's samples in the topic, training through
a broker that dies, and what a full buffer keeps while the broker is away.

Broker outages use a broker of the test's own (never the session's). Requires torch.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from types import ModuleType

import pytest
import torch

from dlrover_events.bus.admin import TopicAdmin
from dlrover_events.bus.topic_reader import read_topic
from dlrover_events.bus.topics import JOB_EVENTS, JOB_METRICS, topic
from dlrover_events.runtime.embedded import Broker, free_port
from dlrover_events.sdk import JobIdentity, Reporter
from dlrover_events.sdk.identity import ENV_ENV, JOB_ID_ENV, RANK_ENV, ROLE_ENV
from dlrover_events.sdk.torch import TorchHook
from dlrover_events.settings import Settings
from schemas.codec import decode
from schemas.envelope import Event
from schemas.jobs import JobMeta, NodeOOM, OOMKind, RuntimeSample
from tests.conftest import ARTIFACTS, REPO, EnvFactory, unique_env

pytestmark = pytest.mark.integration

EXAMPLE = REPO / "examples" / "train_mnist_like.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_mnist_like", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def job_events(settings: Settings, env: str, job: str) -> list[Event]:
    """The job's samples (job.metrics) and its node events, such as OOMs (job.events)."""
    events: list[Event] = []
    for name in (JOB_METRICS, JOB_EVENTS):
        records = await read_topic(settings, topic(env, name), timeout_s=10)
        events.extend(decode(r.value) for r in records)
    # At least once: a resend carries the same event id.
    unique = {e.event_id: e for e in events if e.key == job}
    return list(unique.values())


@pytest.fixture
def own_broker() -> Iterator[Broker]:
    """A broker this test may kill; the session's broker is shared."""
    broker = Broker("127.0.0.1", log_dir=ARTIFACTS / "logs" / "sdk")
    yield broker
    broker.stop()


async def create_topics(settings: Settings, env: str) -> None:
    async with TopicAdmin(settings) as admin:
        await admin.ensure_env_topics(env, 2)


async def test_example_training_publishes_plausible_samples(
    settings: Settings, make_env: EnvFactory
) -> None:
    env = (await make_env()).name
    job = f"mnist-{env}"
    steps, batch = 600, 32
    environ = {
        **os.environ,
        JOB_ID_ENV: job,
        ENV_ENV: env,
        ROLE_ENV: "worker",
        RANK_ENV: "1",
        "DLROVER_EVENTS_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLE),
        f"--steps={steps}",
        f"--batch-size={batch}",
        "--interval-s=0.2",
        env=environ,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 240)
    assert proc.returncode == 0, err.decode()[-3000:]
    summary = json.loads(out.decode().strip().splitlines()[-1])
    assert summary["steps"] == steps and summary["dropped"] == 0
    assert summary["published"] == summary["samples"] >= 1
    assert summary["accuracy"] > 0.2  # it really trained: chance is 0.1

    events = await job_events(settings, env, job)
    samples = sorted(
        (e for e in events if isinstance(e, RuntimeSample)), key=lambda e: e.global_step
    )
    assert len(samples) == summary["samples"]
    assert samples[-1].global_step == steps  # the final sample is cut at close
    assert all(0 < s.global_step <= steps for s in samples)
    for s in samples:
        assert s.env == env and s.job.uuid == job and s.source == f"sdk/{job}/worker-1"
        assert s.speed > 0 and s.local_batch_size == batch
        # Each step reported its batch's size: samples/s is the speed times that.
        assert s.samples_per_s == pytest.approx(s.speed * batch, rel=1e-6)
        (node,) = s.nodes
        assert (node.type, node.id) == ("worker", 1)
        assert node.step_time is not None
        assert node.step_time == pytest.approx(1 / s.speed, rel=1e-6)
        assert 20 * 2**20 < node.memory < 64 * 2**30  # torch is loaded; no host is that big
        assert node.cpu >= 0
        assert node.gpu_memory is None  # no CUDA here
    total_steps = samples[-1].global_step - samples[0].global_step
    assert total_steps > 0


async def test_training_completes_when_the_broker_dies(
    own_broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dlrover_events.sdk")
    own_broker.start()
    settings = Settings(bootstrap_servers=own_broker.bootstrap_servers, request_timeout_ms=5000)
    env = unique_env("sdk")
    await create_topics(settings, env)
    example = load_example()
    torch.set_num_threads(1)
    run = example.MnistLike(batch_size=16)
    reporter = Reporter(
        JobIdentity(job=JobMeta(uuid="job-dies"), env=env),
        settings=settings,
        interval_s=0.1,
        local_batch_size=16,
        send_timeout_s=1.0,
        retry_backoff_max_s=0.5,
    )
    hook = TorchHook(reporter).start()
    try:
        await asyncio.to_thread(run.run, hook, 100)
        assert await asyncio.to_thread(reporter.flush, 10.0)
        before = reporter.stats()
        assert before.published == before.samples >= 1 and before.dropped == 0
        delivered = await job_events(settings, env, "job-dies")
        assert len(delivered) == before.published

        own_broker.kill()
        loss = await asyncio.to_thread(run.run, hook, 300)
    finally:
        final = await asyncio.to_thread(hook.close, 1.0)
    assert run.steps == 400 and math.isfinite(loss)
    assert final.steps == 400
    assert final.published == before.published
    assert final.dropped >= 1  # at least the sample cut at close
    assert final.queued == final.published + final.dropped and final.pending == 0
    summary = [r.getMessage() for r in caplog.records if "reporter closed" in r.getMessage()]
    assert summary == [
        f"dlrover-events reporter closed (job job-dies, worker 0): 400 steps, "
        f"{final.samples} samples, {final.published} events published, {final.dropped} dropped"
    ]


async def test_full_buffer_keeps_the_oom_and_the_newest_samples_until_the_broker_returns(
    own_broker: Broker,
) -> None:
    port = free_port()
    settings = Settings(bootstrap_servers=f"127.0.0.1:{port}", request_timeout_ms=5000)
    env = unique_env("sdk")
    reporter = Reporter(
        JobIdentity(job=JobMeta(uuid="job-waits"), env=env),
        settings=settings,
        interval_s=0.01,
        buffer_size=3,
        send_timeout_s=1.0,
        retry_backoff_max_s=0.2,
    )
    hook = TorchHook(reporter, flush_timeout_s=0.2).start()
    try:
        with pytest.raises(MemoryError), hook.guard():
            raise MemoryError
        deadline = time.monotonic() + 30
        while reporter.stats().samples < 10:
            assert time.monotonic() < deadline
            reporter.step(samples=4)
            await asyncio.sleep(0.002)
        waiting = reporter.stats()
        assert waiting.published == 0 and waiting.dropped >= 7

        # The broker comes up where the reporter has been knocking.
        own_broker.port = port
        own_broker.start()
        await create_topics(settings, env)
        assert await asyncio.to_thread(reporter.flush, 20.0)
    finally:
        final = await asyncio.to_thread(hook.close, 5.0)
    assert final.queued == final.published + final.dropped and final.pending == 0
    events = await job_events(settings, env, "job-waits")
    assert len(events) == final.published
    ooms = [e for e in events if isinstance(e, NodeOOM)]
    assert len(ooms) == 1  # never pushed out by samples
    assert ooms[0].kind == OOMKind.HOST_MEMORY and (ooms[0].memory or 0) > 0
    samples = [e for e in events if isinstance(e, RuntimeSample)]
    assert len(samples) == final.samples - final.dropped
