"""The metrics server serves every registry it was given, on loopback by default."""

from __future__ import annotations

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from dlrover_events.runtime.metrics import BrainMetrics, MetricsServer, OperatorMetrics


def test_two_brains_in_one_process_keep_their_own_metrics() -> None:
    first, second = CollectorRegistry(), CollectorRegistry()
    a, b = BrainMetrics(first, "prod"), BrainMetrics(second, "ab-static")
    a.decisions.inc(3)
    b.decisions.inc()
    a.lag("prod.job.metrics", 2, 17)
    server = MetricsServer()
    server.add(first)
    server.add(second)
    text = server.exposition().decode()
    assert 'dlrover_events_brain_decisions_total{env="prod"} 3.0' in text
    assert 'dlrover_events_brain_decisions_total{env="ab-static"} 1.0' in text
    assert (
        'dlrover_events_brain_consumer_lag_records{env="prod",partition="2",'
        'topic="prod.job.metrics"} 17.0'
    ) in text


@pytest.mark.asyncio
async def test_server_listens_on_loopback_and_serves_the_text_format() -> None:
    registry = CollectorRegistry()
    OperatorMetrics(registry, "prod", "local").answered("partial", 0.2)
    server = MetricsServer(port=0)
    server.add(registry)
    await server.start()
    try:
        assert server.host == "127.0.0.1"
        async with aiohttp.ClientSession() as session, session.get(server.url) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain")
            body = await resp.text()
        assert (
            'dlrover_events_operator_plans_total{env="prod",platform="local",status="partial"} 1.0'
            in body
        )
        assert "dlrover_events_operator_apply_duration_seconds_count" in body
    finally:
        await server.stop()


@pytest.mark.asyncio
async def test_with_a_readiness_it_also_answers_healthz_and_readyz() -> None:
    ready = {"now": False}
    server = MetricsServer(port=0, readiness=lambda: (ready["now"], {"bus": ready["now"]}))
    await server.start()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{server.base_url}/healthz") as resp:
                assert resp.status == 200
            async with session.get(f"{server.base_url}/readyz") as resp:
                assert (resp.status, await resp.json()) == (503, {"ready": False, "bus": False})
            ready["now"] = True
            async with session.get(f"{server.base_url}/readyz") as resp:
                assert resp.status == 200
    finally:
        await server.stop()
    plain = MetricsServer(port=0)  # without one: metrics only
    await plain.start()
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{plain.base_url}/readyz") as resp,
        ):
            assert resp.status == 404
    finally:
        await plain.stop()
