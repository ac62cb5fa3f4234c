"""The training-job client against a real gateway, and with the gateway gone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dlrover_events.config.client import ConfigClient, ConfigSnapshot, SyncConfigClient
from dlrover_events.runtime.embedded import free_port
from tests.integration.gateway.conftest import Running

pytestmark = pytest.mark.integration

ATTRS = {"user": "u1", "cluster": "c1", "job": "job-7"}


async def put(gw: Running, doc: dict[str, object], version: int | None = None) -> None:
    if version is None:
        r = await gw.http.post(gw.url + "/v1/documents", json=doc, headers=gw.as_admin)
    else:
        r = await gw.http.put(
            f"{gw.url}/v1/documents/{doc['name']}",
            json=doc,
            headers={**gw.as_admin, "If-Match": f'"{version}"'},
        )
    assert r.status in (200, 201), await r.text()


async def until(client: ConfigClient, want: dict[str, object]) -> ConfigSnapshot:
    for _ in range(200):
        snap = await client.fetch()
        if snap.config == want:
            return snap
        await asyncio.sleep(0.05)
    raise AssertionError(f"never got {want}: {client.last}")


async def test_async_client_fetches_long_polls_and_survives_an_outage(
    gw: Running, tmp_path: Path
) -> None:
    await put(gw, {"name": "u1", "Include": {"user": "u1"}, "Configure": {"lr": 0.1}})
    cache = tmp_path / "config.json"
    async with ConfigClient(gw.url, gw.read, ATTRS, cache_path=cache) as client:
        snap = await until(client, {"lr": 0.1})
        assert snap.ok
        assert snap.error is None
        assert [s["name"] for s in snap.sources] == ["u1"]
        assert cache.exists()
        confirmed = await client.fetch()  # a 304 underneath
        assert (confirmed.ok, confirmed.config, confirmed.etag) == (True, {"lr": 0.1}, snap.etag)

        waiting = asyncio.create_task(client.wait_for_change(20))
        await asyncio.sleep(0.2)
        await put(gw, {"name": "u1", "Include": {"user": "u1"}, "Configure": {"lr": 0.2}}, 1)
        changed = await waiting
        assert (changed.ok, changed.config) == (True, {"lr": 0.2})

        await gw.server.stop()
        down = await client.fetch()
        assert down.stale
        assert down.config == {"lr": 0.2}
        assert down.error
        assert down.fetched_at == changed.fetched_at

    # A restarted job with the gateway still down starts from the cache file.
    async with ConfigClient(gw.url, gw.read, ATTRS, cache_path=cache) as again:
        snap = await again.fetch()
        assert (snap.stale, snap.config) == (True, {"lr": 0.2})


async def test_sync_client_and_its_watcher(gw: Running, tmp_path: Path) -> None:
    await put(gw, {"name": "all", "Configure": {"workers": 2}})
    client = SyncConfigClient(gw.url, gw.read, ATTRS, cache_path=tmp_path / "c.json")
    for _ in range(200):
        snap = await asyncio.to_thread(client.fetch)
        if snap.config == {"workers": 2}:
            break
        await asyncio.sleep(0.05)
    assert (snap.ok, snap.config) == (True, {"workers": 2})

    seen: list[ConfigSnapshot] = []
    client.start_watching(seen.append, wait_s=5)
    try:
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.05)
        await put(gw, {"name": "all", "Configure": {"workers": 4}}, 1)
        for _ in range(200):
            if seen[-1].config == {"workers": 4}:
                break
            await asyncio.sleep(0.05)
        assert [s.config for s in seen] == [{"workers": 2}, {"workers": 4}]
    finally:
        await asyncio.to_thread(client.stop_watching, 10)


async def test_never_fails_without_a_gateway() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    async with ConfigClient(url, "t", ATTRS, default={"lr": 1}, timeout_s=1) as client:
        snap = await client.fetch()
    assert (snap.stale, snap.config, snap.fetched_at) == (True, {"lr": 1}, None)
    assert snap.error
    sync = SyncConfigClient(url, "t", ATTRS, default={"lr": 1}, timeout_s=1)
    snap = await asyncio.to_thread(sync.fetch)
    assert (snap.stale, snap.config) == (True, {"lr": 1})


async def test_a_rejected_token_is_reported_not_raised(gw: Running) -> None:
    async with ConfigClient(gw.url, "dle.wrong", ATTRS, default={"x": 1}) as client:
        snap = await client.fetch()
    assert (snap.stale, snap.config) == (True, {"x": 1})
    assert snap.error is not None
    assert "401" in snap.error
