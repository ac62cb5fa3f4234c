"""The gateway as `up` runs it stops within the supervisor's grace, long-polls or not, and
closes every bus client it opened (on the real broker and Postgres).

A training job's SDK keeps a plan long-poll (and its config long-poll) open at the gateway
all the time: before, aiohttp's graceful shutdown waited up to a minute for them, the
supervisor cancelled the service after its 10 s, and the cancellation cut the gateway's
stop short of its consumers ("did not stop within 10s", five AIOKafkaConsumers unclosed).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import urllib.parse
import uuid

import aiohttp
import pytest
from aiokafka import AIOKafkaConsumer
from prometheus_client import CollectorRegistry

from dlrover_events.bus.producer import Producer
from dlrover_events.envs.tokens import Scope
from dlrover_events.runtime.services import Service, ServiceContext
from dlrover_events.runtime.supervisor import STOP_GRACE_S, Supervised
from dlrover_events.settings import Settings
from handlers.gateway import service as gateway_service
from handlers.gateway.runtime import GatewayServer
from schemas.jobs import JobMeta, JobSubmitted, RoleSpec
from tests.conftest import EnvFactory
from tests.integration.gateway.conftest import gateway_settings, mint

pytestmark = pytest.mark.integration

#: longer than the supervisor's grace: a wait the stop must not sit out
LONG_POLL_S = 60


def _consumers() -> list[AIOKafkaConsumer]:
    return [o for o in gc.get_objects() if isinstance(o, AIOKafkaConsumer)]


async def _waiting(registry: CollectorRegistry, env: str) -> None:
    """Until a config long-poll and a plan long-poll wait at the gateway."""

    def value(name: str) -> float:
        return registry.get_sample_value(f"dlrover_events_gateway_{name}", {"env": env}) or 0

    for _ in range(600):
        if value("long_polls") >= 1 and value("plan_waiters") >= 1:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the long-polls did not wait at the gateway")


async def test_the_gateway_service_stops_within_its_grace_with_long_polls_open(
    settings: Settings, pg_dsn: str, make_env: EnvFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    env = (await make_env()).name
    token = await mint(pg_dsn, env, Scope.READ)
    job = JobMeta(uuid=f"job-{uuid.uuid4().hex[:8]}", name="j", user="u1", scenario="s")
    async with Producer(settings) as producer:
        await producer.publish(
            JobSubmitted(env=env, job=job, roles={"worker": RoleSpec(replicas=1)})
        )
    before = {id(c) for c in _consumers()}

    async def run(ctx: ServiceContext) -> None:
        await gateway_service.run(ctx, gateway_settings())

    stop = asyncio.Event()

    def make_ctx(own_stop: asyncio.Event, registry: CollectorRegistry) -> ServiceContext:
        return ServiceContext(settings, env, pg_dsn, stop=own_stop, metrics=registry)

    sup = Supervised(Service("gateway", "test", run), make_ctx, stop, env=env)
    supervised = asyncio.create_task(sup.run())
    headers = {"Authorization": f"Bearer {token}"}
    try:
        await asyncio.wait_for(sup.ready.wait(), 60)
        assert sup.ctx is not None
        url = sup.ctx.endpoints["config gateway"].split()[0]
        plan_url = f"{url}/v1/jobs/{urllib.parse.quote(job.uuid)}/plan"
        config_url = f"{url}/v1/config?user=u1"
        async with aiohttp.ClientSession(headers=headers) as http:

            async def etag_of(at: str) -> str:
                for _ in range(100):  # the plan view has the job once the feed read it
                    async with http.get(at) as first:
                        if first.status == 200:
                            return first.headers["ETag"]
                    await asyncio.sleep(0.1)
                raise AssertionError(f"{at} never answered 200")

            config_tag, plan_tag = await etag_of(config_url), await etag_of(plan_url)

            async def long_poll(at: str, tag: str) -> int:
                wait = {"If-None-Match": tag}
                async with http.get(f"{at}&wait={LONG_POLL_S}", headers=wait) as got:
                    await got.read()
                    return got.status

            polls = [
                asyncio.create_task(long_poll(config_url, config_tag)),
                asyncio.create_task(long_poll(f"{plan_url}?", plan_tag)),
            ]
            await _waiting(sup.registry.current, env)
            stop.set()
            await asyncio.wait_for(supervised, 3 * STOP_GRACE_S)
            # the waiting clients were answered, not cut off
            answered = await asyncio.wait_for(asyncio.gather(*polls), LONG_POLL_S)
            assert all(status in (304, 503) for status in answered), answered
    finally:
        stop.set()
        await asyncio.wait_for(supervised, 3 * STOP_GRACE_S)
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "did not stop within" in m], said
    gc.collect()
    left = [c for c in _consumers() if id(c) not in before and not c._closed]
    assert not left, f"{len(left)} consumers of the gateway left open"
    assert not [m for m in said if "Unclosed" in m], said


async def test_a_stop_cut_short_still_closes_every_client(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    """A supervisor whose grace ran out cancels the stop wherever it is (here: in the
    HTTP server's shutdown, its first step): the bus clients and the pool after it are
    closed all the same."""
    env = (await make_env()).name
    before = {id(c) for c in _consumers()}
    server = GatewayServer(settings, env, pg_dsn, gateway_settings())
    await server.start()
    await server.wait_ready(30)
    pool = server._pool
    assert pool is not None
    stopping = asyncio.create_task(server.stop())
    await asyncio.sleep(0)  # (the stop is in its first await)
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    gc.collect()
    left = [c for c in _consumers() if id(c) not in before and not c._closed]
    assert not left, f"{len(left)} consumers of the gateway left open"
    assert pool.is_closing()
