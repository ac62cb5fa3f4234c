"""What the simulator's samples say, read the way the brain's cluster scheduler reads
them, gives back the simulator's own truth: the step-time model fitted from a sample
predicts that sample's step, and the efficiency built from its gradient statistics is the
one the simulator trains with. Otherwise the scheduler would be judged on a virtual env
that disagrees with what it was told."""

from __future__ import annotations

import pytest

from handlers.simulator.cluster import Cluster
from handlers.simulator.job import DEFAULT_ORIGIN, JobSimulator
from handlers.simulator.throughput import application_names, load_application
from schemas.jobs import JobMeta, JobSubmitted, RoleSpec, RuntimeSample
from schemas.plans import NodeGroupResource, ScalePlan
from streams.brain.core.schedulers.goodput import (
    BatchLimits,
    GradStats,
    JobModel,
    PerfParams,
    StepSample,
    fit_perf_params,
)


def samples(
    app_name: str, replicas: int, local_batch: int, accumulation: int, until: float
) -> tuple[JobSimulator, list[RuntimeSample]]:
    """A job of the application on `replicas` GPUs packed on 4-GPU nodes, trained with
    the given knobs until `until` simulated seconds."""
    job = JobSimulator(
        JobSubmitted(
            env="sim",
            occurred_at=DEFAULT_ORIGIN,
            job=JobMeta(uuid="j"),
            application=app_name,
            roles={"worker": RoleSpec(replicas=replicas, gpu_num=1)},
        ),
        load_application(app_name),
        Cluster(16, 4),
        sample_interval=60.0,
    )
    job.update(
        ScalePlan(
            env="sim",
            job=JobMeta(uuid="j"),
            plan_id="knobs",
            node_group_resources={"worker": NodeGroupResource(count=replicas)},
            training={"local_batch_size": local_batch, "accumulation_steps": accumulation},
        )
    )
    found = [e for e in job.advance(until) if isinstance(e, RuntimeSample)]
    assert found
    return job, found


def step_sample(sample: RuntimeSample) -> StepSample:
    assert sample.num_nodes and sample.world_size and sample.local_batch_size
    assert sample.allreduce_s is not None
    return StepSample(
        nodes=sample.num_nodes,
        replicas=sample.world_size,
        local_batch=sample.local_batch_size,
        accumulation=sample.accumulation_steps,
        step_time=1 / sample.speed,
        sync_time=sample.allreduce_s,
    )


@pytest.mark.parametrize(
    ("app_name", "replicas", "accumulation"),
    [("cifar10", 1, 1), ("cifar10", 4, 2), ("imagenet", 8, 1), ("bert", 12, 3)],
)
def test_the_step_time_fitted_from_a_sample_is_that_samples_step(
    app_name: str, replicas: int, accumulation: int
) -> None:
    app = load_application(app_name)
    _, found = samples(app_name, replicas, app.min_local_bsz, accumulation, 300.0)
    measured = step_sample(found[-1])
    perf = fit_perf_params([measured])
    assert isinstance(perf, PerfParams)
    predicted = perf.step_time(
        measured.nodes, measured.replicas, measured.local_batch, measured.accumulation
    )
    assert predicted == pytest.approx(measured.step_time)
    # the brain's compute per micro-step is the traced one (of several replicas: one
    # replica's whole step is compute, it reduces with no one)
    placement = tuple(min(4, replicas - 4 * n) for n in range((replicas + 3) // 4))
    traced = app.step_time(placement, app.min_local_bsz)
    computed = (measured.step_time - measured.sync_time) / measured.accumulation
    if replicas > 1:
        assert computed == pytest.approx(traced.compute_time)
        assert measured.sync_time == pytest.approx(traced.sync_time)
    else:
        assert measured.sync_time == 0.0


@pytest.mark.parametrize("app_name", application_names())
@pytest.mark.parametrize("scale", [1, 4])
def test_the_efficiency_built_from_a_samples_statistics_is_the_simulators(
    app_name: str, scale: int
) -> None:
    app = load_application(app_name)
    batch = min(app.init_batch_size * scale, app.max_batch_size)
    replicas = max(1, -(-batch // app.max_local_bsz))
    local = -(-batch // replicas)
    job, found = samples(app_name, replicas, local, 1, 600.0)
    sample = found[-1]
    assert sample.batch_size == replicas * local
    assert sample.grad_sqr is not None and sample.grad_var is not None
    model = JobModel(
        perf=PerfParams(alpha_c=1.0, beta_c=0.0),
        grad=GradStats(sqr=sample.grad_sqr, var=sample.grad_var / app.init_batch_size),
        limits=BatchLimits(init_batch=app.init_batch_size, max_batch=app.max_batch_size),
    )
    epoch = min(app.epoch_at(job.status().progress), app.max_epochs - 1)
    own = app.gain(sample.batch_size, epoch) / (sample.batch_size / app.init_batch_size)
    assert model.efficiency(sample.batch_size) == pytest.approx(own, rel=1e-9)
