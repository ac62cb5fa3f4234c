"""A trial of examples/experiments/mlp-sweep.yaml: an MLP regressing a fixed nonlinear
function, whose validation loss truly depends on its learning rate and width.

The function is a sum of 16 random sinusoidal features of 8 inputs, drawn once from
``--seed``; training batches depend only on (seed, step), the validation set is 1,024
held-out points of the same function without noise. Too small a learning rate has not
learned it in a few hundred steps, too large a one (with a wide net) diverges, and a narrow
net cannot fit it: the searcher has something to find. A step takes about a millisecond
on one CPU thread.

As a trial (the searcher set DLROVER_EVENTS_EXPERIMENT and the trial's variables on the
pod), it takes ``lr`` and ``width`` from its hyperparameters and trains while its step is
below the budget the searcher gave it (``Trial.budget()``), validating every
``--validate-every`` steps and at its budget (``report_metrics(..., validation=True)``,
metric ``val_loss``). At its budget it saves its checkpoint and waits for the searcher:
a larger budget (promoted in place) and it goes on; stopped or complete and it exits 0;
paused and the operator suspends its job: the SIGTERM ends the wait, it exits as SIGTERM
asks (143), and the resumed job starts from the checkpoint with the budget it was
resumed to. It runs under torchrun (the trial template's elastic command; DDP over gloo
when the trial has more than one worker: ``TrialSync`` gives every rank rank 0's budget)
and alone:

    python examples/experiments/train_trial.py --lr 0.01 --width 64 --steps 300

The checkpoint (``ElasticCheckpoint``, every ``--checkpoint-every`` steps, at the budget
and on SIGTERM) is ``--checkpoint``, else ``$DLROVER_EVENTS_CHECKPOINT_DIR/<job id>.pt``:
the local platform sets that directory (its own, ``.dlrover-events/local/<env>/
checkpoints``) and the job id stays through a suspension, so a resumed trial finds it.

Printed on stdout, one JSON object a line: ``trial`` at the start (hyperparameters,
budget, world), ``resumed`` when it starts from a checkpoint (the step), ``validation``
at each validation (step, budget, val_loss; rank 0), ``budget`` when a wait at the budget
ends (what the searcher said), and ``exit``.

``learning_curve(lr, width, steps)`` is the same training in one process, deterministic
given the seed: what a simulated trial of this experiment follows.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dlrover_events.sdk import JobIdentity, NotATrial, Reporter, Trial
from dlrover_events.sdk.identity import JOB_ID_ENV, default_checkpoint_path
from dlrover_events.sdk.torch import (
    CheckpointError,
    ElasticCheckpoint,
    TorchHook,
    TrialSync,
    exit_promptly,
)
from dlrover_events.sdk.trial import TrialSpec

FEATURES = 8
#: sinusoidal features of the target function
TEACHER_FEATURES = 16
#: samples of one step, over all ranks (each rank takes its part)
GLOBAL_BATCH = 64
VALIDATION_SAMPLES = 1024
LABEL_NOISE = 0.05
METRIC = "val_loss"
#: exit codes: done (stopped, complete, or alone at --steps), and stopped by SIGTERM
EXIT_DONE = 0
EXIT_STOPPED = 143

log = logging.getLogger("train_trial")


def emit(event: str, **fields: Any) -> None:
    # one write per line: an SDK log line (stderr, same pod log) cannot land inside it
    sys.stdout.write(json.dumps({"event": event, "time": round(time.time(), 3), **fields}) + "\n")
    sys.stdout.flush()


class Task:
    """The function to learn, its training batches and its held-out validation set, all
    drawn from ``seed``: the same seed, the same task, on any machine and world size."""

    def __init__(self, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.weights = torch.randn(TEACHER_FEATURES, FEATURES, generator=gen) * (
            2 / math.sqrt(FEATURES)
        )
        self.phases = torch.rand(TEACHER_FEATURES, generator=gen) * 2 * math.pi
        self.amplitudes = torch.randn(TEACHER_FEATURES, generator=gen) / math.sqrt(TEACHER_FEATURES)
        self.seed = seed
        held_out = torch.Generator().manual_seed(seed + 1_000_003)
        self.val_x = torch.randn(VALIDATION_SAMPLES, FEATURES, generator=held_out)
        self.val_y = self.target(self.val_x)

    def target(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x @ self.weights.T + self.phases) @ self.amplitudes

    def batch(self, step: int, rank: int = 0, world_size: int = 1) -> tuple[torch.Tensor, ...]:
        """Rank ``rank``'s part of step ``step``'s batch: the ranks' parts make the same
        global batch whatever the world size, so a resized trial trains on the same data."""
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        x = torch.randn(GLOBAL_BATCH, FEATURES, generator=gen)
        y = self.target(x) + LABEL_NOISE * torch.randn(GLOBAL_BATCH, generator=gen)
        return x.tensor_split(world_size)[rank], y.tensor_split(world_size)[rank]


def build(width: int, lr: float, seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(FEATURES, width),
        nn.Tanh(),
        nn.Linear(width, width),
        nn.Tanh(),
        nn.Linear(width, 1),
    )
    return model, torch.optim.Adam(model.parameters(), lr=lr)


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    task: Task,
    step: int,
    rank: int = 0,
    world_size: int = 1,
) -> float:
    x, y = task.batch(step, rank, world_size)
    loss = ((model(x).squeeze(1) - y) ** 2).mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def validate(model: nn.Module, task: Task) -> float:
    with torch.no_grad():
        loss = float(((model(task.val_x).squeeze(1) - task.val_y) ** 2).mean())
    # a diverged net's loss is reported as the worst one a report may carry
    return loss if math.isfinite(loss) else 1e30


def learning_curve(
    lr: float, width: int, steps: int, *, seed: int = 0, validate_every: int = 25
) -> list[tuple[int, float]]:
    """(step, val_loss) every ``validate_every`` steps and at ``steps``: this trial's
    training in one process, deterministic given the seed (one torch thread)."""
    torch.set_num_threads(1)
    task = Task(seed)
    model, optimizer = build(width, lr, seed)
    curve: list[tuple[int, float]] = []
    for step in range(steps):
        train_step(model, optimizer, task, step)
        if (step + 1) % validate_every == 0 or step + 1 == steps:
            curve.append((step + 1, validate(model, task)))
    return curve


@dataclass
class Run:
    """What the loop needs besides the model: the trial (None alone), the budget every
    rank agrees on, the checkpoint."""

    trial: Trial | None
    sync: TrialSync | None
    checkpoint: ElasticCheckpoint | None
    rank: int
    world_size: int

    @property
    def stopping(self) -> bool:
        """Every rank agreed on a SIGTERM at a step boundary and saved there: leave."""
        return self.checkpoint is not None and self.checkpoint.should_stop

    @property
    def stop_requested(self) -> bool:
        """This process got SIGTERM: what ends the wait for a budget (rank 0 asks, and the
        answer is shared), outside the loop's boundaries."""
        return self.checkpoint is not None and self.checkpoint.stop_requested


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lr", type=float, default=0.01, help="alone: the learning rate")
    p.add_argument("--width", type=int, default=64, help="alone: the hidden layers' width")
    p.add_argument("--steps", type=int, default=300, help="alone: the steps to train")
    p.add_argument("--seed", type=int, default=0, help="the task's and the model's seed")
    p.add_argument("--validate-every", type=int, default=25)
    p.add_argument("--checkpoint-every", type=int, default=25)
    p.add_argument(
        "--checkpoint",
        default=None,
        help="checkpoint directory or URL (default: $DLROVER_EVENTS_CHECKPOINT_DIR/<job id>.pt, "
        "else none)",
    )
    p.add_argument("--step-sleep-s", type=float, default=0.0, help="added to each step")
    p.add_argument("--interval-s", type=float, default=2.0, help="seconds per runtime sample")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    try:
        spec: TrialSpec | None = TrialSpec.from_environ(os.environ)
    except NotATrial:
        spec = None  # alone: the arguments say what to train
    lr = float(spec.hparams["lr"]) if spec else args.lr
    width = int(spec.hparams["width"]) if spec else args.width

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 or "TORCHELASTIC_RUN_ID" in os.environ:
        dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank() if dist.is_initialized() else 0
    world_size = dist.get_world_size() if dist.is_initialized() else 1

    job_id = os.environ.get(JOB_ID_ENV) or (spec.job_name if spec else "trial-alone")
    identity = JobIdentity.from_env(job_id=job_id)
    reporter = Reporter(identity, interval_s=args.interval_s)
    hook = TorchHook(reporter).start()
    trial = Trial(spec, identity, reporter=reporter).start() if spec else None
    sync = TrialSync(trial) if trial is not None else None

    model, optimizer = build(width, lr, args.seed)
    path = args.checkpoint or default_checkpoint_path(identity.job.uuid)
    # rank 0 reports each commit to the env's catalog, with the trial and its metric
    ckpt = (
        ElasticCheckpoint(
            path, model, optimizer, every=args.checkpoint_every, reporter=reporter, trial=trial
        )
        if path
        else None
    )
    try:
        step = ckpt.restore() if ckpt is not None else 0
    except CheckpointError as err:  # a torn manifest: one line, not a traceback
        log.error("%s", err)
        return 2
    if dist.is_initialized():
        model = DistributedDataParallel(model)
    run = Run(trial, sync, ckpt, rank, world_size)
    budget = sync.refresh() if sync is not None else float(args.steps)
    emit(
        "trial",
        experiment=spec.experiment if spec else None,
        trial=spec.index if spec else None,
        lr=lr,
        width=width,
        budget=budget,
        world_size=world_size,
        rank=rank,
        first_step=step,
    )
    if step > 0:
        emit("resumed", step=step, budget=budget, rank=rank, world_size=world_size)
    code, reason = EXIT_DONE, "done"
    task = Task(args.seed)
    try:
        code, reason, step = train(run, model, optimizer, task, hook, step, budget, args)
    finally:
        stats = hook.close(1.0)
        if trial is not None:
            trial.close(timeout_s=1.0)
    emit(
        "exit",
        reason=reason,
        step=step,
        rank=rank,
        world_size=world_size,
        saved_step=ckpt.saved_step if ckpt else None,
        published=stats.published,
        dropped=stats.dropped,
    )
    if dist.is_initialized() and code == EXIT_DONE:
        dist.destroy_process_group()
    return code


