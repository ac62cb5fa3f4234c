"""``/v1/checkpoints`` and ``/v1/models`` on real Postgres, mounted as the local platform's
server mounts them beside ``/v1/experiments``: the catalog read with a read token, a
version registered with the admin token (and refused with a read token, 403, or none,
401), its lineage served, and a 4xx with a message for every mistake: an unknown model or
checkpoint (404), a deleted checkpoint (409), a bad body or name (422)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from dlrover_events.checkpoints.store import Batch, CheckpointStore
from dlrover_events.envs.tokens import Scope, Tokens
from dlrover_events.store import create_pool, env_schema
from handlers.experiments.models import mount
from schemas.checkpoints import CheckpointDeleted, DeletionReason
from schemas.jobs import JobMeta
from tests.conftest import EnvFactory
from tests.integration.checkpoints.conftest import committed

pytestmark = pytest.mark.integration


@pytest.fixture
async def http(pg_dsn: str, make_env: EnvFactory) -> AsyncIterator[tuple[Any, str, str]]:
    env = (await make_env()).name
    pool = await create_pool(pg_dsn, env_schema(env), max_size=2)
    store = CheckpointStore(pool)
    batch = Batch()
    for step in (1, 2):
        batch.add(committed(env, "job-a", step, url=f"file:///ck/job-a/{step}", plan_id="p1"))
    batch.add(
        CheckpointDeleted(
            env=env, job=JobMeta(uuid="uid-job-a", name="job-a"), checkpoint_id="job-a-1",
            url="file:///ck/job-a/1", step=1, reason=DeletionReason.MANUAL, detail="by hand",
        )
    )  # fmt: skip
    await store.record(batch)
    tokens = Tokens(pool, env)
    _, admin = await tokens.mint("test-admin", [Scope.ADMIN])
    _, reader = await tokens.mint("test-reader", [Scope.READ])
    root = web.Application()
    mount(root, store, tokens)
    server = TestServer(root, host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession(str(server.make_url(""))) as session:
            yield session, admin, reader
    finally:
        await server.close()
        await pool.close()


async def test_the_registry_over_http(http: tuple[aiohttp.ClientSession, str, str]) -> None:
    session, admin, reader = http
    as_admin = {"Authorization": f"Bearer {admin}"}
    as_reader = {"Authorization": f"Bearer {reader}"}

    async def call(method: str, path: str, headers: dict[str, str], **kw: Any) -> tuple[int, Any]:
        async with session.request(method, path, headers=headers, **kw) as r:
            return r.status, await r.json()

    status, body = await call("GET", "/v1/checkpoints?job=job-a", as_reader)
    assert status == 200, body
    assert [c["checkpoint_id"] for c in body["checkpoints"]] == ["job-a-2"]
    status, body = await call("GET", "/v1/checkpoints?job=job-a&all=true", as_reader)
    assert [(c["checkpoint_id"], c["state"]) for c in body["checkpoints"]] == [
        ("job-a-2", "kept"),
        ("job-a-1", "deleted"),
    ]
    status, body = await call("GET", "/v1/checkpoints/job-a-1", as_reader)
    assert (status, body["delete_detail"]) == (200, "by hand")

    versions = "/v1/models/m1/versions"
    register = {"checkpoint": "job-a-2", "notes": "first", "labels": ["a", "b", "a"]}
    status, body = await call("POST", versions, as_reader, json=register)
    assert status == 403, body
    status, body = await call("POST", versions, {}, json=register)
    assert status == 401, body
    status, body = await call("POST", versions, as_admin, json=register)
    assert status == 201, body
    assert body["version"]["version"] == 1 and body["version"]["labels"] == ["a", "b"]
    assert body["version"]["lineage"]["plan_in_force"] == "p1"
    assert body["version"]["lineage"]["plans"][0]["plan_id"] == "p1"
    assert body["version"]["registered_by"] == "api"

    status, body = await call("GET", "/v1/models", as_reader)
    assert (status, [(m["name"], m["versions"]) for m in body["models"]]) == (200, [("m1", 1)])
    status, body = await call("GET", "/v1/models/m1?version=1", as_reader)
    assert (status, body["version"]["checkpoint"]["checkpoint_id"]) == (200, "job-a-2")
    status, body = await call("GET", "/v1/models/m1/versions", as_reader)
    assert [v["version"] for v in body["versions"]] == [1]

    for method, path, payload, expected, says in (
        ("POST", versions, {"checkpoint": "job-a-1"}, 409, "is deleted"),
        ("POST", versions, {"checkpoint": "nope"}, 404, "no checkpoint 'nope'"),
        ("POST", versions, {"best_of": "nope"}, 422, "no experiment named 'nope'"),
        ("POST", versions, {}, 422, "give one of checkpoint"),
        ("POST", versions, {"checkpoint": "job-a-2", "labels": "x"}, 422, "labels"),
        ("POST", versions, {"checkpoint": "job-a-2", "color": 1}, 422, "unknown field"),
        ("POST", "/v1/models/bad%20name/versions", {"checkpoint": "job-a-2"}, 422, "model name"),
        ("GET", "/v1/models/nope", None, 404, "no model 'nope'"),
        ("GET", "/v1/models/m1?version=x", None, 400, "version"),
        ("GET", "/v1/models/m1?version=7", None, 404, "no version 7"),
        ("GET", "/v1/checkpoints", None, 400, "name a job"),
        ("GET", "/v1/checkpoints/nope", None, 404, "no checkpoint"),
    ):
        headers = as_admin if method == "POST" else as_reader
        status, body = await call(method, path, headers, json=payload)
        assert status == expected and says in body["error"], (path, payload, status, body)
    status, body = await call("POST", versions, as_admin, data=b"{not json")
    assert status == 400 and "not JSON" in body["error"], body
