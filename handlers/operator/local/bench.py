"""`dlrover-events bench elastic`: how long a plan takes to change a running training job,
restarting its processes and in place.

Registered as the ``elastic`` entry point of ``dlrover_events.benches``.

The example elastic job (examples/elastic) runs on the local platform, driven by the real
reconciler, on a real broker (Kafka as the settings find it, else an embedded tansu) and
Postgres, in a throwaway env: once as ``job.yaml`` (mode restart: torchrun's agents
re-rendezvous and restart every worker, which resumes from its checkpoint), once as
``job-inplace.yaml`` (mode inPlace: the workers re-form their group at a step boundary,
a scale-up admits the warm spare the platform keeps). The same run measures both, one
job after the other, so they meet the same machine.

The bench publishes ScalePlans that take each job up one worker and back down, again and
again, and reads what the workers themselves printed. For each plan: the seconds from its
publication to the end of the first training step at the new world size (the workers'
`rescaled` lines), the steps the job lost to it, and in place the phases (plan delivery,
agreement, group re-form, state transfer, first step) and whether the scale-up took a
warm spare. Before each scale-up in place the bench waits for the spare to be ready (torch
imported, model built): the figures are those of a grow with a warm spare. Medians per
mode and kind are reported; the last line printed is one JSON object.
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

from dlrover_events.bus.producer import Producer
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.pods.memory import available
from dlrover_events.runtime.embedded import Broker, kafka_reachable, resolve_postgres
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.sdk.identity import CHECKPOINT_DIR_ENV
from dlrover_events.settings import Settings, load_settings
from handlers.operator.document.trainingjob import ANN_WORKDIR
from handlers.operator.local.cluster import LocalCluster
from handlers.operator.local.runner import node_env
from handlers.operator.local.spares import SPARES
from handlers.operator.reconcile.events import job_meta
from handlers.operator.reconcile.reconciler import EnvReconciler
from schemas.plans import NodeGroupResource, RescaleMode, ScalePlan

EXAMPLES = {
    RescaleMode.RESTART: Path("examples/elastic/job.yaml"),
    RescaleMode.IN_PLACE: Path("examples/elastic/job-inplace.yaml"),
}
PHASES = ("plan_delivery_s", "agreement_s", "reform_s", "state_transfer_s", "first_step_s")
#: the lines of the elastic example's workers that the bench reads
KINDS = ("membership", "exit", "rescaled", "spare")


_DECODER = json.JSONDecoder()


def worker_lines(paths: list[Path], kinds: tuple[str, ...] = KINDS) -> list[dict[str, Any]]:
    """The workers' JSON lines of ``kinds`` in the logs at ``paths``, each with its pod."""
    out = []
    for log in sorted(paths):
        pod = log.parent.name if log.name == "log" else log.stem
        for line in log.read_text(errors="replace").splitlines():
            if any(line.startswith(f'{{"event": "{kind}"') for kind in kinds):
                # the object alone: a worker's stderr may have run on after it on the line
                found, _ = _DECODER.raw_decode(line)
                out.append({**found, "pod": pod})
    return out


def memberships(root: Path) -> list[dict[str, Any]]:
    """What the workers printed (`membership`, `exit`, `rescaled`, `spare` lines), from
    live pods and kept logs."""
    return worker_lines([*root.glob("pods/*/log"), *root.glob("logs/*.log")])


def ready_spares(root: Path) -> list[dict[str, Any]]:
    """The `spare` lines of the spares waiting now: each is ready to be admitted."""
    return [s for s in worker_lines(list(root.glob(f"{SPARES}/*/log"))) if s["event"] == "spare"]


def first_steps(lines: list[dict[str, Any]], published: float, size: int) -> list[dict[str, Any]]:
    """The `rescaled` lines at ``size`` after ``published``, first step first."""
    found = [
        m
        for m in lines
        if m["event"] == "rescaled" and m["world_size"] == size and m["time"] > published
    ]
    return sorted(found, key=lambda m: m["at"]["first_step"])


