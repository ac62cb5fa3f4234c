"""Suspend and resume on the local platform, on real parts: the example elastic job
(examples/elastic) as torchrun agents and torch workers on this machine, the test broker
and Postgres. A suspend stops the job's processes after their checkpoint and keeps the
job; a resume starts them again and the global step goes on from the checkpoint. The
platform's slots are its capacity, published at its start, and a pod waits for free ones.

Waits are bounded by generous deadlines; nothing asserts on how long anything took.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp

from dlrover_events.envs.tokens import Scope
from dlrover_events.store import EnvStore
from handlers.operator.local.bench import memberships as worker_lines
from handlers.operator.platform.bodies import JobView, PodView
from handlers.operator.reconcile.events import job_meta
from schemas.cluster import CapacityReported
from schemas.jobs import JobSubmitted, RuntimeSample
from schemas.plans import NodeGroupResource, ScalePlan, ScaleResult, ScaleStatus
from tests.integration.local.conftest import Local, shims
from tests.integration.local.test_elastic_loop import (
    CHECKPOINT_EVERY,
    ROOT,
    example_job,
    of_plan,
    wait_for,
)
from tests.integration.local.test_local_jobs_api import mint
from tests.integration.local.test_local_operator_crash import (
    paused,
    start_operator,
    start_pausing,
)
from tests.integration.local.test_local_platform import running, sleeper_job, until
from tests.integration.tap import DEADLINE_S, Tap


def suspend(local: Local, job: JobView, plan_id: str) -> ScalePlan:
    return ScalePlan(env=local.env, job=job_meta(job), plan_id=plan_id, suspend=True)


def resume(local: Local, job: JobView, plan_id: str, workers: int) -> ScalePlan:
    return ScalePlan(
        env=local.env,
        job=job_meta(job),
        plan_id=plan_id,
        node_group_resources={"worker": NodeGroupResource(count=workers)},
    )


async def test_suspend_stops_the_job_after_its_checkpoint_and_resume_goes_on_from_it(
    local: Local, tmp_path: Path
) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "examples").symlink_to(ROOT / "examples")
    capacity = Tap(local.settings, local.env, ("cluster.capacity",))
    await capacity.start()
    ctx, task = await local.start_operator(slots=4)
    try:
        (report, *_) = await capacity.until(
            lambda: capacity.of(CapacityReported), "the capacity report"
        )
        (host,) = report.hosts
        assert (report.platform, host.gpus, host.schedulable) == ("local", 4, True)

        job = await local.submit(example_job("elastic-s"), workdir)
        uid = job.uid
        await local.tap.first(JobSubmitted, uid, lambda e: True, "job.submitted")

        def samples() -> list[RuntimeSample]:
            return local.tap.of(RuntimeSample, uid)

        await wait_for(
            "samples at world size 2 past three checkpoints",
            lambda: [
                s for s in samples() if s.world_size == 2 and s.global_step > 3 * CHECKPOINT_EVERY
            ],
        )
        await local.producer.publish(suspend(local, job, "suspend-1"))
        result = await local.tap.first(ScaleResult, uid, of_plan("suspend-1"), "its result")
        assert result.status == ScaleStatus.APPLIED, result
        # Applied: the job's processes are gone, the job is kept, suspended.
        assert await local.pods("elastic-s") == []
        assert shims(local.root) == []
        kept = await local.cluster().get_job("elastic-s")
        assert isinstance(kept, JobView) and kept.suspended
        assert kept.roles["worker"].replicas == 2
        assert kept.document["status"]["phase"] == "Suspended"
        before = max(s.global_step for s in samples())
        exits = [line for line in worker_lines(local.root) if line["event"] == "exit"]
        assert len(exits) == 2, exits
        saved = max(e["saved_step"] for e in exits if e["saved_step"] is not None)
        stopped_at = max(e["step"] for e in exits)
        assert before <= stopped_at
        # its checkpoint is where it stopped: saved on SIGTERM, within the grace period
        assert saved == stopped_at, exits
        counted = len(samples())
        await asyncio.sleep(3)  # a process left running would still report
        assert len(samples()) == counted

        published = time.time()
        await local.producer.publish(resume(local, job, "resume-1", 2))
        result = await local.tap.first(ScaleResult, uid, of_plan("resume-1"), "its result")
        assert result.status == ScaleStatus.APPLIED, result
        assert sum(result.observed["worker"].values()) == 2
        again = await wait_for(
            "the resumed workers' memberships",
            lambda: [
                m
                for m in worker_lines(local.root)
                if m["event"] == "membership" and m["time"] > published
            ],
        )
        assert {m["first_step"] for m in again} == {saved}, again  # from the checkpoint
        await wait_for(
            "samples past the checkpoint after the resume",
            lambda: [s for s in samples()[counted:] if s.global_step > saved + 5],
        )
        # Lost at most the checkpoint interval, at no moment more.
        high = 0
        for step in (s.global_step for s in samples()):
            assert step >= high - CHECKPOINT_EVERY, (step, high)
            high = max(high, step)
    finally:
        ctx.stop.set()
        await asyncio.wait_for(task, 240)
        await capacity.stop()


async def _running(local: Local, job: str, n: int) -> dict[int, PodView] | None:
    found = running(await local.pods(job))
    return found if len(found) == n else None


async def _no_pods(local: Local, job: str) -> bool:
    return await local.pods(job) == []


async def test_a_pod_waits_for_free_slots(local: Local) -> None:
    ctx, task = await local.start_operator(slots=3)
    try:
        await local.submit(sleeper_job("big", 2))
        await until("big's 2 nodes", lambda: _running(local, "big", 2))
        await local.submit(sleeper_job("small", 2))
        await until("small's first node", lambda: _running(local, "small", 1))
        await asyncio.sleep(2)  # its second would have started by now had it a slot
        pods = await local.pods("small")
        assert sorted(p.phase for p in pods) == ["Pending", "Running"], pods
        # The big job suspended, its slots come free and the small one's node starts. One
        # of big's nodes ending is enough for it, so big's other pod may still be going.
        await local.producer.publish(suspend(local, await _view(local, "big"), "s-big"))
        await until("small's 2 nodes", lambda: _running(local, "small", 2))
        await until("big's pods gone", lambda: _no_pods(local, "big"))
    finally:
        ctx.stop.set()
        await asyncio.wait_for(task, 120)


async def _view(local: Local, name: str) -> JobView:
    got = await local.cluster().get_job(name)
    assert isinstance(got, JobView)
    return got


#: (plan, where the operator dies while applying it): each a suspend or a resume
KILLS = [
    ("suspend-a", "patched"),
    ("resume-a", "patched"),
    ("suspend-b", "pods"),
    ("resume-b", "pods"),
]


async def test_an_operator_killed_during_a_suspend_and_a_resume_applies_each_once(
    local: Local, tmp_path: Path
) -> None:
    """SIGKILL at an exact point of each plan (crash_operator.py pauses there): after the
    job's patch, and once its pods were gone (suspend) or back (resume), before the plan's
    offset is committed. The next operator finishes each, once."""
    log = tmp_path / "operator.log"
    op: subprocess.Popen[bytes] | subprocess.Popen[str] = start_operator(local, log)
    try:
        job = await local.submit(sleeper_job("crashy", 2))
        await until("2 running nodes", lambda: _running(local, "crashy", 2))
        op.send_signal(signal.SIGTERM)
        op.wait(timeout=DEADLINE_S)
        for plan_id, step in KILLS:
            op = start_pausing(local, plan_id, step, log)
            if plan_id.startswith("suspend"):
                plan = suspend(local, job, plan_id)
            else:
                plan = resume(local, job, plan_id, 2)
            await local.producer.publish(plan)
            await paused(op, plan_id, step)
            os.kill(op.pid, signal.SIGKILL)
            op.wait(timeout=30)
        op = start_operator(local, log)
        for plan_id, _ in KILLS:
            answer = await local.tap.first(ScaleResult, job.uid, of_plan(plan_id), plan_id)
            assert answer.status == ScaleStatus.APPLIED, answer
            said = [r for r in local.tap.of(ScaleResult, job.uid) if r.plan_id == plan_id]
            assert {r.status for r in said} == {ScaleStatus.APPLIED}, said
        nodes = await until("2 running nodes", lambda: _running(local, "crashy", 2))
        assert sorted(nodes) == [0, 1]
        await asyncio.sleep(2)  # a duplicate pod would have been made by now
        assert len(await local.pods("crashy")) == 2
        assert len(shims(local.root)) == 2
        view = await _view(local, "crashy")
        assert not view.suspended
        assert view.applied_plans == tuple(p for p, _ in KILLS)  # each once, in order
        async with await EnvStore.open(local.pg_dsn, local.env, max_size=1) as store:
            rows = await store.pool.fetch("SELECT plan_id, status FROM scale_plans")
        assert sorted((r["plan_id"], r["status"]) for r in rows) == sorted(
            (p, "applied") for p, _ in KILLS
        )
    finally:
        op.send_signal(signal.SIGTERM)
        try:
            op.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            op.kill()
    assert op.returncode == 0, log.read_text()[-2000:]


async def test_suspend_and_resume_over_the_jobs_api(local: Local) -> None:
    """POST /v1/jobs/{job}/suspend and /resume publish the plans (202), the rows say
    suspended and why, and a mistake is a 4xx with a message."""
    ctx, task = await local.start_operator()
    base = ctx.endpoints["local jobs API"].split()[0].removesuffix("/v1/jobs")
    admin = {"Authorization": f"Bearer {await mint(local, Scope.ADMIN)}"}
    try:
        async with aiohttp.ClientSession(base) as http:

            async def call(method: str, path: str) -> tuple[int, Any]:
                async with http.request(method, path, headers=admin) as r:
                    return r.status, await r.json()

            job = await local.submit(sleeper_job("api-s", 1))
            await until("its node", lambda: _running(local, "api-s", 1))
            status, body = await call("POST", "/v1/jobs/api-s/resume")
            assert status == 422 and "is not suspended" in body["error"]
            status, body = await call("POST", "/v1/jobs/api-s/suspend")
            assert status == 202, body
            answer = await local.tap.first(
                ScaleResult, job.uid, of_plan(body["plan_id"]), "the suspend's result"
            )
            assert answer.status == ScaleStatus.APPLIED, answer
            status, body = await call("GET", "/v1/jobs/api-s")
            assert status == 200 and body["phase"] == "Suspended", body
            assert body["admission"]["state"] == "suspended"
            assert body["admission"]["reason"] == "Preempted"
            assert body["nodes"] == []
            status, body = await call("POST", "/v1/jobs/api-s/suspend")
            assert status == 422 and "is suspended already" in body["error"]
            status, body = await call("POST", "/v1/jobs/nope/suspend")
            assert status == 404

            status, body = await call("POST", "/v1/jobs/api-s/resume")
            assert status == 202, body
            answer = await local.tap.first(
                ScaleResult, job.uid, of_plan(body["plan_id"]), "the resume's result"
            )
            assert answer.status == ScaleStatus.APPLIED, answer
            await until("its node again", lambda: _running(local, "api-s", 1))
            status, body = await call("GET", "/v1/jobs")
            (row,) = body["jobs"]
            assert row["admission"]["state"] == "admitted" and row["admission"]["reason"] == (
                "Resumed"
            )
    finally:
        ctx.stop.set()
        await asyncio.wait_for(task, 120)
