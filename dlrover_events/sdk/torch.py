"""torch integration (extra ``torch``): GPU memory in the samples, OOMs as events.

An OOM is the one failure the brain can fix by itself (more memory, a smaller batch), but
only if it hears about it with the numbers: so the hook catches it, publishes a
``NodeOOM`` with what the process held and wanted, flushes, and re-raises the same
exception. A kernel OOM kill (SIGKILL, exit 137) cannot be caught in-process; the
operator reports that one from the pod's exit.

    hook = TorchHook(Reporter.from_env(batch_size=256)).start()
    with hook.guard():
        for x, y in hook.track(loader):
            train_step(x, y)
    hook.close()

An elastic job (torchrun, c10d rendezvous) also needs its training to survive a new world:
``ElasticCheckpoint`` saves and resumes it (and stops the loop cleanly when the agent
restarts the workers), and ``knob_sync`` lets ``StepKnobs`` switch every rank at the same
step. See ``examples/elastic/train_elastic.py`` for the whole loop.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any, ParamSpec, Self, TypeVar

import torch
import torch.distributed as dist

from dlrover_events.sdk.knobs import KnobSync, KnobVector, StepKnobs
from dlrover_events.sdk.probes import rss_bytes
from dlrover_events.sdk.reporter import Reporter, ReporterStats
from dlrover_events.sdk.window import GradEstimate, estimate
from schemas.bounds import MAX_BYTES
from schemas.jobs import NodeOOM, OOMKind

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_GPU_REQUEST = re.compile(r"Tried to allocate ([0-9.]+) (B|KiB|MiB|GiB|TiB)")
_CPU_REQUEST = re.compile(r"tried to allocate ([0-9]+) bytes")
#: torch's CPU allocator fails with a RuntimeError, not MemoryError.
_CPU_OOM = "DefaultCPUAllocator: can't allocate memory"
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


def requested_bytes(err: BaseException) -> int:
    """The allocation that failed, as torch's message says it; 0 when it does not."""
    text = str(err)
    if m := _GPU_REQUEST.search(text):
        return int(float(m.group(1)) * _UNITS[m.group(2)])
    if m := _CPU_REQUEST.search(text):
        return int(m.group(1))
    return 0


def oom_kind(err: BaseException) -> OOMKind | None:
    """Which memory ran out, or None when ``err`` is not an OOM."""
    if isinstance(err, torch.cuda.OutOfMemoryError):
        return OOMKind.GPU_MEMORY
    if isinstance(err, MemoryError) or (isinstance(err, RuntimeError) and _CPU_OOM in str(err)):
        return OOMKind.HOST_MEMORY
    return None


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


# -- what a cluster scheduler needs: gradient statistics, the step's split ------------


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


# -- elastic training -------------------------------------------------------------------

#: Words in the errors gloo and NCCL raise when a peer of a collective went away.
_PEER_LOST = re.compile(
    r"gloo|nccl|connection (reset|closed|refused)|broken pipe|processgroup|timed out|"
    r"socket|peer",
    re.IGNORECASE,
)
CHECKPOINT_FORMAT = 1


def distributed() -> bool:
    """Whether this process trains in a torch world (a process group is initialised)."""
    return dist.is_available() and dist.is_initialized()


def world() -> tuple[int, int]:
    """(rank, world size) in the torch world; (0, 1) alone."""
    if distributed():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_peer_failure(err: BaseException) -> bool:
    """Whether ``err`` is a collective failing because a peer left (a membership change).

    gloo raises a plain RuntimeError ("Connection reset by peer") in backward or
    all_reduce; newer torch raises DistBackendError/DistNetworkError (RuntimeErrors too).
    """
    dist_error = getattr(dist, "DistError", None)
    if dist_error is not None and isinstance(err, dist_error):
        return True
    return isinstance(err, RuntimeError) and bool(_PEER_LOST.search(str(err)))


def knob_sync(src: int = 0) -> KnobSync:
    """Rank ``src``'s knob decision, broadcast to every rank (for ``StepKnobs(sync=)``)."""

    def sync(proposal: KnobVector) -> KnobVector:
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if dist.get_backend() == "nccl"
            else torch.device("cpu")
        )
        t = torch.tensor(proposal, dtype=torch.int64, device=device)
        dist.broadcast(t, src)
        return [int(v) for v in t.tolist()]

    return sync


def step_knobs(local_batch_size: int, accumulation_steps: int = 1, **kwargs: Any) -> StepKnobs:
    """``StepKnobs`` for this process's place in the torch world (alone: world size 1)."""
    rank, size = world()
    return StepKnobs(
        local_batch_size,
        accumulation_steps,
        world_size=size,
        rank=rank,
        sync=knob_sync() if size > 1 else None,
        **kwargs,
    )


