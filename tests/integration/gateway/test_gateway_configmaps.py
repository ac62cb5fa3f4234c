"""ConfigMaps on a real kube-apiserver reach long-polling jobs through a real gateway:
cluster -> watch -> Postgres (ConfigStore) -> <env>.config.changes -> index -> HTTP.

The test control plane (`kube`, `namespace`) comes from tests/integration/k8s/
control_plane.py, which tests/conftest.py names as a plugin."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
import pytest
from kubernetes_asyncio import client

from dlrover_events.envs.tokens import Scope
from dlrover_events.settings import Settings
from handlers.gateway.configmaps import ENV_LABEL, LABEL, document_name
from handlers.gateway.configmaps_runner import ConfigMapWatcher
from handlers.gateway.runtime import GatewayServer, GatewaySettings
from tests.conftest import EnvFactory
from tests.integration.gateway.conftest import Running, gateway_settings, mint
from tests.integration.k8s.kube import unique_name

pytestmark = pytest.mark.integration

#: How long a test waits for something that should take well under a second.
DEADLINE_S = 60


def cm_settings(kube: Path, namespace: str) -> GatewaySettings:
    return gateway_settings().model_copy(
        update={"configmaps": True, "kubeconfig": kube, "namespace": namespace}
    )


def configmap(name: str, text: str, labels: dict[str, str] | None = None) -> client.V1ConfigMap:
    return client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name=name, labels=labels or {LABEL: "true"}),
        data={"document.yaml": text},
    )


@pytest.fixture
async def cm_gw(
    settings: Settings, pg_dsn: str, make_env: EnvFactory, kube: Path, namespace: str
) -> AsyncIterator[Running]:
    env = (await make_env(partitions=2)).name
    admin = await mint(pg_dsn, env, Scope.ADMIN)
    read = await mint(pg_dsn, env, Scope.READ)
    async with GatewayServer(settings, env, pg_dsn, cm_settings(kube, namespace)) as server:
        await server.wait_ready(30)
        async with aiohttp.ClientSession() as http:
            yield Running(server, env, server.url, admin, read, http)


def watcher(gw: Running) -> ConfigMapWatcher:
    assert gw.server.configmaps is not None
    return gw.server.configmaps


async def current(gw: Running, job: dict[str, str]) -> tuple[str, dict[str, Any]]:
    r = await gw.http.get(f"{gw.url}/v1/config?{urlencode(job)}", headers=gw.as_reader)
    assert r.status == 200, await r.text()
    return r.headers["ETag"], await r.json()


async def long_poll_until(
    gw: Running, job: dict[str, str], etag: str, done: Callable[[dict[str, Any]], bool]
) -> tuple[str, dict[str, Any]]:
    """Long-poll (wait=30) from ``etag`` until an answer satisfies ``done``."""
    query = urlencode({**job, "wait": "30"})
    async with asyncio.timeout(DEADLINE_S):
        while True:
            r = await gw.http.get(
                f"{gw.url}/v1/config?{query}",
                headers={**gw.as_reader, "If-None-Match": etag},
            )
            assert r.status in (200, 304), await r.text()
            etag = r.headers["ETag"]
            if r.status == 200:
                body = await r.json()
                if done(body):
                    return etag, body


async def history(gw: Running, name: str) -> list[tuple[int, str]]:
    r = await gw.http.get(f"{gw.url}/v1/history/{name}", headers=gw.as_admin)
    assert r.status == 200, await r.text()
    return [(e["version"], e["op"]) for e in (await r.json())["history"]]


def sources(body: dict[str, Any]) -> list[str]:
    return [s["name"] for s in body["sources"]]


async def test_a_configmap_created_changed_and_deleted_reaches_a_long_poll(
    cm_gw: Running, api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api)
    job = {"user": "alice", "group": "vision", "job": "j1"}
    name = unique_name("knobs")
    doc = document_name(namespace, name)
    etag, body = await current(cm_gw, job)
    assert body["config"] == {}

    await core.create_namespaced_config_map(
        namespace, configmap(name, "Include: {User: alice}\nConfigure: {lr: 0.1, batch: 32}\n")
    )
    etag, body = await long_poll_until(cm_gw, job, etag, lambda b: b["config"] != {})
    assert body["config"] == {"lr": 0.1, "batch": 32}
    assert sources(body) == [doc]

    await core.patch_namespaced_config_map(
        name,
        namespace,
        {"data": {"document.yaml": "Include: {User: alice}\nConfigure: {lr: 0.2, batch: 32}\n"}},
    )
    etag, body = await long_poll_until(cm_gw, job, etag, lambda b: b["config"].get("lr") != 0.1)
    assert body["config"] == {"lr": 0.2, "batch": 32}

    await core.delete_namespaced_config_map(name, namespace)
    etag, body = await long_poll_until(cm_gw, job, etag, lambda b: b["config"] == {})
    assert sources(body) == []
    # One version per change in the cluster, and nothing more.
    assert await history(cm_gw, doc) == [(1, "upsert"), (2, "upsert"), (3, "delete")]


async def test_losing_the_label_removes_the_document_and_other_envs_are_left_out(
    cm_gw: Running, api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api)
    job = {"user": "bob"}
    etag, _ = await current(cm_gw, job)
    other = unique_name("other-env")
    await core.create_namespaced_config_map(
        namespace,
        configmap(other, "Configure: {theirs: true}\n", {LABEL: "true", ENV_LABEL: "elsewhere"}),
    )
    mine = unique_name("mine")
    labels = {LABEL: "true", ENV_LABEL: cm_gw.env}
    await core.create_namespaced_config_map(
        namespace, configmap(mine, "Configure: {mine: true}\n", labels)
    )
    # Events of one watch arrive in order: once `mine` is in, `other` was seen and left out.
    etag, body = await long_poll_until(cm_gw, job, etag, lambda b: b["config"] != {})
    assert body["config"] == {"mine": True}
    assert sources(body) == [document_name(namespace, mine)]

    await core.patch_namespaced_config_map(mine, namespace, {"metadata": {"labels": {LABEL: None}}})
    etag, body = await long_poll_until(cm_gw, job, etag, lambda b: b["config"] == {})
    r = await cm_gw.http.get(f"{cm_gw.url}/v1/documents", headers=cm_gw.as_admin)
    assert [d["name"] for d in (await r.json())["documents"]] == []


async def test_an_invalid_configmap_is_skipped_with_a_reason_and_keeps_the_last_good_one(
    cm_gw: Running, api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api)
    job = {"user": "carol"}
    etag, _ = await current(cm_gw, job)
    broken, good = unique_name("broken"), unique_name("good")
    await core.create_namespaced_config_map(namespace, configmap(broken, "Include: [unclosed"))
    await core.create_namespaced_config_map(namespace, configmap(good, "Configure: {a: 1}\n"))
    etag, body = await long_poll_until(cm_gw, job, etag, lambda b: b["config"] != {})
    assert body["config"] == {"a": 1}
    assert "not valid YAML" in watcher(cm_gw).sync.skipped[broken]

    # A good document broken by a later edit stays as it was; fixed, it goes through.
    await core.patch_namespaced_config_map(good, namespace, {"data": {"document.yaml": "- x"}})
    await core.patch_namespaced_config_map(
        broken, namespace, {"data": {"document.yaml": "Configure: {b: 2}\n"}}
    )
    etag, body = await long_poll_until(cm_gw, job, etag, lambda b: "b" in b["config"])
    assert body["config"] == {"a": 1, "b": 2}
    assert "must be a mapping" in watcher(cm_gw).sync.skipped[good]
    assert broken not in watcher(cm_gw).sync.skipped
    assert await history(cm_gw, document_name(namespace, good)) == [(1, "upsert")]


async def test_listing_again_changes_nothing_and_a_second_gateway_writes_nothing(
    settings: Settings,
    pg_dsn: str,
    make_env: EnvFactory,
    kube: Path,
    api: client.ApiClient,
    namespace: str,
) -> None:
    core = client.CoreV1Api(api)
    names = [unique_name("pre") for _ in range(3)]
    for i, name in enumerate(names):  # before any gateway: the first list finds them
        await core.create_namespaced_config_map(
            namespace, configmap(name, f"Include: {{app: a{i}}}\nConfigure: {{i: {i}}}\n")
        )
    env = (await make_env(partitions=2)).name
    conf = cm_settings(kube, namespace)
    async with GatewayServer(settings, env, pg_dsn, conf) as first:
        await first.wait_ready(30)
        assert first.configmaps is not None
        await asyncio.wait_for(first.configmaps.synced.wait(), DEADLINE_S)
        assert first.configmaps.sync.total.created == 3

        report, _ = await first.configmaps.relist()
        assert report.changes == 0

        async with GatewayServer(settings, env, pg_dsn, conf) as second:
            await second.wait_ready(30)
            assert second.configmaps is not None
            await asyncio.wait_for(second.configmaps.synced.wait(), DEADLINE_S)
            assert second.configmaps.sync.total.changes == 0
            assert sorted(second.state.known_versions().items()) == sorted(
                (document_name(namespace, n), 1) for n in names
            )
