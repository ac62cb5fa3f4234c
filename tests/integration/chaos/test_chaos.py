"""Chaos: the brain and the virtual operator of a lockstep env are killed with SIGKILL at
seeded random points of a small workload, and started again each time. Afterwards no plan
id is lost, none is applied twice, and every job ends as it ends in the same env run
without kills (lockstep makes a run a function of its input: the same plans at the same
simulated seconds, hence the same completions).

Kill points are ticks of the simulated clock (seen on the bus), plus a seeded sub-second
delay, so they fall at comparable places of the run however loaded the machine is.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import BRAIN_PLANS, JOB_EVENTS, SCALE_PLANS, SCALE_RESULTS
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.settings import Settings
from handlers.operator.virtual.operator import ALREADY_APPLIED
from schemas.control import EnvMode
from schemas.jobs import JobCompleted, JobFailed, JobMeta, JobSubmitted, RoleSpec
from schemas.lockstep import Barrier
from schemas.plans import OptimizePlan, ScalePlan, ScaleResult, ScaleStatus
from tests.conftest import unique_env
from tests.integration.operator.processes import Service, operator_lock
from tests.integration.tap import DEADLINE_S, Tap

pytestmark = pytest.mark.integration

SEED = 15
KILLS = 4  # at least one of each
T0 = datetime(2026, 3, 1, tzinfo=UTC)
#: (job, arrival second, workers): small ncf jobs (about 25 min simulated on one worker)
JOBS = [("ncf-0", 0, 1), ("ncf-1", 45, 2), ("ncf-2", 200, 1)]
SETTINGS: dict[str, Any] = {
    "brain": {"lockstep": True, "cluster_gpus": 8, "job_config": {"optimizer": "goodput"}},
    # Four samples a tick: fewer round trips to the brain, the same determinism.
    "operator": {"lockstep": True, "nodes": 2, "gpus_per_node": 4, "tick_s": 120.0},
}


@dataclass
class Run:
    """What one env's run said, and how often its processes were killed."""

    env: str
    kills: Counter[str] = field(default_factory=Counter)
    scale_plans: set[str] = field(default_factory=set)
    optimize_plans: set[str] = field(default_factory=set)
    first_answers: Counter[str] = field(default_factory=Counter)
    results: set[str] = field(default_factory=set)
    outcomes: dict[str, tuple[str, datetime]] = field(default_factory=dict)
    ticks: int = 0
    #: plan id -> what the plan said (job, simulated time, cause, reason, size), to tell
    #: which plans two runs do not share
    described: dict[str, str] = field(default_factory=dict)


def differing(calm: Run, chaos: Run) -> str:
    """The scale plans only one of the runs made, with every plan of their jobs in both runs
    (a line each, in simulated time)."""
    odd = calm.scale_plans ^ chaos.scale_plans
    jobs = {chaos.described.get(p, calm.described.get(p, "?")).split()[0] for p in odd}
    lines = []
    for name, run in (("without kills", calm), ("with kills", chaos)):
        lines.append(f"{name}:")
        for p in sorted(run.scale_plans, key=lambda p: run.described.get(p, "")):
            said = run.described.get(p, "? (no description)")
            if said.split()[0] in jobs or p in odd:
                lines.append(f"  {'*' if p in odd else ' '} {p[:8]} {said}")
    return "\n".join(lines)


def submissions(env: str, jobs: list[tuple[str, int, int]] | None = None) -> list[JobSubmitted]:
    return [
        JobSubmitted(
            env=env,
            occurred_at=T0 + timedelta(seconds=at),
            job=JobMeta(uuid=name, name=name, app="ncf"),
            application="ncf",
            roles={"worker": RoleSpec(replicas=workers, gpu_num=1)},
        )
        for name, at, workers in (JOBS if jobs is None else jobs)
    ]


def tick_seen(tap: Tap) -> int:
    return max((e.tick for e in tap.events if isinstance(e, Barrier)), default=0)


def ended(tap: Tap) -> dict[str, tuple[str, datetime]]:
    return {
        e.key or "": (e.type, e.occurred_at)
        for e in tap.events
        if isinstance(e, JobCompleted | JobFailed)
    }


def summarize(run: Run, tap: Tap) -> None:
    events = {e.event_id: e for e in tap.events}.values()  # a re-published event once
    optimize = {e.plan_id: e for e in events if isinstance(e, OptimizePlan)}
    for e in events:
        if isinstance(e, ScalePlan):
            run.scale_plans.add(e.plan_id)
            source = optimize.get(e.source_plan or "")
            groups = {k: v.count for k, v in e.node_group_resources.items()}
            run.described[e.plan_id] = (
                f"{e.job.name} at {e.occurred_at.isoformat()} groups {groups} "
                f"placement {dict(e.placement)} suspend {e.suspend}; caused by "
                f"{source.caused_by if source else '?'}: "
                f"{source.reason if source else '(no optimize plan seen)'}"
            )
        elif isinstance(e, OptimizePlan):
            run.optimize_plans.add(e.plan_id)
        elif isinstance(e, ScaleResult):
            run.results.add(e.plan_id)
            if e.status in (ScaleStatus.APPLIED, ScaleStatus.PARTIAL) and not (
                e.reason.startswith(ALREADY_APPLIED)
            ):
                run.first_answers[e.plan_id] += 1
    run.outcomes = ended(tap)
    run.ticks = tick_seen(tap)


