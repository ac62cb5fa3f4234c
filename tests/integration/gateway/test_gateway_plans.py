"""A job's plan and optimize requests through the gateway, on the real broker and Postgres:
events published to the env's topics -> the gateway's view -> HTTP; and an optimize
request answered by the env's real brain."""

from __future__ import annotations

import asyncio
import statistics
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from multidict import CIMultiDict
from yarl import URL

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topic_reader import read_topic
from dlrover_events.bus.topics import JOB_EVENTS, topic
from dlrover_events.settings import Settings
from handlers.gateway.runtime import GatewayServer
from schemas.codec import decode
from schemas.envelope import Event
from schemas.jobs import JobCompleted, JobMeta, JobSubmitted, RoleSpec
from schemas.plans import (
    JobPlan,
    OptimizePlan,
    OptimizeRequest,
    ResourcePlan,
    ScalePlan,
    ScaleResult,
    ScaleStatus,
)
from streams.brain.runtime.app import Brain
from tests.integration.gateway.conftest import Running, gateway_settings

pytestmark = pytest.mark.integration


def meta(name: str) -> JobMeta:
    return JobMeta(uuid=f"{name}-{uuid.uuid4().hex[:8]}", name=name, user="u1", scenario="s")


def ps_job(env: str, job: JobMeta) -> JobSubmitted:
    roles = {"worker": RoleSpec(replicas=2), "ps": RoleSpec(replicas=1)}
    return JobSubmitted(env=env, job=job, roles=roles, distribution="ps")


def optimize_plan(env: str, job: JobMeta, plan_id: str) -> OptimizePlan:
    return OptimizePlan(
        env=env,
        job=job,
        plan_id=plan_id,
        stage="create",
        optimizer="test",
        reason="a test's plan",
        resource=ResourcePlan(training={"local_batch_size": 32}),
        caused_by="cause",
    )


def scale_plan(env: str, job: JobMeta, plan_id: str) -> ScalePlan:
    return ScalePlan(env=env, job=job, plan_id=plan_id, training={"local_batch_size": 32})


def result(env: str, job: JobMeta, plan_id: str) -> ScaleResult:
    return ScaleResult(env=env, job=job, plan_id=plan_id, status=ScaleStatus.APPLIED)


async def call(
    gw: Running, method: str, path: str, *, headers: dict[str, str] | None = None, **kw: Any
) -> tuple[int, Any, CIMultiDict[str]]:
    async with gw.http.request(method, gw.url + path, headers=headers, **kw) as resp:
        body = await resp.json() if resp.content_type == "application/json" else await resp.text()
        return resp.status, body, resp.headers.copy()


@pytest.fixture
async def producer(settings: Settings) -> AsyncIterator[Producer]:
    async with Producer(settings, linger_ms=0) as p:
        yield p


async def publish(producer: Producer, *events: Event) -> None:
    await producer.publish_many(events)


