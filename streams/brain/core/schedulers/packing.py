"""Where goodput-cluster's replica counts go on the nodes: the whole-node rule, kept places.

A job of at most a node's GPUs runs on one node; a larger one on whole nodes of
`gpus_per_node` GPUs (Pollux's rule: a gang split unevenly across nodes runs at the pace
of its slowest all-reduce). goodput-cluster's search hands out GPUs one step at a time
and must know after every step whether the counts still fit, so this module has two
parts:

- `pack`: counts to placements from scratch, keeping every job that keeps its count where
  it is when it can (else moving everyone), the largest gangs first, each on the node
  where it fits most tightly (its own first). What a round finally places.
- `Packing`: a placement that takes one job's growth at a time, in place when its node
  has room, else on the tightest node that fits it, in O(GPUs per node) rather than a
  repack of every job: what a search step asks.

Free GPUs are kept per node and bucketed by how many, so the tightest node that fits r
GPUs is the first node of the first non-empty bucket from r up.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from streams.brain.core.schedulers.api import ClusterCapacity, Placement

#: A job's place as node indices and GPUs on each, in node order.
Slots = tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class PackedJob:
    """What packing needs of a job: where it is now (node names), whether it keeps its
    count this time (then it stays there if the stable pass can), and the type of GPU
    it must run on (None: any)."""

    placement: Placement
    current: int
    gpu_type: str | None = None


class Packing:
    """Free GPUs per node and where each job sits, changed one job at a time."""

    __slots__ = ("buckets", "free", "per_node", "size", "types", "where")

    def __init__(
        self, size: Sequence[int], per_node: int, types: Sequence[str | None] = ()
    ) -> None:
        self.per_node = per_node
        self.size = list(size)
        self.free = list(size)
        self.types: list[str | None] = list(types) or [None] * len(self.size)
        #: GPU type (None: every node) -> free GPUs -> the nodes with that many free,
        #: in node order
        self.buckets: dict[str | None, list[list[int]]] = {}
        for kind in {None, *self.types}:
            self.buckets[kind] = [[] for _ in range(per_node + 1)]
        for i, f in enumerate(self.free):
            self.buckets[None][f].append(i)
            if self.types[i] is not None:
                self.buckets[self.types[i]][f].append(i)
        self.where: dict[str, Slots] = {}

    def _set_free(self, i: int, f: int) -> None:
        kinds = (None,) if self.types[i] is None else (None, self.types[i])
        for kind in kinds:
            buckets = self.buckets[kind]
            bucket = buckets[self.free[i]]
            del bucket[bisect.bisect_left(bucket, i)]
            bisect.insort(buckets[f], i)
        self.free[i] = f

    def take(self, key: str, slots: Slots) -> None:
        for i, g in slots:
            self._set_free(i, self.free[i] - g)
        self.where[key] = slots

    def release(self, key: str) -> Slots:
        slots = self.where.pop(key, ())
        for i, g in slots:
            self._set_free(i, self.free[i] + g)
        return slots

    def tightest(self, r: int, own: Iterable[int] = (), gpu_type: str | None = None) -> int | None:
        """The node for a gang of r GPUs on one node (of `gpu_type`, if given): one of
        `own` with room (the tightest, first on ties), else the tightest node with room
        (first on ties)."""
        buckets = self.buckets.get(gpu_type)
        if buckets is None:
            return None
        mine = [
            (self.free[i], i)
            for i in own
            if self.free[i] >= r and (gpu_type is None or self.types[i] == gpu_type)
        ]
        if mine:
            return min(mine)[1]
        for f in range(r, self.per_node + 1):
            if buckets[f]:
                return buckets[f][0]
        return None

    def whole(
        self,
        k: int,
        first: Sequence[int] = (),
        last: Iterable[int] = (),
        gpu_type: str | None = None,
    ) -> list[int] | None:
        """k whole free nodes (of `gpu_type`, if given) in node order: those of `first`
        first, those of `last` only when no other is left; None when fewer are free."""
        buckets = self.buckets.get(gpu_type)
        if buckets is None or len(buckets[self.per_node]) < k:
            return None
        free = buckets[self.per_node]
        late = set(last)
        mine = sorted(
            (i in late, i)
            for i in first
            if self.free[i] == self.per_node and (gpu_type is None or self.types[i] == gpu_type)
        )
        chosen = [i for _, i in mine[:k]]
        if len(chosen) < k:
            taken = set(chosen)
            for i in free:
                if i not in taken and i not in late:
                    chosen.append(i)
                    if len(chosen) == k:
                        break
            for i in free:
                if len(chosen) == k:
                    break
                if i not in taken and i in late:
                    chosen.append(i)
        return sorted(chosen)

    def grow(self, key: str, r: int, gpu_type: str | None = None) -> bool:
        """The job at `r` GPUs: more on its node when that has room, else on the
        tightest node that fits it (whole nodes past one node's GPUs, its own first),
        of its GPU type; False, and nothing changed, when nowhere fits."""
        slots = self.where.get(key, ())
        held = sum(g for _, g in slots)
        if r <= self.per_node and len(slots) == 1 and self.free[slots[0][0]] >= r - held:
            i = slots[0][0]
            self._set_free(i, self.free[i] - (r - held))
            self.where[key] = ((i, r),)
            return True
        own = [i for i, _ in self.release(key)]
        if r <= self.per_node:
            node = self.tightest(r, own, gpu_type)
            if node is not None:
                self.take(key, ((node, r),))
                return True
        else:
            nodes = self.whole(r // self.per_node, own, (), gpu_type)
            if nodes is not None:
                self.take(key, tuple((i, self.per_node) for i in nodes))
                return True
        if slots:
            self.take(key, slots)
        return False


class Packer:
    """Counts to placements on one cluster (see the module docstring)."""

    def __init__(self, capacity: ClusterCapacity, jobs: Mapping[str, PackedJob]) -> None:
        self.per_node = capacity.gpus_per_node
        self.names = [n.name for n in capacity.nodes]
        self.index = {name: i for i, name in enumerate(self.names)}
        self.size = [n.gpus for n in capacity.nodes]
        self.types = [n.gpu_type for n in capacity.nodes]
        self.jobs = jobs
        self._own = {
            key: tuple(self.index[name] for name, _ in job.placement if name in self.index)
            for key, job in jobs.items()
        }

    def empty(self) -> Packing:
        return Packing(self.size, self.per_node, self.types)

    def slots(self, placement: Placement) -> Slots:
        return tuple((self.index[name], g) for name, g in placement)

    def placement(self, slots: Slots) -> Placement:
        return tuple((self.names[i], g) for i, g in slots)

    def packing(self, placed: Mapping[str, Placement]) -> Packing:
        """The incremental form of placements `pack` made."""
        out = self.empty()
        for key, placement in placed.items():
            out.take(key, self.slots(placement))
        return out

    def pack(self, counts: Mapping[str, int]) -> dict[str, Placement] | None:
        """Placements for the counts, or None when neither pass fits them."""
        return self._pack(counts, stable=True) or self._pack(counts, stable=False)

    def _pack(self, counts: Mapping[str, int], *, stable: bool) -> dict[str, Placement] | None:
        packing = self.empty()
        out: dict[str, Placement] = {}
        stayers = sorted(k for k, r in counts.items() if r > 0 and r == self.jobs[k].current)
        if stable:
            for key in stayers:
                packing.take(key, self.slots(self.jobs[key].placement))
                out[key] = self.jobs[key].placement
        kept_nodes = {i for k in stayers for i in self._own[k]}
        rest = [k for k, r in counts.items() if r > 0 and k not in out]
        rest.sort(key=lambda k: (-counts[k], k))
        for key in rest:
            r, kind = counts[key], self.jobs[key].gpu_type
            if r > self.per_node:
                nodes = packing.whole(r // self.per_node, self._own[key], kept_nodes, kind)
                if nodes is None:
                    return None
                slots: Slots = tuple((i, self.per_node) for i in nodes)
            else:
                node = packing.tightest(r, self._own[key], kind)
                if node is None:
                    return None
                slots = ((node, r),)
            packing.take(key, slots)
            out[key] = self.placement(slots)
        return out


__all__ = ["PackedJob", "Packer", "Packing", "Slots"]
