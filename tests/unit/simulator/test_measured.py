"""A job whose application has no traces is simulated from its own measured samples: the
step time the brain's fit gives, the work its submission states, efficiency 1 at its own
batch; a job that says too little is refused with what is missing."""

from __future__ import annotations

from datetime import timedelta

import pytest

from dlrover_events.domain.step_time import PerfParams, StepSample, fit_perf_params, step_sample
from handlers.simulator.cluster import Cluster, GiB
from handlers.simulator.job import DEFAULT_ORIGIN, JobPhase, JobSimulator
from handlers.simulator.measured import (
    MeasuredApplication,
    NotMeasurable,
    measure,
    own_samples,
)
from handlers.simulator.throughput import OutOfTraceError, TraceDataError
from schemas.jobs import JobMeta, JobSubmitted, NodeUsage, RoleSpec, RuntimeSample

#: What the job really does: its samples are made from this model.
TRUE = PerfParams(alpha_c=0.05, beta_c=0.01, alpha_r=0.1, beta_r=0.02)
JOB = JobMeta(uuid="ranker-1", name="ranker-1", app="acme-ranker")


def submission(config: dict[str, object] | None = None, **fields: object) -> JobSubmitted:
    return JobSubmitted(
        env="sim",
        job=JOB,
        application="acme-ranker",
        roles={"worker": RoleSpec(replicas=2, gpu_num=1)},
        config={"total_steps": 1000} if config is None else config,
        **{"batch_size": 64, **fields},  # type: ignore[arg-type]
    )


def sample(
    workers: int, local: int, n: int = 0, *, at: float = 0.0, **fields: object
) -> RuntimeSample:
    """A sample of the job at `workers` replicas on one node, timed by TRUE."""
    step = TRUE.step_time(1, workers, local, 1)
    return RuntimeSample(
        env="sim",
        job=JOB,
        occurred_at=DEFAULT_ORIGIN + timedelta(seconds=at),
        global_step=n,
        speed=1 / step,
        batch_size=workers * local,
        local_batch_size=local,
        world_size=workers,
        num_nodes=1,
        allreduce_s=TRUE.network_time(1, workers),
        **fields,  # type: ignore[arg-type]
    )


def first_phase() -> list[RuntimeSample]:
    """At 2 workers, then (scaled by hand) at 4, the same global batch of 64."""
    return [
        *(sample(2, 32, 10 * i, at=30.0 * i) for i in range(3)),
        *(sample(4, 16, 30 + 10 * i, at=90.0 + 30 * i) for i in range(3)),
    ]


def test_a_sample_says_its_step_as_the_fit_reads_it() -> None:
    assert step_sample(sample(4, 16)) == StepSample(
        nodes=1,
        replicas=4,
        local_batch=16,
        accumulation=1,
        step_time=pytest.approx(TRUE.step_time(1, 4, 16, 1)),  # type: ignore[arg-type]
        sync_time=pytest.approx(0.14),  # type: ignore[arg-type]
    )
    # Without world size or local batch, one is read from the other and the global batch;
    # without num_nodes, the training pods it lists are the nodes.
    bare = RuntimeSample(
        env="sim",
        job=JOB,
        global_step=1,
        speed=2.0,
        batch_size=64,
        world_size=4,
        nodes=[NodeUsage(type="worker", id=i) for i in range(2)] + [NodeUsage(type="ps", id=0)],
    )
    assert step_sample(bare) == StepSample(2, 4, 16, 1, 0.5, 0.0)
    assert step_sample(bare.model_copy(update={"speed": 0.0})) is None
    assert step_sample(bare.model_copy(update={"world_size": None})) is None


def test_the_model_gives_back_the_measured_step_times_and_the_brains_fit() -> None:
    app = measure(submission(), first_phase())
    assert app.perf == fit_perf_params([s for x in first_phase() if (s := step_sample(x))])
    assert app.name == "acme-ranker"
    assert (app.init_batch_size, app.total_steps, app.max_local_bsz) == (64, 1000, 32)
    for workers, local in ((2, 32), (4, 16)):
        assert app.step_time((workers,), local).iteration_time(1) == pytest.approx(
            TRUE.step_time(1, workers, local, 1)
        )
    # Accumulation repeats the compute, not the all-reduce.
    two = app.step_time((2,), 32)
    assert two.iteration_time(3) == pytest.approx(TRUE.step_time(1, 2, 32, 3))
    assert two.sync_time == pytest.approx(0.1)
    # Across nodes: never measured, the fit's prior (1.1x the intra-node all-reduce).
    assert app.step_time((2, 2), 16).sync_time == pytest.approx(1.1 * 0.14)
    with pytest.raises(OutOfTraceError, match="largest that fits"):
        app.step_time((1,), 33)


