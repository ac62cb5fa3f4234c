"""A small real torch model trained on synthetic MNIST-like data, reporting through the SDK.

The data is made up (28x28 "images" labelled by a fixed random teacher network), so the
example needs no download and the loss really falls. With the embedded stack running
(`make run`, or `dlrover-events up`), in another terminal:

    DLROVER_EVENTS_JOB_ID=mnist-1 .venv/bin/python examples/train_mnist_like.py --steps 3000
    .venv/bin/dlrover-events tail --env prod --job mnist-1

The job's identity comes from the environment as the operator sets it (DLROVER_EVENTS_JOB_ID,
_ROLE, _RANK, _ENV, and DLROVER_EVENTS_BOOTSTRAP_SERVERS for Kafka). The last line printed
is one JSON object: steps, the final loss, and what the reporter published and dropped.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from dlrover_events.sdk import JobIdentity, Reporter
from dlrover_events.sdk.torch import TorchHook
from dlrover_events.settings import Settings

PIXELS = 28 * 28
CLASSES = 10


class MnistLike:
    """Model, optimiser and data of one training run; ``run`` may be called again to go on."""

    def __init__(self, *, seed: int = 0, batch_size: int = 64, lr: float = 0.05) -> None:
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        self.batch_size = batch_size
        self.images = torch.rand(4096, PIXELS, generator=gen)
        teacher = torch.randn(PIXELS, CLASSES, generator=gen)
        self.labels = (self.images @ teacher).argmax(dim=1)
        self.model = nn.Sequential(
            nn.Linear(PIXELS, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10)
        )
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9)
        self.steps = 0
        self._gen = gen

    def batches(self, steps: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(steps):
            idx = torch.randint(0, len(self.images), (self.batch_size,), generator=self._gen)
            yield self.images[idx], self.labels[idx]

    def run(self, hook: TorchHook, steps: int) -> float:
        """Train ``steps`` steps; returns the last loss. An OOM is reported, then raised."""
        loss = torch.tensor(float("nan"))
        self.model.train()
        with hook.guard():
            for x, y in hook.track(self.batches(steps)):
                self.optimizer.zero_grad(set_to_none=True)
                loss = F.cross_entropy(self.model(x), y)
                loss.backward()
                self.optimizer.step()
                self.steps += 1
        return float(loss.item())

    def accuracy(self) -> float:
        self.model.eval()
        with torch.no_grad():
            predicted = self.model(self.images).argmax(dim=1)
        return float((predicted == self.labels).float().mean())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--interval-s", type=float, default=1.0, help="seconds per sample")
    parser.add_argument("--job-id", help="default: $DLROVER_EVENTS_JOB_ID")
    parser.add_argument("--close-timeout-s", type=float, default=5.0)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads; a model this small only loses time to more",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    # aiokafka says every refused connection at ERROR; the reporter says it once.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)

    identity = JobIdentity.from_env(job_id=args.job_id)
    run = MnistLike(batch_size=args.batch_size)
    reporter = Reporter(
        identity,
        settings=Settings(),
        interval_s=args.interval_s,
        local_batch_size=args.batch_size,
    )
    hook = TorchHook(reporter).start()
    try:
        loss = run.run(hook, args.steps)
    finally:
        stats = hook.close(args.close_timeout_s)
    summary = {
        "job": identity.job.uuid,
        "env": identity.env,
        "steps": run.steps,
        "loss": round(loss, 4),
        "accuracy": round(run.accuracy(), 4),
        "samples": stats.samples,
        "published": stats.published,
        "dropped": stats.dropped,
    }
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
