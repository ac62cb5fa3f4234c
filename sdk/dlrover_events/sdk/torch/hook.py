"""The training loop's reporter: a sample per interval with GPU memory, and OOMs as events.

An OOM is the one failure the brain can fix by itself (more memory, a smaller batch), but
only if it hears about it with the numbers: so ``guard`` catches it, publishes a
``NodeOOM`` with what the process held and wanted, flushes, and re-raises the same
exception. A kernel OOM kill (SIGKILL, exit 137) cannot be caught in-process; the
operator reports that one from the pod's exit.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ParamSpec, Self, TypeVar

import torch

from dlrover_events.sdk.probes import rss_bytes
from dlrover_events.sdk.reporter import Reporter, ReporterStats
from dlrover_events.sdk.torch.gradients import GradientStats
from dlrover_events.sdk.torch.oom import oom_kind, requested_bytes
from schemas.bounds import MAX_BYTES
from schemas.jobs import NodeOOM, OOMKind

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

#: set on an OOM once reported, so nested guards report it once
_REPORTED = "_dlrover_events_oom_reported"


class CudaProbe:
    """GPU memory the caching allocator holds, and utilisation when NVML can tell.

    Reads nothing until the training code has initialised CUDA: a probe must never be
    the thing that creates a CUDA context (in the reporter's thread, on the wrong device).
    """

    def __init__(self, device: torch.device | int | None = None) -> None:
        self._device = device
        self._nvml = True

    def __call__(self) -> dict[str, Any]:
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return {}
        stats = torch.cuda.memory_stats(self._device)
        out: dict[str, Any] = {"gpu_memory": int(stats.get("reserved_bytes.all.current", 0))}
        if self._nvml:
            try:
                out["gpu_util"] = min(max(torch.cuda.utilization(self._device) / 100.0, 0.0), 1.0)
            except Exception as err:  # no pynvml, or no NVML on this host
                self._nvml = False
                log.info("GPU utilisation not reported: %s", err)
        return out


class TorchHook:
    """A torch training loop's reporter: samples per step, GPU memory, OOM events."""

    def __init__(
        self,
        reporter: Reporter,
        *,
        device: torch.device | int | None = None,
        flush_timeout_s: float = 5.0,
    ) -> None:
        self.reporter = reporter
        self._device = device
        self._flush_timeout_s = flush_timeout_s
        if torch.cuda.is_available():
            reporter.add_probe(CudaProbe(device))

    @classmethod
    def from_env(cls, *, device: torch.device | int | None = None, **kwargs: Any) -> TorchHook:
        return cls(Reporter.from_env(**kwargs), device=device)

    def start(self) -> Self:
        self.reporter.start()
        return self

    def close(self, timeout_s: float = 5.0) -> ReporterStats:
        return self.reporter.close(timeout_s)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def step(self, samples: int | None = None, global_step: int | None = None) -> None:
        self.reporter.step(global_step, samples)

    def track(self, loader: Iterable[T]) -> Iterator[T]:
        """Each batch is a step; its size (first dimension of its first tensor) its samples."""
        step = self.reporter.step
        for batch in loader:
            yield batch
            step(None, batch_samples(batch))

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Report an OOM raised inside, flush, and let it propagate unchanged."""
        try:
            yield
        except (RuntimeError, MemoryError) as err:
            kind = oom_kind(err)
            if kind is not None and not getattr(err, _REPORTED, False):
                # Guards nest (a watched step inside a guarded loop): one OOM, one event.
                with contextlib.suppress(AttributeError, TypeError):
                    setattr(err, _REPORTED, True)
                self.report_oom(kind, err)
            raise

    def watch(self, step_fn: Callable[P, R]) -> Callable[P, R]:
        """Decorate a step function: guarded, and a step marked when it returns."""

        def stepped(*args: P.args, **kwargs: P.kwargs) -> R:
            with self.guard():
                result = step_fn(*args, **kwargs)
            self.reporter.step()
            return result

        return stepped

    def gradient_stats(
        self, params: torch.nn.Module | Iterable[torch.nn.Parameter], **kwargs: Any
    ) -> GradientStats:
        """Gradient statistics reported through this hook's reporter (``GradientStats``)."""
        return GradientStats(self.reporter, params, **kwargs)

    def report_oom(self, kind: OOMKind, err: BaseException | None = None) -> bool:
        """Publish the OOM with what was held and wanted; True if it reached the broker.

        Never raises: the caller is already handling a worse error.
        """
        try:
            wanted = requested_bytes(err) if err is not None else 0
            gpu = self._gpu_needed(wanted) if kind == OOMKind.GPU_MEMORY else None
            host = rss_bytes() + (wanted if kind == OOMKind.HOST_MEMORY else 0)
            # a request past the contract's bound (a bug asking for 2^62 bytes) is
            # reported as the bound: the event must still go, and it says "at least"
            host = min(host, MAX_BYTES)
            gpu = None if gpu is None else min(gpu, MAX_BYTES)
            ident = self.reporter.identity
            self.reporter.publish(
                NodeOOM(
                    env=ident.env,
                    job=ident.job,
                    source=ident.source,
                    node=ident.node,
                    kind=kind,
                    memory=host,
                    gpu_memory=gpu,
                )
            )
            sent = self.reporter.flush(self._flush_timeout_s)
            if not sent:
                log.warning("the %s OOM event may not have reached the bus", kind.value)
            return sent
        except Exception:
            log.exception("could not report the %s OOM", kind.value)
            return False

    def _gpu_needed(self, wanted: int) -> int | None:
        """What the device had to hold: the allocator's reservation, or in use plus the
        failed request if more. The brain sizes the next attempt from this number."""
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return wanted or None
        allocated = torch.cuda.memory_allocated(self._device)
        reserved = torch.cuda.memory_reserved(self._device)
        return max(reserved, allocated + wanted)


def batch_samples(batch: object) -> int | None:
    """Samples in a batch: a tensor's first dimension, or that of a tuple's/dict's first."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else None
    if isinstance(batch, (tuple, list)) and batch:
        return batch_samples(batch[0])
    if isinstance(batch, dict) and batch:
        return batch_samples(next(iter(batch.values())))
    return None


__all__ = ["CudaProbe", "TorchHook", "batch_samples"]
