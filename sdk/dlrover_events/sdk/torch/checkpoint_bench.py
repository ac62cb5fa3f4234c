"""`dlrover-events bench checkpoint`: what a checkpoint costs the training step.

Registered as the ``checkpoint`` entry point of ``dlrover_events.benches`` (the full
install's: it imports typer; a training pod never imports it).

For states of each ``--sizes-mb`` (a model of 2048x2048 fp32 layers, ~16.8 MB each), in
one process, alternating order in each run:

- ``torch.save`` in the loop (the former ``ElasticCheckpoint``: a file, flushed and
  fsynced, then renamed): the step waits for all of it;
- ``ElasticCheckpoint``: the step waits for the copy to host memory of what a forward
  changes and, at the optimizer's next step, for the copy of the parameters made behind
  the forward and backward (``blocking``: both; ``staging_wait``: the second), DCP
  persists behind it (``persist``: until the manifest is committed).

Each save is measured in a training step (forward, backward, the optimizer's step over the
same model), beside steps without a save: ``step_s_*`` and the overheads say what the
whole step paid, contention for the cores included. The first save of an
``ElasticCheckpoint`` allocates its host buffers and is reported apart; the medians are
over ``--runs`` saves after it. Then the training throughput of a
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
#: the batch of the training steps the saves are measured in
BATCH = 16


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
    """(blocking, persist) seconds of one save waited for at once, persist until its commit."""
    assert ck.save(step, wait=False)
    ck.wait_staged()
    blocking = ck.last_blocking_s or 0.0
    t = perf_counter()
    assert ck.wait(600), "the persist did not commit"
    return blocking, (ck.last_persist_s or (perf_counter() - t))


class Steps:
    """A training step over ``model``: a forward and backward pass on a batch of
    ``BATCH``, then the optimizer's step. Gradients are zeroed in place, not set to None:
    DCP's ``get_state_dict`` makes a stateless optimizer's state (SGD's) by a step of its
    own over zero gradients, allocated anew, when it finds none, a cost of SGD without
    momentum, not of the copy measured here."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
        self.x = torch.randn(BATCH, LAYER)

    def compute(self) -> None:
        self.model(self.x).square().mean().backward()

    def update(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)


def measure_size(mb: float, runs: int, root: Path, in_step: bool = True) -> dict[str, Any]:
    """Per way, ``runs`` training steps, the ways in turn and the order rotated: without a
    save, with ``torch.save`` in the loop after the optimizer's step (what the step waits
    for: the save), and with ``ElasticCheckpoint.save`` at the boundary before the next
    forward (what the step waits for: the copy in the step, and at the optimizer's step
    the wait for the copy behind the forward and backward, ``wait_staged``); with
    ``in_step``, also an ``ElasticCheckpoint`` that copies everything in the step (as it
    did before the copy behind), its own host buffers, for the ratio in the same run."""
    model = model_of(mb)
    steps = Steps(model)
    steps.compute()
    steps.update()  # gradients exist from here on
    where = root / f"state-{int(mb)}mb"
    where.mkdir(parents=True, exist_ok=True)
    ck = ElasticCheckpoint(where / "elastic", model, steps.optimizer, handle_sigterm=False)
    first_blocking, first_persist = elastic_save(ck, 0)
    ways: tuple[str, ...] = ("none", "torch", "elastic")
    checkpoints = {"elastic": ck}
    if in_step:  # the whole copy in the step (as before the copy behind): the same run
        whole = ElasticCheckpoint(where / "in-step", model, steps.optimizer, handle_sigterm=False)
        whole.STAGE_BEHIND_BYTES = 1 << 62
        elastic_save(whole, 0)
        checkpoints["in_step"] = whole
        ways = (*ways, "in_step")
    saves, persist = [], []
    blocking: dict[str, list[float]] = {way: [] for way in checkpoints}
    waits: list[float] = []
    took: dict[str, list[float]] = {way: [] for way in ways}
    for run in range(runs):
        for way in ways[run % len(ways) :] + ways[: run % len(ways)]:
            saving = checkpoints.get(way)
            t = perf_counter()
            if saving is not None:
                assert saving.save(run + 1, wait=False)
            steps.compute()
            steps.update()
            if way == "torch":
                saves.append(torch_save(model, where / "model.pt"))
            took[way].append(perf_counter() - t)
            if saving is not None:
                blocking[way].append(saving.last_blocking_s or 0.0)
                assert saving.wait(600), "the persist did not commit"
            if way == "elastic":
                waits.append(ck.last_staging_wait_s or 0.0)
                persist.append(ck.last_persist_s or 0.0)
    shutil.rmtree(where, ignore_errors=True)
    med_save, med_block = statistics.median(saves), statistics.median(blocking["elastic"])
    step = {k: statistics.median(v) for k, v in took.items()}
    whole_copy: dict[str, Any] = {}
    if in_step:
        med_whole = statistics.median(blocking["in_step"])
        whole_copy = {
            "in_step_blocking_s": round(med_whole, 4),
            "in_step_blocking_vs_torch_save": round(med_whole / med_save, 4),
            "step_s_in_step": round(step["in_step"], 4),
            "in_step_blocking_runs_s": [round(v, 4) for v in blocking["in_step"]],
        }
    return {
        "state_mb": round(state_mb(model), 1),
        "torch_save_s": round(med_save, 4),
        "blocking_s": round(med_block, 4),
        "staging_wait_s": round(statistics.median(waits), 4),
        "behind_mb": round(ck.last_behind_bytes / 1e6, 1),
        "persist_s": round(statistics.median(persist), 4),
        "blocking_vs_torch_save": round(med_block / med_save, 4),
        "step_s_no_save": round(step["none"], 4),
        "step_s_torch_save": round(step["torch"], 4),
        "step_s_elastic": round(step["elastic"], 4),
        "elastic_step_overhead_s": round(step["elastic"] - step["none"], 4),
        "torch_save_step_overhead_s": round(step["torch"] - step["none"], 4),
        "first_blocking_s": round(first_blocking, 4),
        "first_persist_s": round(first_persist, 4),
        "torch_save_runs_s": [round(v, 4) for v in saves],
        "blocking_runs_s": [round(v, 4) for v in blocking["elastic"]],
        "staging_wait_runs_s": [round(v, 4) for v in waits],
        "persist_runs_s": [round(v, 4) for v in persist],
        "step_runs_s": {k: [round(v, 4) for v in vs] for k, vs in took.items()},
        **whole_copy,
    }


def throughput(
    mb: float, steps: int, every: int, root: Path, rounds: int, in_step: bool = True
) -> dict[str, Any]:
    """Steps per second with no saves, ElasticCheckpoint and torch.save every ``every``
    (medians of ``rounds`` loops each); with ``in_step`` also an ElasticCheckpoint that
    copies everything in the step (the former way)."""
    model = model_of(mb)
    train = Steps(model)
    train.compute()
    train.update()
    where = root / "throughput"
    where.mkdir(parents=True, exist_ok=True)
    ck = ElasticCheckpoint(
        where / "elastic", model, train.optimizer, every=every, handle_sigterm=False
    )
    elastic_save(ck, 0)  # its host buffers, as a job's first save makes them
    checkpoints = {"elastic": ck}
    ways: tuple[str, ...] = ("none", "elastic", "torch")
    if in_step:
        whole = ElasticCheckpoint(
            where / "in-step", model, train.optimizer, every=every, handle_sigterm=False
        )
        whole.STAGE_BEHIND_BYTES = 1 << 62
        elastic_save(whole, 0)
        checkpoints["in_step"] = whole
        ways = (*ways, "in_step")

    def loop(save: str) -> float:
        saving = checkpoints.get(save)
        t = perf_counter()
        for step in range(1, steps + 1):
            train.compute()
            train.update()
            if saving is not None:
                saving.maybe_save(step + loop.offset)  # type: ignore[attr-defined]
            elif save == "torch" and step % every == 0:
                torch_save(model, where / "model.pt")
        took = perf_counter() - t
        if saving is not None:
            saving.wait(600)
        loop.offset += steps  # type: ignore[attr-defined]
        return steps / took

    loop.offset = 0  # type: ignore[attr-defined]
    rates: dict[str, list[float]] = {way: [] for way in ways}
    for run in range(rounds):  # each way in turn, the order rotated: a load that drifts
        n = len(ways)  # weighs on every way alike
        for way in ways[run % n :] + ways[: run % n]:
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
        **(
            {
                "steps_per_s_in_step": round(best["in_step"], 3),
                "in_step_vs_none": round(best["in_step"] / best["none"], 4),
            }
            if in_step
            else {}
        ),
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
    in_step: bool = typer.Option(
        True, help="Also measure the whole copy in the step (the former way) in the same run."
    ),
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
            r = measure_size(mb, runs, base, in_step)
            results.append(r)
            typer.echo(
                f"{r['state_mb']:.0f} MB: torch.save in the loop {r['torch_save_s']:.3f} s, "
                f"ElasticCheckpoint blocks {r['blocking_s']:.3f} s "
                f"({100 * r['blocking_vs_torch_save']:.1f} %; of which "
                f"{r['staging_wait_s']:.3f} s at the optimizer's step) and persists in "
                f"{r['persist_s']:.3f} s behind; steps {r['step_s_no_save']:.3f} s without "
                f"a save, {r['step_s_torch_save']:.3f} s with torch.save, "
                f"{r['step_s_elastic']:.3f} s with ElasticCheckpoint (median of {runs}; "
                f"first save {r['first_blocking_s']:.3f} s blocking)"
            )
            if in_step:
                typer.echo(
                    f"  the whole copy in the step: blocks {r['in_step_blocking_s']:.3f} s "
                    f"({100 * r['in_step_blocking_vs_torch_save']:.1f} %), steps "
                    f"{r['step_s_in_step']:.3f} s"
                )
        rate: dict[str, Any] = {}
        if steps:
            rate = throughput(min(sizes), steps, every, base, runs, in_step)
            typer.echo(
                f"throughput, {rate['throughput_state_mb']:.0f} MB state, a save every "
                f"{every} steps: {rate['steps_per_s_no_saves']:.2f} steps/s without saves, "
                f"{rate['steps_per_s_elastic']:.2f} with ElasticCheckpoint "
                f"({100 * rate['elastic_vs_none']:.1f} %), {rate['steps_per_s_torch_save']:.2f} "
                f"with torch.save ({100 * rate['torch_save_vs_none']:.1f} %)"
                + (
                    f", {rate['steps_per_s_in_step']:.2f} with the whole copy in the step "
                    f"({100 * rate['in_step_vs_none']:.1f} %)"
                    if in_step
                    else ""
                )
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
