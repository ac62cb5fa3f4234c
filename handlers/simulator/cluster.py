"""A simulated cluster: nodes with GPUs, CPU and memory, and whole-job (gang) admission.

A data-parallel job makes no progress until every replica runs, and a half-admitted job
holds GPUs that nobody can use; so a job's pods are admitted all together or not at all.
Pods of a job are packed onto as few nodes as possible because the traces show that
all-reduce across nodes, not compute, is what slows a job down as it grows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

GiB = 1024**3


class OvercommitError(RuntimeError):
    """A node asked to hold more GPUs than it has, or to free GPUs it never gave."""


@dataclass(frozen=True, slots=True)
class PodRequest:
    """One pod of a job: a role replica and what it asks of a node (0 asks nothing)."""

    role: str
    index: int
    gpu: int = 0
    cpu: float = 0.0
    memory: int = 0

    @property
    def key(self) -> tuple[str, int]:
        return (self.role, self.index)


@dataclass(slots=True)
class SimNode:
    """Capacity and what is left of it; usage by job and pod so release is exact."""

    index: int
    gpus: int
    cpu: float
    memory: int
    free_gpus: int = field(init=False)
    free_cpu: float = field(init=False)
    free_memory: int = field(init=False)

    def __post_init__(self) -> None:
        self.free_gpus, self.free_cpu, self.free_memory = self.gpus, self.cpu, self.memory

    def fits(self, pod: PodRequest) -> int:
        """How many more pods like this one the node can take."""
        limits = []
        if pod.gpu:
            limits.append(self.free_gpus // pod.gpu)
        if pod.cpu:
            limits.append(int(self.free_cpu // pod.cpu))
        if pod.memory:
            limits.append(self.free_memory // pod.memory)
        return min(limits) if limits else 1 << 30

    def take(self, pod: PodRequest) -> None:
        # GPUs are whole and a node has so many: a pod beyond them is a simulator bug
        # that would show a cluster holding more GPUs than it has, so it fails loudly.
        if pod.gpu > self.free_gpus:
            raise OvercommitError(
                f"node-{self.index} has {self.free_gpus} of its {self.gpus} GPUs free, "
                f"pod {pod.role}-{pod.index} asks {pod.gpu}"
            )
        self.free_gpus -= pod.gpu
        self.free_cpu -= pod.cpu
        self.free_memory -= pod.memory

    def give(self, pod: PodRequest) -> None:
        if self.free_gpus + pod.gpu > self.gpus:
            raise OvercommitError(
                f"node-{self.index} would have {self.free_gpus + pod.gpu} GPUs free of its "
                f"{self.gpus}: pod {pod.role}-{pod.index} given back twice"
            )
        self.free_gpus += pod.gpu
        self.free_cpu += pod.cpu
        self.free_memory += pod.memory


@dataclass(frozen=True, slots=True)
class Allocation:
    """Where a job's pods landed."""

    job: str
    nodes: Mapping[tuple[str, int], int]
    pods: Mapping[tuple[str, int], PodRequest]

    def gpus_per_node(self, roles: Iterable[str] | None = None) -> tuple[int, ...]:
        """GPUs of the job per node it uses, in node order: the placement of its replicas."""
        wanted = None if roles is None else set(roles)
        per_node: dict[int, int] = {}
        for key, node in self.nodes.items():
            pod = self.pods[key]
            if pod.gpu and (wanted is None or pod.role in wanted):
                per_node[node] = per_node.get(node, 0) + pod.gpu
        return tuple(per_node[n] for n in sorted(per_node))

    def snapshot(self) -> dict[str, Any]:
        """JSON-able; ``Allocation.restore`` gives an equal one back."""
        return {
            "job": self.job,
            "pods": [
                [role, index, node, pod.gpu, pod.cpu, pod.memory]
                for (role, index), node in self.nodes.items()
                for pod in (self.pods[(role, index)],)
            ],
        }

    @classmethod
    def restore(cls, state: Mapping[str, Any]) -> Allocation:
        nodes: dict[tuple[str, int], int] = {}
        pods: dict[tuple[str, int], PodRequest] = {}
        for role, index, node, gpu, cpu, memory in state["pods"]:
            nodes[(role, index)] = node
            pods[(role, index)] = PodRequest(role, index, gpu, cpu, memory)
        return cls(state["job"], nodes, pods)


