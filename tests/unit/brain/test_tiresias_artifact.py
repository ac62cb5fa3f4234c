"""Fidelity (issue 18): the brain's `tiresias` scheduler, driven through the Pollux
artifact's own 60 s loop over workload-6, gives the artifact's published Tiresias mean
JCT (3,469.69 s) within 5 %.

The loop (handlers.simulator.artifact.simulate) asks a policy for the allocations every
interval; the adapter below answers as the brain would: it keeps each job's attained
GPU-seconds from its own past allocations, hands the scheduler JobInputs, and applies the
schedule's decisions (suspend, admit, move) to what each job holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pytest

from handlers.simulator.artifact import (
    TIRESIAS_QUEUE_THRESHOLD,
    ActiveJob,
    Allocations,
    Tiresias,
    WorkloadJob,
    read_workload,
    simulate,
)
from handlers.simulator.throughput import load_application
from handlers.simulator.workload import workload_path
from streams.brain.core.schedulers.goodput import BatchLimits, GradStats, JobModel
from streams.brain.core.schedulers.goodput_cluster import (
    Action,
    Cluster,
    ClusterNode,
    JobInput,
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


class _NoStepTime:
    """Tiresias never reads the goodput model; one that would fail if it did."""

    def step_time(self, nodes: int, replicas: int, local_batch: int, accumulation: int) -> float:
        raise AssertionError("tiresias read the job's step time")


@dataclass
class BrainTiresias:
    """The artifact's Policy, answered by the brain's scheduler."""

    submitted: Mapping[str, int]
    params: TiresiasParams = field(default_factory=TiresiasParams)
    attained: dict[str, float] = field(default_factory=dict)
    last: int = 0
    decisions: int = 0
    suspends: int = 0
    model: JobModel = field(
        default_factory=lambda: JobModel(
            _NoStepTime(), GradStats(1.0, 1.0), BatchLimits(1, 1, 1, 1)
        )
    )

    def allocate(
        self,
        now: int,
        jobs: Sequence[ActiveJob],
        node_gpus: Sequence[int],
        previous: Mapping[str, tuple[int, ...]],
    ) -> Allocations:
        gpus_per_node = max(node_gpus)
        cluster = Cluster(
            gpus_per_node, tuple(ClusterNode(f"node-{i}", g) for i, g in enumerate(node_gpus))
        )
        held = {key: _placement(nodes) for key, nodes in previous.items()}
        # the brain's own bookkeeping: every job held its GPUs since the last tick
        for key, placement in held.items():
            self.attained[key] = self.attained.get(key, 0.0) + (now - self.last) * sum(
                g for _, g in placement
            )
        self.last = now
        inputs = [
            JobInput(
                job.name,
                self.submitted[job.name],
                self.model,
                held.get(job.name, ()),
                requested_replicas=job.target_replicas,
                attained_gpu_s=self.attained.get(job.name, 0.0),
            )
            for job in jobs
        ]
        s = tiresias(now, cluster, inputs, self.params)
        self.decisions += len(s.decisions)
        for d in s.decisions:
            assert d.local_batch is None and d.accumulation is None and d.global_batch is None
            if d.action is Action.SUSPEND:
                self.suspends += 1
                del held[d.job_id]
            else:
                held[d.job_id] = d.placement
        after = {a.job_id: a.placement for a in s.allocations if a.replicas}
        assert after == held, "the decisions lead to the allocations"
        used = used_gpus(s.allocations)
        assert all(used.get(n.name, 0) <= n.gpus for n in cluster.nodes), "a node overfilled"
        return {key: _nodes(placement) for key, placement in held.items()}


def _placement(nodes: tuple[int, ...]) -> Placement:
    counts: dict[int, int] = {}
    for n in nodes:
        counts[n] = counts.get(n, 0) + 1
    return tuple((f"node-{n}", counts[n]) for n in sorted(counts))


def _nodes(placement: Placement) -> tuple[int, ...]:
    return tuple(int(name.split("-")[1]) for name, g in placement for _ in range(g))


@pytest.fixture(scope="module")
def workload_6() -> list[WorkloadJob]:
    return read_workload(workload_path("workload-6").read_text())


def test_the_threshold_is_the_artifacts() -> None:
    assert QUEUE_THRESHOLD_GPU_S == TIRESIAS_QUEUE_THRESHOLD


def test_workload_6_gives_the_published_mean_jct(workload_6: list[WorkloadJob]) -> None:
    """Within 5 % is the issue's bar; the run gives 3,469.69375 s, the published figure to
    the second (every job's JCT is the artifact policy's own), and the exact sum is kept
    so that a drift shows here first."""
    policy = BrainTiresias({w.name: w.time for w in workload_6})
    result = simulate(workload_6, policy, load_application)
    assert len(result.jct) == 160
    assert result.mean_jct == pytest.approx(PUBLISHED_MEAN_JCT_S, rel=0.05)
    assert sum(result.jct.values()) == 555_151  # 3,469.69375 s x 160 jobs
    assert any(a > QUEUE_THRESHOLD_GPU_S for a in policy.attained.values()), "queue 1 used"
    assert policy.suspends > 0, "jobs were preempted"


def test_workload_7_gives_every_job_the_artifact_policys_jct() -> None:
    """Workload-7 has the most jobs past the threshold (9), some suspended there: the
    queue-1 order derived from each tick's inputs is the order the artifact keeps (had a
    suspended job lost its place, its mean JCT moved by 3.5 %)."""
    workload = read_workload(workload_path("workload-7").read_text())
    ours = simulate(workload, BrainTiresias({w.name: w.time for w in workload}), load_application)
    theirs = simulate(workload, Tiresias(), load_application)
    assert ours.jct == theirs.jct
