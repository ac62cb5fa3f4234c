"""Saving and resuming an elastic run across re-rendezvous (``ElasticCheckpoint``)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from dlrover_events.sdk.knobs import StepKnobs
from dlrover_events.sdk.torch.ranks import distributed, is_peer_failure, world

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = 1


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


__all__ = ["CHECKPOINT_FORMAT", "ElasticCheckpoint"]
