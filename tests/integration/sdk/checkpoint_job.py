"""A small training job for the checkpoint's tests (issue 36), under torchrun (gloo, CPU) or
alone: DDP with the elastic sampler, or FSDP2 (``fully_shard``) whose state is sharded.

It resumes from ``--root`` (a directory or an ``s3://`` URL), trains to ``--until``
with a save every ``--every`` steps, saves at the end and exits. Rank 0 prints one JSON
object a line: ``resumed`` (the step and the full model's digest), ``loss`` per step (the
global batch's mean loss), ``saving`` when a save started, ``exit`` (the counters).

``--slow-rank R --slow-step S`` makes rank R's writes from step S's checkpoint take 30 s
(a slow disk): the test kills the job in it. A checkpoint refused (a torn manifest) is
one line on stderr and exit code 2, as a job would say it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from dlrover_events.sdk.checkpoint_manifest import step_of
from dlrover_events.sdk.torch import (
    CheckpointError,
    ElasticCheckpoint,
    ElasticSampler,
    checkpoint_storage,
)
from dlrover_events.sdk.torch.exiting import exit_promptly

SAMPLES, FEATURES = 64, 6


def say(event: str, **fields: Any) -> None:
    if (dist.get_rank() if dist.is_initialized() else 0) == 0:
        sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
        sys.stdout.flush()


def data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(SAMPLES, FEATURES, generator=gen)
    w = torch.randn(FEATURES, 1, generator=gen)
    return x, x @ w + 0.1 * torch.randn(SAMPLES, 1, generator=gen)


def build(mode: str, width: int) -> tuple[nn.Module, nn.Module]:
    """(the module trained, the plain one): the same initial weights at any world size."""
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(FEATURES, width), nn.Tanh(), nn.Linear(width, 1))
    if not dist.is_initialized():
        return plain, plain
    if mode == "ddp":
        return nn.parallel.DistributedDataParallel(plain), plain
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in plain:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(plain, mesh=mesh)
    return plain, plain


def digest(model: nn.Module) -> str:
    """The full model's bytes, hashed (a collective for a sharded model)."""
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    h = hashlib.sha256()
    for key in sorted(full):
        h.update(key.encode())
        value = full[key]
        assert isinstance(value, torch.Tensor), key
        h.update(value.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def slow_writes(rank: int, step: int) -> None:
    """Rank ``rank``'s parts of a checkpoint of step ``step`` or later are written, then
    the write hangs 30 s."""
    if (dist.get_rank() if dist.is_initialized() else 0) != rank:
        return
    made = checkpoint_storage.Storage.writer

    def writer(self: checkpoint_storage.Storage, name: str) -> Any:
        w = made(self, name)
        if (step_of(name) or 0) >= step:
            write_data = w.write_data

            def slow(plan: Any, planner: Any) -> Any:
                done = write_data(plan, planner)
                time.sleep(30)
                return done

            w.write_data = slow
        return w

    checkpoint_storage.Storage.writer = writer  # type: ignore[method-assign]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["ddp", "fsdp"], default="ddp")
    p.add_argument("--root", required=True)
    p.add_argument("--until", type=int, required=True)
    p.add_argument("--every", type=int, default=4)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--step-sleep-s", type=float, default=0.0)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-step", type=int, default=-1)
    args = p.parse_args()
    torch.set_num_threads(1)
    if "LOCAL_RANK" in os.environ:
        dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    world = dist.get_world_size() if dist.is_initialized() else 1
    if args.slow_rank >= 0:
        slow_writes(args.slow_rank, args.slow_step)
    trained, plain = build(args.mode, args.width)
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.05, momentum=0.9)
    sampler = ElasticSampler(SAMPLES, args.global_batch, seed=1)
    ckpt = ElasticCheckpoint(args.root, plain, optimizer, every=args.every, sampler=sampler)
    # every parameter and momentum buffer copied behind the next forward and backward (the
    # optimizer's step waits for it), not only those of 64 KiB or more: at this width the
    # tests would otherwise never take that path, and their losses prove it exact
    ckpt.STAGE_BEHIND_BYTES = 0
    try:
        step = ckpt.restore()
    except CheckpointError as err:
        sys.stderr.write(f"error: {err}\n")
        return 2
    say("resumed", step=step, world_size=world, saved_in=ckpt.restored_world_size,
        digest=digest(plain))  # fmt: skip
    x, y = data()
    while step < args.until and not ckpt.should_stop:
        idx = sampler.local_batch()
        loss = nn.functional.mse_loss(trained(x[idx]), y[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        sampler.advance()
        step += 1
        mean = loss.detach().clone()
        if dist.is_initialized():
            dist.all_reduce(mean)
            mean /= world
        say("loss", step=step, loss=float(mean), world_size=world)
        if ckpt.maybe_save(step):
            say("saving", step=step, blocking_s=ckpt.last_blocking_s)
        if args.step_sleep_s:
            time.sleep(args.step_sleep_s)
    ckpt.save(step)
    counts = {"saves": ckpt.saves, "put_off": ckpt.put_off, "given_up": ckpt.given_up}
    failures = ckpt.persist_failures
    say("exit", step=step, saved_step=ckpt.saved_step, persist_failures=failures,
        digest=digest(plain), **counts)  # fmt: skip
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    # as the SDK asks of a job (exiting.py): without the interpreter's finalization, where a
    # gloo worker still releasing the last collective's tensors aborted rank 1 or 2 of this
    # job, after its last line, in 2 of about 170 runs on two loaded cores (and one CI run)
    exit_promptly(main())