async def plan_when(gw: Running, job: str, ok: Any, timeout_s: float = 10) -> tuple[int, Any, Any]:
    """Poll until the plan satisfies ``ok`` (not a timing assertion: the view follows the
    topics asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while True:
        status, body, headers = await call(gw, "GET", f"/v1/jobs/{job}/plan", headers=gw.as_reader)
        if (status == 200 and ok(body)) or time.monotonic() > deadline:
            return status, body, headers
        await asyncio.sleep(0.05)


async def test_plan_of_a_job_with_etag_304_and_long_poll(gw: Running, producer: Producer) -> None:
    job = meta("plan")
    env = gw.env
    await publish(
        producer,
        ps_job(env, job),
        optimize_plan(env, job, "o1"),
        scale_plan(env, job, "s1"),
        result(env, job, "s1"),
    )
    status, body, headers = await plan_when(gw, job.uuid, lambda b: b["result"] is not None)
    assert status == 200, body
    plan = JobPlan.model_validate(body)
    assert plan.job == job
    assert plan.optimize_plan is not None and plan.optimize_plan.plan_id == "o1"
    assert plan.scale_plan is not None and plan.scale_plan.plan_id == "s1"
    assert plan.result is not None and plan.result.status == ScaleStatus.APPLIED
    assert plan.training_applied is None
    assert plan.knobs_to_apply() == ("s1", {"local_batch_size": 32})
    etag = headers["ETag"]
    assert etag.startswith('"') and headers["Cache-Control"] == "no-cache"

    path = f"/v1/jobs/{job.uuid}/plan"
    status, _, again = await call(gw, "GET", path, headers={**gw.as_reader, "If-None-Match": etag})
    assert (status, again["ETag"]) == (304, etag)
    # a wait that sees no change ends in 304 after it
    started = time.monotonic()
    status, _, _ = await call(
        gw, "GET", path, params={"wait": "0.3"}, headers={**gw.as_reader, "If-None-Match": etag}
    )
    assert status == 304 and time.monotonic() - started >= 0.29

    # a long-poll returns as soon as a new plan for the job is read, not before
    poll = asyncio.create_task(
        call(
            gw, "GET", path, params={"wait": "20"}, headers={**gw.as_reader, "If-None-Match": etag}
        )
    )
    await asyncio.sleep(0.3)
    other = meta("other")
    await publish(producer, ps_job(env, other), scale_plan(env, other, "x1"))  # another job
    await asyncio.sleep(0.5)
    assert not poll.done()
    started = time.monotonic()
    await publish(producer, scale_plan(env, job, "s2"))
    status, body, headers = await asyncio.wait_for(poll, 10)
    print(f"long-poll returned {1000 * (time.monotonic() - started):.1f} ms after the ScalePlan")
    assert status == 200 and headers["ETag"] != etag
    assert body["scale_plan"]["plan_id"] == "s2" and body["result"] is None  # s2 unanswered
    assert body["optimize_plan"]["plan_id"] == "o1"


async def test_unknown_job_no_token_bad_query(gw: Running) -> None:
    status, body, _ = await call(gw, "GET", "/v1/jobs/nope/plan", headers=gw.as_reader)
    assert status == 404 and body["error"]["code"] == "unknown_job"
    assert "'nope'" in body["error"]["message"]
    status, body, headers = await call(gw, "GET", "/v1/jobs/nope/plan")
    assert status == 401 and "Bearer" in headers["WWW-Authenticate"]
    assert "bearer token" in body["error"]["message"]
    status, body, _ = await call(gw, "POST", "/v1/jobs/nope/optimize", json={"stage": "create"})
    assert status == 401
    for params in ({"wait": "61"}, {"wait": "x"}, {"wiat": "1"}):
        status, body, _ = await call(
            gw, "GET", "/v1/jobs/nope/plan", params=params, headers=gw.as_reader
        )
        assert status == 400 and body["error"]["message"], (params, body)
    status, body, _ = await call(gw, "GET", f"/v1/jobs/{'j' * 257}/plan", headers=gw.as_reader)
    assert status == 400 and "256" in body["error"]["message"]


async def test_optimize_rejects_bad_requests_with_a_message(
    gw: Running, producer: Producer
) -> None:
    job = meta("bad")
    done = meta("done")
    env = gw.env
    await publish(producer, ps_job(env, job), ps_job(env, done), JobCompleted(env=env, job=done))
    await plan_when(gw, done.uuid, lambda b: True)
    await plan_when(gw, job.uuid, lambda b: True)
    path = f"/v1/jobs/{job.uuid}/optimize"
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"data": b"{nope"}, 400, "not valid JSON"),
        ({"json": ["create"]}, 422, "JSON object"),
        ({"json": {}}, 422, "does not validate"),
        ({"json": {"stage": ""}}, 422, "does not validate"),
        ({"json": {"stage": 3}}, 422, "does not validate"),
        ({"json": {"stage": "create", "typo": 1}}, 422, "does not validate"),
        ({"json": {"stage": "create", "config": []}}, 422, "does not validate"),
        ({"json": {"stage": "create\x00"}}, 422, "NUL"),
        ({"json": {"stage": "create", "config": {"x": "y" * 70_000}}}, 413, "over"),
        ({"data": b"x" * (2 << 20)}, 413, "too large"),
        ({"json": {"stage": "create"}, "params": {"timeout": "0"}}, 400, "timeout"),
        ({"json": {"stage": "create"}, "params": {"timeout": "61"}}, 400, "timeout"),
    ]
    for kw, want, says in cases:
        status, body, _ = await call(gw, "POST", path, headers=gw.as_reader, **kw)
        assert status == want and says in body["error"]["message"], (kw, body)
    status, body, _ = await call(
        gw, "POST", "/v1/jobs/nope/optimize", json={"stage": "create"}, headers=gw.as_reader
    )
    assert status == 404 and body["error"]["code"] == "unknown_job"
    status, body, _ = await call(
        gw, "POST", f"/v1/jobs/{done.uuid}/optimize", json={"stage": "c"}, headers=gw.as_reader
    )
    assert status == 409 and "finished" in body["error"]["message"]


async def test_optimize_without_a_brain_is_a_504_and_the_request_stays_published(
    gw: Running, producer: Producer, settings: Settings
) -> None:
    job = meta("nobrain")
    await publish(producer, ps_job(gw.env, job))
    await plan_when(gw, job.uuid, lambda b: True)
    started = time.monotonic()
    status, body, _ = await call(
        gw,
        "POST",
        f"/v1/jobs/{job.uuid}/optimize",
        params={"timeout": "0.5"},
        json={"stage": "create", "optimizer": "ps-cold-create", "config": {"a": 1}},
        headers=gw.as_reader,
    )
    assert 0.5 <= time.monotonic() - started < 5
    assert status == 504, body
    error = body["error"]
    request_id = error["details"]["event_id"]
    assert request_id in error["message"] and "stays published" in error["message"]
    records = await read_topic(settings, topic(gw.env, JOB_EVENTS), timeout_s=10)
    requests = [e for e in map(decode, (r.value for r in records)) if e.type == "optimize.request"]
    assert len(requests) == 1
    request = requests[0]
    assert isinstance(request, OptimizeRequest)
    assert str(request.event_id) == request_id
    assert (request.key, request.job, request.stage) == (job.uuid, job, "create")
    assert (request.optimizer, request.config, request.source) == (
        "ps-cold-create",
        {"a": 1},
        "gateway",
    )
    assert gw.server.plans.waiting == 0


async def test_optimize_is_answered_by_the_brain_of_the_env(
    gw: Running, producer: Producer, settings: Settings, pg_dsn: str
) -> None:
    job = meta("brain")
    await publish(producer, ps_job(gw.env, job))
    await plan_when(gw, job.uuid, lambda b: True)
    brain = Brain(settings, gw.env, pg_dsn, checkpoint_every_s=0.5)
    await brain.start()
    try:
        # the brain's own plan for the submission first: the brain is up and caught up
        _, first, _ = await plan_when(gw, job.uuid, lambda b: b["scale_plan"], timeout_s=60)
        assert first["scale_plan"] is not None, first
        asked = {"optimizer_params": {"ps-cold-create": {"replicas": 2}}}
        status, body, headers = await call(
            gw,
            "POST",
            f"/v1/jobs/{job.uuid}/optimize",
            params={"timeout": "30"},
            json={"stage": "create", "optimizer": "ps-cold-create", "config": asked},
            headers=gw.as_reader,
        )
    finally:
        await brain.stop()
    assert status == 200, body
    plan = OptimizePlan.model_validate(body)
    assert plan.caused_by == headers["X-Request-Event-Id"]
    assert plan.job == job and plan.optimizer == "ps-cold-create"
    assert plan.resource.node_group_resources["ps"].count == 2
    _, view, _ = await plan_when(
        gw, job.uuid, lambda b: b["optimize_plan"]["plan_id"] == plan.plan_id
    )
    assert view["optimize_plan"] == body


async def test_a_gateway_started_later_reads_the_topics_whole_before_it_is_ready(
    gw: Running, producer: Producer, settings: Settings, pg_dsn: str
) -> None:
    jobs = [meta(f"j{i}") for i in range(5)]
    await publish(producer, *(ps_job(gw.env, j) for j in jobs))
    await publish(producer, *(scale_plan(gw.env, j, f"p-{j.uuid}") for j in jobs))
    await publish(producer, *(result(gw.env, j, f"p-{j.uuid}") for j in jobs))
    await publish(producer, JobCompleted(env=gw.env, job=jobs[0]))
    async with GatewayServer(settings, gw.env, pg_dsn, gateway_settings()) as second:
        await second.wait_ready(30)
        # no polling: ready means every topic was read to its end
        for j in jobs:
            view = second.plans.view(j.uuid)
            assert view is not None and view.submitted and view.result() is not None
        finished = second.plans.view(jobs[0].uuid)
        assert finished is not None and finished.finished
        status, body, _ = await call(
            Running(second, gw.env, second.url, gw.admin, gw.read, gw.http), "GET", "/readyz"
        )
        assert (status, body["ready"], body["jobs"]) == (200, True, 5)
    # Capped: which jobs stay depends on how the four topics' reads interleave (the
    # order of eviction itself is the unit tests'), but never more than the cap.
    capped = gateway_settings().model_copy(update={"plan_jobs": 3})
    async with GatewayServer(settings, gw.env, pg_dsn, capped) as third:
        await third.wait_ready(30)
        assert len(third.plans) == 3 and third.plans.evicted >= 2


async def test_long_poll_latency_after_a_scale_plan_and_its_result(
    gw: Running, producer: Producer
) -> None:
    """Not a timing assertion: prints the time from publishing a ScalePlan and its
    ScaleResult to a waiting long-poll seeing both."""
    job = meta("latency")
    await publish(producer, ps_job(gw.env, job))
    _, _, headers = await plan_when(gw, job.uuid, lambda b: True)
    path = f"/v1/jobs/{job.uuid}/plan"
    took: list[float] = []
    for i in range(7):
        etag = headers["ETag"]
        poll = asyncio.create_task(
            call(
                gw,
                "GET",
                path,
                params={"wait": "20"},
                headers={**gw.as_reader, "If-None-Match": etag},
            )
        )
        await asyncio.sleep(0.2)
        started = time.monotonic()
        await publish(producer, scale_plan(gw.env, job, f"s{i}"), result(gw.env, job, f"s{i}"))
        status, body, headers = await asyncio.wait_for(poll, 10)
        while status == 200 and body["result"] is None:  # the plan came first, alone
            status, body, headers = await call(
                gw,
                "GET",
                path,
                params={"wait": "20"},
                headers={**gw.as_reader, "If-None-Match": headers["ETag"]},
            )
        took.append(1000 * (time.monotonic() - started))
        assert status == 200 and body["result"]["plan_id"] == f"s{i}"
    print(
        "ScalePlan+ScaleResult to long-poll: "
        f"median {statistics.median(took):.1f} ms, all {[round(t, 1) for t in took]}"
    )


async def test_a_job_uuid_with_any_characters_is_found_when_quoted(
    gw: Running, producer: Producer
) -> None:
    job = JobMeta(uuid=f"ns/a b%2F\u00e9-{uuid.uuid4().hex[:6]}")
    await publish(producer, ps_job(gw.env, job))
    path = f"/v1/jobs/{urllib.parse.quote(job.uuid, safe='')}/plan"
    deadline = time.monotonic() + 10
    while True:
        async with gw.http.get(URL(gw.url + path, encoded=True), headers=gw.as_reader) as resp:
            body = await resp.json()
            if resp.status == 200 or time.monotonic() > deadline:
                break
        await asyncio.sleep(0.05)
    assert resp.status == 200, body
    assert body["job"]["uuid"] == job.uuid