def train(
    run: Run,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    task: Task,
    hook: TorchHook,
    step: int,
    budget: float,
    args: argparse.Namespace,
) -> tuple[int, str, int]:
    """Train to the budget, validate, wait for the searcher; again while it promotes."""
    loss = math.nan
    while True:
        while step < budget and not run.stopping:
            loss = train_step(model, optimizer, task, step, run.rank, run.world_size)
            step += 1
            hook.step(samples=GLOBAL_BATCH // run.world_size, global_step=step)
            if step % args.validate_every == 0 and step < budget:
                report(run, model, task, step, budget, loss)
            if run.checkpoint is not None:
                run.checkpoint.maybe_save(step)
            if args.step_sleep_s:
                time.sleep(args.step_sleep_s)
        if step >= budget:
            # reported again by a trial resumed here: the same event id, kept once
            report(run, model, task, step, budget, loss)
            if run.checkpoint is not None:
                run.checkpoint.save(step)  # a pause or a resize here loses nothing
        if run.stopping:  # SIGTERM: a suspension (a pause) or a re-rendezvous
            return EXIT_STOPPED, "sigterm", step
        if run.sync is None:
            return EXIT_DONE, "steps", step
        given = run.sync.wait_for_budget(step, stop=lambda: run.stop_requested)
        trial = run.trial
        emit(
            "budget",
            step=step,
            budget=given,
            rank=run.rank,
            decision=trial.describe() if trial is not None and trial.follows else None,
        )
        if given is None:
            stopped = run.stopping or run.stop_requested
            return (EXIT_STOPPED, "sigterm", step) if stopped else (EXIT_DONE, "told", step)
        budget = given


def report(
    run: Run, model: nn.Module, task: Task, step: int, budget: float, train_loss: float
) -> None:
    """Rank 0 validates and reports; the others' model is the same (DDP)."""
    if run.rank != 0:
        return
    val_loss = validate(model, task)
    emit("validation", step=step, budget=budget, val_loss=round(val_loss, 6))
    if run.checkpoint is not None:  # the next checkpoint carries it (retention's best)
        run.checkpoint.metrics = {METRIC: val_loss}
    if run.trial is not None:
        run.trial.report_metrics(step, {METRIC: val_loss}, validation=True)
        if math.isfinite(train_loss):
            run.trial.report_metrics(step, {"train_loss": train_loss})


if __name__ == "__main__":
    # the checkpoint is saved and the reporter closed: torch's finalization would only
    # keep the agent waiting
    exit_promptly(main())
