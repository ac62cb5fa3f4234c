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

In place (a role with ``elastic.mode: inPlace``; the platform sets
DLROVER_EVENTS_ELASTIC_STORE): the processes are never restarted for a resize. Each pod's
torchrun agent only supervises its own worker (``--standalone``); the workers form the
job's group themselves (``InPlaceGroup``), re-form it at a step boundary when a pod comes
or goes, and a newcomer gets the model and optimizer state by broadcast. A warm spare
(DLROVER_EVENTS_ELASTIC_ADMIT set) imports torch and builds its model, then waits to be
admitted. When re-forming fails, the worker exits with EXIT_REFORM_FAILED and its agent
starts it again: the job forms anew from the checkpoint (the restart path).

The SDK's pieces: the Reporter and TorchHook (samples with the world size and the knobs
in force), ElasticCheckpoint (save every N steps, on SIGTERM before a re-rendezvous, and
when a peer left mid-step; resume with the step count going on), the PlanFollower (rank 0
follows the job's plan at the gateway when DLROVER_EVENTS_GATEWAY_URL is set),
StepKnobs (local batch size and gradient accumulation switched at a step boundary, on
every rank at the same step, keeping the global batch) and LostPeerWatch (a peer whose
host the operator declared lost, NodeLost on the job's events, ends this worker with exit
code 4 rather than leave it in a collective until the group's timeout; its agent re-forms
the job without the lost node).

Printed on stdout, one JSON object a line: ``spare`` when a warm spare is ready to be
admitted, ``membership`` when training starts in a world (world size, first step),
``rescaled`` when the first step in that world is done (in place: with its phases),
``knobs`` at each switch, and ``exit`` at the end (the summary).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
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
from dlrover_events.sdk.follow_plan import PlanFollower
from dlrover_events.sdk.identity import (
    ELASTIC_ADMIT_ENV,
    ELASTIC_EXPECT_ENV,
    default_checkpoint_path,
)
from dlrover_events.sdk.knobs import StepKnobs, Switch
from dlrover_events.sdk.membership import Rescale, plan_for
from dlrover_events.sdk.probes import process_started_at
from dlrover_events.sdk.torch import (
    CheckpointError,
    ElasticCheckpoint,
    TorchHook,
    exit_promptly,
    is_peer_failure,
    step_knobs,
)
from dlrover_events.sdk.torch.inplace import (
    InPlaceGroup,
    ReformFailed,
    publish_rescale,
    requested,
    wait_admitted,
)
from dlrover_events.sdk.torch.lost_peers import Lost, LostPeerWatch
from schemas.plans import (
    JobPlan,
    NotApplied,
    RescaleMode,
    ScalePlan,
    ScaleResult,
    ScaleStatus,
)

FEATURES = 32
CLASSES = 8
#: Exit codes: a stop asked by SIGTERM (as if killed by it), a peer lost mid-step, in-place
#: re-forming failed (the agent starts the worker again: the restart path); and, by the
#: SDK's LostPeerWatch, a peer's host declared lost while this worker trained with it
#: (EXIT_PEER_LOST, 4: its collective would only have ended at the group's timeout).
EXIT_STOPPED = 143
EXIT_PEER_FAILED = 1
EXIT_REFORM_FAILED = 3

log = logging.getLogger("train_elastic")


def emit(event: str, **fields: Any) -> None:
    # One write of the whole line: print() writes the text and its newline apart, and a
    # log line of the SDK (stderr, into the same pod log) could land in between.
    line = json.dumps({"event": event, "time": round(time.time(), 3), **fields})
    sys.stdout.write(f"{line}\n")
    sys.stdout.flush()


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


def pause(args: argparse.Namespace, world_size: int) -> None:
    """The step's added time: a fixed part, and a synchronisation that grows with the
    world as a ring all-reduce's latency does (log2 of the workers)."""
    seconds = args.step_sleep_s + args.sync_cost_s * math.log2(max(world_size, 1))
    if seconds > 0:
        time.sleep(seconds)


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
        help="checkpoint directory or URL (default: $DLROVER_EVENTS_CHECKPOINT_DIR/<job>.pt, "
        "else none)",
    )
    p.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints")
    p.add_argument("--step-sleep-s", type=float, default=0.0, help="added to each step")
    p.add_argument(
        "--sync-cost-s",
        type=float,
        default=0.0,
        help="added to each step times log2(world size): the all-reduce of a model larger "
        "than this one, so that a CPU run shows the goodput optimizer a scale that costs",
    )
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--knob-sync-every", type=int, default=5, help="steps between knob checks")
    p.add_argument("--simulate-plan", action="append", default=[], metavar="STEP:K=V[,K=V]")
    p.add_argument("--job-id", default=None, help="default: $DLROVER_EVENTS_JOB_ID or 'elastic'")
    p.add_argument("--close-timeout-s", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--loss-every", type=int, default=0, help="print a `loss` line every N steps (0: never)"
    )
    return p.parse_args(argv)


