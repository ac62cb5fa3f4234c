"""An elastic all-reduce job: it follows the brain's plans and survives a new world size.

Runs under torchrun's elastic agent (c10d rendezvous), one process per node, and also
alone (``python examples/elastic/train_elastic.py``: world size 1):

    torchrun --nnodes=1:4 --nproc-per-node=1 --rdzv-backend=c10d \\
        --rdzv-endpoint=127.0.0.1:29400 --rdzv-id=job-1 --rdzv-conf=is_host=1 \\
        --max-restarts=10 --no-python \\
        python examples/elastic/train_elastic.py --steps 2000 --checkpoint /tmp/job-1.pt

Start the same command again (``is_host=0``) and the workers of every node re-rendezvous
at the new size and go on from the checkpoint; stop one node and the others go on without
it. The model is a small MLP on synthetic data (no download), trained with
DistributedDataParallel (gloo on CPU, NCCL with CUDA).

The SDK's pieces: the Reporter and TorchHook (samples with the world size and the knobs
in force), ElasticCheckpoint (save every N steps, on SIGTERM before a re-rendezvous, and
when a peer left mid-step; resume with the step count going on), the PlanFollower (rank 0
follows the job's plan at the gateway when DLROVER_EVENTS_GATEWAY_URL is set) and
StepKnobs (local batch size and gradient accumulation switched at a step boundary, on
every rank at the same step, keeping the global batch).

Printed on stdout, one JSON object a line: ``membership`` when training starts in a world
(world size, first step), ``knobs`` at each switch, and ``exit`` at the end (the summary).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dlrover_events.sdk import JobIdentity, Reporter
from dlrover_events.sdk.identity import default_checkpoint_path
from dlrover_events.sdk.knobs import StepKnobs, Switch
from dlrover_events.sdk.plans import PlanFollower
from dlrover_events.sdk.torch import (
    ElasticCheckpoint,
    TorchHook,
    is_peer_failure,
    step_knobs,
)
from schemas.plans import JobPlan, NotApplied, ScalePlan, ScaleResult, ScaleStatus

FEATURES = 32
CLASSES = 8
#: Exit codes: a stop asked by SIGTERM (as if killed by it), a peer lost mid-step.
EXIT_STOPPED = 143
EXIT_PEER_LOST = 1

log = logging.getLogger("train_elastic")


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "time": round(time.time(), 3), **fields}), flush=True)


class Data:
    """Synthetic samples labelled by a fixed random teacher: the loss really falls.

    A batch depends only on (step, rank, micro-batch), so a resumed run trains on the
    samples it would have trained on, whatever happened in between.
    """

    def __init__(self, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.teacher = torch.randn(FEATURES, CLASSES, generator=gen)
        self.seed = seed

    def batch(
        self, step: int, rank: int, micro: int, size: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(hash((self.seed, step, rank, micro)) & 0x7FFFFFFF)
        x = torch.randn(size, FEATURES, generator=gen)
        return x, (x @ self.teacher).argmax(dim=1)


def simulated_plan(spec: str, identity: JobIdentity) -> tuple[int, JobPlan]:
    """``STEP:local_batch_size=8[,accumulation_steps=2]``: the plan the brain would send,
    accepted by the operator (partial: the knobs are the job's to apply), offered at STEP.
    For trying the knobs without a brain and a gateway."""
    at, _, knobs_text = spec.partition(":")
    training = {k.strip(): int(v) for k, v in (p.split("=") for p in knobs_text.split(","))}
    plan_id = f"simulated-{at}"
    base = {"env": identity.env, "job": identity.job, "source": "simulated"}
    plan = JobPlan(
        job=identity.job,
        scale_plan=ScalePlan(**base, plan_id=plan_id, training=training),
        result=ScaleResult(
            **base,
            plan_id=plan_id,
            status=ScaleStatus.PARTIAL,
            not_applied=[
                NotApplied(part=f"training.{k}", reason="the job applies it") for k in training
            ],
        ),
    )
    return int(at), plan


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: Data,
    step: int,
    rank: int,
    knobs: StepKnobs,
) -> float:
    """One optimizer step of ``accumulation_steps`` micro-batches; only the last one's
    backward all-reduces (DDP's no_sync before it)."""
    acc = knobs.accumulation_steps
    total = 0.0
    for micro in range(acc):
        x, y = data.batch(step, rank, micro, knobs.local_batch_size)
        last = micro == acc - 1
        sync = (
            contextlib.nullcontext()
            if last or not isinstance(model, DistributedDataParallel)
            else model.no_sync()
        )
        with sync:
            loss = F.cross_entropy(model(x), y) / acc
            loss.backward()
        total += float(loss.detach())
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=500, help="global steps to reach")
    p.add_argument("--batch-size", type=int, default=16, help="local batch size at the start")
    p.add_argument("--accumulation", type=int, default=1, help="accumulation steps at the start")
    p.add_argument(
        "--global-batch",
        type=int,
        default=None,
        help="global batch to keep (default: batch size x accumulation x the first world size)",
    )
    p.add_argument("--interval-s", type=float, default=1.0, help="seconds per runtime sample")
    p.add_argument(
        "--checkpoint",
        default=None,
        help="checkpoint file (default: $DLROVER_EVENTS_CHECKPOINT_DIR/<job>.pt, else none)",
    )
    p.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints")
    p.add_argument("--step-sleep-s", type=float, default=0.0, help="added to each step")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--knob-sync-every", type=int, default=5, help="steps between knob checks")
    p.add_argument("--simulate-plan", action="append", default=[], metavar="STEP:K=V[,K=V]")
    p.add_argument("--job-id", default=None, help="default: $DLROVER_EVENTS_JOB_ID or 'elastic'")
    p.add_argument("--close-timeout-s", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s [rank %(rank)s] %(message)s"
    )
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    started = time.time()

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 or "TORCHELASTIC_RUN_ID" in os.environ:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend, timeout=timedelta(seconds=60))
    rank = dist.get_rank() if dist.is_initialized() else 0
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    _tag_logs(rank)

    identity = JobIdentity.from_env(
        job_id=args.job_id or os.environ.get("DLROVER_EVENTS_JOB_ID") or "elastic"
    )
    reporter = Reporter(identity, interval_s=args.interval_s)
    knobs = step_knobs(
        args.batch_size,
        args.accumulation,
        reporter=reporter,
        sync_every=args.knob_sync_every,
        target_global_batch=args.global_batch,
    )
    torch.manual_seed(args.seed)
    model: nn.Module = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    path = args.checkpoint or default_checkpoint_path(identity.job.uuid)
    ckpt = (
        ElasticCheckpoint(path, model, optimizer, every=args.checkpoint_every, knobs=knobs)
        if path
        else None
    )
    step = ckpt.restore() if ckpt is not None else 0
    if dist.is_initialized():
        model = DistributedDataParallel(model)
    hook = TorchHook(reporter).start()
    follower: PlanFollower | None = None
    if rank == 0:  # rank 0 decides the knobs for all: the only one to follow the plan
        follower = PlanFollower.from_env(identity)
        knobs.follow(follower.start())
    simulated = sorted(
        (simulated_plan(s, identity) for s in args.simulate_plan), key=lambda p: p[0]
    )

    emit(
        "membership",
        world_size=world_size,
        rank=rank,
        node=identity.rank,
        first_step=step,
        restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        since_start_s=round(time.time() - started, 3),
        **knobs.knobs.as_training(),
    )
    first = step
    data = Data(args.seed)
    reason, loss, code = "done", float("nan"), 0
    try:
        while step < args.steps:
            while simulated and rank == 0 and step >= simulated[0][0]:
                knobs.offer(simulated.pop(0)[1])
            # The knob check is a collective too (every few steps): a peer lost there
            # saves the same state as one lost in backward.
            with hook.guard(), ckpt.on_peer_failure() if ckpt else contextlib.nullcontext():
                switch = knobs.at_step_boundary(step)
                if switch is not None:
                    _said(switch)
                loss = train_step(model, optimizer, data, step, rank, knobs)
            step += 1
            hook.step(samples=knobs.local_batch_size * knobs.accumulation_steps, global_step=step)
            if ckpt is not None:
                ckpt.maybe_save(step)
                if ckpt.should_stop:
                    reason, code = "sigterm", EXIT_STOPPED
                    break
            if args.step_sleep_s:
                time.sleep(args.step_sleep_s)
        else:
            if ckpt is not None:
                ckpt.save(step)
    except RuntimeError as err:
        if not is_peer_failure(err):
            raise
        log.warning(
            "a peer left at step %d (%s); exiting for the re-rendezvous",
            step + 1,
            str(err).splitlines()[0][:200],
        )
        reason, code = "peer_lost", EXIT_PEER_LOST
    finally:
        stats = hook.close(args.close_timeout_s if code == 0 else min(args.close_timeout_s, 0.5))
        if follower is not None:
            follower.close()
    emit(
        "exit",
        reason=reason,
        world_size=world_size,
        rank=rank,
        node=identity.rank,
        first_step=first,
        step=step,
        loss=round(loss, 4),
        saved_step=ckpt.saved_step if ckpt else None,
        saves=ckpt.saves if ckpt else 0,
        knob_switches=knobs.switches,
        samples=stats.samples,
        published=stats.published,
        dropped=stats.dropped,
        **knobs.knobs.as_training(),
    )
    if dist.is_initialized() and code == 0:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    return code


def _said(switch: Switch) -> None:
    emit(
        "knobs",
        step=switch.step,
        plan_id=switch.plan_id,
        world_size=switch.world_size,
        global_batch=switch.global_batch,
        target_global_batch=switch.target_global_batch,
        **switch.after.as_training(),
    )


def _tag_logs(rank: int) -> None:
    old = logging.getLogRecordFactory()

    def factory(*a: Any, **kw: Any) -> logging.LogRecord:
        record = old(*a, **kw)
        record.rank = rank
        return record

    logging.setLogRecordFactory(factory)


if __name__ == "__main__":
    sys.exit(main())
