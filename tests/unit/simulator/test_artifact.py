"""Fidelity (issue 18, 7a): the Pollux artifact's loop and baselines over this project's
throughput model give the artifact's published mean JCTs on workload-6, to the second.

The published figures (simulator/README.md of the OSDI'21 artifact, and its
results-jobload/*-1.0/summary.json) are 3,469.69375 s for Tiresias+TunedJobs and
5,301.875 s for Optimus+Oracle+TunedJobs: every JCT is a whole number of seconds, so the
sums over the 160 jobs are exact integers too.
"""

from __future__ import annotations

import pytest

from handlers.simulator.artifact import (
    ActiveJob,
    Optimus,
    Tiresias,
    WorkloadJob,
    read_workload,
    simulate,
)
from handlers.simulator.throughput import load_application
from handlers.simulator.workload import workload_path


@pytest.fixture(scope="module")
def workload_6() -> list[WorkloadJob]:
    return read_workload(workload_path("workload-6").read_text())


def test_tiresias_gives_the_published_mean_jct(workload_6: list[WorkloadJob]) -> None:
    result = simulate(workload_6, Tiresias(), load_application)
    assert len(result.jct) == 160
    assert round(result.mean_jct, 2) == 3469.69
    assert sum(result.jct.values()) == 555_151  # 3,469.69375 s x 160 jobs


def test_optimus_gives_the_published_mean_jct(workload_6: list[WorkloadJob]) -> None:
    result = simulate(workload_6, Optimus(), load_application)
    assert len(result.jct) == 160
    assert round(result.mean_jct, 3) == 5301.875
    assert sum(result.jct.values()) == 848_300  # 5,301.875 s x 160 jobs


def test_the_workload_reads_in_order() -> None:
    rows = read_workload("name,time,application,num_replicas,batch_size\nncf-0,16,ncf,1,32768\n")
    assert rows == [WorkloadJob("ncf-0", 16, "ncf", 1, 32768)]


def job(name: str, replicas: int, app: str = "cifar10", batch: int = 2048) -> ActiveJob:
    return ActiveJob(name, load_application(app), 0, replicas, batch)


def test_tiresias_demotes_by_attained_service_and_suspends_what_no_longer_fits() -> None:
    """A job past the threshold goes behind every first-queue job: a newcomer that needs
    its GPUs takes them, and it is suspended (its GPUs gone) until they are free again."""
    policy = Tiresias(queue_threshold=4 * 120)
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
    policy = Tiresias()
    got = policy.allocate(60, [job("a", 3), job("big", 6), job("b", 2), job("c", 1)], [4, 4], {})
    assert got == {"a": (0, 0, 0), "b": (1, 1), "c": (1,)}, "not FIFO: smaller jobs go past"


def test_optimus_gives_each_job_one_gpu_then_the_largest_marginal_gains() -> None:
    policy = Optimus()
    jobs = [job("c", 1), job("ncf", 1, "ncf", 32768)]
    got = policy.allocate(60, jobs, [4, 4], {})
    assert len(got["ncf"]) == 1, "ncf is capped at one replica, as in the artifact"
    assert len(got["c"]) == 7
    # Same count next round: the same GPUs, no restart.
    again = policy.allocate(120, jobs, [4, 4], got)
    assert again == got