def build(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model: nn.Module = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s [rank %(rank)s] %(message)s"
    )
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    started = process_started_at() or time.time()
    _tag_logs(0)
    model, optimizer = build(args.seed)  # a warm spare has it built before it is admitted
    spare = bool(os.environ.get(ELASTIC_ADMIT_ENV))
    if spare:
        emit("spare", pid=os.getpid(), since_start_s=round(time.time() - started, 3))
    if not wait_admitted():
        return 0  # a spare no longer needed
    if requested():
        return in_place(args, model, optimizer, started, spare)

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 or "TORCHELASTIC_RUN_ID" in os.environ:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend, timeout=timedelta(seconds=60))
    rank = dist.get_rank() if dist.is_initialized() else 0
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    _tag_logs(rank)
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # the restart path's phases: this process's start to its group, the checkpoint's load
    rescale = Rescale(
        mode=RescaleMode.RESTART,
        generation=restarts,
        world_before=None,
        world_size=world_size,
        rank=rank,
        step=0,
        reason="re-rendezvous: the workers restarted" if restarts else "started",
        agreed_at=started,
        group_at=time.time(),
    )

    identity = JobIdentity.from_env(
        job_id=args.job_id or os.environ.get("DLROVER_EVENTS_JOB_ID") or "elastic"
    )
    reporter = Reporter(identity, interval_s=args.interval_s)
    step = 0

    def abandoned(lost: Lost) -> None:
        # said by the watch's thread, as this process ends: the main thread may be in a
        # collective with the lost peer
        emit(
            "exit",
            reason="peer_host_lost",
            world_size=world_size,
            rank=rank,
            node=identity.rank,
            first_step=rescale.step,
            step=step,
            lost_node=lost.member.rank,
            lost_pod=lost.pod,
        )

    # A peer whose host is lost says nothing: the operator's word that it is (NodeLost)
    # ends this worker, and the agent re-forms the job without it (not alone: no peers).
    watch = LostPeerWatch.for_world(identity, formed_at=started, on_abandon=abandoned)
    knobs = step_knobs(
        args.batch_size,
        args.accumulation,
        reporter=reporter,
        sync_every=args.knob_sync_every,
        target_global_batch=args.global_batch,
    )
    path = args.checkpoint or default_checkpoint_path(identity.job.uuid)
    ckpt = (
        ElasticCheckpoint(
            path, model, optimizer, every=args.checkpoint_every, knobs=knobs, reporter=reporter
        )
        if path
        else None
    )
    try:
        step = ckpt.restore() if ckpt is not None else 0
    except CheckpointError as err:  # a torn manifest: one line, not a traceback
        log.error("%s", err)
        return 2
    rescale.state_at = time.time()
    rescale.step = step
    rescale.world_before = ckpt.restored_world_size if ckpt is not None else None
    if dist.is_initialized():
        model = DistributedDataParallel(model)
    rescale.ready_at = time.time()
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
            if rescale.first_step_at is None:
                rescale.first_step_at = time.time()
                _restarted(rescale, follower, identity.role, reporter if restarts else None)
            if ckpt is not None:
                ckpt.maybe_save(step)
                if ckpt.should_stop:
                    reason, code = "sigterm", EXIT_STOPPED
                    break
            pause(args, world_size)
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
        reason, code = "peer_lost", EXIT_PEER_FAILED
    finally:
        if watch is not None:
            watch.close(0.0)
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


def _restarted(
    rescale: Rescale,
    follower: PlanFollower | None,
    role: str,
    reporter: Reporter | None,
) -> None:
    """After the first step of a restarted worker: say it, and rank 0 reports it."""
    current = follower.current() if follower is not None else None
    found = plan_for(current.scale_plan if current else None, role, rescale.world_size)
    if found is not None and found[1] <= (rescale.agreed_at or 0):
        rescale.plan_id, rescale.published_at = found
    emit("rescaled", pid=os.getpid(), **rescale.as_line())
    if reporter is not None and rescale.rank == 0:
        publish_rescale(reporter, rescale)


