"""A small real torch model trained on synthetic MNIST-like data, reporting through the SDK.

The data is made up (28x28 "images" labelled by a fixed random teacher network), so the
example needs no download and the loss really falls. With the embedded stack running
(`make run`, or `dlrover-events up`), in another terminal:

    DLROVER_EVENTS_JOB_ID=mnist-1 .venv/bin/python examples/train_mnist_like.py --steps 3000
    .venv/bin/dlrover-events tail --env prod --job mnist-1

The job's identity comes from the environment as the operator sets it (DLROVER_EVENTS_JOB_ID,
_ROLE, _RANK, _ENV, and DLROVER_EVENTS_BOOTSTRAP_SERVERS for Kafka). The last line printed
is one JSON object: steps, the final loss, and what the reporter published and dropped.

Its state goes through the SDK's one way of saving and loading it: ``ElasticCheckpoint``
(``--checkpoint``, else ``$DLROVER_EVENTS_CHECKPOINT_DIR/<job>.pt``, which the local
platform sets; none without either) restores at the start, saves every
``--checkpoint-every`` steps and at the first step after a SIGTERM (a suspension: it then
exits 143), and carries the ``ElasticSampler``'s position, so a job resumed goes on to
``--steps`` from the step and the samples it stopped at.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dlrover_events.sdk import JobIdentity, Reporter
from dlrover_events.sdk.identity import default_checkpoint_path
from dlrover_events.sdk.torch import (
    CheckpointError,
    ElasticCheckpoint,
    ElasticSampler,
    TorchHook,
)
from dlrover_events.settings import Settings

PIXELS = 28 * 28
CLASSES = 10
#: exit codes: done, a checkpoint refused (torn), stopped by SIGTERM after its save
EXIT_DONE, EXIT_REFUSED, EXIT_STOPPED = 0, 2, 143

log = logging.getLogger("train_mnist_like")


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
        #: the order of the samples, and how far the run got in it (what a checkpoint keeps)
        self.sampler = ElasticSampler(len(self.images), batch_size, seed=seed)
        self.steps = 0

    def batches(
        self, steps: int, checkpoint: ElasticCheckpoint | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The next ``steps`` batches from the sampler's position; none once a SIGTERM
        asked the checkpoint to stop (the step before was saved)."""
        for _ in range(steps):
            if checkpoint is not None and checkpoint.should_stop:
                return
            idx = torch.tensor(self.sampler.local_batch())
            yield self.images[idx], self.labels[idx]

    def run(
        self, hook: TorchHook, steps: int, checkpoint: ElasticCheckpoint | None = None
    ) -> float:
        """Train ``steps`` steps (fewer when stopped); returns the last loss. An OOM is
        reported, then raised."""
        loss = torch.tensor(float("nan"))
        self.model.train()
        with hook.guard():
            for x, y in hook.track(self.batches(steps, checkpoint)):
                self.optimizer.zero_grad(set_to_none=True)
                loss = F.cross_entropy(self.model(x), y)
                loss.backward()
                self.optimizer.step()
                self.sampler.advance()
                self.steps += 1
                if checkpoint is not None:
                    checkpoint.maybe_save(self.steps)  # on SIGTERM: saved, then stopping
        return float(loss.item())

    def accuracy(self) -> float:
        self.model.eval()
        with torch.no_grad():
            predicted = self.model(self.images).argmax(dim=1)
        return float((predicted == self.labels).float().mean())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000, help="steps to reach")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--interval-s", type=float, default=1.0, help="seconds per sample")
    parser.add_argument("--job-id", help="default: $DLROVER_EVENTS_JOB_ID")
    parser.add_argument("--close-timeout-s", type=float, default=5.0)
    parser.add_argument(
        "--checkpoint",
        default=None,
        help="checkpoint directory or URL (default: $DLROVER_EVENTS_CHECKPOINT_DIR/<job>.pt, "
        "else none)",
    )
    parser.add_argument("--checkpoint-every", type=int, default=500, help="steps between saves")
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
    path = args.checkpoint or default_checkpoint_path(identity.job.uuid)
    ckpt = (
        ElasticCheckpoint(
            path,
            run.model,
            run.optimizer,
            every=args.checkpoint_every,
            sampler=run.sampler,
            reporter=reporter,
        )
        if path
        else None
    )
    try:
        run.steps = first = ckpt.restore() if ckpt is not None else 0
    except CheckpointError as err:  # a torn manifest: one line, not a traceback
        log.error("%s", err)
        reporter.close(args.close_timeout_s)
        return EXIT_REFUSED
    hook = TorchHook(reporter).start()
    try:
        loss = run.run(hook, max(args.steps - run.steps, 0), ckpt)
        stopped = ckpt is not None and ckpt.should_stop
        if ckpt is not None and not stopped:
            ckpt.save(run.steps)  # waits for the commit
    finally:
        stats = hook.close(args.close_timeout_s)
    resumed: dict[str, Any] = {}
    if ckpt is not None:
        resumed = {"first_step": first, "saved_step": ckpt.saved_step, "saves": ckpt.saves}
    summary = {
        "job": identity.job.uuid,
        "env": identity.env,
        "steps": run.steps,
        **resumed,
        "loss": round(loss, 4),
        "accuracy": round(run.accuracy(), 4),
        "samples": stats.samples,
        "published": stats.published,
        "dropped": stats.dropped,
    }
    print(json.dumps(summary), flush=True)
    return EXIT_STOPPED if stopped else EXIT_DONE


if __name__ == "__main__":
    sys.exit(main())
