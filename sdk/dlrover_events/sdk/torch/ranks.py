"""This process's place in the torch world, and what a change of that world looks like:
the rank and size, a collective that failed because a peer left, and knobs switched on
every rank at the same step."""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.distributed as dist

from dlrover_events.sdk.knobs import KnobSync, KnobVector, StepKnobs

#: Words in the errors gloo and NCCL raise when a peer of a collective went away.
_PEER_LOST = re.compile(
    r"gloo|nccl|connection (reset|closed|refused)|broken pipe|processgroup|timed out|"
    r"socket|peer",
    re.IGNORECASE,
)


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


__all__ = ["distributed", "is_peer_failure", "knob_sync", "step_knobs", "world"]