def in_place(
    args: argparse.Namespace,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    started: float,
    spare: bool,
) -> int:
    """The training loop of an in-place role: the process outlives every resize."""
    identity = JobIdentity.from_env(
        job_id=args.job_id or os.environ.get("DLROVER_EVENTS_JOB_ID") or "elastic"
    )
    reporter = Reporter(identity, interval_s=args.interval_s)
    expect = int(os.environ.get(ELASTIC_EXPECT_ENV) or 1)
    knobs = StepKnobs(
        args.batch_size,
        args.accumulation,
        reporter=reporter,
        sync_every=args.knob_sync_every,
        target_global_batch=args.global_batch
        or args.batch_size * args.accumulation * max(expect, 1),
    )
    # every process follows the plan: whichever is rank 0 after a re-form decides knobs
    follower = PlanFollower.from_env(identity)
    knobs.follow(follower.start())

    def plan() -> ScalePlan | None:
        current = follower.current()
        return current.scale_plan if current is not None else None

    def rescaled(r: Rescale) -> None:
        emit("rescaled", pid=os.getpid(), node=identity.rank, **r.as_line())

    group = InPlaceGroup.from_env(reporter=reporter, knobs=knobs, plan=plan, on_rescaled=rescaled)
    assert group is not None
    path = args.checkpoint or default_checkpoint_path(identity.job.uuid)
    ckpt = (
        ElasticCheckpoint(
            path,
            model,
            optimizer,
            every=args.checkpoint_every,
            knobs=knobs,
            handle_sigterm=False,
            reporter=reporter,
        )
        if path
        else None
    )
    hook = TorchHook(reporter).start()
    data = Data(args.seed)
    reason, loss, code, first = "done", float("nan"), 0, 0
    generation = 0
    try:
        group.join(model, optimizer, checkpoint=ckpt)
        first = group.step
        while group.step < args.steps and not group.left:
            if group.generation != generation:
                generation = group.generation
                _tag_logs(group.rank)
                emit(
                    "membership",
                    mode="in_place",
                    world_size=group.world_size,
                    rank=group.rank,
                    node=identity.rank,
                    pid=os.getpid(),
                    generation=generation,
                    first_step=group.step,
                    restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
                    spare=spare,
                    since_start_s=round(time.time() - started, 3),
                    **knobs.knobs.as_training(),
                )
            group.boundary()
            if group.left:
                reason = "left"
                break
            if group.generation != generation:
                continue  # say the new membership before its first step
            before = group.step
            with hook.guard(), group.stepping():
                switch = knobs.at_step_boundary(group.step)
                if switch is not None:
                    _said(switch)
                loss = train_step(group.model, optimizer, data, group.step, group.rank, knobs)
            if group.step == before:
                continue  # a peer was lost in it: the group re-formed, the step goes again
            hook.step(
                samples=knobs.local_batch_size * knobs.accumulation_steps,
                global_step=group.step,
            )
            if args.loss_every and group.step % args.loss_every == 0:
                emit("loss", step=group.step, loss=round(loss, 4), world_size=group.world_size)
            if ckpt is not None:
                with group.surviving():  # its agreement may meet a peer lost since the step
                    ckpt.maybe_save(group.step)
            pause(args, group.world_size)
        else:
            if ckpt is not None and not group.left:
                ckpt.save(group.step)
    except ReformFailed as err:
        log.error("in-place re-forming failed (%s): exiting for a restart", err)
        reason, code = "reform_failed", EXIT_REFORM_FAILED
    finally:
        stats = hook.close(args.close_timeout_s if code == 0 else min(args.close_timeout_s, 0.5))
        follower.close()
    emit(
        "exit",
        mode="in_place",
        reason=reason,
        world_size=group.world_size,
        rank=group.rank,
        node=identity.rank,
        pid=os.getpid(),
        first_step=first,
        step=group.step,
        loss=round(loss, 4),
        saved_step=ckpt.saved_step if ckpt else None,
        saves=ckpt.saves if ckpt else 0,
        knob_switches=knobs.switches,
        samples=stats.samples,
        published=stats.published,
        dropped=stats.dropped,
        **knobs.knobs.as_training(),
    )
    group.close()
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
    # the work is saved and the reporter closed: torch's finalization would only make the
    # agent (and so the whole job's restart) wait for this process, 1.4-3 s
    exit_promptly(main())
