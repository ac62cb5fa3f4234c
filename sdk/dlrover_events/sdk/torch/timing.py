"""Where a step's time goes (compute, or waiting for the all-reduce): what a scheduler
needs to model how a job scales."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch

from dlrover_events.sdk.reporter import Reporter


class StepTimer:
    """Where a step's time goes: computing, or waiting for the gradient all-reduce.

    For loops that all-reduce after backward (the reporter gets the split of every
    ``every``-th step); DDP overlaps its all-reduce with backward, so there time the
    whole step as compute, or give the reporter your own numbers (``observe_split``).
    With CUDA, a timed step synchronises the device at each boundary so the times are
    the kernels', not their launches' (``synchronize``).

        timer = StepTimer(reporter, every=10)
        with timer.compute():
            loss_fn(model(x)).backward()
        with timer.allreduce():
            for p in model.parameters(): dist.all_reduce(p.grad)
        with timer.compute():
            optimizer.step()
        timer.step()
    """

    def __init__(
        self, reporter: Reporter, *, every: int = 10, synchronize: bool | None = None
    ) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.reporter = reporter
        self.every = every
        self._sync = synchronize
        self._steps = 0
        self.compute_s = 0.0
        self.allreduce_s = 0.0

    @property
    def timing(self) -> bool:
        """Whether the current step is timed."""
        return self._steps % self.every == 0

    def compute(self) -> contextlib.AbstractContextManager[None]:
        return self._timed("compute_s")

    def allreduce(self) -> contextlib.AbstractContextManager[None]:
        return self._timed("allreduce_s")

    @contextlib.contextmanager
    def _timed(self, total: str) -> Iterator[None]:
        """Add the block's time to `total` on a timed step; nothing otherwise."""
        if not self.timing:
            yield
            return
        t = self._now()
        try:
            yield
        finally:
            setattr(self, total, getattr(self, total) + self._now() - t)

    def step(self) -> None:
        """The step ended: a timed one goes to the reporter."""
        if self.timing:
            self.reporter.observe_split(self.compute_s, self.allreduce_s)
            self.compute_s = self.allreduce_s = 0.0
        self._steps += 1

    def _now(self) -> float:
        sync = self._sync
        if sync is None:
            sync = torch.cuda.is_available() and torch.cuda.is_initialized()
        if sync:
            torch.cuda.synchronize()
        return time.perf_counter()


__all__ = ["StepTimer"]
