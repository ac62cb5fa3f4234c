"""Fidelity (issue 18, 7a): the Pollux artifact's loop and its Optimus+Oracle baseline over
this project's throughput model give the artifact's published mean JCT on workload-6, to
the second.

The published figure (simulator/README.md of the OSDI'21 artifact, and its
results-jobload/*-1.0/summary.json) is 5,301.875 s for Optimus+Oracle+TunedJobs: every JCT
is a whole number of seconds, so the sum over the 160 jobs is an exact integer too. The
Tiresias baseline is the brain's scheduler, driven through the same loop by
tests/unit/brain/core/schedulers/test_tiresias_artifact.py (3,469.69375 s, also to the second).
"""

from __future__ import annotations

import pytest

from handlers.simulator.artifact import (
    ActiveJob,
    Optimus,
    WorkloadJob,
    read_workload,
    simulate,
)
from handlers.simulator.throughput import load_application
from handlers.simulator.workload import workload_path


@pytest.fixture(scope="module")
def workload_6() -> list[WorkloadJob]:
    return read_workload(workload_path("workload-6").read_text())


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


def test_optimus_gives_each_job_one_gpu_then_the_largest_marginal_gains() -> None:
    policy = Optimus()
    jobs = [job("c", 1), job("ncf", 1, "ncf", 32768)]
    got = policy.allocate(60, jobs, [4, 4], {})
    assert len(got["ncf"]) == 1, "ncf is capped at one replica, as in the artifact"
    assert len(got["c"]) == 7
    # Same count next round: the same GPUs, no restart.
    again = policy.allocate(120, jobs, [4, 4], got)
    assert again == got
