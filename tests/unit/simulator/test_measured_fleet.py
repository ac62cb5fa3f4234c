"""The simulated cluster runs a job of an untraced application from its measured samples,
fails one without samples as "not simulable: no measured samples", and a snapshot taken
mid-run says from then on what the cluster that never stopped says."""

from __future__ import annotations

from datetime import timedelta

import pytest

from dlrover_events.domain.step_time import PerfParams
from handlers.simulator.checkpoint import OperatorState, dump, load
from handlers.simulator.cluster import Cluster
from handlers.simulator.fleet import VirtualCluster
from handlers.simulator.job import DEFAULT_ORIGIN, DEFAULT_RESTART_DELAY
from schemas.jobs import (
    JobCompleted,
    JobEvent,
    JobFailed,
    JobMeta,
    JobSubmitted,
    RoleSpec,
    RuntimeSample,
)

#: Two made-up applications, each job's samples made from its own true model.
TRUE = {
    "ranker": PerfParams(alpha_c=0.05, beta_c=0.01, alpha_r=0.1, beta_r=0.02),
    "embedder": PerfParams(alpha_c=0.2, beta_c=0.002, alpha_r=0.05, beta_r=0.01),
}


def submitted(name: str, app: str, at: float, steps: int | None = 2000) -> JobSubmitted:
    return JobSubmitted(
        env="sim",
        occurred_at=DEFAULT_ORIGIN + timedelta(seconds=at),
        job=JobMeta(uuid=name, name=name, app=app),
        application=app,
        batch_size=64,
        roles={"worker": RoleSpec(replicas=2, gpu_num=1)},
        config={} if steps is None else {"total_steps": steps},
    )


def samples(name: str, app: str, at: float) -> list[RuntimeSample]:
    """First-phase samples at 2 then 4 workers (global batch 64), from the real env."""
    true = TRUE[app]
    out = []
    for i, (workers, local) in enumerate(((2, 32), (2, 32), (4, 16), (4, 16))):
        out.append(
            RuntimeSample(
                env="sim",
                job=JobMeta(uuid=name, name=name, app=app),
                source="sdk",
                occurred_at=DEFAULT_ORIGIN + timedelta(seconds=at + 30 * (i + 1)),
                global_step=10 * i,
                speed=1 / true.step_time(1, workers, local, 1),
                batch_size=64,
                local_batch_size=local,
                world_size=workers,
                num_nodes=1,
                allreduce_s=true.network_time(1, workers),
            )
        )
    return out


def measurements() -> list[RuntimeSample]:
    return [
        *samples("r-1", "ranker", 0.0),
        *samples("e-2", "embedder", 100.0),
        *samples("long-4", "ranker", 0.0),
    ]


def fleet() -> VirtualCluster:
    """Two measured jobs, one without samples, one that states no length, all untraced."""
    cluster = VirtualCluster(Cluster(1, 4), origin=None, sample_interval=60.0)
    cluster.measured(measurements())
    for event in (
        submitted("r-1", "ranker", 0.0),
        submitted("e-2", "embedder", 100.0),
        submitted("nothing-3", "acme", 50.0),
        submitted("long-4", "ranker", 60.0, steps=None),
    ):
        cluster.submit(event)
    return cluster


def run(cluster: VirtualCluster, events: list[JobEvent] | None = None) -> list[JobEvent]:
    said = list(events or [])
    while (step := cluster.step()) is not None:
        said.extend(step)
    return said


def test_untraced_jobs_run_from_their_measured_step_time() -> None:
    cluster = fleet()
    events = run(cluster, cluster.start())
    ended = {e.job.uuid: e for e in events if isinstance(e, JobCompleted | JobFailed)}
    assert set(ended) == {"r-1", "e-2", "nothing-3", "long-4"}
    failed = {k: e.reason for k, e in ended.items() if isinstance(e, JobFailed)}
    assert failed["nothing-3"].startswith("not simulable: no measured samples (")
    assert "acme" in failed["nothing-3"]
    assert failed["long-4"].startswith("not simulable: its submission does not say how long")
    # Two workers each, on a 4-GPU node: both run at once, from their arrival, at the
    # measured step time of 2 workers x 32 samples.
    for name, app, at in (("r-1", "ranker", 0.0), ("e-2", "embedder", 100.0)):
        job = cluster.job(name)
        assert job is not None and job.completed_at is not None
        step = TRUE[app].step_time(1, 2, 32, 1)
        assert job.completed_at - at == pytest.approx(DEFAULT_RESTART_DELAY + 2000 * step)
        assert job.status().global_step == 2000
    # What the simulated jobs report is what they measured.
    said = [e for e in events if isinstance(e, RuntimeSample) and e.job.uuid == "r-1"]
    assert said
    assert said[0].speed == pytest.approx(1 / TRUE["ranker"].step_time(1, 2, 32, 1))
    assert said[0].grad_sqr is None, "the job reported no gradient statistics"


def test_a_restored_cluster_goes_on_as_the_one_that_never_stopped() -> None:
    straight = fleet()
    expected = run(straight, straight.start())
    for stop_after in (1, 3, 6):
        cluster = fleet()
        said = cluster.start()
        for _ in range(stop_after):
            step = cluster.step()
            assert step is not None
            said.extend(step)
        state = load(dump(OperatorState(fleet=cluster)))
        assert state.fleet is not None
        # The models of the jobs that arrived are in the snapshot; the operator gives the
        # samples again (it reads them at every start) for the jobs still to arrive.
        state.fleet.measured(measurements())
        restored = run(state.fleet)
        assert [(e.type, e.event_id, e.occurred_at) for e in said + restored] == [
            (e.type, e.event_id, e.occurred_at) for e in expected
        ]