def test_the_samples_order_does_not_change_the_model() -> None:
    samples = first_phase()
    other_jobs = [s.model_copy(update={"job": JobMeta(uuid="other")}) for s in samples]
    assert measure(submission(), [*reversed(samples), *other_jobs]) == measure(
        submission(), samples
    )
    assert own_samples([*reversed(samples), *other_jobs], JOB.uuid) == samples


def test_efficiency_is_one_at_its_own_batch_and_never_more_without_statistics() -> None:
    app = measure(submission(), first_phase())
    assert app.grad_stats(64, 0) is None
    assert app.gain(64, 0) == 1.0
    assert app.gain(32, 0) == 0.5, "half the batch: half a step's progress"
    assert app.gain(256, 0) == 1.0, "nothing says a larger batch helps"
    # With reported statistics: AdaScale's gain from their means.
    stats = [
        s.model_copy(update={"grad_sqr": 1.0, "grad_var": v})
        for s, v in zip(first_phase(), (60.0, 68.0, 64.0, 64.0, 60.0, 68.0), strict=True)
    ]
    adaptive = measure(submission(), stats)
    assert adaptive.grad == (1.0, 64.0)
    assert adaptive.gain(64, 0) == pytest.approx(1.0)
    # E(128) = (64 + 64) / (64 + 128) = 2/3, worth 2 x 2/3 steps of the initial batch
    assert adaptive.gain(128, 0) == pytest.approx(4 / 3)
    assert adaptive.grad_stats(64, 0) == (1.0, 1.0)  # as the traces store it: var / B0


def test_a_job_runs_for_its_total_steps_at_its_measured_step_time() -> None:
    app = measure(submission(), first_phase())
    job = JobSimulator(submission(), app, Cluster(1, 4), sample_interval=None)  # type: ignore[arg-type]
    job.try_admit()
    events = job.advance(10_000.0)
    assert job.state is JobPhase.COMPLETED
    assert [e.type for e in events][-1] == "job.completed"
    expected = job.restart_delay + 1000 * TRUE.step_time(1, 2, 32, 1)
    assert job.completed_at == pytest.approx(expected)
    assert job.status().global_step == 1000


def test_memory_is_what_its_pods_were_seen_to_use() -> None:
    used = [
        s.model_copy(update={"nodes": [NodeUsage(type="worker", id=0, memory=m * GiB)]})
        for s, m in zip(first_phase(), (3, 5, 4, 3, 3, 3), strict=True)
    ]
    app = measure(submission(), used)
    assert app.memory is not None and (app.memory.base, app.memory.per_sample) == (5 * GiB, 0)
    assert measure(submission(), first_phase()).memory is None


def test_a_job_that_says_too_little_is_refused_with_what_is_missing() -> None:
    with pytest.raises(NotMeasurable, match="no measured samples"):
        measure(submission(), [])
    with pytest.raises(NotMeasurable, match="config total_steps"):
        measure(submission(config={}), first_phase())
    with pytest.raises(NotMeasurable, match="says a step time"):
        measure(submission(), [s.model_copy(update={"speed": 0.0}) for s in first_phase()])
    assert issubclass(NotMeasurable, TraceDataError), "the fleet's 'not simulable' path"


def test_the_submissions_limits_win_over_what_was_seen() -> None:
    app = measure(submission(max_local_batch_size=64, batch_size=128), first_phase())
    assert (app.init_batch_size, app.max_local_bsz) == (128, 64)
    # no batch in the submission: the first sample's
    assert measure(submission(batch_size=None), first_phase()).init_batch_size == 64


def test_a_snapshot_restores_the_same_model() -> None:
    used = [
        s.model_copy(
            update={
                "grad_sqr": 0.5,
                "grad_var": 8.0,
                "nodes": [NodeUsage(type="worker", id=0, memory=2 * GiB)],
            }
        )
        for s in first_phase()
    ]
    for app in (measure(submission(), first_phase()), measure(submission(), used)):
        assert MeasuredApplication.restore(app.snapshot()) == app
