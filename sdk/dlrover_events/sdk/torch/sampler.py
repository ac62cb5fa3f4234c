"""A sampler whose global order of samples does not depend on the world size.

torch's ``DistributedSampler`` deals the epoch's permutation round-robin over the ranks:
at another world size every rank sees other samples, and a resized job trains on other
batches than it would have. ``ElasticSampler`` cuts the epoch's permutation (seeded by
seed and epoch alone) into global batches of a fixed size and gives rank ``r`` of ``W``
the ``r``-th contiguous slice of each: the global batch at a position is the same set of
samples at any world size, so a DDP job at a fixed global batch (gradients averaged
over ranks) takes the same steps after 4 -> 2 -> 4 as a run never resized, up to the
float error of summing in another order (EasyScale's consistency).

Its position (samples consumed since the start, epochs included) is global too: it is
what a checkpoint saves (``ElasticCheckpoint(sampler=...)``) and any world resumes from.
The rank and world size are read from the torch world at each iteration (set them to
pin), so a job re-formed in place deals the next batch over its new world.

Iterated (``DataLoader(ds, batch_size=sampler.local_batch_size, sampler=sampler)``) it
yields this rank's indices from its position to the end of the epoch and counts a global
batch consumed once this rank's slice of it is taken: exact with ``num_workers=0``; a
loader with workers prefetches ahead, so call ``local_batch()`` and ``advance()`` in the
loop instead where the position must be exact.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Sampler

from dlrover_events.sdk.torch.ranks import world


def epoch_order(size: int, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    """The epoch's global order of sample indices: a function of (size, seed, epoch)."""
    if not shuffle:
        return list(range(size))
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return [int(i) for i in torch.randperm(size, generator=gen)]


def rank_slice(global_batch: list[int], rank: int, world_size: int) -> list[int]:
    """Rank ``rank``'s contiguous part of a global batch the world divides evenly."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of {world_size}")
    if len(global_batch) % world_size:
        raise ValueError(
            f"a global batch of {len(global_batch)} does not divide over {world_size} ranks"
        )
    local = len(global_batch) // world_size
    return global_batch[rank * local : (rank + 1) * local]


class ElasticSampler(Sampler[int]):
    """Indices for this rank, in a global order independent of the world size."""

    def __init__(
        self,
        size: int,
        global_batch_size: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        if size < global_batch_size or global_batch_size < 1:
            raise ValueError(
                f"a global batch of {global_batch_size} needs 1 to {size} samples (the "
                "dataset's size)"
            )
        self.size = size
        self.global_batch_size = global_batch_size
        self.seed = seed
        self.shuffle = shuffle
        self._rank, self._world_size = rank, world_size
        #: samples consumed since the start, all epochs (global: every rank agrees)
        self.position = 0
        self._order: tuple[int, list[int]] | None = None

    # -- where it is -----------------------------------------------------------------------

    @property
    def batches_per_epoch(self) -> int:
        """Global batches in an epoch: the remainder of the permutation is dropped, so
        every global batch is whole and divides over the ranks alike."""
        return self.size // self.global_batch_size

    @property
    def epoch(self) -> int:
        return self.position // (self.batches_per_epoch * self.global_batch_size)

    def place(self) -> tuple[int, int]:
        """(rank, world size): pinned, or the torch world's now."""
        rank, size = world()
        return (
            self._rank if self._rank is not None else rank,
            self._world_size if self._world_size is not None else size,
        )

    @property
    def local_batch_size(self) -> int:
        size = self.place()[1]
        if self.global_batch_size % size:
            raise ValueError(
                f"a global batch of {self.global_batch_size} does not divide over {size} ranks"
            )
        return self.global_batch_size // size

    def global_batch(self, position: int | None = None) -> list[int]:
        """The global batch at ``position`` (default: the current one), every rank's."""
        pos = self.position if position is None else position
        per_epoch = self.batches_per_epoch * self.global_batch_size
        epoch, offset = divmod(pos, per_epoch)
        if offset % self.global_batch_size:
            raise ValueError(f"position {pos} is not at a global batch's start")
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, epoch_order(self.size, self.seed, epoch, self.shuffle))
        return self._order[1][offset : offset + self.global_batch_size]

    def local_batch(self) -> list[int]:
        """This rank's indices of the current global batch (the position does not move)."""
        rank, size = self.place()
        return rank_slice(self.global_batch(), rank, size)

    def advance(self, batches: int = 1) -> None:
        """``batches`` global batches consumed (after an optimizer step)."""
        self.position += batches * self.global_batch_size

    # -- torch's Sampler ---------------------------------------------------------------------

    def __iter__(self) -> Iterator[int]:
        end = (self.epoch + 1) * self.batches_per_epoch * self.global_batch_size
        while self.position < end:
            batch = self.local_batch()
            self.advance()
            yield from batch

    def __len__(self) -> int:
        per_epoch = self.batches_per_epoch * self.global_batch_size
        left = per_epoch - self.position % per_epoch
        return left // self.global_batch_size * self.local_batch_size

    # -- what a checkpoint keeps ---------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "size": self.size,
            "global_batch_size": self.global_batch_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from a saved position. Another dataset size, seed or order would make it
        another sequence of batches: refused (ValueError names which)."""
        for key in ("size", "seed", "shuffle"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"the checkpoint's sampler has {key}={state[key]!r}, this one "
                    f"{getattr(self, key)!r}: the order of samples would not go on"
                )
        self.position = int(state["position"])


__all__ = ["ElasticSampler", "epoch_order", "rank_slice"]
