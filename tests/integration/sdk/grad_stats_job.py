"""A training job whose gradient statistics are known, for torchrun (gloo, CPU).

The parameter w stays at 0 (learning rate 0) and each sample x ~ N(mu, sigma^2 I) in d
dimensions has the loss |w - x|^2 / 2, so one sample's gradient is w - x = -x:
|E[g]|^2 = d mu^2 and tr(Cov[g]) = d sigma^2. Each rank takes ``--accumulation``
micro-batches of ``--local-batch`` samples per step; gradients are synchronised by DDP
(``--ddp``) or by an explicit all-reduce the loop times (``StepTimer``). The reporter
publishes to the broker in the environment; the last line printed is a JSON summary.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

import torch
import torch.distributed as dist

from dlrover_events.sdk import Reporter
from dlrover_events.sdk.torch import GradientStats, StepTimer

D, MU, SIGMA = 16, 1.0, 2.0


class Mean(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * ((self.w - x) ** 2).sum(dim=1).mean()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=2)
    ap.add_argument("--local-batch", type=int, default=8)
    ap.add_argument("--accumulation", type=int, default=2)
    ap.add_argument("--ddp", action="store_true")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1000 + rank)
    torch.set_num_threads(1)
    module = Mean()
    model: torch.nn.Module = (
        torch.nn.parallel.DistributedDataParallel(module) if args.ddp else module
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    k, b = args.accumulation, args.local_batch

    reporter = Reporter.from_env(interval_s=0.2, local_batch_size=b, accumulation_steps=k)
    reporter.start()
    stats = GradientStats(reporter, model, every=args.every)
    timer = StepTimer(reporter, every=1, synchronize=False)
    for step in range(1, args.steps + 1):
        stats.begin()
        for i in range(k):
            x = MU + SIGMA * torch.randn(b, D)
            last = i == k - 1
            sync = contextlib.nullcontext() if last or not args.ddp else model.no_sync()  # type: ignore[operator]
            with timer.compute(), sync:
                (model(x) / k).backward()
        if not args.ddp:
            with timer.allreduce():
                for p in model.parameters():
                    assert p.grad is not None
                    dist.all_reduce(p.grad)
                    p.grad /= world
        stats.end()
        with timer.compute():
            optimizer.step()
            optimizer.zero_grad()
        timer.step()
        reporter.step(global_step=step, samples=b * k)
    flushed = reporter.flush(10.0)
    final = reporter.close(2.0)
    dist.destroy_process_group()
    summary = {
        "rank": rank,
        "estimates": stats.made,
        "samples": final.samples,
        "published": final.published,
        "dropped": final.dropped,
        "flushed": flushed,
    }
    # one write of the whole line: both ranks share the pipe, and print() writes the text
    # and its newline apart (two summaries were seen on one line)
    os.write(sys.stdout.fileno(), (json.dumps(summary) + "\n").encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