def resize_figures(lines: list[dict[str, Any]], published: float, size: int) -> dict[str, Any]:
    """One plan's figures: seconds from its publication to the end of the first step at
    ``size``, the steps lost, and (in place) the phases and whether a spare came in."""
    done = first_steps(lines, published, size)
    if not done:
        raise ValueError(f"no first step at world size {size} after {published}")
    first = done[0]
    mode = first["mode"]
    out: dict[str, Any] = {
        "mode": mode,
        "seconds": round(first["at"]["first_step"] - published, 3),
    }
    if mode == RescaleMode.IN_PLACE.value:
        lead = next(
            (m for m in done if m["rank"] == 0 and m["generation"] == first["generation"]), first
        )
        at = lead["at"]
        sign = at.get("sign")
        out["steps_lost"] = lead.get("steps_lost") or 0
        out["phases"] = {
            "plan_delivery_s": None if sign is None else round(max(sign - published, 0.0), 3),
            **{k: lead[k] for k in PHASES[1:] if k in lead},
        }
        if lead.get("joined"):  # a scale-up: did a warm spare come in?
            out["warm"] = any(
                m["event"] == "membership"
                and m.get("generation") == first["generation"]
                and m["first_step"] == first["step"]
                and m.get("spare")
                for m in lines
            )
        return out
    # restart: the steps trained before the plan that the new world did again
    resumed = min(m["step"] for m in done)
    before = [
        m["step"]
        for m in lines
        if m["event"] == "exit" and published <= m["time"] <= first["at"]["first_step"]
    ]
    out["steps_lost"] = max(0, max(before, default=resumed) - resumed)
    return out


