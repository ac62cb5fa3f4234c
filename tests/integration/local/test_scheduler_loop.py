"""A cluster scheduler shares this machine between real jobs (issue 26's done-when): the
local platform with 4 slots, four example jobs of different sizes and priorities
submitted within seconds, the env's brain running goodput-cluster (then tiresias) on the
slots the operator reports. Jobs queue and are admitted in the scheduler's order; a
high-priority job that arrives on a full machine has a lower one suspended, which
resumes later from its checkpoint; every job finishes; and at no moment are more than
4 slots in use, as counted from the training processes themselves and from what the
jobs' samples say, not from the brain's own view.

Real parts: the test broker and Postgres, the operator, the brain, torchrun agents and
torch workers. Waits are bounded by generous deadlines; nothing asserts on how long
anything took.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest

from dlrover_events.envs.registry import EnvRegistry
from schemas.jobs import JobCompleted, NodeStarted, RuntimeSample
from schemas.plans import ScalePlan, ScaleResult, ScaleStatus
from streams.brain.runtime.app import Brain
from tests.integration.local.conftest import Local
from tests.integration.local.test_elastic_loop import CHECKPOINT_EVERY, ROOT, example_job
from tests.integration.tap import Tap

pytestmark = pytest.mark.integration

SLOTS = 4
DEADLINE_S = 600.0
SAMPLE_EVERY_S = 0.5


@dataclass(frozen=True)
class Spec:
    name: str
    workers: int
    priority: int
    steps: int
    #: seconds after the first submission
    at_s: float = 0.0


#: Two gangs of 2 and one of 1 take 3 of the 4 slots between them at most, so one
#: gang of 2 waits; the high-priority gang of 2 that comes next finds no room and must
#: have a lower-priority job suspended.
JOBS = (
    Spec("low-a", 2, 0, 300),
    Spec("low-b", 2, 0, 300),
    Spec("mid-c", 1, 1, 300),
    Spec("high-d", 2, 5, 100, at_s=15.0),
)


def _job(spec: Spec) -> dict[str, Any]:
    body = example_job(spec.name, spec.workers)
    worker = body["spec"]["roles"]["worker"]
    worker["minReplicas"] = worker["maxReplicas"] = spec.workers
    command = worker["elastic"]["command"]
    command[command.index("--steps=100000")] = f"--steps={spec.steps}"
    command[command.index("--interval-s=0.5")] = f"--interval-s={SAMPLE_EVERY_S}"
    body["metadata"].setdefault("labels", {})["dlrover-events.io/priority"] = str(spec.priority)
    return body


def _workers(workdir: Path) -> list[psutil.Process]:
    """The training workers of this test's jobs (not their torchrun agents): processes
    whose program is the example and that run where the jobs were submitted."""
    found = []
    for p in psutil.process_iter(["cmdline", "cwd"]):
        cmd = p.info.get("cmdline") or []
        cwd = p.info.get("cwd") or ""
        is_worker = len(cmd) > 1 and cmd[1].endswith("examples/elastic/train_elastic.py")
        if is_worker and cwd.startswith(str(workdir)):
            found.append(p)
    return found


async def _watch_workers(workdir: Path, most: list[int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        most[0] = max(most[0], len(await asyncio.to_thread(_workers, workdir)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)


def _slots_by_samples(samples: list[RuntimeSample]) -> Iterator[tuple[datetime, int]]:
    """At each sample's time, the workers that every job's latest sample says it runs on,
    counting only jobs still reporting (a sample within three intervals)."""
    window = timedelta(seconds=3 * SAMPLE_EVERY_S)
    latest: dict[str, RuntimeSample] = {}
    for sample in sorted(samples, key=lambda s: s.occurred_at):
        latest[sample.job.uuid] = sample
        now = sample.occurred_at
        yield now, sum(s.world_size or 0 for s in latest.values() if now - s.occurred_at <= window)


async def _until(what: str, check: Any, deadline_s: float = DEADLINE_S) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    while loop.time() < deadline:
        got = check()
        if got:
            return got
        await asyncio.sleep(0.5)
    raise AssertionError(f"no {what} within {deadline_s:.0f}s")


@pytest.mark.parametrize("scheduler", ["goodput-cluster", "tiresias"])
async def test_the_scheduler_shares_four_slots_between_four_real_jobs(
    local: Local, tmp_path: Path, scheduler: str
) -> None:
    registry = EnvRegistry(local.settings, local.pg_dsn)
    await registry.change_settings(
        local.env,
        lambda doc: {
            **doc,
            "brain": {
                **doc.get("brain", {}),
                "scheduler": {
                    "name": scheduler,
                    "nodes": 1,
                    "gpus_per_node": SLOTS,
                    "interval_s": 2,
                },
            },
        },
    )
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "examples").symlink_to(ROOT / "examples")
    plans = Tap(local.settings, local.env, ("scale.plans",))
    await plans.start()
    brain = Brain(local.settings, local.env, local.pg_dsn, checkpoint_every_s=1)
    await brain.start()
    ctx, task = await local.start_operator(slots=SLOTS)
    most = [0]
    stop_watch = asyncio.Event()
    watcher = asyncio.create_task(_watch_workers(workdir, most, stop_watch))
    try:
        uids: dict[str, str] = {}

        def trained() -> set[str]:
            mine = set(uids.values())
            return {s.job.uuid for s in local.tap.of(RuntimeSample) if s.job.uuid in mine}

        loop = asyncio.get_running_loop()
        started = loop.time()
        for spec in sorted(JOBS, key=lambda s: s.at_s):
            await asyncio.sleep(max(0.0, started + spec.at_s - loop.time()))
            if spec.at_s:
                # A late job comes once the two jobs that fit have trained (on a loaded
                # machine a torch worker can take longer than at_s to its first sample),
                # so the one suspended for it is one that had trained.
                await _until("the two jobs that fit to train", lambda: len(trained()) >= 2)
            view = await local.submit(_job(spec), workdir)
            uids[spec.name] = view.uid
        names = {uid: name for name, uid in uids.items()}

        def completed() -> set[str]:
            return {names[e.job.uuid] for e in local.tap.of(JobCompleted) if e.job.uuid in names}

        await _until("every job to finish", lambda: completed() == set(uids))

        scale_plans = [p for p in plans.of(ScalePlan) if p.job.uuid in names]
        results = {r.plan_id: r for r in local.tap.of(ScaleResult) if r.job.uuid in names}
        story = [
            (
                p.occurred_at.strftime("%H:%M:%S.%f")[:-3],
                names[p.job.uuid],
                "suspend" if p.suspend else p.node_group_resources.get("worker"),
                results[p.plan_id].status if p.plan_id in results else None,
            )
            for p in sorted(scale_plans, key=lambda p: p.occurred_at)
        ]
        print("plans:", *story, sep="\n  ")
        applied = [p for p in scale_plans if results.get(p.plan_id) is not None]

        # Queued, then admitted in the scheduler's order: no job's pod started before a
        # plan admitted it, and the jobs started in the order of the plans that started
        # them (a job admitted and suspended before its pods came is started by a later one).
        first_pod: dict[str, datetime] = {}
        for event in sorted(local.tap.of(NodeStarted), key=lambda e: e.occurred_at):
            if event.job.uuid in names:
                first_pod.setdefault(names[event.job.uuid], event.occurred_at)
        assert set(first_pod) == set(uids), first_pod
        started_by: dict[str, datetime] = {}
        for plan in sorted(applied, key=lambda p: p.occurred_at):
            name = names[plan.job.uuid]
            group = plan.node_group_resources.get("worker")
            admits = group is not None and group.count and not plan.suspend
            if admits and plan.occurred_at <= first_pod[name]:
                started_by[name] = plan.occurred_at
        assert set(started_by) == set(uids), (started_by, first_pod)
        # (two plans of one burst of rounds, a few milliseconds apart, start their pods
        # in either order: the order is the scheduler's where its plans are apart)
        for x in uids:
            for y in uids:
                if started_by[x] + timedelta(seconds=1) < started_by[y]:
                    assert first_pod[x] <= first_pod[y], (x, y, started_by, first_pod)
        # The high-priority job came to a full machine: someone was suspended for it
        # (applied: its processes gone) and resumed afterwards.
        samples = [s for s in local.tap.of(RuntimeSample) if s.job.uuid in names]

        def reported(uuid: str, before: datetime) -> list[RuntimeSample]:
            return [s for s in samples if s.job.uuid == uuid and s.occurred_at < before]

        suspended = [
            p
            for p in applied
            if p.suspend
            and results[p.plan_id].status == ScaleStatus.APPLIED
            and reported(p.job.uuid, p.occurred_at)
        ]
        assert suspended, story  # (one that had trained, not only one still queued)
        victim = suspended[0]
        resumed = [
            p
            for p in applied
            if p.job.uuid == victim.job.uuid
            and p.occurred_at > victim.occurred_at
            and not p.suspend
            and results[p.plan_id].status == ScaleStatus.APPLIED
        ]
        assert resumed, f"{names[victim.job.uuid]} was never resumed: {story}"
        # Its global step went on from its checkpoint; no job ever lost more than the
        # checkpoint interval.
        for uid in uids.values():
            high = 0
            for step in (s.global_step for s in samples if s.job.uuid == uid):
                assert step >= high - CHECKPOINT_EVERY, (names[uid], step, high)
                high = max(high, step)
        before = reported(victim.job.uuid, victim.occurred_at)
        after = [
            s
            for s in samples
            if s.job.uuid == victim.job.uuid and s.occurred_at > resumed[0].occurred_at
        ]
        assert after and after[0].global_step >= before[-1].global_step - CHECKPOINT_EVERY
        assert after[0].global_step > CHECKPOINT_EVERY  # (not from the start again)
        # Never more than the slots: from the processes, and from the samples.
        assert 0 < most[0] <= SLOTS, most
        for at, used in _slots_by_samples(samples):
            assert used <= SLOTS, (at, used)
    finally:
        stop_watch.set()
        await watcher
        ctx.stop.set()
        await asyncio.wait_for(task, 240)
        await brain.stop()
        await plans.stop()
