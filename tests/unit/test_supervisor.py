"""`up`'s supervision of its services: said, restarted with backoff, stopped in seconds."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import CollectorRegistry

from dlrover_events.backoff import Backoff
from dlrover_events.errors import BusUnavailable, EnvError, StoreUnavailable, UserError
from dlrover_events.runtime.metrics import ServiceMetrics
from dlrover_events.runtime.services import Service, ServiceContext
from dlrover_events.runtime.supervisor import (
    BusWatch,
    State,
    Supervised,
    is_fatal,
    readiness,
)
from dlrover_events.settings import Settings

FAST = Backoff(initial_s=0.01, max_s=0.04, stable_s=60)


def test_only_user_mistakes_are_fatal() -> None:
    assert is_fatal(UserError("bad setting")) and is_fatal(EnvError("no env"))
    assert not is_fatal(BusUnavailable("broker away"))
    assert not is_fatal(StoreUnavailable("postgres away"))
    assert not is_fatal(RuntimeError("bug")) and not is_fatal(None)


def _supervised(run: object, stop: asyncio.Event, metrics: ServiceMetrics) -> Supervised:
    def make_ctx(own_stop: asyncio.Event, reg: CollectorRegistry) -> ServiceContext:
        return ServiceContext(Settings(), "prod", "postgresql://x", stop=own_stop, metrics=reg)

    svc = Service(name="flaky", description="test", run=run)  # type: ignore[arg-type]
    return Supervised(svc, make_ctx, stop, env="prod", backoff=FAST, metrics=metrics)


async def test_a_failing_service_is_said_and_restarted_until_it_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    starts = 0

    async def flaky(ctx: ServiceContext) -> None:
        nonlocal starts
        starts += 1
        if starts <= 2:
            raise RuntimeError(f"crash {starts}")
        if starts == 3:
            return  # returning while `up` runs is a failure too
        ctx.ready.set()
        await ctx.stop.wait()

    stop = asyncio.Event()
    registry = CollectorRegistry()
    sup = _supervised(flaky, stop, ServiceMetrics(registry, "prod"))
    task = asyncio.create_task(sup.run())
    with caplog.at_level(logging.ERROR, logger="dlrover_events.runtime.supervisor"):
        async with asyncio.timeout(10):
            await sup.ready.wait()
    assert (starts, sup.restarts, sup.state) == (4, 3, State.READY)
    said = caplog.text
    assert "service flaky failed: RuntimeError: crash 1; restarting in" in said
    assert "service flaky returned although `up` still runs" in said
    assert (
        registry.get_sample_value(
            "dlrover_events_service_restarts_total", {"env": "prod", "service": "flaky"}
        )
        == 3
    )
    assert (
        registry.get_sample_value("dlrover_events_service_up", {"env": "prod", "service": "flaky"})
        == 1
    )
    stop.set()
    async with asyncio.timeout(10):
        await task
    assert sup.state == State.STOPPED and sup.fatal is None


async def test_a_user_mistake_is_not_retried() -> None:
    async def misconfigured(ctx: ServiceContext) -> None:
        raise UserError("DLROVER_EVENTS_X is not a number")

    stop = asyncio.Event()
    sup = _supervised(misconfigured, stop, ServiceMetrics(CollectorRegistry(), "prod"))
    async with asyncio.timeout(10):
        await sup.run()
    assert sup.failed.is_set() and sup.state == State.FAILED
    assert str(sup.fatal) == "DLROVER_EVENTS_X is not a number" and sup.restarts == 0


async def test_stop_ends_a_backoff_at_once() -> None:
    async def crash(ctx: ServiceContext) -> None:
        raise RuntimeError("down")

    stop = asyncio.Event()
    slow = Backoff(initial_s=3600, max_s=3600)
    sup = _supervised(crash, stop, ServiceMetrics(CollectorRegistry(), "prod"))
    sup._backoff = slow
    task = asyncio.create_task(sup.run())
    for _ in range(1000):
        if sup.state == State.RESTARTING:
            break
        await asyncio.sleep(0.01)
    assert sup.state == State.RESTARTING
    stop.set()
    async with asyncio.timeout(10):  # not the hour of its backoff
        await task
    assert sup.state == State.STOPPED


async def test_readiness_names_what_is_not_ready() -> None:
    """/readyz's verdict for `up` and a standalone command: 200 only with everything
    ready, else 503 with a reason a person can act on."""
    bus = BusWatch("kafka-0:9092", asyncio.Event())
    postgres = asyncio.Event()
    postgres.set()
    ready, body = readiness(bus, {"brain": State.READY}, postgres=postgres)
    assert ready and "reason" not in body
    assert body == {"bus": True, "services": {"brain": "ready"}, "postgres": True}

    bus.up.clear()
    postgres.clear()
    ready, body = readiness(bus, {"brain": State.STARTING, "gateway": State.READY}, postgres)
    assert not ready
    assert body["reason"] == (
        "bus at kafka-0:9092 does not answer; Postgres does not answer; service brain is starting"
    )
    # no Postgres watch given: no such key, and it does not decide
    bus.up.set()
    ready, body = readiness(bus, {"brain": State.READY})
    assert ready and "postgres" not in body
