"""The console's API on real parts: auth, the live tail with filters, the jobs board."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest

from schemas.jobs import JobMeta, JobSubmitted, NodeUsage, RoleSpec, RuntimeSample
from schemas.plans import (
    NodeGroupResource,
    NodeResource,
    OptimizePlan,
    ResourcePlan,
    ScalePlan,
    ScaleResult,
    ScaleStatus,
)
from tests.integration.console.conftest import Console

pytestmark = pytest.mark.integration

GiB = 2**30


def sample(env: str, job: str, step: int) -> RuntimeSample:
    return RuntimeSample(
        env=env,
        job=JobMeta(uuid=job),
        global_step=step,
        speed=2.0,
        samples_per_s=64.0,
        nodes=[NodeUsage(type="worker", id=0, memory=3 * GiB, step_time=0.5)],
    )


async def read_sse(resp: aiohttp.ClientResponse, count: int) -> list[tuple[str, dict[str, Any]]]:
    """The next ``count`` non-ready events of a stream."""
    got: list[tuple[str, dict[str, Any]]] = []
    name, data = "message", b""
    async for raw in resp.content:
        line = raw.rstrip(b"\n")
        if line.startswith(b"event:"):
            name = line[6:].strip().decode()
        elif line.startswith(b"data:"):
            data += line[5:].strip()
        elif not line and data:
            got.append((name, orjson.loads(data)))
            name, data = "message", b""
            if len([g for g in got if g[0] != "ready"]) >= count:
                break
    return [g for g in got if g[0] != "ready"]


async def test_token_is_required_but_not_for_the_page(console: Console) -> None:
    async with aiohttp.ClientSession() as http:
        r = await http.get(console.url)
        assert r.status == 200 and console.env in await r.text()
        r = await http.get(console.url + "v1/jobs")
        assert r.status == 401
        r = await http.get(console.url + "v1/jobs", headers={"Authorization": "Bearer nope"})
        assert r.status == 401
        other = "dle.someenv.0123456789ab." + "x" * 43
        r = await http.get(console.url + "v1/jobs", headers={"Authorization": f"Bearer {other}"})
        assert r.status == 403
        r = await http.get(console.url + "v1/events?topic=nope", headers=console.auth)
        assert r.status == 400
        assert "unknown topics" in (await r.json())["error"]["message"]


async def test_live_tail_filters_by_job_and_type(console: Console) -> None:
    env = console.env
    async with aiohttp.ClientSession() as http:
        r = await http.get(
            console.url + "v1/events",
            params={"job": "job-b", "type": "job.*"},
            headers=console.auth,
        )
        assert r.status == 200 and r.headers["Content-Type"] == "text/event-stream"
        first = await r.content.readuntil(b"\n\n")
        assert b"event: ready" in first
        reading = asyncio.create_task(read_sse(r, 2))
        await console.producer.publish_many(
            [sample(env, "job-a", 1), sample(env, "job-b", 1), sample(env, "job-a", 2)]
        )
        await console.producer.publish(sample(env, "job-b", 2))
        got = await asyncio.wait_for(reading, 20)
        r.close()
    assert [(n, d["job"], d["event"]["global_step"]) for n, d in got] == [
        ("line", "job-b", 1),
        ("line", "job-b", 2),
    ]
    assert got[0][1]["type"] == "job.runtime_sample"
    assert got[0][1]["topic"] == f"{env}.job.metrics"
    assert "step=1" in got[0][1]["summary"]


async def test_backlog_replays_recent_matching_events(console: Console) -> None:
    env = console.env
    await console.producer.publish_many([sample(env, "job-c", s) for s in range(1, 4)])
    async with aiohttp.ClientSession() as http:
        for _ in range(100):  # until the hub has seen them
            body = await (await http.get(console.url + "v1/jobs", headers=console.auth)).json()
            if any(j["job"] == "job-c" and j["global_step"] == 3 for j in body["jobs"]):
                break
            await asyncio.sleep(0.1)
        r = await http.get(
            console.url + "v1/events",
            params={"job": "job-c", "backlog": "2"},
            headers=console.auth,
        )
        got = await asyncio.wait_for(read_sse(r, 2), 20)
        r.close()
    assert [d["event"]["global_step"] for _, d in got] == [2, 3]


async def test_jobs_show_current_resources_and_last_plan(console: Console) -> None:
    env, job = console.env, JobMeta(uuid="job-r", name="resnet")
    group = NodeGroupResource(count=4, node_resource=NodeResource(memory=16 * GiB))
    events = [
        JobSubmitted(
            env=env, job=job, roles={"worker": RoleSpec(replicas=2, cpu=4, memory=8 * GiB)}
        ),
        sample(env, "job-r", 10),
        OptimizePlan(
            env=env,
            job=job,
            plan_id="p1",
            stage="running",
            optimizer="worker_resource",
            reason="memory near its limit",
            resource=ResourcePlan(node_group_resources={"worker": group}),
        ),
        ScalePlan(env=env, job=job, plan_id="s1", node_group_resources={"worker": group}),
        ScaleResult(env=env, job=job, plan_id="s1", status=ScaleStatus.APPLIED),
    ]
    await console.producer.publish_many(events)
    view: dict[str, Any] = {}
    async with aiohttp.ClientSession() as http:
        for _ in range(100):
            body = await (await http.get(console.url + "v1/jobs", headers=console.auth)).json()
            view = next((j for j in body["jobs"] if j["job"] == "job-r"), {})
            if view.get("events") == len(events):  # five topics: read in any order
                break
            await asyncio.sleep(0.1)
    assert view["name"] == "resnet" and view["status"] == "running"
    assert view["resources"]["worker"] == {
        "replicas": 4,
        "cpu": 4.0,
        "memory": 16 * GiB,
        "gpu_num": 0,
    }
    assert view["usage"]["worker-0"]["memory"] == 3 * GiB
    assert view["global_step"] == 10 and view["speed"] == 2.0
    assert view["last_plan"]["optimizer"] == "worker_resource"
    assert view["last_plan"]["groups"]["worker"] == {"count": 4, "memory": 16 * GiB}
    assert view["last_scale"]["status"] == "applied"


async def test_health_says_ready(console: Console) -> None:
    async with aiohttp.ClientSession() as http:
        r = await http.get(console.url + "healthz")
        assert r.status == 200 and (await r.json())["ready"] is True
