"""The local platform's server serves /v1/experiments beside /v1/jobs, behind the same
admin token (what the experiments API answers: tests/integration/experiments)."""

from __future__ import annotations

import aiohttp

from dlrover_events.envs.tokens import Scope
from tests.integration.local.conftest import Local
from tests.integration.local.test_local_jobs_api import mint
from tests.unit.experiments.documents import document


async def test_experiments_are_served_beside_the_jobs(local: Local) -> None:
    ctx, task = await local.start_operator()
    base = ctx.endpoints["experiments API"].split()[0]
    assert base == ctx.endpoints["local jobs API"].split()[0].replace("/v1/jobs", "/v1/experiments")
    admin = {"Authorization": f"Bearer {await mint(local, Scope.ADMIN)}"}
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(base) as r:
                assert r.status == 401 and "bearer token" in (await r.json())["error"]
            async with http.get(base, headers=admin) as r:
                assert r.status == 200 and await r.json() == {"experiments": []}
            async with http.post(base, headers=admin, json=document("from-local")) as r:
                body = await r.json()
                assert r.status == 201 and body["env"] == local.env, body
    finally:
        ctx.stop.set()
        await task
