"""Jobs across machines, and machines lost (issue 35), on three hosts made of network
namespaces (tests/integration/hosts/netns.py): in each a `dlrover-events agent` process
with one artificial slot, reaching the broker at the bridge's address in the root
namespace, where the operator (`--platform hosts`) and Postgres are.

The example elastic job trains across two namespaces (its pods on two hosts, its samples
at world size 2), grows to three hosts on a plan; then a host is lost twice, by its link
cut and by SIGKILL of its agent and every process in it, and each time the job goes on at
the smaller size and grows back once the host returns; an agent killed and started again
while its pods train takes them back (same pids, no new membership); and a plan shrinks
the job back. Its steps go back only to the newest checkpoint committed before a restart.

The figures (loss detected, first step at the smaller size, steps lost) are printed as
one JSON line; nothing asserts on how long anything took.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dlrover_events.bus.topics import CHECKPOINTS
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.pods import shim
from dlrover_events.runtime.embedded import Broker
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from handlers.operator.document.trainingjob import ANN_WORKDIR
from handlers.operator.hosts.cluster import HostsCluster
from handlers.operator.hosts.runner import platform_root
from handlers.operator.local.bench import memberships as worker_lines
from handlers.operator.platform.bodies import PodView
from handlers.operator.wiring.modes import run_operator
from schemas.checkpoints import CheckpointCommitted
from schemas.cluster import CapacityReported
from schemas.control import EnvMode
from schemas.hosts import HostReported
from schemas.jobs import NodeFailed, RuntimeSample
from schemas.plans import ScalePlan, ScaleResult, ScaleStatus
from tests.conftest import ARTIFACTS, cli_environ, unique_env
from tests.integration.hosts.conftest import DEADLINE_S
from tests.integration.hosts.netns import Namespaces, available, namespaces
from tests.integration.local.test_elastic_loop import example_job
from tests.integration.tap import OPERATOR_OUTPUTS, Tap

pytestmark = [
    pytest.mark.skipif(available() is not None, reason=str(available())),
    # three namespaces of torch processes, eight resizes: minutes on a loaded machine
    pytest.mark.timeout(900),
]

ROOT = Path(__file__).resolve().parents[3]
HOSTS = ["ha", "hb", "hc"]
#: the operator's default (DLROVER_EVENTS_HOSTS_LOST_AFTER_S): the agent restarted as a
#: process must be back within it, and a cold start of `dlrover-events agent` (its imports)
#: took 0.7, 2.0 and 5.1 s from the kill to its first report on this machine under other
#: sessions' load (4 s, the value before, counted the host lost in the last of those runs)
LOST_AFTER_S = 6.0
FENCE_AFTER_S = 8.0
CLI = str(Path(sys.executable).parent / "dlrover-events")


class Cluster:
    """The three hosts, their agents, the operator's view and the job's events."""

    def __init__(
        self, settings: Settings, pg_dsn: str, env: str, net: Namespaces, root: Path
    ) -> None:
        self.settings = settings
        self.pg_dsn = pg_dsn
        self.env = env
        self.net = net
        self.root = root
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.tap = Tap(
            settings,
            env,
            (*OPERATOR_OUTPUTS, "scale.plans", "cluster.capacity", CHECKPOINTS, "hosts.reports"),
        )

    def workdir(self, host: str) -> Path:
        return self.root / f"agent-{host}"

    def start_agent(self, host: str) -> None:
        env = {
            **cli_environ(self.settings, self.pg_dsn),
            "DLROVER_EVENTS_AGENT_HEARTBEAT_S": "0.5",
            # cut from the bus past the operator's LOST_AFTER_S, its pods go (else a node
            # cut off would come back into the job's rendezvous as a stale member)
            "DLROVER_EVENTS_AGENT_FENCE_AFTER_S": str(FENCE_AFTER_S),
        }
        log = open(self.root / f"agent-{host}.log", "ab")  # noqa: SIM115 - the agent's
        self.agents[host] = subprocess.Popen(
            [
                *self.net.exec(host),
                CLI,
                "agent",
                "--env",
                self.env,
                "--host",
                host,
                "--workdir",
                str(self.workdir(host)),
                "--artificial-slots",
                "1",
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def platform(self) -> HostsCluster:
        return HostsCluster(platform_root(self.settings, self.env))

    async def pods(self, job: str) -> list[PodView]:
        return (await self.platform().list_pods(job))[0]

    def memberships(self) -> list[dict[str, Any]]:
        lines = [x for h in HOSTS for x in worker_lines(self.workdir(h))]
        return [m for m in lines if m["event"] == "membership"]

    def samples(self, uid: str, size: int, after: float = 0.0) -> list[RuntimeSample]:
        return [
            s
            for s in self.tap.of(RuntimeSample, uid)
            if s.world_size == size and s.occurred_at.timestamp() > after
        ]

    async def on_hosts(self, job: str, n: int) -> set[str] | None:
        pods = [p for p in await self.pods(job) if p.running and not p.deleting]
        names = {p.node_name for p in pods if p.node_name}
        return {str(n) for n in names} if len(pods) == n and len(names) == n else None


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


@pytest.fixture
def net() -> Iterator[Namespaces]:
    with namespaces(HOSTS) as made:
        yield made


@pytest.fixture
async def cluster(
    net: Namespaces, own_pg: str, settings: Settings, tmp_path: Path
) -> AsyncIterator[Cluster]:
    """A broker of the test's own on the bridge's address (what it advertises is what the
    namespaces reach), the real env on it, and an agent in each namespace."""
    broker = Broker(net.gateway, log_dir=ARTIFACTS / "logs")
    await broker.start_async()
    mine = settings.model_copy(
        update={
            "bootstrap_servers": broker.bootstrap_servers,
            "pg_dsn": own_pg,
            "data_dir": tmp_path / "data",
        }
    )
    env = unique_env("hn")
    registry = EnvRegistry(mine, own_pg)
    await registry.create(env, EnvMode.REAL, partitions=1)
    made = Cluster(mine, own_pg, env, net, tmp_path)
    await made.tap.start()
    try:
        for host in HOSTS:
            made.start_agent(host)
        yield made
    finally:
        for proc in made.agents.values():
            proc.kill()
        for host in HOSTS:
            net.kill_all(host)
        await made.tap.stop()
        broker.stop()


async def test_a_job_across_namespaces_outlives_lost_hosts(
    cluster: Cluster, tmp_path: Path
) -> None:
    ctx = ServiceContext(cluster.settings, cluster.env, cluster.pg_dsn)
    options = {"platform": "hosts", "poll_s": 0.1, "lost_after_s": LOST_AFTER_S}
    task = asyncio.create_task(run_operator(ctx, options))
    figures: dict[str, Any] = {}
    try:
        await wait_for("the operator ready", lambda: ctx.ready.is_set() or task.done())
        if task.done():
            task.result()
        await wait_for("three live hosts in the capacity", lambda: _live(cluster) == set(HOSTS))
        workdir = tmp_path / "work"
        workdir.mkdir()
        (workdir / "examples").symlink_to(ROOT / "examples")
        body = example_job("across")
        body["metadata"].setdefault("annotations", {})[ANN_WORKDIR] = str(workdir)
        container = body["spec"]["roles"]["worker"]["template"]["spec"]["containers"][0]
        # gloo's own sockets on the namespace's interface, not where the host name points
        container["env"].append({"name": "GLOO_SOCKET_IFNAME", "value": "eth0"})
        job = await cluster.platform().submit_job(body)
        uid = job.uid

        await wait_for("samples at world size 2", lambda: cluster.samples(uid, 2))
        two = await wait_for("2 pods on 2 hosts", lambda: cluster.on_hosts("across", 2))
        figures["trained_on"] = sorted(two)

        async def scale(target: int) -> None:
            plan_id = _job_cli(cluster, "scale", "across", "--replicas", str(target)).split()[1]
            plan = await cluster.tap.first(
                ScalePlan, uid, lambda e: e.plan_id == plan_id, f"plan {plan_id}"
            )
            result = await cluster.tap.first(
                ScaleResult, uid, lambda e: e.plan_id == plan_id, f"result of {plan_id}"
            )
            assert result.status == ScaleStatus.APPLIED, result
            after = plan.occurred_at.timestamp()
            got = await wait_for(
                f"samples at world size {target}", lambda: cluster.samples(uid, target, after)
            )
            figures.setdefault("resize_s", {})[target] = round(
                got[0].occurred_at.timestamp() - after, 1
            )
            await wait_for(
                f"{target} pods on {target} hosts", lambda: cluster.on_hosts("across", target)
            )

        await scale(3)

        async def lose(how: str, cut: Callable[[str], None], mend: Callable[[str], None]) -> None:
            pods = {p.node_name: p for p in await cluster.pods("across") if p.running}
            host = next(str(h) for h in sorted(pods, key=str) if pods[h].rank != 0)
            high = max(s.global_step for s in cluster.tap.of(RuntimeSample, uid))
            cut(host)
            at = time.time()

            def lost_said() -> list[CapacityReported]:
                return [
                    r
                    for r in cluster.tap.of(CapacityReported)
                    if r.occurred_at.timestamp() > at
                    and any(h.name == host and not h.schedulable for h in r.hosts)
                ]

            said = await wait_for(f"{host} lost in the capacity ({how})", lost_said)
            detected = said[0].occurred_at.timestamp() - at
            # A peer cut off says nothing: the others' workers would wait out their
            # group's timeout in a collective with it (60 s in the example); the SDK's
            # LostPeerWatch ends them on the operator's NodeLost, and their agents re-form
            # without it (issue 35: the goal is 15 s).
            smaller = await wait_for(
                f"a membership at world size 2 after {how}",
                lambda: [
                    m for m in cluster.memberships() if m["world_size"] == 2 and m["time"] > at
                ],
                deadline_s=3 * DEADLINE_S,
            )
            first = min(smaller, key=lambda m: m["time"])
            await wait_for(f"samples at 2 after {how}", lambda: cluster.samples(uid, 2, at))
            await wait_for(f"{host}'s pods ended", lambda: not _running_pods(cluster, host))
            figures[how] = {
                "host": host,
                "loss_detected_s": round(detected, 2),
                "first_step_at_smaller_size_s": round(first["time"] - at, 2),
                "steps_lost": max(0, high - int(first["first_step"])),
            }
            back = time.time()
            mend(host)
            # a grow like the plan's to 3, plus the host's return to the capacity and a new
            # pod's start: as long as that grow took here, three times over (CI's load
            # comes and goes), never less than the usual deadline
            grow_s = max(DEADLINE_S, 3 * figures["resize_s"][3])
            await wait_for(
                f"samples at 3 with {host} back",
                lambda: cluster.samples(uid, 3, back),
                deadline_s=grow_s,
            )
            figures[how]["back_at_3_s"] = round(time.time() - back, 1)
            await wait_for("3 pods on 3 hosts again", lambda: cluster.on_hosts("across", 3))

        await lose(
            "link down",
            lambda h: cluster.net.link(h, up=False),
            lambda h: cluster.net.link(h, up=True),
        )

        def kill(host: str) -> None:
            cluster.net.kill_all(host)
            cluster.agents[host].wait(10)

        await lose("SIGKILL", kill, cluster.start_agent)

        # An agent killed alone and started again: its pods keep their pids, nothing re-joins.
        # Waited for: the new agent's report of the pods it took back (before it, samples
        # alone proved nothing: the pods train on while no agent runs, until the operator
        # counts the host lost), then training on past it.
        host = sorted(HOSTS)[1]
        before = _pids(cluster, host)
        running = {name: before[name] for name in _running_pods(cluster, host)}
        assert running, f"no pod runs on {host}"
        killed_id = json.loads((cluster.workdir(host) / "agent.json").read_text())["agent_id"]
        joined = len(cluster.memberships())
        cluster.agents[host].kill()
        cluster.agents[host].wait(10)
        killed = time.time()
        cluster.start_agent(host)

        def taken_back() -> list[HostReported]:
            return [
                e
                for e in cluster.tap.of(HostReported)
                if e.host == host
                and e.agent_id != killed_id
                and {p.name: p.pid for p in e.pods if p.phase == "Running"} == running
            ]

        back = await wait_for(f"{host}'s restarted agent reporting its pods", taken_back)
        figures["agent_restart_first_report_s"] = round(back[0].occurred_at.timestamp() - killed, 2)
        seen = len(cluster.tap.of(RuntimeSample, uid))
        await wait_for("more samples", lambda: len(cluster.tap.of(RuntimeSample, uid)) > seen + 6)
        assert _pids(cluster, host) == before
        assert len(cluster.memberships()) == joined, "a worker re-joined: the job restarted"
        lost = [
            e
            for e in cluster.tap.of(NodeFailed, uid)
            if e.reason == "NodeLost" and e.occurred_at.timestamp() > killed
        ]
        assert not lost, f"the restarted agent's host was counted lost: {lost}"

        await scale(2)

        # Steps go back only at a restart, and then to the newest checkpoint committed
        # before it or later: a host cut off mid-save leaves that save uncommitted, and a
        # save is put off while the one before still persists (how many steps that is
        # depends on the machine's speed, so no fixed bound holds).
        samples = cluster.tap.of(RuntimeSample, uid)
        commits = cluster.tap.of(CheckpointCommitted, uid)
        figures["most_steps_back"] = _most_steps_back(samples)
        assert commits, "no checkpoint committed"
        assert not (behind := _behind_newest_checkpoint(samples, commits)), behind
    finally:
        print(json.dumps(figures), flush=True)  # what was measured, also when it failed
        ctx.stop.set()
        await asyncio.wait_for(task, DEADLINE_S)


def _live(cluster: Cluster) -> set[str]:
    """The schedulable hosts of the operator's latest capacity report (one slot each)."""
    ended = {h: p.returncode for h, p in cluster.agents.items() if p.poll() is not None}
    assert not ended, f"agents ended: {ended} (their logs: {cluster.root}/agent-*.log)"
    reports = cluster.tap.of(CapacityReported)
    if not reports:
        return set()
    return {h.name for h in reports[-1].hosts if h.schedulable and h.gpus == 1}


