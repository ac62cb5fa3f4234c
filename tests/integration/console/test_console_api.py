"""The console's API on real parts: auth, the live tail with filters, the jobs board, a
job's page, the dead letters, config documents, A/B results, the envs."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from dlrover_events.bus.topics import topic
from dlrover_events.envs.tokens import Scope
from dlrover_events.settings import Settings
from handlers.gateway.store import ConfigStore
from schemas.config import ConfigDocument
from schemas.dlq import FailureKind, fitting_letter
from schemas.evaluation import EvaluationReport
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
from streams.ab.report import ArmResult, compare
from streams.ab.summary import RunInfo, build_summary, write_summary
from tests.conftest import EnvFactory
from tests.integration.console.conftest import Console
from tests.integration.gateway.conftest import mint

pytestmark = pytest.mark.integration

GiB = 2**30
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def sample(env: str, job: str, step: int, world: int | None = None) -> RuntimeSample:
    return RuntimeSample(
        env=env,
        job=JobMeta(uuid=job),
        global_step=step,
        speed=2.0,
        samples_per_s=64.0,
        world_size=world,
        occurred_at=T0 + timedelta(seconds=30 * step),
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


def v1(console: Console, path: str = "") -> str:
    return f"{console.url}v1/envs/{console.env}{path}"


async def until_board(console: Console, found: Any) -> dict[str, Any]:
    """The jobs board, once ``found(body)`` holds (the hub reads five topics)."""
    body: dict[str, Any] = {}
    async with aiohttp.ClientSession() as http:
        for _ in range(200):
            body = await (await http.get(v1(console, "/jobs"), headers=console.auth)).json()
            if found(body):
                return body
            await asyncio.sleep(0.1)
    raise AssertionError(f"the board never showed it: {body}")


async def test_token_is_required_but_not_for_the_page(
    console: Console, pg_dsn: str, make_env: EnvFactory
) -> None:
    other_env = (await make_env(partitions=1)).name
    other_token = await mint(pg_dsn, other_env, Scope.READ)
    async with aiohttp.ClientSession() as http:
        r = await http.get(console.url)
        assert r.status == 200
        assert console.env in await r.text()
        assert "script-src 'self'" in r.headers["Content-Security-Policy"]
        r = await http.get(console.url + "static/console.js")
        assert r.status == 200
        r = await http.get(console.url + "static/vendor/uplot/uPlot.iife.min.js")
        assert r.status == 200
        assert "uPlot" in await r.text()
        r = await http.get(v1(console, "/jobs"))
        assert r.status == 401
        r = await http.get(v1(console, "/jobs"), headers={"Authorization": "Bearer nope"})
        assert r.status == 401
        # a token of another env (that exists) is refused here, and its own env is shown
        other = {"Authorization": f"Bearer {other_token}"}
        r = await http.get(v1(console, "/jobs"), headers=other)
        assert r.status == 403
        assert other_env in (await r.json())["error"]["message"]
        r = await http.get(f"{console.url}v1/envs/{other_env}/jobs", headers=other)
        assert r.status == 200
        r = await http.get(f"{console.url}v1/envs/nosuchenv/jobs", headers=console.auth)
        assert r.status == 404
        r = await http.get(v1(console, "/events?topic=nope"), headers=console.auth)
        assert r.status == 400
        assert "unknown topics" in (await r.json())["error"]["message"]


async def test_the_env_list_and_what_a_read_token_may_do(console: Console) -> None:
    async with aiohttp.ClientSession() as http:
        r = await http.get(console.url + "v1/envs", headers=console.auth)
        assert r.status == 200
        body = await r.json()
        assert body["home"] == console.env
        assert console.env in [e["name"] for e in body["envs"]]
        r = await http.get(v1(console, "/whoami"), headers=console.auth)
        me = await r.json()
        assert me["mode"] == "virtual"
        assert me["admin"] is False
        assert me["actions"] == []
        r = await http.get(v1(console, "/tokens"), headers=console.auth)
        assert r.status == 403


async def test_live_tail_filters_by_job_and_type(console: Console) -> None:
    env = console.env
    async with aiohttp.ClientSession() as http:
        r = await http.get(
            v1(console, "/events"), params={"job": "job-b", "type": "job.*"}, headers=console.auth
        )
        assert r.status == 200
        assert r.headers["Content-Type"] == "text/event-stream"
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
    await until_board(
        console, lambda b: any(j["job"] == "job-c" and j["global_step"] == 3 for j in b["jobs"])
    )
    async with aiohttp.ClientSession() as http:
        r = await http.get(
            v1(console, "/events"), params={"job": "job-c", "backlog": "2"}, headers=console.auth
        )
        got = await asyncio.wait_for(read_sse(r, 2), 20)
        r.close()
    assert [d["event"]["global_step"] for _, d in got] == [2, 3]


def job_r_events(env: str) -> list[Any]:
    job = JobMeta(uuid="job-r", name="resnet")
    group = NodeGroupResource(count=4, node_resource=NodeResource(memory=16 * GiB))
    return [
        JobSubmitted(
            env=env, job=job, roles={"worker": RoleSpec(replicas=2, cpu=4, memory=8 * GiB)}
        ),
        sample(env, "job-r", 10, world=2),
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
        sample(env, "job-r", 11, world=4),
    ]


async def test_jobs_show_current_resources_and_last_plan(console: Console) -> None:
    events = job_r_events(console.env)
    await console.producer.publish_many(events)
    body = await until_board(
        console,
        lambda b: any(j["job"] == "job-r" and j["events"] == len(events) for j in b["jobs"]),
    )
    view = next(j for j in body["jobs"] if j["job"] == "job-r")
    assert view["name"] == "resnet"
    assert view["status"] == "running"
    assert view["resources"]["worker"] == {
        "replicas": 4,
        "cpu": 4.0,
        "memory": 16 * GiB,
        "gpu_num": 0,
    }
    # sizes for people: binary units, never the raw byte counts
    assert view["resources_text"] == "worker 4x 4 cpu 16 GiB"
    assert view["usage_text"] == "worker-0 3 GiB"
    assert view["usage"]["worker-0"]["memory"] == 3 * GiB
    assert view["global_step"] == 11
    assert view["speed"] == 2.0
    assert view["world_size"] == 4
    assert view["last_plan"]["optimizer"] == "worker_resource"
    assert view["last_plan"]["groups"]["worker"] == {"count": 4, "memory": 16 * GiB}
    assert view["last_scale"]["status"] == "applied"


async def test_a_jobs_page_has_its_timeline_and_series(console: Console) -> None:
    events = job_r_events(console.env)
    await console.producer.publish_many(events)
    await until_board(
        console,
        lambda b: any(j["job"] == "job-r" and j["events"] == len(events) for j in b["jobs"]),
    )
    async with aiohttp.ClientSession() as http:
        by_uuid = await (await http.get(v1(console, "/jobs/job-r"), headers=console.auth)).json()
        by_name = await (await http.get(v1(console, "/jobs/resnet"), headers=console.auth)).json()
        r = await http.get(v1(console, "/jobs/nope"), headers=console.auth)
        assert r.status == 404
    assert by_name == by_uuid
    types = [e["type"] for e in by_uuid["timeline"]]
    assert sorted(types) == sorted(["job.submitted", "brain.plan", "scale.plan", "scale.result"])
    result = next(e for e in by_uuid["timeline"] if e["type"] == "scale.result")
    assert result["status"] == "applied"
    assert result["plan_id"] == "s1"
    submitted = next(e for e in by_uuid["timeline"] if e["type"] == "job.submitted")
    assert submitted["text"] == "worker: 2 replicas, cpu 4, memory 8 GiB"
    series = by_uuid["series"]
    assert series["world_size"] == [2, 4]
    assert series["speed"] == [2.0, 2.0]
    assert series["t"] == [(T0 + timedelta(seconds=s)).timestamp() for s in (300, 330)]


def report(env: str, evaluator: str, value: float, at: datetime) -> EvaluationReport:
    return EvaluationReport(
        env=env,
        evaluator=evaluator,
        window_start=at - timedelta(seconds=10),
        window_end=at,
        occurred_at=at,
        jobs=1,
        metrics={"gpu_hours": value},
    )


async def test_repeated_reports_are_told_as_repeats_not_lines(console: Console) -> None:
    """Issue 28: evaluators reporting the same values every 10 s pushed everything else
    out of the page. The same values again are a ``repeat`` of the line shown."""
    env = console.env
    async with aiohttp.ClientSession() as http:
        r = await http.get(v1(console, "/events"), params={"backlog": "0"}, headers=console.auth)
        await r.content.readuntil(b"\n\n")
        reading = asyncio.create_task(read_sse(r, 5))
        await console.producer.publish_many(
            [
                report(env, "gpu", 1.0, T0),
                report(env, "gpu", 1.0, T0 + timedelta(seconds=10)),
                report(env, "gpu", 1.0, T0 + timedelta(seconds=20)),
                report(env, "gpu", 2.0, T0 + timedelta(seconds=30)),
                report(env, "gpu", 2.0, T0 + timedelta(seconds=40)),
            ]
        )
        got = await asyncio.wait_for(reading, 20)
        r.close()
        body = await (await http.get(v1(console, "/jobs"), headers=console.auth)).json()
    assert [(n, d.get("repeats")) for n, d in got] == [
        ("line", None),
        ("repeat", 1),
        ("repeat", 2),
        ("line", None),
        ("repeat", 1),
    ]
    (row,) = body["reports"]
    assert row["metrics"] == {"gpu_hours": 2.0}
    assert row["repeats"] == 1
    assert row["last_at"] == (T0 + timedelta(seconds=40)).isoformat()


async def test_dead_letters_with_their_reasons(console: Console, settings: Settings) -> None:
    env = console.env
    letter = fitting_letter(
        env=env,
        original_topic=topic(env, "job.metrics"),
        partition=1,
        offset=42,
        key=b"job-x",
        value=b'{"type": "job.runtime_sample", "global_step": -1}',
        kind=FailureKind.INVALID,
        error="global_step: Input should be greater than or equal to 0",
        group=f"{env}.brain",
    )
    await console.producer.publish(letter)
    await console.producer.send_raw(topic(env, "job.events"), b"not json at all", b"job-y")
    async with aiohttp.ClientSession() as http:
        for _ in range(200):
            body = await (await http.get(v1(console, "/dlq"), headers=console.auth)).json()
            if body["seen"] >= 2:
                break
            await asyncio.sleep(0.1)
    assert body["seen"] == 2
    kinds = {row["kind"]: row for row in body["letters"]}
    assert kinds["invalid"]["error"] == "global_step: Input should be greater than or equal to 0"
    assert kinds["invalid"]["offset"] == 42
    assert kinds["invalid"]["consumer_group"] == f"{env}.brain"
    assert '"global_step": -1' in kinds["invalid"]["preview"]
    assert kinds["unreadable"]["original_topic"] == topic(env, "job.events")
    assert kinds["unreadable"]["error"]


async def test_config_documents_listed_and_read_whole(console: Console, pg_dsn: str) -> None:
    pool = await console.server.views.pool(console.env)
    store = ConfigStore(pool, console.env, console.producer)
    await store.create(
        ConfigDocument(
            name="big-gpus",
            include={"cluster": "a100"},
            configure={"optimizer": {"name": "goodput"}},
            priority=3,
        )
    )
    async with aiohttp.ClientSession() as http:
        body = await (await http.get(v1(console, "/configs"), headers=console.auth)).json()
        doc = await (await http.get(v1(console, "/configs/big-gpus"), headers=console.auth)).json()
        r = await http.get(v1(console, "/configs/nope"), headers=console.auth)
        assert r.status == 404
    assert body["total"] == 1
    (row,) = body["documents"]
    assert row["name"] == "big-gpus"
    assert row["include"] == {"cluster": "a100"}
    assert row["priority"] == 3
    assert row["configure_size"].endswith(" B")
    assert doc["document"]["Configure"] == {"optimizer": {"name": "goodput"}}
    assert doc["version"] == 1


async def test_ab_results_from_the_summaries_ab_run_writes(console: Console) -> None:
    folder = console.server.conf.ab_reports[0]
    jobs = [f"j{i}" for i in range(20)]
    arms = [
        ArmResult("static", "ab-x-static", "defaults", {j: 3000.0 + i for i, j in enumerate(jobs)},
                  {"gpu_hours": 10.0}),
        ArmResult("goodput", console.env, "defaults", {j: 2000.0 + i for i, j in enumerate(jobs)},
                  {"gpu_hours": 9.0}),
    ]  # fmt: skip
    run = RunInfo("x", "workload-6.csv", None, "lockstep", 16, 4, 12.0)
    write_summary(folder / "run-x", build_summary(compare(arms), run))
    bad = folder / "run-bad"
    bad.mkdir()
    (bad / "summary.json").write_text('{"schema_version": 99, "arms": []}')
    async with aiohttp.ClientSession() as http:
        body = await (await http.get(v1(console, "/ab"), headers=console.auth)).json()
    assert body["folders"] == [str(folder)]  # tmp_path: absolute already
    runs = {Path(r["path"]).parent.name: r for r in body["runs"]}
    assert "schema_version 99" in runs["run-bad"]["error"]
    good = runs["run-x"]
    assert good["baseline"] == "static"
    assert [a["name"] for a in good["arms"]] == ["static", "goodput"]
    goodput = good["arms"][1]
    assert goodput["env"] == console.env
    assert goodput["verdict"] == "better"
    assert goodput["jobs"] == 20
    assert goodput["mean_jct_s"] == pytest.approx(2009.5)


async def test_actions_are_refused_to_a_read_token_and_in_a_virtual_env(
    console: Console, pg_dsn: str
) -> None:
    admin = {"Authorization": f"Bearer {await mint(pg_dsn, console.env, Scope.ADMIN)}"}
    scale = {"role": "worker", "replicas": 2}
    async with aiohttp.ClientSession() as http:
        r = await http.post(v1(console, "/jobs/any/scale"), json=scale, headers=console.auth)
        assert r.status == 403
        assert "admin" in (await r.json())["error"]["message"]
        r = await http.delete(v1(console, "/jobs/any"), headers=console.auth)
        assert r.status == 403
        r = await http.post(v1(console, "/tokens/abc/revoke"), headers=console.auth)
        assert r.status == 403
        r = await http.post(console.url + "v1/promote", json={"env": console.env})
        assert r.status == 401
        # an admin of a virtual env: its jobs are simulated, nothing to scale by hand
        r = await http.post(v1(console, "/jobs/any/scale"), json=scale, headers=admin)
        assert r.status == 409
        assert "virtual" in (await r.json())["error"]["message"]
        me = await (await http.get(v1(console, "/whoami"), headers=admin)).json()
        assert me["admin"] is True
        # its tokens, and its experiments (an action on the bus, in any env)
        assert [a["name"] for a in me["actions"]] == ["revoke", "pause", "activate", "kill"]


async def test_health_says_ready(console: Console) -> None:
    async with aiohttp.ClientSession() as http:
        r = await http.get(console.url + "healthz")
        assert r.status == 200
        assert (await r.json())["ready"] is True
