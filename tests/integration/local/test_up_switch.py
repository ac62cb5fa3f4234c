"""The real/virtual switch in what ships (issue 38): `dlrover-events up` on the local
platform, as processes, with a watchdog whose standby nobody made by hand. Jobs fail, the
watchdog promotes the standby, and then, checked from the processes and the new real env's
topics: the job that was running still runs with the same processes (adopted, none
restarted, none started twice), a job submitted as before runs on the new real env, whose
brain plans for it (its cluster scheduler admits it), and a `job scale` reaches its
processes; the demoted env's operator applies nothing after the switch. Then `env promote`
switches back, and `up` (the operator and the brain run in it) is killed with SIGKILL in
the middle of that switch and started again: the same holds, for every job that ran.

Real parts: a broker and a database of the test's own (the envs are `prod` and
`standby`, as a laptop's), `up` and the `job` commands in their own processes, the jobs'
processes on this machine. Waits are bounded; nothing asserts on how long anything took.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import BRAIN_PLANS, JOB_EVENTS, SCALE_PLANS, SCALE_RESULTS
from dlrover_events.envs.failover import last_switch
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.settings import Settings
from handlers.operator.local.cluster import LocalCluster
from handlers.operator.local.runner import platform_root
from handlers.operator.platform.bodies import RUNNING, JobView
from handlers.operator.reconcile.events import job_meta
from schemas.control import EnvMode
from schemas.jobs import JobEvent
from schemas.plans import NodeGroupResource, ScalePlan, ScaleResult
from tests.conftest import cli_environ
from tests.integration.local.conftest import shims
from tests.integration.local.test_local_platform import sleeper_job
from tests.integration.tap import DEADLINE_S, Tap
from tests.integration.test_up import Up, up_environ

#: a guard against a hang only (each wait has its own deadline): at load ~28 here one run
#: went past 300 s (in its third phase, after the switch and back), another took 227 s
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

REAL, STANDBY = "prod", "standby"
#: this machine's slots for jobs (each of the test's pods takes one)
SLOTS = 8
#: the real env's settings, which the standby `up` makes must have too: a cluster scheduler,
#: so that a job starts only once the env's brain admits it (a plan of the brain's for it)
SETTINGS = {
    "brain": {
        "scheduler": {"name": "tiresias", "nodes": 1, "gpus_per_node": SLOTS, "interval_s": 1}
    }
}
#: failed jobs that trip the watchdog (it judges at least this many finished, all failed)
FAILING = 2
SERVICES = ("local", "brain", "watchdog", "gateway", "archiver")


def failing_job(name: str) -> dict[str, Any]:
    body = sleeper_job(name, 1)
    (container,) = body["spec"]["roles"]["worker"]["template"]["spec"]["containers"]
    container["command"] = [sys.executable, "-c", "import sys; sys.exit(3)"]
    return body


class Install:
    """`up` with its watchdog, and the `job` commands, as a user runs them here."""

    def __init__(self, settings: Settings, tmp_path: Path) -> None:
        self.settings = settings
        self.data = tmp_path / "data"
        self.work = tmp_path / "work"
        self.work.mkdir()
        self.environ = up_environ(
            settings.pg_dsn or "",
            self.data,
            DLROVER_EVENTS_BOOTSTRAP_SERVERS=settings.bootstrap_servers,
            DLROVER_EVENTS_WATCHDOG_STANDBY=STANDBY,
            DLROVER_EVENTS_WATCHDOG_MIN_FINISHED=str(FAILING),
            DLROVER_EVENTS_WATCHDOG_CHECK_EVERY_S="0.5",
            DLROVER_EVENTS_LOCAL_POLL_S="0.1",
            DLROVER_EVENTS_LOCAL_SLOTS=str(SLOTS),
            DLROVER_EVENTS_LOCAL_API_PORT="0",  # unused here: any free port
        )
        self.registry = EnvRegistry(settings, settings.pg_dsn or "")

    def up(self) -> Up:
        return Up(self.environ, *[a for s in SERVICES for a in ("-s", s)])

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**cli_environ(self.settings, self.settings.pg_dsn or ""), **self.environ}
        return subprocess.run(
            [sys.executable, "-c", "from dlrover_events.cli.app import main; main()", *args],
            env=env,
            cwd=self.work,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def submit(self, body: dict[str, Any]) -> None:
        """`job submit FILE --platform local`, to the real env (whichever it is now)."""
        spec = self.work / f"{body['metadata']['name']}.yaml"
        spec.write_text(yaml.safe_dump(body))
        done = self.cli("job", "submit", str(spec), "--platform", "local")
        assert done.returncode == 0, done.stderr

    @property
    def root(self) -> Path:
        """The folder of the machine's jobs (the real env's, before the switch)."""
        return platform_root(self.settings.model_copy(update={"data_dir": self.data}), REAL)

    async def job(self, name: str) -> JobView:
        job = await LocalCluster(self.root).get_job(name)
        assert isinstance(job, JobView), name
        return job

    async def running(self, name: str) -> int:
        pods, _ = await LocalCluster(self.root).list_pods(name)
        return sum(1 for p in pods if p.phase == RUNNING and not p.deleting)

    def nodes(self, name: str) -> list[list[psutil.Process]]:
        """The job's nodes as processes: each shim, then what it runs."""
        found = []
        for shim in shims(self.root.resolve()):
            try:
                cmdline = shim.cmdline()
                with_dir = [c for c in cmdline if c.startswith(f"{self.root.resolve()}/")]
                if with_dir and Path(with_dir[0]).name.startswith(f"{name}-"):
                    found.append([shim, *shim.children(recursive=True)])
            except psutil.Error:
                continue
        return found

    def processes(self, name: str) -> dict[int, float]:
        """The job's processes, each shim and what it runs: pid -> start time."""
        return _started_at(self.nodes(name))


