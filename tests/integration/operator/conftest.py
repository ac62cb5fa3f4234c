"""A virtual operator per test on the real broker and Postgres, and a tap on what it says.

Waiting is bounded by generous deadlines only; no assertion depends on how long anything
took, because the simulated clock runs on a wall clock that a loaded machine slows down.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from handlers.operator.wiring.modes import run_operator
from schemas.envelope import Event
from schemas.jobs import JobMeta, JobSubmitted, RoleSpec
from schemas.plans import ScalePlan
from tests.conftest import EnvFactory
from tests.integration.tap import DEADLINE_S, Tap

T = TypeVar("T")
E = TypeVar("E", bound=Event)

#: Fast enough that a test sees many samples, slow enough that a job (imagenet needs days
#: of simulated time) is still running when the test's plan arrives.
OPTIONS: dict[str, Any] = {"speed": 300.0, "sample_interval": 30.0, "nodes": 4}


@dataclass
class Running:
    ctx: ServiceContext
    task: asyncio.Task[None]

    async def stop(self) -> None:
        self.ctx.stop.set()
        await asyncio.wait_for(self.task, DEADLINE_S)


@dataclass
class Sim:
    settings: Settings
    pg_dsn: str
    env: str
    tap: Tap
    producer: Producer
    running: list[Running] = field(default_factory=list)

    async def start(self, **options: Any) -> Running:
        ctx = ServiceContext(self.settings, self.env, self.pg_dsn)
        task = asyncio.create_task(run_operator(ctx, {**OPTIONS, **options}))
        ready = asyncio.create_task(ctx.ready.wait())
        await asyncio.wait([task, ready], timeout=DEADLINE_S, return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            ready.cancel()
            if task.done():
                task.result()  # raises what stopped it
            pytest.fail(f"the operator of {self.env} was not ready within {DEADLINE_S:.0f}s")
        running = Running(ctx, task)
        self.running.append(running)
        return running

    def job(self, name: str) -> JobMeta:
        return JobMeta(uuid=name, name=name, app="imagenet")

    async def submit(
        self, name: str, application: str = "imagenet", replicas: int = 1, memory: int = 0
    ) -> JobSubmitted:
        event = JobSubmitted(
            env=self.env,
            job=JobMeta(uuid=name, name=name, app=application),
            source="test",
            application=application,
            roles={"worker": RoleSpec(replicas=replicas, gpu_num=1, memory=memory)},
        )
        await self.producer.publish(event)
        return event

    def plan(self, job: str, plan_id: str, **fields: Any) -> ScalePlan:
        return ScalePlan(env=self.env, job=self.job(job), source="test", plan_id=plan_id, **fields)


@pytest.fixture
async def sim(settings: Settings, pg_dsn: str, make_env: EnvFactory) -> AsyncIterator[Sim]:
    env = (await make_env()).name
    tap = Tap(settings, env)
    await tap.start()
    try:
        async with Producer(settings) as producer:
            s = Sim(settings, pg_dsn, env, tap, producer)
            try:
                yield s
            finally:
                for running in s.running:
                    if not running.task.done():
                        await running.stop()
    finally:
        await tap.stop()
