"""`dlrover-events bench checkpoint`: what a checkpoint costs the training step.

Registered as the ``checkpoint`` entry point of ``dlrover_events.benches`` (the full
install's: it imports typer; a training pod never imports it).

For states of each ``--sizes-mb`` (a model of 2048x2048 fp32 layers, ~16.8 MB each), in
one process, alternating order in each run:

- ``torch.save`` in the loop (the former ``ElasticCheckpoint``: a file, flushed and
  fsynced, then renamed): the step waits for all of it;
- ``ElasticCheckpoint``: the step waits for the copy to host memory (``blocking``), DCP
  persists behind it (``persist``: until the manifest is committed).

The first save of an ``ElasticCheckpoint`` allocates its host buffers and is reported
apart; the medians are over ``--runs`` saves after it. Then the training throughput of a
loop whose step is a forward and backward pass over the smallest state's model, with a
save every ``--every`` steps (each way) against none: medians of ``--runs`` loops each,
the order rotated. The last line is one JSON object.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path
from time import perf_counter
from typing import Any

import torch
import typer
from torch import nn

from dlrover_events.sdk.torch.checkpoint import ElasticCheckpoint

LAYER = 2048
LAYER_MB = LAYER * (LAYER + 1) * 4 / 1e6


def model_of(mb: float) -> nn.Module:
    layers = max(1, round(mb / LAYER_MB))
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Linear(LAYER, LAYER) for _ in range(layers)))


def state_mb(model: nn.Module) -> float:
    return sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6


def torch_save(model: nn.Module, path: Path) -> float:
    """Seconds the step waits for the in-loop save: written, fsynced, renamed."""
    t = perf_counter()
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        torch.save(model.state_dict(), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return perf_counter() - t


def elastic_save(ck: ElasticCheckpoint, step: int) -> tuple[float, float]:
    """(blocking, persist) seconds of one save, persist until its commit."""
    assert ck.save(step, wait=False)
    blocking = ck.last_blocking_s or 0.0
    t = perf_counter()
    assert ck.wait(600), "the persist did not commit"
    return blocking, (ck.last_persist_s or (perf_counter() - t))


def measure_size(mb: float, runs: int, root: Path) -> dict[str, Any]:
    model = model_of(mb)
    where = root / f"state-{int(mb)}mb"
    where.mkdir(parents=True, exist_ok=True)
    ck = ElasticCheckpoint(where / "elastic", model, handle_sigterm=False)
    first_blocking, first_persist = elastic_save(ck, 0)
    saves, blocking, persist = [], [], []
    for run in range(runs):
        order = ("torch", "elastic") if run % 2 == 0 else ("elastic", "torch")
        for way in order:
            if way == "torch":
                saves.append(torch_save(model, where / "model.pt"))
            else:
                b, p = elastic_save(ck, run + 1)
                blocking.append(b)
                persist.append(p)
            with torch.no_grad():  # the state changes between saves, as in training
                for param in model.parameters():
                    param.add_(1e-3)
    shutil.rmtree(where, ignore_errors=True)
    med_save, med_block = statistics.median(saves), statistics.median(blocking)
    return {
        "state_mb": round(state_mb(model), 1),
        "torch_save_s": round(med_save, 4),
        "blocking_s": round(med_block, 4),
        "persist_s": round(statistics.median(persist), 4),
        "blocking_vs_torch_save": round(med_block / med_save, 4),
        "first_blocking_s": round(first_blocking, 4),
        "first_persist_s": round(first_persist, 4),
        "torch_save_runs_s": [round(v, 4) for v in saves],
        "blocking_runs_s": [round(v, 4) for v in blocking],
        "persist_runs_s": [round(v, 4) for v in persist],
    }


def throughput(mb: float, steps: int, every: int, root: Path, rounds: int) -> dict[str, Any]:
    """Steps per second with no saves, ElasticCheckpoint and torch.save every ``every``
    (medians of ``rounds`` loops each)."""
    model = model_of(mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    x = torch.randn(16, LAYER)
    where = root / "throughput"
    where.mkdir(parents=True, exist_ok=True)
    ck = ElasticCheckpoint(where / "elastic", model, every=every, handle_sigterm=False)
    elastic_save(ck, 0)  # its host buffers, as a job's first save makes them

    def loop(save: str) -> float:
        t = perf_counter()
        for step in range(1, steps + 1):
            model(x).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            if save == "elastic":
                ck.maybe_save(step + loop.offset)  # type: ignore[attr-defined]
            elif save == "torch" and step % every == 0:
                torch_save(model, where / "model.pt")
        took = perf_counter() - t
        if save == "elastic":
            ck.wait(600)
            loop.offset += steps  # type: ignore[attr-defined]
        return steps / took

    loop.offset = 0  # type: ignore[attr-defined]
    rates: dict[str, list[float]] = {"none": [], "elastic": [], "torch": []}
    ways = ("none", "elastic", "torch")
    for run in range(rounds):  # each way in turn, the order rotated: a load that drifts
        for way in ways[run % 3 :] + ways[: run % 3]:  # weighs on every way alike
            rates[way].append(loop(way))
    shutil.rmtree(where, ignore_errors=True)
    best = {k: statistics.median(v) for k, v in rates.items()}
    return {
        "throughput_state_mb": round(state_mb(model), 1),
        "every": every,
        "steps": steps,
        "rounds": rounds,
        "steps_per_s_no_saves": round(best["none"], 3),
        "steps_per_s_elastic": round(best["elastic"], 3),
        "steps_per_s_torch_save": round(best["torch"], 3),
        "elastic_vs_none": round(best["elastic"] / best["none"], 4),
        "torch_save_vs_none": round(best["torch"] / best["none"], 4),
        "put_off": ck.put_off,
    }


def bench_checkpoint(
    sizes_mb: str = typer.Option("100,1000", help="States to save, in MB, comma-separated."),
    runs: int = typer.Option(5, min=1, help="Saves each way per size (medians reported)."),
    every: int = typer.Option(10, min=1, help="The throughput loop saves every N steps."),
    steps: int = typer.Option(40, min=0, help="Steps per throughput loop; 0: skip it."),
    root: str = typer.Option(
        "", help="A directory to write in (default: a temporary one, removed after)."
    ),
    threads: int = typer.Option(0, min=0, help="torch threads (0: torch's default)."),
) -> None:
    """Blocking time per save and persist time of ElasticCheckpoint against torch.save in
    the loop, and the training throughput with saves every N steps against none."""
    if threads:
        torch.set_num_threads(threads)
    sizes = [float(s) for s in sizes_mb.split(",") if s.strip()]
    base = Path(root) if root else Path(tempfile.mkdtemp(prefix="bench-checkpoint-"))
    load = os.getloadavg()
    results = []
    try:
        for mb in sizes:
            r = measure_size(mb, runs, base)
            results.append(r)
            typer.echo(
                f"{r['state_mb']:.0f} MB: torch.save in the loop {r['torch_save_s']:.3f} s, "
                f"ElasticCheckpoint blocks {r['blocking_s']:.3f} s "
                f"({100 * r['blocking_vs_torch_save']:.1f} %) and persists in "
                f"{r['persist_s']:.3f} s behind (median of {runs}; first save "
                f"{r['first_blocking_s']:.3f} s blocking)"
            )
        rate: dict[str, Any] = {}
        if steps:
            rate = throughput(min(sizes), steps, every, base, runs)
            typer.echo(
                f"throughput, {rate['throughput_state_mb']:.0f} MB state, a save every "
                f"{every} steps: {rate['steps_per_s_no_saves']:.2f} steps/s without saves, "
                f"{rate['steps_per_s_elastic']:.2f} with ElasticCheckpoint "
                f"({100 * rate['elastic_vs_none']:.1f} %), {rate['steps_per_s_torch_save']:.2f} "
                f"with torch.save ({100 * rate['torch_save_vs_none']:.1f} %)"
            )
    finally:
        if not root:
            shutil.rmtree(base, ignore_errors=True)
    summary = {
        "bench": "checkpoint",
        "sizes": results,
        **rate,
        "runs": runs,
        "torch_threads": torch.get_num_threads(),
        "loadavg_before": [round(v, 2) for v in load],
        "loadavg_after": [round(v, 2) for v in os.getloadavg()],
        "torch": torch.__version__,
    }
    typer.echo(json.dumps(summary))


__all__ = ["bench_checkpoint"]
