"""`dlrover-events bench elastic`: how long a plan takes to change a running training job.

Registered as the ``elastic`` entry point of ``dlrover_events.benches``.

The example elastic job (examples/elastic) runs on the local platform, driven by the real
reconciler, on a real broker (Kafka as the settings find it, else an embedded tansu) and
Postgres, in a throwaway env. The bench publishes ScalePlans that take it up one worker
and back down, again and again, and reads what the workers themselves printed: for each
plan, the seconds from its publication to the first step at the new world size (the
`membership` line each worker prints as it starts training in a world), and the steps the
job lost to it (the last step trained before, minus the step it resumed from; negative
never, 0 when the checkpoint held the last step). Medians are reported; the last line
printed is one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import typer
import yaml  # type: ignore[import-untyped,unused-ignore]

from dlrover_events.bus import Producer
from dlrover_events.embedded import Broker, kafka_reachable, resolve_postgres
from dlrover_events.envs import EnvRegistry
from dlrover_events.sdk.identity import CHECKPOINT_DIR_ENV
from dlrover_events.services import ServiceContext
from dlrover_events.settings import Settings, load_settings
from handlers.operator.kube.podevents import job_meta
from handlers.operator.kube.reconciler import EnvReconciler
from handlers.operator.kube.trainingjob import TRAINING_JOB
from handlers.operator.local.cluster import ANN_WORKDIR, LocalCluster
from handlers.operator.local.memory import available
from handlers.operator.local.runner import node_env
from schemas.plans import NodeGroupResource, ScalePlan

EXAMPLE = Path("examples/elastic/job.yaml")


def memberships(root: Path) -> list[dict[str, Any]]:
    """What the workers printed: `membership` and `exit` lines, from live and kept logs."""
    out = []
    for log in sorted([*root.glob("pods/*/log"), *root.glob("logs/*.log")]):
        pod = log.parent.name if log.name == "log" else log.stem
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith('{"event": "membership"') or line.startswith('{"event": "exit"'):
                out.append({**json.loads(line), "pod": pod})
    return out


def resize_figures(lines: list[dict[str, Any]], published: float, size: int) -> tuple[float, int]:
    """(seconds from the plan to the first step at ``size``, steps lost) for one plan."""
    joined = [
        m
        for m in lines
        if m["event"] == "membership" and m["world_size"] == size and m["time"] > published
    ]
    first = min(joined, key=lambda m: m["time"])
    before = [m["step"] for m in lines if m["event"] == "exit" and m["time"] <= first["time"]]
    lost = max(0, max(before, default=first["first_step"]) - first["first_step"])
    return first["time"] - published, lost


async def _until(check: Any, what: str, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        await asyncio.sleep(0.2)
    raise TimeoutError(f"no {what} within {timeout_s:.0f} s")


async def _run(
    settings: Settings, dsn: str, workdir: Path, resizes: int, step_sleep_s: float
) -> dict[str, Any]:
    env = f"bench-elastic-{uuid.uuid4().hex[:8]}"
    registry = EnvRegistry(settings, dsn)
    await registry.create(env, partitions=1)
    tmp = tempfile.TemporaryDirectory(prefix="dlrover-bench-elastic-")
    root = Path(tmp.name)
    cluster = LocalCluster(
        root,
        TRAINING_JOB,
        runs_pods=True,
        base_env={**node_env(settings), CHECKPOINT_DIR_ENV: str(root / "checkpoints")},
        enforcement=available(),
        poll_s=0.1,
    )
    ctx = ServiceContext(settings, env, dsn)
    reconciler = EnvReconciler(settings, env, dsn, cluster, platform="local")
    await cluster.start()
    running = asyncio.create_task(reconciler.run(ctx.stop))
    figures: list[dict[str, Any]] = []
    try:
        await asyncio.wait_for(reconciler.ready.wait(), 120)
        body = yaml.safe_load((workdir / EXAMPLE).read_text())
        command = body["spec"]["roles"]["worker"]["elastic"]["command"]
        body["spec"]["roles"]["worker"]["elastic"]["command"] = [
            *[c for c in command if not c.startswith("--step-sleep-s")],
            f"--step-sleep-s={step_sleep_s}",
        ]
        body["metadata"]["annotations"] = {ANN_WORKDIR: str(workdir)}
        obj = await cluster.create_job(body)
        job = TRAINING_JOB.parse(obj)
        await _until(
            lambda: [m for m in memberships(root) if m.get("world_size") == 2],
            "training at world size 2",
            180,
        )
        async with Producer(settings) as producer:
            for i in range(resizes):
                size = 3 if i % 2 == 0 else 2
                plan = ScalePlan(
                    env=env,
                    source="bench",
                    job=job_meta(job),
                    plan_id=f"bench-{i}",
                    node_group_resources={"worker": NodeGroupResource(count=size)},
                )
                published = time.time()
                await producer.publish(plan)
                await _until(
                    lambda s=size, t=published: [
                        m
                        for m in memberships(root)
                        if m["event"] == "membership" and m["world_size"] == s and m["time"] > t
                    ],
                    f"training at world size {size}",
                    180,
                )
                seconds, lost = resize_figures(memberships(root), published, size)
                figures.append({"to": size, "seconds": round(seconds, 3), "steps_lost": lost})
                typer.echo(f"plan {i}: -> {size} workers in {seconds:.2f} s, {lost} steps lost")
                await asyncio.sleep(3)  # a few steps at the new size before the next plan
    finally:
        ctx.stop.set()
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await cluster.stop(end_pods=True)
        tmp.cleanup()
        await registry.delete(env, force=True)
    grow = [f["seconds"] for f in figures if f["to"] == 3]
    shrink = [f["seconds"] for f in figures if f["to"] == 2]
    return {
        "bench": "elastic",
        "resizes": len(figures),
        "grow_median_s": round(statistics.median(grow), 3) if grow else None,
        "shrink_median_s": round(statistics.median(shrink), 3) if shrink else None,
        "steps_lost_median": statistics.median([f["steps_lost"] for f in figures]),
        "steps_lost_max": max((f["steps_lost"] for f in figures), default=0),
        "step_sleep_s": step_sleep_s,
        "memory_limits": available().value,
        "runs": figures,
    }


def bench_elastic(
    resizes: int = typer.Option(6, min=1, help="Plans to publish: up one worker, down one."),
    step_sleep_s: float = typer.Option(
        0.05, min=0.0, help="Added to each training step of the example."
    ),
) -> None:
    """Seconds from a plan to the first step at the new world size, and steps lost."""
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    workdir = Path.cwd()
    if not (workdir / EXAMPLE).exists():
        typer.echo(f"error: run from the repository's root ({EXAMPLE} not found)", err=True)
        raise typer.Exit(2)
    settings = load_settings()
    broker: Broker | None = None
    if not kafka_reachable(settings.bootstrap_servers):
        broker = Broker(settings.host)
        broker.start()
        settings = settings.with_overrides(bootstrap_servers=broker.bootstrap_servers)
    postgres = asyncio.run(resolve_postgres(settings))
    try:
        result = asyncio.run(_run(settings, postgres.dsn, workdir, resizes, step_sleep_s))
    finally:
        postgres.stop()
        if broker is not None:
            broker.stop()
    sys.stdout.write(json.dumps(result) + "\n")
