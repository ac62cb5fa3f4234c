"""The local platform over HTTP, as a notebook drives it: the same jobs as `job` submits,
an admin token, a 4xx with a message for every mistake."""

from __future__ import annotations

from typing import Any

import aiohttp

from dlrover_events.envs.tokens import Scope, Tokens
from dlrover_events.store import EnvStore
from schemas.plans import ScalePlan
from tests.integration.local.conftest import Local
from tests.integration.local.test_local_platform import sleeper_job


async def mint(local: Local, scope: Scope) -> str:
    store = await EnvStore.open(local.pg_dsn, local.env, max_size=1)
    try:
        _, token = await Tokens(store.pool, local.env).mint("test", [scope])
    finally:
        await store.close()
    return token


async def test_jobs_over_http_with_an_admin_token(local: Local) -> None:
    ctx, task = await local.start_operator()
    base = ctx.endpoints["local jobs API"].split()[0].removesuffix("/v1/jobs")
    admin = {"Authorization": f"Bearer {await mint(local, Scope.ADMIN)}"}
    reader = {"Authorization": f"Bearer {await mint(local, Scope.READ)}"}
    try:
        async with aiohttp.ClientSession(base) as http:

            async def call(
                method: str, path: str, headers: dict[str, str], **kw: Any
            ) -> tuple[int, Any]:
                async with http.request(method, path, headers=headers, **kw) as r:
                    return r.status, await r.json()

            status, body = await call("GET", "/v1/jobs", {})
            assert status == 401 and "bearer token" in body["error"]
            status, body = await call("GET", "/v1/jobs", reader)
            assert status == 403 and "admin" in body["error"]

            status, body = await call("POST", "/v1/jobs", admin, json=sleeper_job("api-job", 1))
            assert status == 201, body
            assert body["name"] == "api-job" and body["roles"]["worker"]["replicas"] == 1
            status, body = await call("POST", "/v1/jobs", admin, json=sleeper_job("api-job", 1))
            assert status == 409 and "already exists" in body["error"]
            status, body = await call("POST", "/v1/jobs", admin, data=b"{not json")
            assert status == 400 and "not JSON" in body["error"]
            status, body = await call("POST", "/v1/jobs", admin, json={"kind": "Pod"})
            assert status == 422 and "TrainingJob" in body["error"]
            status, body = await call("POST", "/v1/jobs", admin, json=sleeper_job("big", 9))
            assert status == 422 and "above maxReplicas 4" in body["error"]

            status, body = await call("GET", "/v1/jobs", admin)
            assert status == 200 and [j["name"] for j in body["jobs"]] == ["api-job"]
            status, body = await call("GET", "/v1/jobs/api-job", admin)
            assert status == 200 and body["spec"]["roles"]["worker"]["replicas"] == 1
            status, body = await call("GET", "/v1/jobs/nope", admin)
            assert status == 404 and "nope" in body["error"]

            status, body = await call(
                "POST", "/v1/jobs/api-job/scale", admin, json={"role": "worker", "replicas": 2}
            )
            assert status == 202, body
            plan_id = body["plan_id"]
            plan = await local.tap.until(
                lambda: next((p for p in local.tap.of(ScalePlan) if p.plan_id == plan_id), None),
                "the API's plan",
            )
            assert plan.source == "api"
            status, body = await call(
                "POST", "/v1/jobs/api-job/scale", admin, json={"role": "ps", "replicas": 2}
            )
            assert status == 422 and "no role 'ps'" in body["error"]
            status, body = await call("POST", "/v1/jobs/api-job/scale", admin, json={"n": 1})
            assert status == 422

            status, body = await call("DELETE", "/v1/jobs/api-job", admin)
            assert status == 200
            status, body = await call("DELETE", "/v1/jobs/api-job", admin)
            assert status == 404
    finally:
        ctx.stop.set()
        await task
