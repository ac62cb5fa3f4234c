"""A local operator killed with SIGKILL while it applies plans, and started again, applies
nothing twice and leaves no process behind: plans are launches (each adds a node), so a
plan applied twice would show as a node too many. Each kill lands at an exact point of a
plan (tests/integration/local/crash_operator.py pauses there): after the job's patch, or
after its pods were made, before the plan's offset is committed."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

from handlers.operator.platform.bodies import JobView, PodView
from schemas.jobs import JobSubmitted
from schemas.plans import Node, ScalePlan, ScaleResult, ScaleStatus
from tests.conftest import cli_environ
from tests.integration.local.conftest import Local, shims
from tests.integration.local.test_elastic_loop import of_plan
from tests.integration.local.test_local_platform import running, sleeper_job, until
from tests.integration.tap import DEADLINE_S

#: (plan, where the operator dies while applying it)
KILLS = [
    ("launch-0", "patched"),
    ("launch-1", "pods"),
    ("launch-2", "patched"),
    ("launch-3", "pods"),
]


def _environ(local: Local) -> dict[str, str]:
    return {
        **cli_environ(local.settings, local.pg_dsn),
        "DLROVER_EVENTS_DATA_DIR": str(local.settings.data_dir),
        "DLROVER_EVENTS_LOCAL_POLL_S": "0.1",
        "DLROVER_EVENTS_LOCAL_API_PORT": "0",
    }


def start_operator(local: Local, log: Path) -> subprocess.Popen[bytes]:
    cli = str(Path(sys.executable).parent / "dlrover-events")
    return subprocess.Popen(
        [cli, "operator", "--env", local.env, "--platform", "local"],
        env=_environ(local),
        stdout=subprocess.DEVNULL,
        stderr=open(log, "ab"),
    )


def start_pausing(local: Local, plan_id: str, step: str, log: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.local.crash_operator", local.env, plan_id, step],
        env=_environ(local),
        cwd=Path(__file__).resolve().parents[3],
        stdout=subprocess.PIPE,
        stderr=open(log, "ab"),
        text=True,
    )


async def paused(proc: subprocess.Popen[str], plan_id: str, step: str) -> None:
    assert proc.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), DEADLINE_S)
    assert line.strip() == f"paused {plan_id} {step}", line


async def test_a_killed_local_operator_applies_nothing_twice_and_leaves_no_orphan(
    local: Local, tmp_path: Path
) -> None:
    log = tmp_path / "operator.log"
    op: subprocess.Popen[bytes] | subprocess.Popen[str] = start_operator(local, log)
    try:
        job = await local.submit(sleeper_job("crashy", 1, maxReplicas=len(KILLS) + 2))
        uid = job.uid
        submitted = await local.tap.first(JobSubmitted, uid, lambda e: True, "job.submitted")
        await until("1 running node", lambda: _count(local, "crashy", 1))
        op.send_signal(signal.SIGTERM)
        op.wait(timeout=DEADLINE_S)
        plans = []
        for i, (plan_id, step) in enumerate(KILLS):
            op = start_pausing(local, plan_id, step, log)
            plan = ScalePlan(
                env=local.env,
                job=submitted.job,
                plan_id=plan_id,
                launch_nodes=[Node(type="worker", id=10 + i)],
            )
            plans.append(plan)
            await local.producer.publish(plan)
            await paused(op, plan_id, step)
            os.kill(op.pid, signal.SIGKILL)
            op.wait(timeout=30)
        op = start_operator(local, log)
        for plan in plans:
            result = await local.tap.first(ScaleResult, uid, of_plan(plan.plan_id), plan.plan_id)
            assert result.status == ScaleStatus.APPLIED, result
        # Every launch added exactly one node: 1 + len(KILLS), never more.
        want = 1 + len(KILLS)
        nodes = await until(f"{want} running nodes", lambda: _count(local, "crashy", want))
        assert sorted(nodes) == list(range(want))
        await asyncio.sleep(2)  # a duplicate launch would have made its pod by now
        pods = await local.pods("crashy")
        assert len(pods) == want, [p.name for p in pods]
        obj = await local.cluster().get_job("crashy")
        assert isinstance(obj, JobView)
        assert obj.roles["worker"].replicas == want
        # Each node is one process, and each process is a node's.
        assert len({p.pid for p in shims(local.root)}) == want
    finally:
        op.send_signal(signal.SIGTERM)
        try:
            op.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            op.kill()
    assert not shims(local.root), "a clean stop ends every node"
    assert op.returncode == 0, log.read_text()[-2000:]


async def _count(local: Local, job: str, n: int) -> dict[int, PodView] | None:
    found = running(await local.pods(job))
    return found if len(found) == n else None
