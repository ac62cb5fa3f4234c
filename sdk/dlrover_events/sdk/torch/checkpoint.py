"""Saving and resuming an elastic run across re-rendezvous (``ElasticCheckpoint``).

The step pays for a copy of what a forward pass changes (buffers, small tensors, the RNG
and the data's position) to host memory; the parameters and the optimizer's state are
copied behind the next forward and backward, and the optimizer's next ``step`` waits for
that copy (``wait_staged``); torch.distributed.checkpoint's ``save`` persists it in a
thread behind training, each rank writing its own part (no
gather on rank 0: a job whose state is sharded, FSDP2, saves as it is), and rank 0 commits
it by writing a manifest last (``dlrover_events.sdk.checkpoint_manifest``). A job resumed at
another world size loads the same checkpoint resharded by DCP. See docs/checkpoints.md.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import json
import logging
import os
import pickle
import random
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from dlrover_events.backoff import Backoff
from dlrover_events.sdk.checkpoint_manifest import (
    CHECKPOINT_FORMAT,
    LEGACY_FORMAT,
    MANIFEST,
    CheckpointError,
    Manifest,
    SaveReason,
    checkpoint_id,
    committed_event,
    newest_first,
    parse_manifest,
    part_sizes,
    refuse_parts,
    step_dir,
)
from dlrover_events.sdk.knobs import StepKnobs
from dlrover_events.sdk.torch.checkpoint_storage import Storage
from dlrover_events.sdk.torch.exiting import weak_handler
from dlrover_events.sdk.torch.ranks import distributed, is_peer_failure, world
from dlrover_events.sdk.torch.sampler import ElasticSampler

log = logging.getLogger(__name__)

#: Seconds from SIGTERM to SIGKILL that a save on SIGTERM must fit in: torchrun's agent
#: and Kubernetes both wait 30 s; the save keeps a margin for the process's own end.
DEFAULT_GRACE_S = 25.0
#: How long a persist that fails (storage down) is retried before it is given up; the
#: next due save starts again from the state of its step.
DEFAULT_RETRY_FOR_S = 600.0
RETRY_BACKOFF = Backoff(initial_s=1.0, max_s=30.0)


#: Called by rank 0 with each manifest it committed (the catalog's event is sent from it).
OnCommit = Callable[[Manifest, str], None]


#: One thread at a time imports DCP and what it brings: the prefetch behind training and
#: a save, a load or a check that needs a part of it now would import the circular
#: submodules of torch.distributed.checkpoint from two threads, which deadlocked a worker
#: under load once (test_sdk_checkpoint_stop, load 23).
_IMPORTING = threading.RLock()


def _imported(name: str) -> Any:
    """``importlib.import_module(name)``, one thread at a time (`_IMPORTING`)."""
    with _IMPORTING:
        return importlib.import_module(name)


def _dcp() -> Any:
    """torch.distributed.checkpoint, imported when a checkpoint is first saved or loaded:
    it brings DTensor, torch.fx and sympy, seconds of a worker's start (twice torch's
    own import on a loaded 2-core machine), which a job without a checkpoint, or one
    resuming from a format-1 file, does not pay."""
    return _imported("torch.distributed.checkpoint")


_prefetched = False


def _prefetch_dcp() -> None:
    """Import DCP behind training, from its first step boundary (not at the start: a
    worker's start is on a restart's critical path, and a job with a checkpoint to load
    imports it then anyway): by the first save it is there, and that step does not pay
    for it."""

    def load() -> None:
        try:
            _imported("torch.distributed.checkpoint.state_dict")
        except Exception:  # the save or load that needs it says why
            log.debug("torch.distributed.checkpoint not imported ahead", exc_info=True)

    global _prefetched
    if not _prefetched and "torch.distributed.checkpoint.state_dict" not in sys.modules:
        _prefetched = True
        threading.Thread(target=load, name="checkpoint-import", daemon=True).start()


def _failures() -> tuple[type[BaseException], ...]:
    """What a failed DCP save raises: its CheckpointException is a BaseException, not an
    Exception (it gathers every rank's errors)."""
    api = _imported("torch.distributed.checkpoint.api")
    return (Exception, api.CheckpointException)


def _has_dtensor(state: Any) -> bool:
    dtensor = _imported("torch.distributed.tensor").DTensor

    def has(value: Any) -> bool:
        if isinstance(value, dtensor):
            return True
        if isinstance(value, Mapping):
            return any(has(v) for v in value.values())
        if isinstance(value, list | tuple):
            return any(has(v) for v in value)
        return False

    return has(state)


def _rng_state() -> bytes:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    return pickle.dumps(state)


def _set_rng_state(blob: bytes) -> None:
    state = pickle.loads(blob)
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        with contextlib.suppress(Exception):  # another number of devices
            torch.cuda.set_rng_state_all(state["cuda"])
    numpy = sys.modules.get("numpy")
    if "numpy" in state and numpy is not None:
        numpy.random.set_state(state["numpy"])


class _HostCopy:
    """Host buffers the state is copied into at each save, allocated once: the step pays a
    memcpy, not an allocation (page faults of a fresh GB cost more than the copy)."""

    def __init__(self) -> None:
        self._buffers: dict[str, Any] | None = None
        self._shape: list[tuple[str, Any]] | None = None

    @staticmethod
    def _signature(state: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        for key, value in state.items():
            name = f"{prefix}{key}"
            if isinstance(value, torch.Tensor):
                local = getattr(value, "_local_tensor", value)
                out.append((name, (tuple(local.shape), local.dtype, type(value).__name__)))
            elif isinstance(value, Mapping):
                out.extend(_HostCopy._signature(value, f"{name}."))
            else:
                out.append((name, type(value).__name__))
        return out

    def stage(
        self, state: dict[str, Any]
    ) -> tuple[dict[str, Any], list[tuple[torch.Tensor, torch.Tensor]]]:
        """The staged state (``state`` with each tensor replaced by its host buffer) and
        the (buffer, source) pairs still to copy: the caller copies them, some now, some
        behind training."""
        from torch.distributed._state_dict_utils import _create_cpu_state_dict

        shape = self._signature(state)
        if self._buffers is None or shape != self._shape:
            pin = torch.cuda.is_available()
            self._buffers = _create_cpu_state_dict(state, pin_memory=pin)
            self._shape = shape
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        staged: dict[str, Any] = _pair(state, self._buffers, pairs)
        return staged, pairs

    def drop(self) -> None:
        self._buffers, self._shape = None, None


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard, or the tensor."""
    local: torch.Tensor = getattr(t, "_local_tensor", t)
    return local


def _pair(state: Any, buffers: Any, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """``state`` with each tensor replaced by its buffer (same structure), the (buffer,
    source) local tensors appended to ``pairs``; plain values are taken as they are (the
    state dicts are made anew at each save), others copied."""
    if isinstance(state, torch.Tensor):
        shards = getattr(state, "local_shards", None)
        if callable(shards):  # a ShardedTensor
            for mine, theirs in zip(buffers.local_shards(), shards(), strict=True):
                pairs.append((mine.tensor, theirs.tensor))
        else:
            pairs.append((_local(buffers), _local(state)))
        return buffers
    if isinstance(state, Mapping):
        return {k: _pair(v, buffers[k], pairs) for k, v in state.items()}
    if isinstance(state, list | tuple):
        out = [_pair(v, b, pairs) for v, b in zip(state, buffers, strict=True)]
        return tuple(out) if isinstance(state, tuple) else out
    if state is None or isinstance(state, int | float | str | bytes):
        return state
    return copy.deepcopy(state)


def _storage(t: torch.Tensor) -> int:
    """Where a tensor's memory is (0 when it has none to speak of)."""
    try:
        return int(_local(t).untyped_storage().data_ptr())
    except Exception:  # a tensor without a storage of its own: copied in the step
        return 0


def _before_step(checkpoint: ElasticCheckpoint) -> Callable[..., None]:
    """An optimizer's step pre-hook: its first change of the state waits for the copy of
    the checkpoint's save (``wait_staged``); it keeps no checkpoint alive."""
    ref = weakref.ref(checkpoint)

    def before_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        live = ref()
        if live is not None:
            live.wait_staged()

    return before_step


def _current_world() -> Any:
    """The torch world a save is taken in: its default group, compared by identity (None
    alone). A process group destroyed, or made anew, is another world."""
    return dist.group.WORLD if distributed() else None


def _waited(persist: _Persist) -> float:
    """How long training waited for the save's copy behind it (0.0: not at all)."""
    if persist.wait_from is None or persist.copied_at is None:
        return 0.0
    return max(persist.copied_at - persist.wait_from, 0.0)


@torch.no_grad()
def _copy(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    for dst, src in pairs:
        dst.copy_(src)


@dataclass(eq=False)  # compared by identity (wait_staged)
class _Persist:
    """One save behind training: DCP's save, its retries, rank 0's commit."""

    step: int
    name: str
    reason: SaveReason
    staged: dict[str, Any]
    blocking_s: float
    started: float
    world_size: int
    generation: int
    #: the torch world the save was taken in (``_current_world``) and this rank in it: its
    #: parts are written, and rank 0 commits, only while that world lasts
    world: Any = None
    rank: int = 0
    #: what the loop said at the save: the metrics and the plan whose knobs are in force
    metrics: dict[str, float] = field(default_factory=dict)
    plan_id: str | None = None
    #: (buffer, source) pairs the persist's thread copies first: the parameters and the
    #: optimizer's state, which only the optimizer's step changes
    behind: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    #: set once ``behind`` is copied (or the copy failed): what the optimizer's step waits for
    copied: threading.Event = field(default_factory=threading.Event)
    #: (perf_counter) when the training first waited for that copy, and when it ended:
    #: the wait, counted in the manifest's blocking time
    wait_from: float | None = None
    copied_at: float | None = None
    done: threading.Event = field(default_factory=threading.Event)
    committed: bool = False
    error: str | None = None
    thread: threading.Thread | None = None


class ElasticCheckpoint:
    """Save and resume a training run across re-rendezvous: model, optimizer, step, knobs,
    the data's position (an ``ElasticSampler``) and every rank's RNG.

    torchrun's agent restarts every worker when the world changes; the new workers start
    from this checkpoint, at whatever world size they now have, so training goes on from
    the step it saved instead of from 0.

    - ``path`` is the job's root: a local directory (every rank must see it: one machine,
      or a shared filesystem) or a URL fsspec opens (``s3://bucket/jobs/job-1``). Each
      checkpoint is ``<root>/step-<n>/``: every rank's part (DCP's format) and rank 0's
      ``manifest.json``, written last. A root that is a file (format 1, one torch.save by
      rank 0) is still read.
    - ``maybe_save(step)`` every ``every`` steps, at a step boundary, on every rank: the
      step waits for a copy to host memory of what a forward pass changes (buffers such
      as BatchNorm's running statistics, tensors under 64 KiB, the RNG, the data's
      position); the parameters and the optimizer's state that the optimizer holds are
      copied behind the next forward and backward, and that optimizer's next ``step``
      waits for the copy (a step pre-hook), so the checkpoint is the state as of the save.
      Whatever changes a parameter or the optimizer's state outside ``optimizer.step``
      (an in-place update, a ``load_state_dict``) calls ``wait_staged()`` first. The
      persist runs behind. At most one
      save is in flight: one due while the previous still persists is put off to the next
      boundary (training never waits for storage; the checkpoint is taken a few steps
      late), agreed by every rank so all save the same step.
    - SIGTERM (the agent's, before a re-rendezvous; a suspension's): at the next boundary
      every rank saves and waits for the commit, within ``grace_s`` of the signal;
      ``should_stop`` then tells the loop to leave. A second SIGTERM kills as the default.
    - ``on_peer_failure()`` saves when a collective fails because a peer left: rank 0
      alone, the previous step's state, when it is replicated (DDP); a sharded state
      cannot be saved without its peers and resumes from the last checkpoint.
    - A persist that fails (storage down) is retried with backoff for ``retry_for_s``
      and logged; training goes on meanwhile. A crash mid-persist leaves no manifest: the
      directory is passed over and the previous checkpoint loads.
    - ``restore()`` on every rank: rank 0 finds the newest committed checkpoint, every
      rank loads its part of it (resharded to this world); a torn manifest or a missing
      part is refused with ``CheckpointError`` (one line, naming the directory).
    - Each commit is reported by rank 0: ``CheckpointCommitted`` through ``reporter``
      (the SDK's reporter, to the env's catalog), and ``on_commit`` if given.
    """

    #: tensors smaller than this are copied in the step, whatever they are: their copy costs
    #: less than a wait, and code of the job's own may change one
    STAGE_BEHIND_BYTES = 64 * 1024

    def __init__(
        self,
        path: str | os.PathLike[str],
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        every: int = 100,
        knobs: StepKnobs | None = None,
        handle_sigterm: bool = True,
        sampler: ElasticSampler | None = None,
        reporter: Any = None,
        trial: Any = None,
        job: str | None = None,
        on_commit: OnCommit | None = None,
        grace_s: float = DEFAULT_GRACE_S,
        retry_for_s: float = DEFAULT_RETRY_FOR_S,
        backoff: Backoff = RETRY_BACKOFF,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.storage = Storage(path, storage_options)
        self.url = self.storage.url
        self.model = model
        self.optimizer = optimizer
        self.every = every
        self.knobs = knobs
        self.sampler = sampler
        self.reporter = reporter
        self.trial = trial
        self.job = (
            job
            or (reporter.identity.job.uuid if reporter is not None else "")
            or (Path(self.url).name or "job")
        )
        self.on_commit = on_commit
        self.grace_s = grace_s
        self.retry_for_s = retry_for_s
        self.backoff = backoff
        #: metrics at the next save (the catalog keeps them: retention's best, `model register
        #: --best`); set by the loop, e.g. after a validation
        self.metrics: dict[str, float] = {}
        #: the last completed step the loop told us of (the state a failure saves).
        self.step = 0
        #: the step of the newest checkpoint committed (or restored)
        self.saved_step: int | None = None
        #: saves committed by this process
        self.saves = 0
        #: due saves put off because the previous one was still persisting
        self.put_off = 0
        #: persists that failed an attempt (retried), and those given up
        self.persist_failures = 0
        self.given_up = 0
        #: the world size the checkpoint ``restore`` loaded was saved in (None: none loaded)
        self.restored_world_size: int | None = None
        #: the step's part of the last save: its copy in the step, plus any wait for the
        #: copy behind it (``wait_staged``, the optimizer's next step)
        self.last_blocking_s: float | None = None
        #: of which the last wait for the copy behind (0.0: it was done by then)
        self.last_staging_wait_s: float | None = None
        #: bytes of the last save copied behind training rather than in the step
        self.last_behind_bytes = 0
        self.last_persist_s: float | None = None
        self._started_step: int | None = None
        self._stop = False
        self._stop_at: float | None = None
        self._agreed_stop = False
        self._said_stop = False
        self._previous: Any = None
        self._host = _HostCopy()
        self._inflight: _Persist | None = None
        #: saves whose copy behind training is not known to be done (an abandoned one too)
        self._copying: list[_Persist] = []
        #: the optimizers whose step waits for that copy: id -> (optimizer, hook handle)
        self._hooked: dict[int, tuple[Any, Any]] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._world: Any = None
        self._control: Any = None
        self._persist_group: Any = None
        self._generation = 0
        if handle_sigterm:
            self.install_sigterm_handler()

    # -- stopping ------------------------------------------------------------------------

    @property
    def should_stop(self) -> bool:
        """True once the loop is to leave: in a torch world of more than one, once a step
        boundary (``maybe_save``) agreed on a SIGTERM (here or on another rank) and saved
        that step; alone, as soon as the SIGTERM came.

        Never on this rank's own signal alone in a world: the signal lands at any moment,
        also just after a boundary's agreement (its all-reduce is where a rank waits, so
        the handler runs as it returns), and a rank leaving then would leave its peers in
        the next step's collectives, the stop's save not taken by anyone (seen under load
        in a suspension: one rank out at step 38 unsaved, its peer lost). It waits for the
        next boundary, which every rank reaches and saves at. A wait outside the loop
        that must end on the signal itself asks ``stop_requested``."""
        stop = self._agreed_stop or (self._stop and world()[1] < 2)
        if stop and not self._said_stop:
            self._said_stop = True
            log.info("SIGTERM: step %d saved, stopping (a re-rendezvous is coming)", self.step)
        return stop

    @property
    def stop_requested(self) -> bool:
        """Whether this process got SIGTERM (or ``request_stop``), agreed or not: for a wait
        outside the training loop that the signal must end and whose decision the caller
        shares with the other ranks (``TrialSync.wait_for_budget``'s ``stop``, asked on
        rank 0). A training loop asks ``should_stop``."""
        return self._stop

    def request_stop(self) -> None:
        self._stop = True
        self._stop_at = self._stop_at or time.monotonic()

    def install_sigterm_handler(self) -> bool:
        """Make SIGTERM stop the loop at the next step boundary; only the main thread can."""
        if threading.current_thread() is not threading.main_thread():
            log.warning("not in the main thread: SIGTERM will not save a checkpoint")
            return False
        self._previous = signal.signal(signal.SIGTERM, weak_handler(self._on_sigterm))
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
        self._stop_at = time.monotonic()
        self._stop = True  # nothing else here: a signal handler must not take locks

    # -- the torch world's groups ----------------------------------------------------------

    def _groups(self) -> tuple[Any, Any]:
        """(control, persist) gloo groups of this world, or (None, None) alone (the persist
        needs a group with a CPU backend: a job on NCCL alone has none). The persist has
        its own group: DCP's collectives run in a thread while training's run in the
        default group, and two threads must not share a group. Made anew when the world
        is (in place, each generation has its own default group); a collective of all."""
        if not distributed():
            return None, None
        current = dist.group.WORLD
        if current is not self._world:
            timeout = timedelta(seconds=max(self.retry_for_s, 120.0))
            self._control = dist.new_group(backend="gloo", timeout=timeout)
            self._persist_group = dist.new_group(backend="gloo", timeout=timeout)
            self._world = current
            self._generation += 1
        return self._control, self._persist_group

    def _agree(self, stop: bool, busy: bool) -> tuple[bool, bool]:
        """Whether any rank is stopping, any still persisting: one small all-reduce on the
        control group, so every rank saves (or puts off) the same step."""
        control, _ = self._groups()
        if control is None or dist.get_world_size() < 2:
            return stop, busy
        flags = torch.tensor([int(stop), int(busy)], dtype=torch.int64)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=control)
        return bool(flags[0]), bool(flags[1])

    # -- saving --------------------------------------------------------------------------

    def maybe_save(self, step: int, *, metrics: Mapping[str, float] | None = None) -> bool:
        """At a step boundary (``step`` steps done), on every rank: save every ``every``
        steps, or when stopping (then wait for the commit). True when a save started (or,
        stopping, was committed). Never raises for storage: the training goes on."""
        self.step = step
        if metrics:
            self.metrics = dict(metrics)
        if self._started_step is None and self.saved_step is None:
            _prefetch_dcp()  # training runs: import DCP behind it before the first save
        last = self._started_step if self._started_step is not None else (self.saved_step or 0)
        due = step - last >= self.every
        busy = self._inflight is not None and not self._inflight.done.is_set()
        try:
            stop, busy = self._agree(self._stop, busy)
        except RuntimeError as err:
            if not is_peer_failure(err):
                raise
            log.warning("a peer left at step %d: %s", step, str(err).splitlines()[0][:200])
            self.save_alone(step)
            raise
        if stop and not self._agreed_stop:
            self._agreed_stop = True
            self._stop_at = self._stop_at or time.monotonic()
        if stop:
            if self.saved_step == step:
                return True
            return self.save(step, reason=SaveReason.SIGTERM, wait=True)
        if not due:
            return False
        if busy:
            self.put_off += 1
            log.debug("checkpoint of step %d put off: step %s still persisting", step, last)
            return False
        return self._begin(step, SaveReason.PERIODIC)

    def save(
        self,
        step: int | None = None,
        *,
        wait: bool = True,
        reason: SaveReason = SaveReason.MANUAL,
    ) -> bool:
        """Save now, on every rank (a collective, like every DCP save). With ``wait``
        (the default) it returns once committed: True then; False when it failed (logged,
        never raised: a full disk must not end the training it was meant to protect)."""
        step = self.step if step is None else step
        self.step = step
        if not self._wait_done(self._deadline()):
            log.error(
                "the persist of step %s did not end in time; saving step %d anew",
                self._inflight.step if self._inflight else "?",
                step,
            )
            self._abandon()
        if self.saved_step == step:
            return False
        if not self._begin(step, reason):
            return False
        if not wait:
            return True
        self._wait_done(None)
        return self._inflight is not None and self._inflight.committed

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait for the save in flight to commit (or be given up); True when none is left
        in flight and the last one committed."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        if not self._wait_done(deadline):
            return False
        return self._inflight is None or self._inflight.committed

    def wait_staged(self, timeout_s: float | None = None) -> bool:
        """Wait until the state of the last save is copied to host memory: after it, the
        parameters and the optimizer's state may change without reaching the checkpoint.

        The optimizer's ``step`` calls it (a step pre-hook on each optimizer the
        checkpoint saves); whatever else changes a parameter or the optimizer's state in
        place (an update outside the optimizer, an exponential average written into the
        model, a ``load_state_dict``) must call it first. True when no copy is left;
        False when ``timeout_s`` passed first. The wait counts in the save's blocking time."""
        t0 = time.perf_counter()
        with self._lock:  # the copy's end is marked under it too (_persist)
            pending = [p for p in self._copying if not p.copied.is_set()]
            self._copying = pending
            for persist in pending:
                persist.wait_from = persist.wait_from or t0
        if not pending:
            return True
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        ok = self._wait_copies(pending, deadline)
        waited = time.perf_counter() - t0
        if self._inflight in pending:
            self.last_staging_wait_s = waited
            self.last_blocking_s = (self.last_blocking_s or 0.0) + waited
        return ok

    def _wait_copies(self, pending: list[_Persist], deadline: float | None) -> bool:
        ok = True
        for persist in pending:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ok = persist.copied.wait(left) and ok
        return ok

    def _optimizers(self) -> list[Any]:
        if self.optimizer is None:
            return []
        if isinstance(self.optimizer, torch.optim.Optimizer):
            return [self.optimizer]
        try:
            return list(self.optimizer)
        except TypeError:
            return [self.optimizer]

    def _behind(self) -> set[int]:
        """The storages that may be copied behind training: those of the parameters and
        of the state of each optimizer whose step waits for the copy (hooked here at the
        first save). Anything else (buffers, a parameter no hooked optimizer holds) is
        copied in the step: a forward pass, or code of the job's own, may change it."""
        storages: set[int] = set()
        for opt in self._optimizers():
            if id(opt) not in self._hooked:
                register = getattr(opt, "register_step_pre_hook", None)
                if register is None:
                    continue  # no hook to wait in: its tensors are copied in the step
                self._hooked[id(opt)] = (opt, register(_before_step(self)))
            for group in opt.param_groups:
                storages.update(_storage(p) for p in group["params"])
            for per_param in opt.state.values():
                if isinstance(per_param, Mapping):
                    storages.update(
                        _storage(v) for v in per_param.values() if isinstance(v, torch.Tensor)
                    )
        storages.discard(0)
        return storages

    def close(self, timeout_s: float | None = None) -> bool:
        """Wait for the save in flight, then stop retrying (the process is ending)."""
        ok = self.wait(timeout_s)
        self._closing.set()
        return ok

    def _deadline(self) -> float | None:
        if self._stop_at is None:
            return None
        return self._stop_at + self.grace_s

    def _wait_done(self, deadline: float | None) -> bool:
        """Whether the save in flight (if any) has ended, committed or given up."""
        persist = self._inflight
        if persist is None:
            return True
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        return persist.done.wait(left)

    def _abandon(self) -> None:
        """Leave a persist that does not end (it keeps its buffers): later saves copy into
        new ones, and its retries stop."""
        persist = self._inflight
        if persist is not None:
            persist.generation = -1
            self._host = _HostCopy()
            self._inflight = None

    def _state(self, step: int) -> tuple[dict[str, Any], bool]:
        rank = world()[0]
        api = _imported("torch.distributed.checkpoint.state_dict")
        get_model_state_dict, get_state_dict = api.get_model_state_dict, api.get_state_dict

        if self.optimizer is not None:
            model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        else:
            model_sd, optim_sd = get_model_state_dict(self.model), None
        progress = self.progress(step)
        # rank 0's progress alone: its knobs carry the plan it applied (the other ranks got
        # the numbers, not the plan), and DCP would keep any one rank's copy of a key
        state: dict[str, Any] = {"model": model_sd, f"rng_rank{rank}": _rng_state()}
        if rank == 0:
            state["progress"] = json.dumps(progress)
        if optim_sd is not None:
            state["optim"] = optim_sd
        return state, _has_dtensor(model_sd)

    def _begin(self, step: int, reason: SaveReason) -> bool:
        """The blocking part: the copy to host memory of what a forward pass may change,
        and the persist's start; the parameters and optimizer state the hooked optimizers
        hold (tensors of ``STAGE_BEHIND_BYTES`` or more) are copied first in the persist's
        thread, while training computes the next forward and backward (``wait_staged``).

        DCP's save (its planning, the plans' collectives on the persist group, the
        write) runs whole in the persist's thread, not through ``async_save``: that
        one would make its own executor and thread and run its stager in the step
        (35 ms of a 500 MB save's 0.77 s blocking here), for a copy already made."""
        t0 = time.perf_counter()
        name = step_dir(step)
        try:
            self._groups()
            state, sharded = self._state(step)
            behind = self._behind()  # after _state: DCP may have made the optimizer's state
            staged, pairs = self._host.stage(state)
            now: list[tuple[torch.Tensor, torch.Tensor]] = []
            later: list[tuple[torch.Tensor, torch.Tensor]] = []
            for dst, src in pairs:
                big = src.numel() * src.element_size() >= self.STAGE_BEHIND_BYTES
                (later if big and _storage(src) in behind else now).append((dst, src))
            _copy(now)
        except Exception as err:
            if isinstance(err, RuntimeError) and is_peer_failure(err):
                raise
            log.error("checkpoint of step %d not started at %s: %s", step, self.url, err)
            return False
        blocking = time.perf_counter() - t0
        self.last_blocking_s = blocking
        self.last_staging_wait_s = 0.0
        self.last_behind_bytes = sum(src.numel() * src.element_size() for _, src in later)
        self._started_step = step
        persist = _Persist(
            step=step,
            name=name,
            reason=reason,
            staged=staged,
            blocking_s=blocking,
            started=time.perf_counter(),
            world_size=world()[1],
            generation=self._generation,
            world=_current_world(),
            rank=world()[0],
            metrics=dict(self.metrics),
            plan_id=getattr(self.knobs, "applied_plan_id", None),
            behind=later,
        )
        if not later:
            persist.copied.set()
        persist.thread = threading.Thread(
            target=self._persist,
            args=(persist, sharded),
            name=f"checkpoint-{step}",
            daemon=False,  # an ending process waits for its last save (bounded by retries)
        )
        self._inflight = persist
        if later:
            with self._lock:
                self._copying.append(persist)
        persist.thread.start()
        return True

    def _copy_behind(self, persist: _Persist) -> None:
        """In the persist's thread, before DCP's save: the tensors left to copy."""
        _copy(persist.behind)

    def _persist(self, persist: _Persist, sharded: bool) -> None:
        """Behind training: wait for DCP's write, retry it, and (rank 0) commit."""
        failures = 0
        give_up_at = time.monotonic() + self.retry_for_s
        metadata = None
        try:
            try:
                if persist.behind:
                    self._copy_behind(persist)
            except Exception as err:
                persist.error = f"not copied to host memory: {err}"
                log.error("checkpoint of step %d: %s", persist.step, persist.error)
                return
            finally:
                persist.behind = []
                with self._lock:
                    persist.copied_at = time.perf_counter()
                    persist.copied.set()
            while True:
                if self._world_gone(persist):
                    return
                try:
                    metadata = self._save(persist)
                    if self._world_gone(persist):
                        return  # it may have been saved alone, this rank's part as a whole
                    break
                except _failures() as err:
                    failures += 1
                    self.persist_failures += 1
                    delay = self.backoff.delay(failures)
                    gone = persist.generation != self._generation or self._closing.is_set()
                    if gone or time.monotonic() + delay > give_up_at:
                        self.given_up += 1
                        persist.error = str(err).splitlines()[0][:300] if str(err) else repr(err)
                        log.error(
                            "checkpoint of step %d given up after %d tries: %s",
                            persist.step,
                            failures,
                            persist.error,
                        )
                        return
                    log.warning(
                        "checkpoint of step %d: persist failed (try %d, again in %.0f s): %s",
                        persist.step,
                        failures,
                        delay,
                        str(err).splitlines()[0][:300] if str(err) else repr(err),
                    )
                    if self._closing.wait(delay):
                        persist.error = "closed while retrying"
                        return
            if persist.rank == 0:
                self._commit(persist, metadata, sharded, give_up_at)
            persist.committed = persist.error is None
            if persist.committed:
                self.saved_step = max(persist.step, self.saved_step or 0)
                self.saves += 1
        finally:
            persist.staged = {}
            persist.copied.set()
            persist.done.set()

    def _world_gone(self, persist: _Persist) -> bool:
        """Give the persist up when the world it was taken in is gone (its process group
        destroyed after a peer was lost, as the process ends, or re-formed in place): DCP,
        called without an initialised process group, saves this rank's part alone as if
        it were the whole checkpoint, and this rank, rank 0 of no world, would commit it.
        A rank 1 that did so after its store's host died, from the thread an exiting
        worker waited for, committed a checkpoint without rank 0's progress and RNG, which
        every restarted worker then failed to load. The checkpoint before it is the one to
        resume from."""
        if persist.world is _current_world():
            return False
        persist.error = "its torch world is gone"
        self.given_up += 1
        log.warning("checkpoint of step %d given up: %s", persist.step, persist.error)
        return True

    def _save(self, persist: _Persist) -> Any:
        return _dcp().save(
            persist.staged,
            storage_writer=self.storage.writer(persist.name),
            process_group=self._persist_group,
        )

    def _commit(self, persist: _Persist, metadata: Any, sharded: bool, give_up_at: float) -> None:
        """Rank 0, once every part is persisted: the manifest, then the report."""
        failures = 0
        while True:
            try:
                sizes = self.storage.sizes(persist.name)
                sizes.pop(MANIFEST, None)
                expected = part_sizes(getattr(metadata, "storage_data", None) or {})
                short = [n for n, s in expected.items() if sizes.get(n, -1) < s]
                if short:
                    raise OSError(f"parts not all on storage after the write: {short[:3]}")
                persist_s = time.perf_counter() - persist.started
                manifest = Manifest(
                    checkpoint_id=checkpoint_id(self.job, persist.step),
                    job=self.job,
                    step=persist.step,
                    world_size=persist.world_size,
                    saved_at=time.time(),
                    reason=persist.reason,
                    blocking_s=round(persist.blocking_s + _waited(persist), 6),
                    persist_s=round(persist_s, 6),
                    files=sizes,
                    sharded=sharded,
                    plan_id=persist.plan_id,
                    metrics=persist.metrics,
                )
                self.storage.write_manifest(persist.name, manifest.model_dump_json().encode())
                break
            except Exception as err:
                failures += 1
                self.persist_failures += 1
                delay = self.backoff.delay(failures)
                if time.monotonic() + delay > give_up_at or self._closing.is_set():
                    persist.error = f"manifest not written: {err}"
                    self.given_up += 1
                    log.error("checkpoint of step %d: %s", persist.step, persist.error)
                    return
                log.warning(
                    "checkpoint of step %d: manifest not written (try %d, again in %.0f s): %s",
                    persist.step,
                    failures,
                    delay,
                    err,
                )
                if self._closing.wait(delay):
                    persist.error = "closed while retrying"
                    return
        self.last_persist_s = manifest.persist_s
        log.info(
            "checkpoint of step %d committed at %s (%.1f MB, blocking %.3f s, persist %.2f s)",
            persist.step,
            self.storage.join(persist.name),
            manifest.size_bytes / 1e6,
            manifest.blocking_s,
            manifest.persist_s,
        )
        self._report(manifest, self.storage.join(persist.name))

    def _report(self, manifest: Manifest, url: str) -> None:
        if self.reporter is not None:
            try:
                spec = getattr(self.trial, "spec", self.trial)
                event = committed_event(
                    manifest,
                    url,
                    self.reporter.identity,
                    getattr(spec, "experiment", None),
                    getattr(spec, "index", None),
                )
                self.reporter.publish(event)
            except Exception:
                log.exception("checkpoint of step %d not reported", manifest.step)
        if self.on_commit is not None:
            try:
                self.on_commit(manifest, url)
            except Exception:
                log.exception("on_commit failed for the checkpoint of step %d", manifest.step)

    def save_alone(self, step: int) -> bool:
        """Rank 0 saves the replicated state without its peers (one left): synchronously,
        no collective. A sharded state cannot (its other parts are on the peers)."""
        if world()[0] != 0 or self.saved_step == step:
            return False
        try:
            state, sharded = self._state(step)
            if sharded:
                log.warning("a peer left: a sharded state cannot be saved without it")
                return False
            self._abandon()
            t0 = time.perf_counter()
            name = step_dir(step)
            metadata = _dcp().save(state, storage_writer=self.storage.writer(name), no_dist=True)
            persist = _Persist(
                step=step,
                name=name,
                reason=SaveReason.SIGTERM if self._stop else SaveReason.MANUAL,
                staged={},
                blocking_s=time.perf_counter() - t0,
                started=t0,
                world_size=world()[1],
                generation=self._generation,
                metrics=dict(self.metrics),
                plan_id=getattr(self.knobs, "applied_plan_id", None),
            )
            self._commit(persist, metadata, False, time.monotonic() + min(self.grace_s, 10.0))
        except _failures() as err:
            log.error("checkpoint of step %d not written to %s: %s", step, self.url, err)
            return False
        if persist.error is not None:
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
                self.save_alone(self.step)
            raise

    # -- resuming ------------------------------------------------------------------------

    def committed(self) -> list[Manifest]:
        """The committed checkpoints under the root, newest first (CheckpointError for a
        torn manifest)."""
        return _committed(self.storage)

    def _choose(self) -> tuple[str, str] | None:
        """(directory, manifest) of the newest committed checkpoint; CheckpointError for a
        newest one with a torn manifest or a missing part."""
        for _, name in newest_first(self.storage.names()):
            text = self.storage.read(name, MANIFEST)
            where = self.storage.join(name)
            if text is None:
                log.info("passing over %s: no manifest (a persist that did not finish)", where)
                continue
            manifest = parse_manifest(text, where)
            refuse_parts(manifest, self.storage.sizes(name), where)
            return name, manifest.model_dump_json()
        return None

    def restore(self) -> int:
        """Load the newest committed checkpoint into every rank, resharded to this world;
        the step to go on from (0 without one). Every rank must call it (collectives, in a
        torch world). CheckpointError (one line) when the newest one is refused."""
        if self.storage.is_legacy_file():
            return self._restore_legacy()
        control, group = self._groups()
        choice: Any = None
        if world()[0] == 0:
            try:
                choice = self._choose()
            except CheckpointError as err:
                choice = ("error", str(err))
        if control is not None and dist.get_world_size() > 1:
            box = [choice]
            dist.broadcast_object_list(box, src=0, group=control)
            choice = box[0]
        if choice is None:
            return 0
        if choice[0] == "error":
            raise CheckpointError(choice[1])
        name, text = choice
        manifest = Manifest.model_validate_json(text)
        self._load(name, manifest, group)
        self.step = self.saved_step = manifest.step
        self._started_step = manifest.step
        self.restored_world_size = manifest.world_size
        log.info(
            "resumed from step %d (saved in a world of %d) at %s",
            manifest.step,
            manifest.world_size,
            self.storage.join(name),
        )
        return manifest.step

    def _load(self, name: str, manifest: Manifest, group: Any) -> None:
        self.wait_staged()  # the load writes into the model and the optimizer
        rank = world()[0]
        state, _ = self._state(manifest.step)
        saved = set(self.storage.reader(name).read_metadata().state_dict_metadata)
        # this rank's RNG when it was in the world that saved (rank 0's for a newcomer, or
        # when rank 0 saved alone)
        rng_key = f"rng_rank{rank}" if f"rng_rank{rank}" in saved else "rng_rank0"
        state.pop(f"rng_rank{rank}", None)
        state[rng_key] = b""
        state["progress"] = ""
        if not any(k.startswith("optim.") for k in saved):
            state.pop("optim", None)  # saved without an optimizer: this one starts afresh
        _dcp().load(state, storage_reader=self.storage.reader(name), process_group=group)
        api = _imported("torch.distributed.checkpoint.state_dict")
        set_model_state_dict, set_state_dict = api.set_model_state_dict, api.set_state_dict

        if "optim" in state and self.optimizer is not None:
            set_state_dict(
                self.model,
                self.optimizer,
                model_state_dict=state["model"],
                optim_state_dict=state["optim"],
            )
        else:
            set_model_state_dict(self.model, state["model"])
        self.take_progress(json.loads(state["progress"]), manifest.step)
        _set_rng_state(state[rng_key])

    # -- the progress: what a checkpoint holds besides tensors -------------------------------

    def progress(self, step: int) -> dict[str, Any]:
        """The step, knobs and data position of this rank at ``step``: what a checkpoint
        keeps beside the tensors, and what an in-place newcomer takes from a member
        (``InPlaceGroup``), so a resume from storage and one from a peer go on alike."""
        return {
            "format": CHECKPOINT_FORMAT,
            "step": step,
            "world_size": world()[1],
            "knobs": self.knobs.state_dict() if self.knobs is not None else None,
            "sampler": self.sampler.state_dict() if self.sampler is not None else None,
        }

    def take_progress(self, progress: Mapping[str, Any], step: int) -> None:
        """Go on from a saved or a member's ``progress``: its knobs (kept at the global
        batch in this world) and the sampler's position."""
        if self.knobs is not None and progress.get("knobs"):
            self.knobs.load_state_dict(progress["knobs"], step)
        if self.sampler is not None and progress.get("sampler"):
            self.sampler.load_state_dict(progress["sampler"])

    # -- format 1: one torch.save file by rank 0 -------------------------------------------

    def _restore_legacy(self) -> int:
        self.wait_staged()
        local = self._load_legacy()
        state = local
        if distributed() and dist.get_world_size() > 1:
            state = self._share_legacy(local)
        if state is None:
            return 0
        getattr(self.model, "module", self.model).load_state_dict(state["model"])
        if self.optimizer is not None and state.get("optimizer") is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        step = int(state["step"])
        saved_world = state.get("world_size")
        self.restored_world_size = int(saved_world) if saved_world is not None else None
        if self.knobs is not None and state.get("knobs"):
            self.knobs.load_state_dict(state["knobs"], step)
        self.step = step
        log.info("resumed from step %d of the format-1 file %s", step, self.url)
        return step

    def _load_legacy(self) -> dict[str, Any] | None:
        try:
            state = torch.load(self.url, map_location="cpu", weights_only=True)
            if not isinstance(state, dict) or state.get("format") != LEGACY_FORMAT:
                raise ValueError(f"not a checkpoint of format {LEGACY_FORMAT}")
            return state
        except Exception as err:
            log.warning("ignoring the unreadable checkpoint %s: %s", self.url, err)
            return None

    def _share_legacy(self, local: dict[str, Any] | None) -> dict[str, Any] | None:
        """The rank holding the newest file (by step, rank 0 on a tie) sends it to all:
        format 1 lay on each node's own disk."""
        steps: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(steps, -1 if local is None else int(local["step"]))
        newest = max(steps)
        if newest < 0:
            return None
        src = steps.index(newest)
        box: list[Any] = [local if dist.get_rank() == src else None]
        dist.broadcast_object_list(box, src)
        return dict(box[0])


def list_checkpoints(
    root: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
) -> list[Manifest]:
    """The committed checkpoints of a job's root, newest first (CheckpointError for a torn
    manifest)."""
    return _committed(Storage(root, storage_options))


def _committed(storage: Storage) -> list[Manifest]:
    found = []
    for _, name in newest_first(storage.names()):
        text = storage.read(name, MANIFEST)
        if text is not None:
            found.append(parse_manifest(text, storage.join(name)))
    return found


__all__ = [
    "CHECKPOINT_FORMAT",
    "DEFAULT_GRACE_S",
    "CheckpointError",
    "ElasticCheckpoint",
    "SaveReason",
    "list_checkpoints",
]
