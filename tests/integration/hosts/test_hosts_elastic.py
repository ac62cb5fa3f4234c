"""The example elastic job on plain hosts, on this machine: three agents (in this process,
one artificial slot each, their pods meeting at 127.0.0.1), the hosts platform's operator
(`operator --platform hosts`, the one reconciler), real torchrun and torch workers.

A 2-node job trains on two hosts, grows to three on a plan (`job scale --platform hosts`)
and shrinks back; then a host is lost (its agent and its pods killed) and the job goes on
smaller, then grows back once the host returns. Separately, an agent stopped and started
again while its pods train takes them back: the same pids, no new membership.

Nothing asserts on how long anything took; the figures printed (loss detected, first
step at the smaller size, steps lost) are measured from the same events.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from handlers.agent.agent import Agent
from handlers.operator.document.trainingjob import ANN_WORKDIR
from handlers.operator.hosts.cluster import HostsCluster
from handlers.operator.hosts.runner import platform_root
from handlers.operator.local.bench import memberships as worker_lines
from handlers.operator.platform.bodies import PodView
from handlers.operator.wiring.modes import run_operator
from schemas.control import EnvMode
from schemas.hosts import HostReported
from schemas.jobs import NodeFailed, RuntimeSample
from schemas.plans import ScalePlan, ScaleResult, ScaleStatus
from tests.conftest import EnvFactory, cli_environ
from tests.integration.hosts.conftest import (
    DEADLINE_S,
    RunningAgent,
    agent_in,
    kill_trees,
    shims,
)
from tests.integration.local.test_elastic_loop import CHECKPOINT_EVERY, example_job
from tests.integration.tap import OPERATOR_OUTPUTS, Tap

ROOT = Path(__file__).resolve().parents[3]
LOST_AFTER_S = 5.0
#: how long the operator waits for a restarted agent's first report before it counts the
#: host lost: an agent restarted in time reports without reading the bus (its name checked
#: by its own record, handlers.agent.naming), measured 0.5-1 s after its predecessor's last
#: report on this machine under load, so 10 s is an honest bound (the issue's goal for
#: declaring a host lost), not a wait stretched to fit
AGENT_RESTART_S = 10.0


@dataclass
class Hosts:
    settings: Settings
    pg_dsn: str
    env: str
    tap: Tap
    root: Path
    agents: dict[str, RunningAgent]

    def platform(self) -> HostsCluster:
        """The platform as the `job` commands see it (the pods as the operator last said)."""
        return HostsCluster(platform_root(self.settings, self.env))

    async def pods(self, job: str) -> list[PodView]:
        return (await self.platform().list_pods(job))[0]

    def lines(self) -> list[dict[str, Any]]:
        """What the workers printed, on every host."""
        return [x for d in self.root.glob("agent-*") for x in worker_lines(d)]

    def memberships(self) -> list[dict[str, Any]]:
        return [m for m in self.lines() if m["event"] == "membership"]


@pytest.fixture
async def hosts(
    settings: Settings, pg_dsn: str, make_env: EnvFactory, tmp_path: Path
) -> AsyncIterator[Hosts]:
    settings = settings.model_copy(update={"data_dir": tmp_path / "data"})
    env = (await make_env(mode=EnvMode.REAL)).name
    tap = Tap(settings, env, (*OPERATOR_OUTPUTS, "scale.plans", "hosts.reports"))
    await tap.start()
    running = {
        h: agent_in(settings, env, tmp_path / f"agent-{h}", h, 1) for h in ("ha", "hb", "hc")
    }
    try:
        for one in running.values():
            await one.start()
        yield Hosts(settings, pg_dsn, env, tap, tmp_path, running)
    finally:
        for one in running.values():
            await one.halt()
        kill_trees(shims(tmp_path))
        await tap.stop()


async def start_operator(
    hosts: Hosts, lost_after_s: float = LOST_AFTER_S
) -> tuple[ServiceContext, asyncio.Task[None]]:
    ctx = ServiceContext(hosts.settings, hosts.env, hosts.pg_dsn)
    options = {"platform": "hosts", "poll_s": 0.1, "lost_after_s": lost_after_s}
    task = asyncio.create_task(run_operator(ctx, options))
    ready = asyncio.create_task(ctx.ready.wait())
    await asyncio.wait([task, ready], timeout=DEADLINE_S, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()
    assert ready.done(), "the hosts operator did not get ready"
    return ctx, task


async def wait_for(what: str, check: Callable[[], Any], deadline_s: float = DEADLINE_S) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    while loop.time() < deadline:
        got = check()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return got
        await asyncio.sleep(0.2)
    raise AssertionError(f"no {what} within {deadline_s:.0f}s")


def job_cli(hosts: Hosts, *args: str) -> str:
    """A `dlrover-events job` command on the hosts platform, as a user runs it."""
    env = {
        **cli_environ(hosts.settings, hosts.pg_dsn),
        "DLROVER_EVENTS_DATA_DIR": str(hosts.settings.data_dir),
    }
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "dlrover-events"),
            "job",
            *args,
            *("--platform", "hosts", "--env", hosts.env),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def workdir_of(tmp_path: Path) -> Path:
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "examples").symlink_to(ROOT / "examples")
    return workdir


class Running:
    """One job of the example on the hosts, as the test follows it."""

    def __init__(self, hosts: Hosts, name: str, uid: str) -> None:
        self.hosts = hosts
        self.name = name
        self.uid = uid
        self.started = time.time()

    def say(self, what: str) -> None:
        print(f"{time.time() - self.started:7.1f}s {self.name}: {what}", flush=True)

    def samples_at(self, n: int, after: float = 0.0) -> list[RuntimeSample]:
        return [
            s
            for s in self.hosts.tap.of(RuntimeSample, self.uid)
            if s.world_size == n and s.occurred_at.timestamp() > after
        ]

    async def on_hosts(self, n: int) -> set[str] | None:
        """The hosts of its ``n`` running pods, one each (None: not so now)."""
        pods = [p for p in await self.hosts.pods(self.name) if p.running and not p.deleting]
        names = {str(p.node_name) for p in pods if p.node_name}
        return names if len(pods) == n and len(names) == n else None

    async def at(self, n: int, after: float = 0.0) -> set[str]:
        """Once it trains at world size ``n`` (samples after ``after``) on ``n`` hosts."""
        await wait_for(f"samples at world size {n}", lambda: self.samples_at(n, after))
        on: set[str] = await wait_for(f"{n} pods on {n} hosts", lambda: self.on_hosts(n))
        self.say(f"world size {n} on {sorted(on)}")
        return on

    async def scale(self, target: int) -> None:
        out = job_cli(self.hosts, "scale", self.name, "--replicas", str(target))
        plan_id = out.split()[1]
        tap = self.hosts.tap
        plan = await tap.first(ScalePlan, self.uid, lambda e: e.plan_id == plan_id, "the plan")
        result = await tap.first(
            ScaleResult, self.uid, lambda e: e.plan_id == plan_id, f"result of {plan_id}"
        )
        assert result.status == ScaleStatus.APPLIED, result
        await self.at(target, plan.occurred_at.timestamp())

    def steps_never_went_back(self) -> None:
        top = 0
        for step in (s.global_step for s in self.hosts.tap.of(RuntimeSample, self.uid)):
            assert step >= top - CHECKPOINT_EVERY, (step, top)
            top = max(top, step)


async def run_job(hosts: Hosts, name: str, replicas: int, tmp_path: Path) -> Running:
    body = example_job(name, replicas)
    body["metadata"].setdefault("annotations", {})[ANN_WORKDIR] = str(workdir_of(tmp_path))
    job = await hosts.platform().submit_job(body)
    running = Running(hosts, name, job.uid)
    await running.at(replicas)
    return running


async def test_a_job_across_hosts_grows_and_shrinks_on_plans(hosts: Hosts, tmp_path: Path) -> None:
    ctx, task = await start_operator(hosts)
    try:
        job = await run_job(hosts, "across", 2, tmp_path)
        described = job_cli(hosts, "describe", "across")
        assert sum(f" on {h}" in described for h in hosts.agents) == 2, described
        await job.scale(3)
        await job.scale(2)
        job.steps_never_went_back()
    finally:
        ctx.stop.set()
        await asyncio.wait_for(task, DEADLINE_S)


async def test_a_lost_host_shrinks_the_job_and_its_return_grows_it(
    hosts: Hosts, tmp_path: Path
) -> None:
    """Every slot taken (3 pods on 3 hosts): a host's agent and every process of its pods
    killed at once. The job goes on at 2, and at 3 again once the host is back."""
    ctx, task = await start_operator(hosts)
    try:
        job = await run_job(hosts, "lost", 3, tmp_path)
        pods = {p.node_name: p for p in await hosts.pods("lost") if p.running and p.node_name}
        lost = next(str(h) for h in sorted(pods, key=str) if pods[h].rank != 0)
        high = max(s.global_step for s in hosts.tap.of(RuntimeSample, job.uid))
        await hosts.agents[lost].halt()
        kill_trees(shims(hosts.root / f"agent-{lost}"))
        killed = time.time()
        job.say(f"{lost} killed")

        # The operator says the lost host's pod failed (NodeLost) on the job's events: its
        # record says Failed only until the reconciler deletes it, a window the test's poll
        # can miss on a loaded machine, so the durable event is what is waited for.
        gone = pods[lost].name
        await job.hosts.tap.first(
            NodeFailed,
            job.uid,
            lambda e: e.node.name == gone and e.reason == "NodeLost",
            f"the pod of {lost} counted gone (node.failed, NodeLost)",
        )
        detected = time.time() - killed
        smaller = await wait_for(
            "a membership at world size 2 after the loss",
            lambda: [m for m in hosts.memberships() if m["world_size"] == 2 and m["time"] > killed],
        )
        first = min(smaller, key=lambda m: m["time"])
        await job.at(2, killed)
        back = time.time()
        await hosts.agents[lost].start()
        await job.at(3, back)
        job.steps_never_went_back()
        print(
            json.dumps(
                {
                    "host_lost": lost,
                    "loss_detected_s": round(detected, 2),
                    "first_step_at_smaller_size_s": round(first["time"] - killed, 2),
                    "steps_lost": max(0, high - int(first["first_step"])),
                }
            )
        )
    finally:
        ctx.stop.set()
        await asyncio.wait_for(task, DEADLINE_S)


async def test_an_agent_restarted_takes_its_pods_back(hosts: Hosts, tmp_path: Path) -> None:
    # An agent back later than lost_after_s is a lost host, by design: its pods are counted
    # gone and the job re-forms. A restart is back well within AGENT_RESTART_S (a CI run
    # once saw 5 s, when a restarted agent read the hosts' reports to check its name
    # before its first report); the gap is printed, never asserted.
    ctx, task = await start_operator(hosts, lost_after_s=AGENT_RESTART_S)
    try:
        job = await run_job(hosts, "kept", 2, tmp_path)
        uid = job.uid
        pods = [p for p in await hosts.pods("kept") if p.running]
        host = pods[0].node_name
        assert host is not None
        agent = hosts.agents[host]
        before = {p.name: p.pid for p in agent.agent.pods.states()}
        joined = len(hosts.memberships())

        await agent.halt()
        again = agent_in(
            hosts.settings, hosts.env, agent.agent.workdir, host, len(agent.agent.slots)
        )
        hosts.agents[host] = again
        await again.start()
        assert again.agent.agent_id != agent.agent.agent_id
        assert sorted(again.agent.pods.adopted()) == sorted(before)
        after = {p.name: p.pid for p in again.agent.pods.states()}
        assert after == before, "the restarted agent's pods are not the ones that ran"
        # Training goes on as it was: more samples, and no one re-joined.
        seen = len(hosts.tap.of(RuntimeSample, uid))
        await wait_for("more samples", lambda: len(hosts.tap.of(RuntimeSample, uid)) > seen + 4)
        assert all(p.phase == "Running" for p in again.agent.pods.states())
        assert len(hosts.memberships()) == joined, "a worker re-joined: the job restarted"
        lost = [e for e in hosts.tap.of(NodeFailed, uid) if e.reason == "NodeLost"]
        assert not lost, f"the restarted agent's host was counted lost: {lost}"

        def said(by: Agent) -> list[float]:
            return [
                e.occurred_at.timestamp()
                for e in hosts.tap.of(HostReported)
                if e.agent_id == by.agent_id
            ]

        first_new = min(await wait_for("the new agent's report", lambda: said(again.agent)))
        last_old = max(said(agent.agent))
        print(json.dumps({"agent_restart_report_gap_s": round(first_new - last_old, 2)}))
    finally:
        ctx.stop.set()
        await asyncio.wait_for(task, DEADLINE_S)
