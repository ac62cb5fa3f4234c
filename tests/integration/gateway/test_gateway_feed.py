"""Instances build their index from the topic; Postgres is put back over a lost publish;
the `up` service and the token CLI work on the real parts."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import aiohttp
import pytest

from dlrover_events.bus.topic_reader import read_topic
from dlrover_events.bus.topics import CONFIG_CHANGES, topic
from dlrover_events.config.matching import Index, make_job
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.envs.tokens import Scope
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from dlrover_events.store import connect, env_schema
from handlers.gateway.runtime import GatewayServer
from handlers.gateway.service import service
from schemas.codec import decode
from schemas.config import ConfigChange
from tests.conftest import EnvFactory, unique_env
from tests.integration.gateway.conftest import Running, gateway_settings, mint

pytestmark = pytest.mark.integration


async def test_every_change_is_on_the_compacted_topic_keyed_by_name(
    gw: Running, settings: Settings
) -> None:
    doc = {"name": "k", "Configure": {"a": 1}}
    r = await gw.http.post(gw.url + "/v1/documents", json=doc, headers=gw.as_admin)
    assert r.status == 201
    r = await gw.http.delete(gw.url + "/v1/documents/k", headers={**gw.as_admin, "If-Match": '"1"'})
    assert r.status == 200
    records = await read_topic(settings, topic(gw.env, CONFIG_CHANGES), expect=2, timeout_s=10)
    changes = [decode(rec.value) for rec in records]
    assert [rec.key for rec in records] == [b"k", b"k"]
    assert all(isinstance(c, ConfigChange) for c in changes)
    assert [(c.op, c.version) for c in changes] == [("upsert", 1), ("delete", 2)]  # type: ignore[attr-defined]


async def test_a_new_instance_builds_its_index_from_the_topic(
    gw: Running, settings: Settings, pg_dsn: str
) -> None:
    for i in range(20):
        doc = {"name": f"d{i}", "Include": {"user": f"u{i % 4}"}, "Configure": {"i": i}}
        r = await gw.http.post(gw.url + "/v1/documents", json=doc, headers=gw.as_admin)
        assert r.status == 201
    r = await gw.http.delete(
        gw.url + "/v1/documents/d3", headers={**gw.as_admin, "If-Match": '"1"'}
    )
    assert r.status == 200
    async with GatewayServer(settings, gw.env, pg_dsn, gateway_settings()) as second:
        await second.wait_ready(30)

        def has_all(index: Index) -> bool:
            # not the count alone: 19 is also d0..d18 before d19 and the deletion of d3
            return len(index) == 19 and "d19" in index and "d3" not in index

        for _ in range(100):  # the first instance follows asynchronously too
            if has_all(gw.server.state.index):
                break
            await asyncio.sleep(0.05)
        assert has_all(second.state.index)
        assert has_all(gw.server.state.index)
        for user in ("u0", "u1", "u2", "u3"):
            job = make_job({"user": user})
            assert second.state.answer(job).body == gw.server.state.answer(job).body


async def test_reconcile_puts_back_what_postgres_has_and_the_topic_lacks(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    env = (await make_env()).name
    read = await mint(pg_dsn, env, Scope.READ)
    # A commit whose publish never happened: the row is only in Postgres.
    conn = await connect(pg_dsn, env_schema(env))
    try:
        await conn.execute(
            "INSERT INTO configs (name, version, document) VALUES ($1, $2, $3)",
            "lost",
            1,
            {"name": "lost", "Configure": {"found": True}, "version": 1},
        )
    finally:
        await conn.close()
    async with GatewayServer(settings, env, pg_dsn, gateway_settings()) as server:
        await server.wait_ready(30)
        async with aiohttp.ClientSession() as http:
            for _ in range(200):
                async with http.get(
                    server.url + "/v1/config", headers={"Authorization": f"Bearer {read}"}
                ) as r:
                    body = await r.json()
                if body["config"]:
                    break
                await asyncio.sleep(0.05)
    assert body["config"] == {"found": True}
    assert body["sources"][0]["name"] == "lost"


async def test_service_for_up(
    settings: Settings, pg_dsn: str, make_env: EnvFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = (await make_env()).name
    monkeypatch.setenv("DLROVER_EVENTS_GATEWAY_PORT", "0")
    ctx = ServiceContext(settings, env, pg_dsn)
    task = asyncio.create_task(service.run(ctx))
    await asyncio.wait_for(ctx.ready.wait(), 30)
    assert not task.done()
    ctx.stop.set()
    await asyncio.wait_for(task, 30)
    assert service.name == "gateway"


def test_token_cli_mints_a_working_token(settings: Settings, pg_dsn: str) -> None:
    async def scenario() -> None:
        registry = EnvRegistry(settings, pg_dsn)
        env = (await registry.create(unique_env())).name
        try:
            code = (
                "import sys, typer; from handlers.gateway.cli import token_app; "
                "token_app(sys.argv[1:])"
            )
            cli_env = {**os.environ, "DLROVER_EVENTS_PG_DSN": pg_dsn}
            made = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-c", code, "create", "--env", env, "--scope", "admin"],
                capture_output=True,
                text=True,
                env=cli_env,
                timeout=60,
            )
            assert made.returncode == 0, made.stderr
            token = made.stdout.strip()
            assert token.startswith(f"dle.{env}.")
            listed = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-c", code, "list", "--env", env],
                capture_output=True,
                text=True,
                env=cli_env,
                timeout=60,
            )
            assert "admin" in listed.stdout
            assert token not in listed.stdout
            async with GatewayServer(settings, env, pg_dsn, gateway_settings()) as server:
                await server.wait_ready(30)
                async with aiohttp.ClientSession() as http:
                    r = await http.get(
                        server.url + "/v1/documents", headers={"Authorization": f"Bearer {token}"}
                    )
                    assert r.status == 200
        finally:
            await registry.delete(env, force=True)

    asyncio.run(scenario())
