"""A job of several roles that find each other (issue 40) on the local platform, with real
processes: examples/multirole (coordinator, collectors, a torch learner, an aggregator
exchanging data over their addresses) from the coordinator's start to the job's success;
and a role's pod killed mid-run, replaced at the address its peers already know."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import yaml  # type: ignore[import-untyped,unused-ignore]

from dlrover_events.envs.tokens import Tokens, job_scope
from dlrover_events.store import EnvStore
from handlers.operator.platform.bodies import SUCCEEDED, JobView, PodView
from schemas.plans import ScalePlan
from tests.integration.local.conftest import Local
from tests.integration.local.test_local_job_commands import job_cli
from tests.integration.local.test_local_platform import until

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "multirole" / "job.yaml"
NAME = "multirole-rl"


def example(*args: str) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    for role in body["spec"]["roles"].values():
        container = role["template"]["spec"]["containers"][0]
        role["template"] = json.loads(json.dumps(role["template"]))  # no shared anchors
        role["template"]["spec"]["containers"][0]["command"] = [*container["command"], *args]
    return body


def log_of(local: Local, pod: str) -> str:
    for path in (local.root / "pods" / pod / "log", local.root / "logs" / f"{pod}.log"):
        if path.exists():
            return path.read_text(errors="replace")
    return ""


def pod_env(local: Local, pod: str) -> dict[str, str]:
    spec = json.loads((local.root / "pods" / pod / "spec.json").read_text())
    return dict(spec["env"])


async def job_now(local: Local) -> JobView:
    job = await local.cluster().get_job(NAME)
    assert isinstance(job, JobView)
    return job


async def test_the_multirole_example_end_to_end(local: Local) -> None:
    ctx, task = await local.start_operator()
    base = ctx.endpoints["local jobs API"].split()[0].removesuffix("/v1/jobs")
    try:
        await local.submit(example("--steps=100", "--warmup-s=1", "--linger-s=2"), workdir=ROOT)

        # the coordinator first; every other role only once it is ready
        seen_ready = False

        async def others_after_the_coordinator() -> list[PodView]:
            nonlocal seen_ready
            pods = await local.pods(NAME)
            seen_ready = seen_ready or any(p.role == "coordinator" and p.ready for p in pods)
            others = [p for p in pods if p.role != "coordinator"]
            assert seen_ready or not others, f"started before the coordinator: {others}"
            return others if seen_ready else []

        others = await until("other roles' pods", others_after_the_coordinator)
        assert {p.role for p in others} <= {"collector", "learner", "aggregator"}

        # the job's own token: its pods that scale others have it, and it does no more
        coordinator_env = pod_env(local, f"{NAME}-coordinator-0")
        own = {"Authorization": f"Bearer {coordinator_env['DLROVER_EVENTS_JOB_TOKEN']}"}
        assert "DLROVER_EVENTS_JOB_TOKEN" not in pod_env(local, f"{NAME}-learner-0")
        store = await EnvStore.open(local.pg_dsn, local.env, max_size=1)
        try:
            _, other = await Tokens(store.pool, local.env).mint("other", [job_scope("other-uid")])
        finally:
            await store.close()
        async with aiohttp.ClientSession(base) as http:

            async def scale(headers: dict[str, str], role: str, n: int) -> tuple[int, str]:
                async with http.post(
                    f"/v1/jobs/{NAME}/scale", headers=headers, json={"role": role, "replicas": n}
                ) as r:
                    return r.status, (await r.json()).get("error", "")

            status, error = await scale(own, "collector", 5)
            assert status == 422 and "beyond trainingjob multirole-rl's bounds" in error, error
            status, error = await scale(own, "learner", 2)
            assert status == 403 and "no role of trainingjob multirole-rl may scale learner" in (
                error
            )
            status, error = await scale({"Authorization": f"Bearer {other}"}, "collector", 3)
            assert status == 403 and "another job's" in error, error
            async with http.get("/v1/jobs", headers=own) as r:
                assert r.status == 403 and "job's token" in (await r.json())["error"]

        # every role's pods found each other: the learner stepped, the coordinator grew the
        # collectors to 4 and back through the job's own API, and the job succeeded
        async def ended() -> JobView | None:
            job = await job_now(local)
            return job if job.phase == SUCCEEDED else None

        job = await until("the job's success", ended)
        log = log_of(local, f"{NAME}-coordinator-0")
        assert "grew collectors to 4" in log and "shrank collectors to 2" in log, log
        assert "collectors back to 2" in log and "heard from collectors [0, 1, 2, 3]" in log, log
        assert "refused as it should be: 422" in log, log
        first, last = map(float, re.findall(r"loss ([0-9.]+) -> ([0-9.]+)", log)[0])
        assert last < first, f"the learner's loss did not move down: {first} -> {last}"
        assert "policy, read from the shared volume" in log, log
        for rank in (2, 3):
            assert f"collector {rank} at 127.0.0.1:" in log_of(local, f"{NAME}-collector-{rank}")

        plans = [p for p in local.tap.of(ScalePlan) if p.job.uuid == job.uid]
        authors = {p.source for p in plans}
        assert len(plans) == 2 and all(
            a.startswith(f"job/{NAME}/coordinator-0 (token ") for a in authors
        ), authors
        assert [p.node_group_resources["collector"].count for p in plans] == [4, 2]

        described = job_cli(local, "describe", NAME, cwd=ROOT)
        assert described.returncode == 0, described.stderr
        assert "role collector: 2 replicas [1, 4]" in described.stdout, described.stdout
        assert "after coordinator" in described.stdout and "succeeded 1" in described.stdout
    finally:
        ctx.stop.set()
        await task


async def test_a_killed_pod_is_found_again_at_the_same_address(local: Local) -> None:
    ctx, task = await local.start_operator()
    try:
        await local.submit(
            example("--steps=100000", "--warmup-s=0", "--grow-at=100000"), workdir=ROOT
        )
        first = f"{NAME}-aggregator-0"

        async def aggregating() -> bool:
            return "aggregated 20 rounds" in log_of(local, first)

        await until("the aggregator's rounds", aggregating)
        address = pod_env(local, first)["DLROVER_EVENTS_ADDRESS"]
        shim = json.loads((local.root / "pods" / first / "pid").read_text())["pid"]
        (command,) = psutil.Process(shim).children()
        os.kill(command.pid, signal.SIGKILL)

        async def replaced() -> PodView | None:
            pods = await local.pods(NAME)
            return next(
                (p for p in pods if p.role == "aggregator" and p.index > 0 and p.running), None
            )

        again = await until("a new aggregator pod", replaced)
        assert again.rank == 0
        assert pod_env(local, again.name)["DLROVER_EVENTS_ADDRESS"] == address

        # the learner, which knew the aggregator only by its address, goes on with the new
        async def found_again() -> bool:
            return "aggregated 20 rounds" in log_of(local, again.name)

        await until("rounds at the new aggregator", found_again)
        await local.cluster().delete_job(NAME)

        async def gone() -> bool:
            return not await local.pods(NAME)

        await until("the job's pods gone", gone)
    finally:
        ctx.stop.set()
        await task