async def run_env(
    settings: Settings,
    pg_dsn: str,
    logs: Path,
    *,
    kills: int,
    seed: int = SEED,
    jobs: list[tuple[str, int, int]] | None = None,
) -> Run:
    """One env's run of ``jobs`` (default JOBS), its brain and operator killed ``kills``
    times."""
    jobs = JOBS if jobs is None else jobs
    rng = random.Random(seed)
    schedule = kill_schedule(rng, kills)
    registry = EnvRegistry(settings, pg_dsn)
    env = unique_env("chaos")
    await registry.create(env, EnvMode.VIRTUAL, settings=SETTINGS)
    run = Run(env)
    tap = Tap(settings, env, (JOB_EVENTS, BRAIN_PLANS, SCALE_PLANS, SCALE_RESULTS))
    # Metrics on any free port: two envs run side by side, and a killed brain's port may
    # linger.
    port = {"DLROVER_EVENTS_METRICS_PORT": "0"}
    services = {
        "brain": Service(
            settings, pg_dsn, ["brain", "--env", env], logs / f"{env}.brain.log", extra_env=port
        ),
        "operator": Service(
            settings,
            pg_dsn,
            ["operator", "--env", env],
            logs / f"{env}.operator.log",
            extra_env=port,
            lock_key=operator_lock(env),
        ),
    }
    await tap.start()
    try:
        async with Producer(settings) as producer:
            await producer.publish_many(submissions(env, jobs))
        for service in services.values():
            await service.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 2 * DEADLINE_S * max(1, len(jobs) // len(JOBS))
        while len(ended(tap)) < len(jobs):
            if loop.time() > deadline:
                pytest.fail(
                    f"{env}: {len(ended(tap))} of {len(jobs)} jobs ended within "
                    f"{2 * DEADLINE_S:.0f}s, tick {tick_seen(tap)}, kills {dict(run.kills)}"
                )
            for service in services.values():
                service.alive()
            if schedule and tick_seen(tap) >= schedule[0][0]:
                _, victim = schedule.pop(0)
                await asyncio.sleep(rng.uniform(0.0, 0.3))
                await services[victim].kill()
                run.kills[victim] += 1
                await services[victim].start()
            await asyncio.sleep(0.05)
        assert not schedule, f"the run ended before kills at ticks {schedule}"
        # The last answers come after the last completion: let them arrive.
        await tap.until(lambda: set(run_results(tap)) >= run_plans(tap) or None, "results")
    finally:
        for service in services.values():
            await service.stop()
        await tap.stop()
        with contextlib.suppress(Exception):
            await registry.delete(env, force=True)
    summarize(run, tap)
    return run


def kill_schedule(rng: random.Random, kills: int) -> list[tuple[int, str]]:
    """(tick, whom to kill once the bus shows that tick), at least one kill of each."""
    if kills == 0:
        return []
    victims = ["brain", "operator"] + [rng.choice(["brain", "operator"]) for _ in range(kills - 2)]
    rng.shuffle(victims)
    return list(zip(sorted(rng.sample(range(2, 30), kills)), victims, strict=True))


def run_plans(tap: Tap) -> set[str]:
    return {e.plan_id for e in tap.events if isinstance(e, ScalePlan)}


def run_results(tap: Tap) -> set[str]:
    return {e.plan_id for e in tap.events if isinstance(e, ScaleResult)}


async def test_kills_of_brain_and_operator_lose_no_plan_and_change_no_outcome(
    settings: Settings, pg_dsn: str, tmp_path: Path
) -> None:
    # Side by side: each env has its own topics, groups, schema and lock.
    calm, chaos = await asyncio.gather(
        run_env(settings, pg_dsn, tmp_path, kills=0),
        run_env(settings, pg_dsn, tmp_path, kills=KILLS),
    )

    lost = (calm.scale_plans - chaos.scale_plans) | (chaos.scale_plans - chaos.results)
    lost_optimize = calm.optimize_plans - chaos.optimize_plans
    twice = {p for p, n in chaos.first_answers.items() if n > 1}
    print(  # the figures the issue asks for
        f"\nchaos: kills {sum(chaos.kills.values())} ({dict(chaos.kills)}), "
        f"scale plans {len(chaos.scale_plans)} (without kills {len(calm.scale_plans)}), "
        f"optimize plans {len(chaos.optimize_plans)} ({len(calm.optimize_plans)}), "
        f"lost {len(lost)} (+{len(lost_optimize)} optimize), applied twice {len(twice)}, "
        f"new plan ids {len(chaos.scale_plans - calm.scale_plans)}, "
        f"ticks {chaos.ticks} ({calm.ticks})"
    )
    assert calm.scale_plans, "the brain planned something: the test would be vacuous"
    assert sum(chaos.kills.values()) == KILLS
    assert set(chaos.kills) == {"brain", "operator"}
    assert not lost, f"plan ids lost: {sorted(lost)}"
    assert not lost_optimize, f"optimize plan ids lost: {sorted(lost_optimize)}"
    assert not twice, f"applied twice: {sorted(twice)}"
    assert chaos.scale_plans == calm.scale_plans
    assert chaos.outcomes == calm.outcomes
