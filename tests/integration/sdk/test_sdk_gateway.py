"""The reporter fetches its job's config from a real gateway at start."""

from __future__ import annotations

import asyncio

import pytest

from dlrover_events.config.client import ConfigClient
from dlrover_events.runtime.embedded import free_port
from dlrover_events.sdk import JobIdentity, Reporter
from dlrover_events.settings import Settings
from schemas.jobs import JobMeta
from tests.integration.gateway.conftest import Running, gw

pytestmark = pytest.mark.integration

__all__ = ["gw"]  # the gateway fixture, used by name


async def served(gw: Running, attrs: dict[str, str], want: dict[str, object]) -> None:
    """Documents reach the gateway's cache through the change feed: wait for it."""
    async with ConfigClient(gw.url, gw.read, attrs) as client:
        for _ in range(200):
            if (await client.fetch()).config == want:
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"the gateway never served {want}")


async def test_reporter_starts_with_its_jobs_config(gw: Running) -> None:
    doc = {"name": "sdk-ps", "Include": {"user": "u-sdk", "role": "ps"}, "Configure": {"lr": 0.3}}
    r = await gw.http.post(gw.url + "/v1/documents", json=doc, headers=gw.as_admin)
    assert r.status in (200, 201), await r.text()
    identity = JobIdentity(job=JobMeta(uuid="job-cfg", user="u-sdk"), env=gw.env, role="ps")
    await served(gw, identity.attributes(), {"lr": 0.3})

    reporter = Reporter(
        identity,
        settings=Settings(bootstrap_servers=f"127.0.0.1:{free_port()}"),
        gateway_url=gw.url,
        gateway_token=gw.read,
    )
    # start() blocks on the fetch, and the gateway answers from this test's loop.
    await asyncio.to_thread(reporter.start)
    try:
        assert reporter.config is not None
        assert reporter.config.ok and reporter.config.config == {"lr": 0.3}
        assert [s["name"] for s in reporter.config.sources] == ["sdk-ps"]
    finally:
        await asyncio.to_thread(reporter.close, 0.1)

    # A worker of the same job matches no document: it gets the empty config, not an error.
    worker = Reporter(
        JobIdentity(job=JobMeta(uuid="job-cfg", user="u-sdk"), env=gw.env, role="worker"),
        settings=Settings(bootstrap_servers=f"127.0.0.1:{free_port()}"),
        gateway_url=gw.url,
        gateway_token=gw.read,
    )
    await asyncio.to_thread(worker.start)
    try:
        assert worker.config is not None and worker.config.ok and worker.config.config == {}
    finally:
        await asyncio.to_thread(worker.close, 0.1)