def _started_at(nodes: list[list[psutil.Process]]) -> dict[int, float]:
    found: dict[int, float] = {}
    for p in (p for node in nodes for p in node):
        try:
            found[p.pid] = p.create_time()
        except psutil.Error:
            continue
    return found


async def until(what: str, check: Any, up: Up | None = None) -> Any:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if got := await check():
            return got
        await asyncio.sleep(0.1)
    stderr = f"; up's stderr:\n{up.stderr[-6000:]}" if up is not None else ""
    pytest.fail(f"no {what} within {DEADLINE_S:.0f}s{stderr}")


async def _at_least(install: Install, name: str, n: int) -> bool:
    try:
        return await install.running(name) >= n
    except AssertionError:
        return False


def announced(tap: Tap, uid: str) -> Callable[[], list[JobEvent]]:
    return lambda: tap.of(JobEvent, uid)


def running_workers(install: Install, name: str, n: int) -> Callable[[], Awaitable[bool]]:
    return lambda: _at_least(install, name, n)


async def started(install: Install, name: str, n: int, up: Up) -> dict[int, float]:
    """The job's processes once ``n`` of its pods run and every shim of the job has started
    its worker. A pod runs as soon as its shim is alive, and the shim starts the pod's
    command only after its own interpreter has started (0.3-0.6 s measured here at load
    2-3, more on a loaded machine): processes counted in between have the shims without
    their workers, and any later "the same processes" would then see a worker more."""

    async def each_with_its_worker() -> dict[int, float] | None:
        if not await _at_least(install, name, n):
            return None
        nodes = install.nodes(name)
        if len(nodes) >= n and all(len(node) >= 2 for node in nodes):
            return _started_at(nodes)
        return None

    procs: dict[int, float] = await until(
        f"{n} running workers of {name}, each shim with its worker", each_with_its_worker, up
    )
    return procs


async def before_the_switch(install: Install, up: Up) -> tuple[JobView, dict[int, float]]:
    """`up` made the standby with the real env's settings; a job runs; jobs fail."""
    await up.started()
    standby = await install.registry.get(STANDBY)
    assert standby is not None and standby.mode == EnvMode.VIRTUAL, "up made the standby"
    assert standby.settings == SETTINGS, "with the real env's settings"

    install.submit(sleeper_job("keep", 2))
    procs = await started(install, "keep", 2, up)  # two shims, each with its worker
    keep = await install.job("keep")
    cluster = LocalCluster(install.root)  # (the failing jobs: straight into the store)
    for i in range(FAILING):
        await cluster.submit_job(failing_job(f"fails-{i}"))
    return keep, procs


