"""`dlrover-events bench sdk`: what the reporter costs a training step, in microseconds.

Registered as the ``sdk`` entry point of ``dlrover_events.benches``.

Each run times the same loop of pure-Python work twice, without and with
``reporter.step()``, in alternating order, and the difference per step is the overhead. The
work is computation, not a sleep or a spin on the clock, so the reporter thread taking the
GIL to build, encode and publish samples shows up as overhead too, as it would in training.
The reporter samples every ``--interval-s`` (short by default, so it really works during
the runs) and publishes to a real broker: Kafka as the settings find it, else an embedded
tansu. The median over runs is reported; the last line printed is one JSON object.

Where torch is installed it also times what the gradient statistics (``GradientStats``,
issue 18) add to a real, small torch training step: every ``--grad-stats-every`` steps,
as a job would run them, and every step, the cost of one measured step.
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import uuid
from collections.abc import Callable
from time import perf_counter, thread_time
from typing import Any

import typer

from dlrover_events.bus.admin import TopicAdmin
from dlrover_events.runtime.embedded import Broker, free_port, kafka_reachable
from dlrover_events.sdk.identity import JobIdentity
from dlrover_events.sdk.reporter import Reporter
from dlrover_events.settings import Settings, load_settings
from schemas.jobs import JobMeta

TARGET_US = 50.0


def make_work(work_us: float) -> Callable[[], int]:
    """A step's worth of computation, calibrated to take about ``work_us`` here."""
    probe = 20_000
    best = float("inf")
    for _ in range(5):
        t = perf_counter()
        sum(range(probe))
        best = min(best, perf_counter() - t)
    size = max(int(work_us / (best * 1e6 / probe)), 1)

    def work() -> int:
        return sum(range(size))

    return work


def time_loop(steps: int, work: Callable[[], int], step: Callable[[], None] | None) -> float:
    """Seconds for ``steps`` steps of ``work``, each followed by ``step`` when given."""
    if step is None:
        t = perf_counter()
        for _ in range(steps):
            work()
        return perf_counter() - t
    t = perf_counter()
    for _ in range(steps):
        work()
        step()
    return perf_counter() - t


def time_calls(calls: int, step: Callable[[], None]) -> float:
    t = perf_counter()
    for _ in range(calls):
        step()
    return perf_counter() - t


def measure(reporter: Reporter, steps: int, runs: int, work: Callable[[], int]) -> dict[str, Any]:
    step = reporter.step
    time_loop(min(steps, 1000), work, None)  # warm up both loops
    time_loop(min(steps, 1000), work, step)
    overheads, bases, withs = [], [], []
    for i in range(runs):
        if i % 2 == 0:
            base = time_loop(steps, work, None)
            with_reporter = time_loop(steps, work, step)
        else:
            with_reporter = time_loop(steps, work, step)
            base = time_loop(steps, work, None)
        bases.append(base / steps * 1e6)
        withs.append(with_reporter / steps * 1e6)
        overheads.append((with_reporter - base) / steps * 1e6)
    calls = [time_calls(steps, step) / steps * 1e6 for _ in range(runs)]
    return {
        "per_step_overhead_us": round(statistics.median(overheads), 3),
        "overhead_runs_us": [round(o, 3) for o in overheads],
        "step_call_us": round(statistics.median(calls), 3),
        "baseline_step_us": round(statistics.median(bases), 3),
        "with_reporter_step_us": round(statistics.median(withs), 3),
    }