def _running_pods(cluster: Cluster, host: str) -> list[str]:
    """The pods of the host whose shim still runs."""
    out = []
    for pid_file in cluster.workdir(host).glob("pods/*/pid"):
        record = json.loads(pid_file.read_text())
        if shim.alive(record):
            out.append(pid_file.parent.name)
    return out


def _pids(cluster: Cluster, host: str) -> dict[str, int]:
    out = {}
    for pid_file in cluster.workdir(host).glob("pods/*/pid"):
        out[pid_file.parent.name] = int(json.loads(pid_file.read_text())["pid"])
    return out


def _job_cli(cluster: Cluster, *args: str) -> str:
    env = {
        **cli_environ(cluster.settings, cluster.pg_dsn),
        "DLROVER_EVENTS_DATA_DIR": str(cluster.settings.data_dir),
    }
    done = subprocess.run(
        [CLI, "job", *args, "--platform", "hosts", "--env", cluster.env],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _most_steps_back(samples: list[RuntimeSample]) -> int:
    """The most steps the job went back, its samples in the order they were taken."""
    top, most = 0, 0
    for sample in sorted(samples, key=lambda s: s.occurred_at):
        most = max(most, top - sample.global_step)
        top = max(top, sample.global_step)
    return most


def _behind_newest_checkpoint(
    samples: list[RuntimeSample], commits: list[CheckpointCommitted]
) -> list[str]:
    """Each sample whose step is below a checkpoint committed before it was taken: a
    restart that did not resume from the newest checkpoint (rank 0 reports a commit once
    its manifest is written, so a restore after that report finds it), with the samples
    and commits before it."""
    found = []
    ordered = sorted(samples, key=lambda s: s.occurred_at)
    for i, sample in enumerate(ordered):
        before = [c for c in commits if c.occurred_at < sample.occurred_at]
        newest = max(before, key=lambda c: c.step, default=None)
        if newest is not None and sample.global_step < newest.step:
            context = [
                (s.occurred_at.isoformat(), s.global_step, s.world_size)
                for s in ordered[max(0, i - 4) : i + 1]
            ]
            recent = sorted((c.occurred_at.isoformat(), c.step) for c in before)[-3:]
            found.append(
                f"step {sample.global_step} at {sample.occurred_at.isoformat()} is below "
                f"checkpoint {newest.step}; samples {context}; commits {recent}"
            )
    return found[:3]
