"""Fidelity (issue 18): the brain's `tiresias` scheduler, driven through the Pollux
artifact's own 60 s loop over workload-6, gives the artifact's published Tiresias mean
JCT (3,469.69375 s) to the second.

Tiresias is written once, as the brain's scheduler; the artifact's loop
(handlers.simulator.artifact.simulate) takes its policy as a parameter, and handlers never
import streams, so the adapter lives here: it answers the loop as the brain would, keeping
each job's attained GPU-seconds from its own past allocations, handing the scheduler
JobInputs, and applying the schedule's changes (suspend, admit, move) to what each job
holds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pytest

from handlers.simulator.artifact import (
    ActiveJob,
    HeldGpus,
    WorkloadJob,
    read_workload,
    simulate,
)
from handlers.simulator.throughput import load_application
from handlers.simulator.workload import workload_path
from streams.brain.core.schedulers.api import (
    ChangeKind,
    ClusterCapacity,
    JobInput,
    NodeCapacity,
    Placement,
    used_gpus,
)
from streams.brain.core.schedulers.tiresias import (
    QUEUE_THRESHOLD_GPU_S,
    TiresiasParams,
    tiresias,
)

#: The published Tiresias+TunedJobs mean JCT on workload-6 (artifact README, summary.json).
PUBLISHED_MEAN_JCT_S = 3469.69375


@dataclass
class BrainTiresias:
    """The artifact loop's policy, answered by the brain's scheduler."""

    submitted: Mapping[str, int]
    params: TiresiasParams = field(default_factory=TiresiasParams)
    attained: dict[str, float] = field(default_factory=dict)
    last: int = 0
    changes: int = 0
    suspends: int = 0

    def allocate(
        self,
        now: int,
        jobs: Sequence[ActiveJob],
        node_gpus: Sequence[int],
        previous: Mapping[str, tuple[int, ...]],
    ) -> HeldGpus:
        cluster = ClusterCapacity(
            tuple(NodeCapacity(f"node-{i}", g) for i, g in enumerate(node_gpus)),
            max(node_gpus),
        )
        held = {key: _placement(nodes) for key, nodes in previous.items()}
        # the brain's own bookkeeping: every job held its GPUs since the last tick
        for key, placement in held.items():
            self.attained[key] = self.attained.get(key, 0.0) + (now - self.last) * sum(
                g for _, g in placement
            )
        self.last = now
        # no goodput model: tiresias must not need one
        inputs = [
            JobInput(
                job.name,
                self.submitted[job.name],
                None,
                held.get(job.name, ()),
                requested_replicas=job.target_replicas,
                attained_gpu_s=self.attained.get(job.name, 0.0),
            )
            for job in jobs
        ]
        s = tiresias(now, cluster, inputs, self.params)
        self.changes += len(s.changes)
        for c in s.changes:
            assert c.local_batch is None and c.accumulation is None and c.global_batch is None
            if c.kind is ChangeKind.SUSPEND:
                self.suspends += 1
                del held[c.job_id]
            else:
                held[c.job_id] = c.placement
        after = {h.job_id: h.placement for h in s.holdings if h.replicas}
        assert after == held, "the changes lead to the holdings"
        used = used_gpus(s.holdings)
        assert all(used.get(n.name, 0) <= n.gpus for n in cluster.nodes), "a node overfilled"
        return {key: _nodes(placement) for key, placement in held.items()}


def _placement(nodes: tuple[int, ...]) -> Placement:
    counts: dict[int, int] = {}
    for n in nodes:
        counts[n] = counts.get(n, 0) + 1
    return tuple((f"node-{n}", counts[n]) for n in sorted(counts))


def _nodes(placement: Placement) -> tuple[int, ...]:
    return tuple(int(name.split("-")[1]) for name, g in placement for _ in range(g))


def _policy(workload: Sequence[WorkloadJob]) -> BrainTiresias:
    return BrainTiresias({w.name: w.time for w in workload})


def _digest(jct: Mapping[str, int]) -> str:
    return hashlib.sha256(json.dumps(sorted(jct.items())).encode()).hexdigest()[:16]


@pytest.fixture(scope="module")
def workload_6() -> list[WorkloadJob]:
    return read_workload(workload_path("workload-6").read_text())


def test_workload_6_gives_the_published_mean_jct(workload_6: list[WorkloadJob]) -> None:
    """Within 5 % was the issue's bar; the run gives 3,469.69375 s, the published figure
    to the second, and the exact sum is kept so that a drift shows here first."""
    policy = _policy(workload_6)
    result = simulate(workload_6, policy, load_application)
    assert len(result.jct) == 160
    assert round(result.mean_jct, 2) == round(PUBLISHED_MEAN_JCT_S, 2)
    assert sum(result.jct.values()) == 555_151  # 3,469.69375 s x 160 jobs
    assert any(a > QUEUE_THRESHOLD_GPU_S for a in policy.attained.values()), "queue 1 used"
    assert policy.suspends > 0, "jobs were preempted"


def test_workload_7_gives_every_job_the_artifact_policys_jct() -> None:
    """Workload-7 has the most jobs past the threshold (9), some suspended there: the
    queue-1 order derived from each tick's inputs is the order the artifact keeps (had a
    suspended job lost its place, its mean JCT moved by 3.5 %). The figures are those of
    the artifact's own list-keeping Tiresias in this loop (recorded when this repository
    still carried a copy of it, before Tiresias was written once): every job's JCT."""
    workload = read_workload(workload_path("workload-7").read_text())
    result = simulate(workload, _policy(workload), load_application)
    assert sum(result.jct.values()) == 876_786
    assert _digest(result.jct) == "227a824f2049315e"


def job(name: str, replicas: int, app: str = "cifar10", batch: int = 2048) -> ActiveJob:
    return ActiveJob(name, load_application(app), 0, replicas, batch)


def test_tiresias_demotes_by_attained_service_and_suspends_what_no_longer_fits() -> None:
    """A job past the threshold goes behind every first-queue job: a newcomer that needs
    its GPUs takes them, and it is suspended (its GPUs gone) until they are free again."""
    policy = BrainTiresias({"old": 0, "new": 240}, TiresiasParams(queue_threshold_gpu_s=4 * 120))
    first = policy.allocate(60, [job("old", 4)], [4, 4], {})
    assert first == {"old": (0, 0, 0, 0)}
    # 2 minutes on 4 GPUs: 480 GPU-seconds, past the threshold.
    held = policy.allocate(180, [job("old", 4)], [4, 4], first)
    assert held == first, "a running job keeps its GPUs"
    both = policy.allocate(240, [job("old", 4), job("new", 8)], [4, 4], held)
    assert both == {"new": (0, 0, 0, 0, 1, 1, 1, 1)}
    after = policy.allocate(300, [job("old", 4)], [4, 4], {})
    assert after == {"old": (0, 0, 0, 0)}


def test_tiresias_fills_the_fullest_nodes_first_and_skips_a_gang_that_does_not_fit() -> None:
    policy = BrainTiresias({"a": 0, "big": 1, "b": 2, "c": 3})
    got = policy.allocate(60, [job("a", 3), job("big", 6), job("b", 2), job("c", 1)], [4, 4], {})
    assert got == {"a": (0, 0, 0), "b": (1, 1), "c": (1,)}, "not FIFO: smaller jobs go past"
