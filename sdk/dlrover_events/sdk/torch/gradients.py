"""What a cluster scheduler needs of a job's gradients: Pollux's gradient statistics."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist

from dlrover_events.sdk.reporter import Reporter
from dlrover_events.sdk.torch.ranks import distributed
from dlrover_events.sdk.window import GradEstimate, estimate

log = logging.getLogger(__name__)


class GradientStats:
    """Pollux's gradient statistics from the job's own gradients, every ``every`` steps.

    On a measured step, hooks on the parameters see each replica's gradient of each
    micro-batch before it is synchronised, and add up their squared norms (one float64
    scalar per parameter and backward pass); at ``end()`` the gradients are synchronised,
    their squared norm is the average's, and one all-reduce of two numbers gives the sum
    over replicas. ``window.estimate`` turns them into unbiased estimates of grad_sqr and
    grad_var (see ``dlrover_events.sdk.window``), handed to the reporter. Other steps cost
    a counter: no hook is registered on them.

        stats = GradientStats(reporter, model, every=50, local_batch_size=32)
        for batch in loader:
            stats.begin()                  # before the step's first backward
            loss_fn(model(batch)).backward()  # DDP (or all_reduce / world size after it)
            stats.end()                    # gradients synchronised; before zero_grad
            optimizer.step()
            optimizer.zero_grad()

    ``accumulation`` says how micro-batch gradients add up in ``.grad``: ``"mean"`` when
    each micro-batch's loss is divided by the accumulation steps (the usual way),
    ``"sum"`` when not. With a loss scaler (AMP), pass its scale to ``end``. A process
    alone with one micro-batch per step has one gradient: it compares two consecutive
    measured steps instead (AdaptDL's difference estimator, biased by the update between
    them), which keeps a copy of the gradients from the first to the second.
    """

    def __init__(
        self,
        reporter: Reporter | None,
        params: torch.nn.Module | Iterable[torch.nn.Parameter],
        *,
        every: int = 100,
        local_batch_size: int | None = None,
        accumulation: str = "mean",
    ) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        if accumulation not in ("mean", "sum"):
            raise ValueError(f"accumulation must be 'mean' or 'sum', got {accumulation!r}")
        if isinstance(params, torch.nn.Module):
            params = params.parameters()
        self.params = [p for p in params if p.requires_grad]
        self.reporter = reporter
        self.every = every
        self.local_batch_size = local_batch_size
        self.accumulation = accumulation
        #: the last estimate made, and how many were.
        self.last: GradEstimate | None = None
        self.made = 0
        self._steps = 0
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._sqr: list[torch.Tensor] = []
        self._calls = [0] * len(self.params)
        #: the first gradient of a difference pair (a process alone, one micro-batch).
        self._previous: list[torch.Tensor | None] | None = None
        self._said_no_batch = False

    @property
    def armed(self) -> bool:
        return bool(self._handles)

    def begin(self) -> bool:
        """Before the step's first backward: True when this step is measured."""
        self._steps += 1
        if self._handles:
            return True
        if (self._steps - 1) % self.every and self._previous is None:
            return False
        self._sqr = []
        self._calls = [0] * len(self.params)
        self._handles = [p.register_hook(self._hook(i)) for i, p in enumerate(self.params)]
        return True

    def _hook(self, index: int) -> Callable[[torch.Tensor], None]:
        sqr, calls = self._sqr, self._calls

        def hook(grad: torch.Tensor) -> None:
            # runs in autograd's thread, before the gradient is accumulated and reduced
            sqr.append(_norm(grad.detach()))
            calls[index] += 1

        return hook

    def end(
        self, local_batch_size: int | None = None, loss_scale: float = 1.0
    ) -> GradEstimate | None:
        """After the gradients are synchronised (and accumulated), before they are zeroed:
        the estimate of this step, also given to the reporter; None on steps not measured
        (and on the first of a difference pair)."""
        if not self._handles:
            return None
        for handle in self._handles:
            handle.remove()
        self._handles = []
        micro = max(self._calls, default=0)
        if micro == 0:  # no backward ran since begin()
            self._previous = None
            return None
        batch = local_batch_size or self.local_batch_size
        if batch is None and self.reporter is not None:
            batch = self.reporter.local_batch_size
        if not batch:
            if not self._said_no_batch:
                self._said_no_batch = True
                log.warning("gradient statistics need the local batch size: none is known")
            return None
        est = self._estimate(micro, float(batch), float(loss_scale) ** 2)
        if est is not None:
            self.last = est
            self.made += 1
            if self.reporter is not None:
                self.reporter.observe_gradients(est.grad_sqr, est.grad_var)
        return est

    def _estimate(self, micro: int, batch: float, scale_sqr: float) -> GradEstimate | None:
        grads = [p.grad for p in self.params]
        device = next((g.device for g in grads if g is not None), torch.device("cpu"))
        local = (
            torch.stack(self._sqr).double().square().sum()
            if self._sqr
            else torch.zeros((), dtype=torch.float64)
        )
        self._sqr = []
        counts = torch.stack(
            [local.to(device), torch.tensor(float(micro), dtype=torch.float64, device=device)]
        )
        if distributed() and dist.get_world_size() > 1:
            dist.all_reduce(counts)
        local_sum, count = (float(v) for v in counts.tolist())
        total = _sqr_norm(grads)
        # .grad holds the mean of the micro-batches' gradients, or their sum
        per_micro = micro * micro if self.accumulation == "mean" else 1.0
        local_mean = local_sum * per_micro / count / scale_sqr
        total_mean = total / scale_sqr / (1.0 if self.accumulation == "mean" else micro * micro)
        if round(count) >= 2:
            self._previous = None
            return estimate(local_mean, total_mean, round(count), batch)
        # One gradient a step: pair this one with the next measured step's.
        now = [None if g is None else g.detach().clone() for g in grads]
        first, self._previous = self._previous, None
        if first is None:
            if math.isfinite(total_mean):
                self._previous = now
            return None
        pair_local = (_sqr_norm(first) + _sqr_norm(now)) / 2 / scale_sqr
        mean = [_average(a, b) for a, b in zip(first, now, strict=True)]
        return estimate(pair_local, _sqr_norm(mean) / scale_sqr, 2, batch)


def _norm(grad: torch.Tensor) -> torch.Tensor:
    """A gradient's norm as a float32 scalar (squared later, in float64): a float32 norm
    is exact to 1e-7 of itself, and casting every gradient to float64 first cost twice
    as much; half-precision gradients are read in float32, where their squares fit."""
    if grad.dtype in (torch.float16, torch.bfloat16):
        return torch.linalg.vector_norm(grad, dtype=torch.float32)
    return torch.linalg.vector_norm(grad).float()


def _sqr_norm(grads: Iterable[torch.Tensor | None]) -> float:
    """The squared norm of all the tensors together (float64 sum), one read off the
    device."""
    tensors = [g.detach() for g in grads if g is not None]
    if not tensors:
        return 0.0
    if any(t.dtype in (torch.float16, torch.bfloat16) for t in tensors):
        norms = [_norm(t) for t in tensors]
    else:  # one kernel for all (a quarter less than one norm each, on CPU)
        norms = list(torch._foreach_norm(tensors))
    return float(torch.stack([n.to(norms[0].device) for n in norms]).double().square().sum())


def _average(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    if a is None:
        return b
    if b is None:
        return a
    return (a + b) / 2


__all__ = ["GradientStats"]