async def after_the_switch(
    install: Install,
    up: Up,
    new: str,
    old: str,
    running: dict[str, tuple[JobView, dict[int, float], int]],
    fresh_name: str,
    taps: dict[str, Tap],
) -> tuple[JobView, dict[int, float]]:
    """The new real env acts for the machine's jobs; the demoted one does nothing.
    ``running``: job name -> (the job, its processes, its workers), each still so after;
    returns the job submitted after the switch, with its processes."""
    real = await install.registry.real()
    assert real is not None and real.name == new
    switch = last_switch(await install.registry.changes())
    assert switch is not None and (switch.to, switch.came_from) == (new, old), switch
    for name, (job, procs, workers) in running.items():
        # adopted by the new real env: known there (announced by its operator, for a job
        # it never had), still running, the same processes, none restarted
        await taps[new].until(announced(taps[new], job.uid), f"{name} announced in {new}")
        await until(f"{name} running", running_workers(install, name, workers), up)
        assert install.processes(name) == procs, f"{name}: the same processes, none restarted"

    # a plan of the demoted env's (as its brain might still publish) reaches nothing (it
    # asks for what keep has: the env, promoted back later, finds it in its topic then)
    keep, _, keep_workers = running["keep"]
    async with Producer(install.settings) as producer:
        await producer.publish(
            ScalePlan(
                env=old,
                job=job_meta(keep),
                source="test",
                plan_id=f"demoted-{old}",
                node_group_resources={"worker": NodeGroupResource(count=keep_workers)},
            )
        )

    # a job submitted as before (to the real env: now the new one) runs there, once the new
    # real env's brain (its cluster scheduler) admits it
    install.submit(sleeper_job(fresh_name, 1))
    before = set(await started(install, fresh_name, 1, up))
    fresh = await install.job(fresh_name)
    await taps[new].until(
        lambda: [p for p in taps[new].of(ScalePlan, fresh.uid) if p.source == "brain"],
        f"{new}'s brain planning for {fresh_name}",
    )
    scaled = install.cli("job", "scale", fresh_name, "--replicas", "2", "--platform", "local")
    assert scaled.returncode == 0, scaled.stderr
    published = re.search(rf"plan (\S+) published to {new}\.scale\.plans", scaled.stdout)
    assert published, scaled.stdout
    procs = await started(install, fresh_name, 2, up)
    assert set(procs) > before, "the plan reached new processes"
    (result,) = await taps[new].until(
        lambda: [r for r in taps[new].of(ScaleResult) if r.plan_id == published[1]],
        f"{fresh_name}'s scale result",
    )
    assert result.status.value == "applied", result.reason

    # nothing of the demoted env's applied after the switch: no result, keep unchanged
    assert not [r for r in taps[old].of(ScaleResult) if r.occurred_at > switch.at], (
        f"the demoted env {old}'s operator answered a plan after the switch"
    )
    job = await install.job("keep")
    assert job.roles["worker"].replicas == keep_workers
    assert f"demoted-{old}" not in job.applied_plans
    return fresh, procs


async def test_up_fails_over_to_the_standby_and_back_and_the_jobs_run_on(
    own_settings: Settings, tmp_path: Path
) -> None:
    install = Install(own_settings, tmp_path)
    await install.registry.create(REAL, EnvMode.REAL, settings=SETTINGS)
    up = install.up()
    again: Up | None = None
    topics = (JOB_EVENTS, BRAIN_PLANS, SCALE_PLANS, SCALE_RESULTS)
    taps = {env: Tap(install.settings, env, topics) for env in (REAL, STANDBY)}
    try:
        keep, procs = await before_the_switch(install, up)
        for tap in taps.values():
            await tap.start()
        # the watchdog fails over; `up` stops prod's services and starts standby's
        await up.wait_for(lambda: f"starts {STANDBY}'s" in up.stderr, "the switch", DEADLINE_S)
        await up.wait_for(
            lambda: up.stdout.count("Ctrl-C stops everything") >= 2,
            "the standby's services ready",
            DEADLINE_S,
        )
        running = {"keep": (keep, procs, 2)}
        fresh, fresh_procs = await after_the_switch(
            install, up, STANDBY, REAL, running, "fresh", taps
        )
        listed = install.cli("env", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        roles = {e["name"]: (e["role"], e["switch"]) for e in json.loads(listed.stdout)}
        assert roles[REAL] == ("virtual", None), roles
        role, switch = roles[STANDBY]
        assert role == "real" and switch["from"] == REAL, roles
        assert switch["reason"].startswith("watchdog:"), switch

        # back by hand, and `up` (with its operator and brain) killed as it switches
        await install.registry.promote(REAL, reason="back: drill")  # (`env promote`'s call)
        await up.wait_for(lambda: f"starts {REAL}'s" in up.stderr, "the switch back", DEADLINE_S)
        up.proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(up.proc.wait, 30)
        running["fresh"] = (fresh, fresh_procs, 2)
        for name, (_, procs_of, _) in running.items():
            assert install.processes(name) == procs_of, f"{name} outlives `up`"
        again = install.up()
        await again.started()
        await after_the_switch(install, again, REAL, STANDBY, running, "third", taps)
    finally:
        for tap in taps.values():
            await tap.stop()
        await up.stop()
        rc = await again.stop() if again is not None else None
        _end_jobs(install)
    assert rc == 0, again.stderr if again is not None else ""
    assert again is not None and "did not stop within" not in again.stderr, again.stderr


def _end_jobs(install: Install) -> None:
    """The test's job processes, ended (a clean stop of the real env's `up` ends them; a
    failed test may leave some)."""
    for shim in shims(install.root.resolve()):
        for p in [*shim.children(recursive=True), shim]:
            try:
                p.kill()
            except psutil.Error:
                continue