class ElasticCheckpoint:
    """Save and resume a training run across re-rendezvous: model, optimizer, step, knobs.

    torchrun's agent restarts every worker when the world changes (a node joins or
    leaves); the new workers start from this checkpoint, so training goes on from the
    step it saved instead of from 0.

    - Saved every ``every`` steps by ``maybe_save(step)``, and at the first boundary after
      a SIGTERM (the agent sends it to its workers before a re-rendezvous): ``should_stop``
      then tells the loop to leave. A second SIGTERM kills as the default would.
    - ``on_peer_failure()`` saves when a collective fails because a peer left: that is in
      backward or all_reduce, before ``optimizer.step`` of that step ran, so the state is
      the previous step's and is saved as that step (``maybe_save``'s last ``step``).
    - Only rank 0 writes; atomically (a temporary file, fsync, ``os.replace``), so a kill
      mid-write leaves the previous checkpoint.
    - ``restore()`` on every rank: the rank holding the newest file (by step, rank 0 on a
      tie) sends its state to all with ``broadcast_object_list``, so ranks on machines
      without the file (the new rank 0 may be on another node) get it too.

    The state travels pickled through the process group: right for models of up to a few
    hundred MB; larger ones want torch.distributed.checkpoint on shared storage.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        every: int = 100,
        knobs: StepKnobs | None = None,
        handle_sigterm: bool = True,
    ) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.path = Path(path)
        self.model = model
        self.optimizer = optimizer
        self.every = every
        self.knobs = knobs
        #: the last completed step the loop told us of (the state a failure saves).
        self.step = 0
        self.saved_step: int | None = None
        self.saves = 0
        #: the world size the checkpoint ``restore`` loaded was saved in (None: none loaded)
        self.restored_world_size: int | None = None
        self._stop = False
        self._said_stop = False
        self._previous: Any = None
        if handle_sigterm:
            self.install_sigterm_handler()

    # -- stopping ------------------------------------------------------------------------

    @property
    def should_stop(self) -> bool:
        """True once a SIGTERM came: save (``maybe_save`` does) and leave the loop."""
        if self._stop and not self._said_stop:
            self._said_stop = True
            log.info("SIGTERM: saving step %d and stopping (a re-rendezvous is coming)", self.step)
        return self._stop

    def request_stop(self) -> None:
        self._stop = True

    def install_sigterm_handler(self) -> bool:
        """Make SIGTERM stop the loop at the next step boundary; only the main thread can."""
        if threading.current_thread() is not threading.main_thread():
            log.warning("not in the main thread: SIGTERM will not save a checkpoint")
            return False
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        return True

    def uninstall_sigterm_handler(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self._stop:  # the second one: the loop is stuck, die as without us
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        self._stop = True  # nothing else here: a signal handler must not take locks

    # -- saving --------------------------------------------------------------------------

    def maybe_save(self, step: int) -> bool:
        """At a step boundary (``step`` steps done): save every ``every`` steps or when
        stopping. True when a file was written (on rank 0)."""
        self.step = step
        due = step - (self.saved_step or 0) >= self.every
        if due or self._stop:
            return self.save(step)
        return False

    def save(self, step: int | None = None) -> bool:
        """Write the checkpoint now (rank 0 only). Never raises: a full disk must not end
        the training it was meant to protect; it is logged and False returned."""
        step = self.step if step is None else step
        self.step = step
        if world()[0] != 0 or self.saved_step == step:
            return False
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            state = self._state(step)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except Exception as err:
            log.error("checkpoint of step %d not written to %s: %s", step, self.path, err)
            with contextlib.suppress(OSError):
                tmp.unlink()
            return False
        self.saved_step = step
        self.saves += 1
        return True

    @contextlib.contextmanager
    def on_peer_failure(self) -> Iterator[None]:
        """Around a step: when a collective fails because a peer left, save the last
        completed step (the state is still that step's) and let the error propagate, so
        the process exits non-zero and its agent re-rendezvous."""
        try:
            yield
        except RuntimeError as err:
            if is_peer_failure(err):
                log.warning("a peer left during step %d: saving step %d", self.step + 1, self.step)
                self.save(self.step)
            raise

    def _module(self) -> torch.nn.Module:
        # DDP's keys carry "module.": saved unwrapped, the file loads with or without DDP.
        return getattr(self.model, "module", self.model)

    def _state(self, step: int) -> dict[str, Any]:
        return {
            "format": CHECKPOINT_FORMAT,
            "step": step,
            "world_size": world()[1],
            "saved_at": time.time(),
            "model": self._module().state_dict(),
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "knobs": self.knobs.state_dict() if self.knobs is not None else None,
        }

    # -- resuming ------------------------------------------------------------------------

    def restore(self) -> int:
        """Load the newest checkpoint any rank holds into every rank; the step to go on
        from (0 without one). Every rank must call it (collectives, in a torch world)."""
        local = self._load_local()
        state = local
        if distributed() and dist.get_world_size() > 1:
            state = self._share(local)
        if state is None:
            return 0
        self._module().load_state_dict(state["model"])
        if self.optimizer is not None and state.get("optimizer") is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        step = int(state["step"])
        saved_world = state.get("world_size")
        self.restored_world_size = int(saved_world) if saved_world is not None else None
        if self.knobs is not None and state.get("knobs"):
            self.knobs.load_state_dict(state["knobs"], step)
        self.step = step
        if local is not None and int(local["step"]) == step:
            self.saved_step = step  # this rank's file already holds it
        log.info(
            "resumed from step %d (saved in a world of %s)", step, state.get("world_size", "?")
        )
        return step

    def _load_local(self) -> dict[str, Any] | None:
        if not self.path.exists():
            return None
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True)
            if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
                raise ValueError(f"not a checkpoint of format {CHECKPOINT_FORMAT}")
            return state
        except Exception as err:
            log.warning("ignoring the unreadable checkpoint %s: %s", self.path, err)
            return None

    def _share(self, local: dict[str, Any] | None) -> dict[str, Any] | None:
        steps: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(steps, -1 if local is None else int(local["step"]))
        newest = max(steps)
        if newest < 0:
            return None
        src = steps.index(newest)
        box: list[Any] = [local if dist.get_rank() == src else None]
        dist.broadcast_object_list(box, src)
        return dict(box[0])


__all__ = [
    "CHECKPOINT_FORMAT",
    "CudaProbe",
    "ElasticCheckpoint",
    "GradientStats",
    "StepTimer",
    "TorchHook",
    "batch_samples",
    "distributed",
    "is_peer_failure",
    "knob_sync",
    "oom_kind",
    "requested_bytes",
    "step_knobs",
    "world",
]