def measure_grad_stats(reporter: Reporter, steps: int, runs: int, every: int) -> dict[str, Any]:
    """What ``GradientStats`` costs a torch training step (CPU, one thread), in us.

    A small MLP trains on a fixed batch of 32 samples, without and with the statistics,
    in alternating order: every ``every`` steps and every step
    (the cost of a measured step), with two micro-batches of 16 per step (the estimator
    of several gradients) and with one (a process alone: pairs of steps, a copy of the
    gradients). Times are the training thread's CPU time (torch runs on it, one thread),
    so other processes on a shared machine do not count; the overhead is the median over
    runs of each run's difference. Empty when torch is not installed (the light SDK
    install)."""
    try:
        import torch

        from dlrover_events.sdk.torch import GradientStats
    except ImportError:
        return {}
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = torch.nn.Sequential(
            torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(32, 256), torch.randint(0, 10, (32,))

        def loop(n: int, micro: int, stats: GradientStats | None) -> float:
            xs, ys = x.chunk(micro), y.chunk(micro)
            t = thread_time()
            for _ in range(n):
                if stats is not None:
                    stats.begin()
                for xm, ym in zip(xs, ys, strict=True):
                    (torch.nn.functional.cross_entropy(model(xm), ym) / micro).backward()
                if stats is not None:
                    stats.end()
                optimizer.step()
                optimizer.zero_grad()
            return (thread_time() - t) / n * 1e6

        def stats_every(n: int) -> GradientStats:
            return GradientStats(reporter, model, every=n, local_batch_size=16)

        arms: dict[str, tuple[int, Callable[[], GradientStats | None]]] = {
            "base": (2, lambda: None),
            "every_n": (2, lambda: stats_every(every)),
            "every_1": (2, lambda: stats_every(1)),
            "alone_base": (1, lambda: None),
            "alone_every_1": (1, lambda: stats_every(1)),
        }
        for micro, make in arms.values():
            loop(min(steps, 50), micro, make())  # warm up
        times: dict[str, list[float]] = {name: [] for name in arms}
        names = list(arms)
        for i in range(runs):
            for name in names if i % 2 == 0 else reversed(names):
                micro, make = arms[name]
                times[name].append(loop(steps, micro, make()))
    finally:
        torch.set_num_threads(threads)

    def overhead(arm: str, base: str) -> float:
        """Median over runs of the arm's time less its base's in the same run."""
        return round(
            statistics.median(a - b for a, b in zip(times[arm], times[base], strict=True)), 1
        )

    return {
        "grad_stats_every": every,
        "train_step_us": round(statistics.median(times["base"]), 1),
        "grad_stats_every_n_overhead_us": overhead("every_n", "base"),
        "grad_stats_every_step_overhead_us": overhead("every_1", "base"),
        "grad_stats_alone_train_step_us": round(statistics.median(times["alone_base"]), 1),
        "grad_stats_alone_every_step_overhead_us": overhead("alone_every_1", "alone_base"),
        "grad_stats_runs_us": {name: [round(v, 1) for v in vs] for name, vs in times.items()},
    }


async def _create_topics(settings: Settings, env: str) -> None:
    async with TopicAdmin(settings) as admin:
        await admin.ensure_env_topics(env, 1)


async def _delete_topics(settings: Settings, env: str) -> None:
    async with TopicAdmin(settings) as admin:
        await admin.delete_env_topics(env)


def bench_sdk(
    steps: int = typer.Option(20_000, min=100, help="Steps per timed loop."),
    runs: int = typer.Option(7, min=1, help="Runs; the median is reported."),
    work_us: float = typer.Option(
        20.0, min=0.5, help="Computation per step in microseconds (real steps take longer)."
    ),
    interval_s: float = typer.Option(
        0.05, min=0.001, help="Sample interval of the reporter during the bench."
    ),
    broker_down: bool = typer.Option(
        False, "--broker-down", help="Report to a port nobody listens on: the outage path."
    ),
    grad_stats_every: int = typer.Option(
        10,
        min=0,
        help="Also time a torch training step with gradient statistics every N steps "
        "(and every step); 0: skip.",
    ),
    torch_steps: int = typer.Option(
        200, min=10, help="Steps per timed loop of the gradient statistics' bench."
    ),
) -> None:
    """Per-step overhead of the SDK reporter in microseconds (median of runs vs a baseline)."""
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    settings = load_settings()
    broker: Broker | None = None
    env = f"bench-sdk-{uuid.uuid4().hex[:8]}"
    created = False
    if broker_down:
        settings = settings.with_overrides(bootstrap_servers=f"127.0.0.1:{free_port()}")
        where = f"nobody at {settings.bootstrap_servers}"
    elif kafka_reachable(settings.bootstrap_servers):
        where = f"Kafka at {settings.bootstrap_servers}"
    else:
        broker = Broker(settings.host)
        broker.start()
        settings = settings.with_overrides(bootstrap_servers=broker.bootstrap_servers)
        where = f"embedded tansu at {broker.bootstrap_servers}"
    try:
        if not broker_down:
            asyncio.run(_create_topics(settings, env))
            created = True
        reporter = Reporter(
            JobIdentity(job=JobMeta(uuid=f"{env}-job"), env=env),
            settings=settings,
            interval_s=interval_s,
            local_batch_size=32,
            send_timeout_s=1.0,
        ).start()
        try:
            work = make_work(work_us)
            typer.echo(f"reporter publishing to {where}, a sample every {interval_s:g}s")
            result = measure(reporter, steps, runs, work)
            if grad_stats_every:
                result.update(measure_grad_stats(reporter, torch_steps, runs, grad_stats_every))
            reporter.flush(5.0)
        finally:
            stats = reporter.close(timeout_s=2.0)
    finally:
        if created and broker is None:
            asyncio.run(_delete_topics(settings, env))
        if broker is not None:
            broker.stop()
    typer.echo(
        f"baseline {result['baseline_step_us']:.2f} us/step, with reporter "
        f"{result['with_reporter_step_us']:.2f} us/step: overhead "
        f"{result['per_step_overhead_us']:.3f} us/step (median of {runs}; target < "
        f"{TARGET_US:g}); step() alone {result['step_call_us']:.3f} us"
    )
    if "train_step_us" in result:
        typer.echo(
            f"gradient statistics: a training step of {result['train_step_us']:.0f} us "
            f"costs {result['grad_stats_every_n_overhead_us']:.1f} us more with them every "
            f"{grad_stats_every} steps, {result['grad_stats_every_step_overhead_us']:.1f} us "
            f"every step (one process alone, every step: "
            f"{result['grad_stats_alone_every_step_overhead_us']:.1f} us of "
            f"{result['grad_stats_alone_train_step_us']:.0f})"
        )
    summary = {
        "bench": "sdk",
        **result,
        "target_us": TARGET_US,
        "within_target": result["per_step_overhead_us"] < TARGET_US,
        "steps": steps,
        "runs": runs,
        "work_us": work_us,
        "interval_s": interval_s,
        "broker": where,
        "samples_published": stats.published,
        "dropped": stats.dropped,
    }
    typer.echo(json.dumps(summary))