async def _until(check: Any, what: str, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        await asyncio.sleep(0.2)
    raise TimeoutError(f"no {what} within {timeout_s:.0f} s")


async def _measure(
    cluster: LocalCluster,
    root: Path,
    producer: Producer,
    env: str,
    workdir: Path,
    mode: RescaleMode,
    resizes: int,
    step_sleep_s: float,
) -> list[dict[str, Any]]:
    """One job of ``mode``: ``resizes`` plans, 2 -> 3 -> 2 ..., then the job deleted."""
    body = yaml.safe_load((workdir / EXAMPLES[mode]).read_text())
    body["metadata"]["name"] = f"bench-{'inplace' if mode is RescaleMode.IN_PLACE else 'restart'}"
    command = body["spec"]["roles"]["worker"]["elastic"]["command"]
    body["spec"]["roles"]["worker"]["elastic"]["command"] = [
        *[c for c in command if not c.startswith("--step-sleep-s")],
        f"--step-sleep-s={step_sleep_s}",
    ]
    body["metadata"]["annotations"] = {ANN_WORKDIR: str(workdir)}
    job = await cluster.submit_job(body)
    started = time.time()
    figures: list[dict[str, Any]] = []
    try:
        await _until(
            lambda: first_steps(memberships(root), started, 2), "training at world size 2", 180
        )
        for i in range(resizes):
            size = 3 if i % 2 == 0 else 2
            if size == 3 and mode is RescaleMode.IN_PLACE:
                await _until(lambda: ready_spares(root), "a ready warm spare", 180)
            plan = ScalePlan(
                env=env,
                source="bench",
                job=job_meta(job),
                plan_id=f"bench-{mode.value}-{i}",
                node_group_resources={"worker": NodeGroupResource(count=size)},
            )
            published = time.time()
            await producer.publish(plan)
            await _until(
                lambda s=size, t=published: first_steps(memberships(root), t, s),
                f"training at world size {size}",
                180,
            )
            await asyncio.sleep(0.5)  # the other ranks' lines of the same step
            got = resize_figures(memberships(root), published, size)
            figures.append(
                {"plan": i, "to": size, "kind": "grow" if size == 3 else "shrink", **got}
            )
            typer.echo(_said(figures[-1]))
            await asyncio.sleep(3)  # a few steps at the new size before the next plan
    finally:
        await cluster.delete_job(job.name)
        await _until(
            lambda: not list(root.glob("pods/*")) and not list(root.glob(f"{SPARES}/*")),
            "the job's pods gone",
            120,
        )
    return figures


def _said(f: dict[str, Any]) -> str:
    text = (
        f"plan {f['plan']} [{f['mode']}]: -> {f['to']} workers in {f['seconds']:.2f} s, "
        f"{f['steps_lost']} steps lost"
    )
    phases = f.get("phases")
    if phases:
        text += (
            " ("
            + ", ".join(
                f"{k.removesuffix('_s').replace('_', ' ')} {v:.3f}"
                for k, v in phases.items()
                if v is not None
            )
            + ")"
        )
    if f.get("warm"):
        text += ", warm spare"
    return text


def summary(figures: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per kind of plan (and per phase, in place) of one mode's figures."""

    def median(values: list[float]) -> float | None:
        return round(statistics.median(values), 3) if values else None

    out: dict[str, Any] = {}
    for kind in ("grow", "shrink"):
        mine = [f for f in figures if f["kind"] == kind]
        out[kind] = {
            "plans": len(mine),
            "median_s": median([f["seconds"] for f in mine]),
            "max_s": max((f["seconds"] for f in mine), default=None),
            "steps_lost_median": median([f["steps_lost"] for f in mine]),
            "steps_lost_max": max((f["steps_lost"] for f in mine), default=None),
        }
        phased = [f["phases"] for f in mine if f.get("phases")]
        if phased:
            out[kind]["phases_median_s"] = {
                k: median([p[k] for p in phased if p.get(k) is not None]) for k in PHASES
            }
        if kind == "grow" and any("warm" in f for f in mine):
            out[kind]["warm"] = sum(1 for f in mine if f.get("warm"))
    return out


async def _run(
    settings: Settings,
    dsn: str,
    workdir: Path,
    modes: list[RescaleMode],
    resizes: int,
    step_sleep_s: float,
) -> dict[str, Any]:
    env = f"bench-elastic-{uuid.uuid4().hex[:8]}"
    registry = EnvRegistry(settings, dsn)
    await registry.create(env, partitions=1)
    tmp = tempfile.TemporaryDirectory(prefix="dlrover-bench-elastic-")
    root = Path(tmp.name)
    cluster = LocalCluster(
        root,
        runs_pods=True,
        base_env={**node_env(settings), CHECKPOINT_DIR_ENV: str(root / "checkpoints")},
        enforcement=available(),
        poll_s=0.1,
    )
    ctx = ServiceContext(settings, env, dsn)
    reconciler = EnvReconciler(settings, env, dsn, cluster)
    await cluster.start()
    running = asyncio.create_task(reconciler.run(ctx.stop))
    by_mode: dict[str, list[dict[str, Any]]] = {}
    try:
        await asyncio.wait_for(reconciler.ready.wait(), 120)
        async with Producer(settings) as producer:
            for mode in modes:
                by_mode[mode.value] = await _measure(
                    cluster, root, producer, env, workdir, mode, resizes, step_sleep_s
                )
    finally:
        ctx.stop.set()
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await cluster.stop(end_pods=True)
        tmp.cleanup()
        await registry.delete(env, force=True)
    return {
        "bench": "elastic",
        "resizes": resizes,
        "step_sleep_s": step_sleep_s,
        "memory_limits": available().value,
        "modes": {mode: summary(figures) for mode, figures in by_mode.items()},
        "runs": [f for figures in by_mode.values() for f in figures],
    }


def bench_elastic(
    resizes: int = typer.Option(
        12, min=1, help="Plans per mode: up one worker, down one (12: six of each kind)."
    ),
    mode: str = typer.Option(
        "both", help="restart, in_place, or both (restart first, in the same run)."
    ),
    step_sleep_s: float = typer.Option(
        0.05, min=0.0, help="Added to each training step of the example."
    ),
) -> None:
    """Seconds from a plan to the first step at the new world size, restart and in place."""
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    choices = {"both": [RescaleMode.RESTART, RescaleMode.IN_PLACE]} | {
        m.value: [m] for m in RescaleMode
    }
    if mode not in choices:
        typer.echo(f"error: --mode must be one of {', '.join(choices)}, got {mode!r}", err=True)
        raise typer.Exit(2)
    workdir = Path.cwd()
    missing = [str(p) for m in choices[mode] if not (workdir / (p := EXAMPLES[m])).exists()]
    if missing:
        typer.echo(
            f"error: run from the repository's root ({', '.join(missing)} not found)", err=True
        )
        raise typer.Exit(2)
    settings = load_settings()
    broker: Broker | None = None
    if not kafka_reachable(settings.bootstrap_servers):
        broker = Broker(settings.host)
        broker.start()
        settings = settings.with_overrides(bootstrap_servers=broker.bootstrap_servers)
    postgres = asyncio.run(resolve_postgres(settings))
    try:
        result = asyncio.run(
            _run(settings, postgres.dsn, workdir, choices[mode], resizes, step_sleep_s)
        )
    finally:
        postgres.stop()
        if broker is not None:
            broker.stop()
    sys.stdout.write(json.dumps(result) + "\n")