class Cluster:
    """N identical nodes; deterministic placement (ties go to the lowest node index)."""

    def __init__(
        self,
        num_nodes: int,
        gpus_per_node: int,
        *,
        cpu_per_node: float = 64.0,
        memory_per_node: int = 256 * GiB,
    ) -> None:
        if num_nodes < 1 or gpus_per_node < 0:
            raise ValueError("a cluster needs at least one node and a non-negative GPU count")
        self._shape = (num_nodes, gpus_per_node, cpu_per_node, memory_per_node)
        self.nodes = [
            SimNode(i, gpus_per_node, cpu_per_node, memory_per_node) for i in range(num_nodes)
        ]
        self._allocations: dict[str, Allocation] = {}

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def free_gpus(self) -> int:
        return sum(n.free_gpus for n in self.nodes)

    def allocation(self, job: str) -> Allocation | None:
        return self._allocations.get(job)

    def jobs(self) -> tuple[str, ...]:
        return tuple(self._allocations)

    def can_ever_fit(
        self, pods: Sequence[PodRequest], pinned: Mapping[tuple[str, int], int] | None = None
    ) -> bool:
        """Whether the pods would fit on the empty cluster (``pinned`` pods on their
        nodes): else waiting is pointless."""
        num_nodes, gpus, cpu, memory = self._shape
        empty = Cluster(num_nodes, gpus, cpu_per_node=cpu, memory_per_node=memory)
        return empty._place(pods, pinned or {}) is not None

    def admit(
        self,
        job: str,
        pods: Sequence[PodRequest],
        pinned: Mapping[tuple[str, int], int] | None = None,
    ) -> Allocation | None:
        """Place all of a job's pods, or none of them (gang admission).

        A job already holding pods is re-placed as a whole (its old pods count as free),
        which is how a rescale looks to the scheduler: all replicas restart together.
        ``pinned`` pods (by key) go on the node index given or nowhere: a scheduler that
        chose the nodes is told "not yet", never given other nodes.
        """
        previous = self._allocations.pop(job, None)
        if previous is not None:
            self._give_back(previous)
        placed = self._place(pods, pinned or {})
        if placed is None:
            if previous is not None:  # the old gang keeps running
                self._take(previous)
                self._allocations[job] = previous
            return None
        allocation = Allocation(job, placed, {p.key: p for p in pods})
        self._take(allocation)
        self._allocations[job] = allocation
        return allocation

    def release(self, job: str, pods: Iterable[tuple[str, int]] | None = None) -> None:
        """Free a job's pods (all of them by default): completion, scale-down, failure."""
        allocation = self._allocations.pop(job, None)
        if allocation is None:
            return
        if pods is None:
            self._give_back(allocation)
            return
        gone = set(pods)
        for key in gone & set(allocation.nodes):
            self.nodes[allocation.nodes[key]].give(allocation.pods[key])
        kept = {k: v for k, v in allocation.nodes.items() if k not in gone}
        if kept:
            self._allocations[job] = Allocation(job, kept, {k: allocation.pods[k] for k in kept})

    def snapshot(self) -> dict[str, Any]:
        """Shape, what each node has left and every allocation, JSON-able: a restarted
        operator goes on with the same cluster (the free amounts are kept as they are, not
        summed again, so not even float rounding differs)."""
        return {
            "shape": list(self._shape),
            "free": [[n.free_gpus, n.free_cpu, n.free_memory] for n in self.nodes],
            "allocations": [a.snapshot() for a in self._allocations.values()],
        }

    @classmethod
    def restore(cls, state: Mapping[str, Any]) -> Cluster:
        num_nodes, gpus, cpu, memory = state["shape"]
        cluster = cls(num_nodes, gpus, cpu_per_node=cpu, memory_per_node=memory)
        if len(state["free"]) != num_nodes:
            raise ValueError("a cluster snapshot needs the free amounts of every node")
        for node, (free_gpus, free_cpu, free_memory) in zip(
            cluster.nodes, state["free"], strict=True
        ):
            node.free_gpus, node.free_cpu, node.free_memory = free_gpus, free_cpu, free_memory
        for raw in state["allocations"]:
            allocation = Allocation.restore(raw)
            cluster._allocations[allocation.job] = allocation
        return cluster

    @property
    def shape(self) -> tuple[int, int, float, int]:
        """(nodes, GPUs per node, cores per node, memory per node)."""
        return self._shape

    def _take(self, allocation: Allocation) -> None:
        for key, node in allocation.nodes.items():
            self.nodes[node].take(allocation.pods[key])

    def _give_back(self, allocation: Allocation) -> None:
        for key, node in allocation.nodes.items():
            self.nodes[node].give(allocation.pods[key])

    def _place(
        self, pods: Sequence[PodRequest], pinned: Mapping[tuple[str, int], int]
    ) -> dict[tuple[str, int], int] | None:
        """Pinned pods on their nodes (each must fit there now), the others packed
        around them; None, with nothing taken, when any does not fit."""
        taken: list[tuple[int, PodRequest]] = []
        placed: dict[tuple[str, int], int] = {}
        for pod in pods:
            index = pinned.get(pod.key)
            if index is None:
                continue
            if not 0 <= index < len(self.nodes) or self.nodes[index].fits(pod) < 1:
                break
            self.nodes[index].take(pod)
            taken.append((index, pod))
            placed[pod.key] = index
        else:
            rest = self._pack([p for p in pods if p.key not in pinned])
            if rest is not None:
                placed.update(rest)
        for node, pod in taken:  # admit() takes them for real once the gang is complete
            self.nodes[node].give(pod)
        return placed if len(placed) == len(pods) else None

    def _pack(self, pods: Sequence[PodRequest]) -> dict[tuple[str, int], int] | None:
        """Fewest nodes first: a node that takes all remaining pods of a kind, tightest fit
        first; otherwise the node that takes the most. Undone entirely on failure."""
        taken: list[tuple[int, PodRequest]] = []
        placed: dict[tuple[str, int], int] = {}
        groups: dict[tuple[int, float, int], list[PodRequest]] = {}
        for pod in pods:
            groups.setdefault((pod.gpu, pod.cpu, pod.memory), []).append(pod)
        # Biggest pods first, so small ones fill the gaps the big ones leave.
        for shape in sorted(groups, reverse=True):
            pending = list(groups[shape])
            used: set[int] = set()
            while pending:
                room = [(n.fits(pending[0]), n.index) for n in self.nodes]
                # Prefer nodes this job already uses, so a role does not spread needlessly.
                whole = [(r, i not in used, i) for r, i in room if r >= len(pending)]
                if whole:
                    _, _, best = min(whole)
                    count = len(pending)
                else:
                    count, best = max(((r, -i) for r, i in room), default=(0, 0))
                    best = -best
                    if count == 0:
                        for node, pod in reversed(taken):
                            self.nodes[node].give(pod)
                        return None
                for pod in pending[:count]:
                    self.nodes[best].take(pod)
                    taken.append((best, pod))
                    placed[pod.key] = best
                used.add(best)
                pending = pending[count:]
        for node, pod in taken:  # admit() takes them for real once the gang is complete
            self.nodes[node].give(pod)
        return placed
