"""The torch side of an in-place generation (``dlrover_events.sdk.torch.inplace``): the
process group a generation forms on its prefix of the job's store, and the DDP around the
training module, both made anew at every re-form and dropped before the next. Who is in
the generation is decided elsewhere; this only builds and tears down."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


class GenerationGroup:
    """This process's process group and DDP wrapper for the current generation.
    ``backend`` None: nccl when CUDA is there, gloo otherwise."""

    def __init__(
        self,
        backend: str | None,
        timeout_s: float,
        ddp_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        self.timeout_s = timeout_s
        self.ddp_kwargs = dict(ddp_kwargs or {})
        #: the DDP around the module while a generation is formed, else None
        self.ddp: torch.nn.Module | None = None

    @property
    def device(self) -> torch.device:
        """Where the collectives' tensors live for this backend."""
        if self.backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def form(self, store: dist.Store, rank: int, world_size: int) -> None:
        """Join the process group of a generation on ``store`` (its prefix of the job's
        store). Raises what torch raises when a member does not come."""
        dist.init_process_group(
            self.backend,
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=self.timeout_s),
        )

    def wrap(self, module: torch.nn.Module) -> None:
        """DDP around ``module`` for this generation; ``init_sync=False``: the members'
        state is the same already (from the checkpoint or by broadcast)."""
        self.ddp = DistributedDataParallel(module, init_sync=False, **self._ddp_args())

    def teardown(self) -> None:
        """Drop the DDP and destroy the process group (errors ignored: a group whose peer
        is lost may not destroy cleanly, and the next is formed on a new prefix)."""
        self.ddp = None
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()

    def _ddp_args(self) -> dict[str, Any]:
        args = dict(self.ddp_kwargs)
        if self.backend == "nccl":
            args.setdefault("device_ids", [self.device.index])
        return args


__all__ = ["GenerationGroup"]
