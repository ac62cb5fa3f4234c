"""Routing: stage and condition and config -> optimizers; errors as values."""

from __future__ import annotations

from typing import Any

import pytest

from schemas.jobs import OOMKind
from schemas.plans import ResourcePlan
from streams.brain.core.decide import JobDecision, NoDecision, decide
from streams.brain.core.optimizers import REGISTRY, NoParams, OptimizeContext, Proposal
from streams.brain.core.router import Condition, Route, RouteError, route
from streams.brain.core.state import PS, WORKER, JobState, RoleResources, Stage
from tests.unit.brain.builders import T0, node, nodes, oom, sample, state, use


def _route(job: JobState, optimizer: str | None = None) -> Route:
    result = route(job, optimizer)
    assert isinstance(result, Route), result
    return result


def _error(job: JobState, optimizer: str | None = None) -> RouteError:
    result = route(job, optimizer)
    assert isinstance(result, RouteError), result
    return result


PS_JOB: dict[str, Any] = {"distribution": "ps", "roles": {PS: RoleResources(replicas=2)}}


@pytest.mark.parametrize(
    ("stage", "fields", "steps"),
    [
        ("create", PS_JOB, (("worker-create",), ("ps-create", "ps-cold-create"))),
        ("create", {}, (("worker-create",),)),
        ("ps-initial", PS_JOB, (("ps-init-adjust",),)),
        ("worker-initial", PS_JOB, (("worker-resource",),)),
        ("worker-initial", {}, (("goodput", "worker-resource"),)),
        ("running", PS_JOB, (("hot-ps", "ps-util"),)),
        ("running", {}, (("goodput", "worker-resource"),)),
        ("job_stage_running", PS_JOB, (("hot-ps", "ps-util"),)),
    ],
)
def test_stage_routes(
    stage: str, fields: dict[str, Any], steps: tuple[tuple[str, ...], ...]
) -> None:
    chosen = _route(state(stage=stage, **fields))
    assert chosen.steps == steps
    assert chosen.condition == Condition.HEALTHY


def test_a_state_never_holds_an_unknown_stage() -> None:
    """A stage no brain knows in an older state loads as create (routed as such); an
    optimize request naming one is answered with `unknown_stage` (test_brain_triggers),
    and a user's state file naming one is refused (test_brain_dry_run)."""
    job = state(stage="warmup")
    assert job.stage is Stage.CREATE
    assert _route(job).steps == (("worker-create",),)
    assert state(stage="job_stage_ps_initial").stage is Stage.PS_INITIAL
    assert state(stage="initial", distribution="ps").stage is Stage.PS_INITIAL


def test_host_oom_routes_by_role_and_stage() -> None:
    worker_oom = {"worker-0": [oom("o1")]}
    ps_oom = {"ps-0": [oom("o2")]}
    assert _route(state(stage="running", ooms=worker_oom)).steps == (("host-oom",),)
    assert _route(state(stage="create", ooms=worker_oom)).steps == (("worker-create-oom",),)
    both = state(stage="running", ooms={**worker_oom, **ps_oom}, **PS_JOB)
    assert _route(both).steps == (("ps-oom",), ("host-oom",))
    assert _route(both).condition == Condition.HOST_OOM


def test_gpu_oom_routes_to_gpu_oom() -> None:
    job = state(stage="running", ooms={"worker-0": [oom("g", OOMKind.GPU_MEMORY)]})
    assert _route(job).steps == (("gpu-oom",),)
    assert _route(job).condition == Condition.GPU_OOM


def test_handled_ooms_do_not_route() -> None:
    handled = oom("o1").model_copy(update={"handled": True})
    assert _route(state(stage="running", ooms={"worker-0": [handled]})).condition == (
        Condition.HEALTHY
    )


def test_straggler_routes_in_running_stage() -> None:
    rows = [
        sample([use(WORKER, i, step_time=1.0) for i in range(4)] + [use(WORKER, 4, step_time=3)], j)
        for j in range(3)
    ]
    job = state(stage="running", samples=rows, nodes=nodes(*(node(WORKER, i) for i in range(5))))
    assert _route(job).steps == (("straggler",),)
    assert _route(job.model_copy(update={"stage": "worker-initial"})).condition == (
        Condition.HEALTHY
    )


def test_config_names_the_optimizer_by_job_or_by_stage() -> None:
    assert _route(state(stage="running", config={"optimizer": "worker-resource"})).steps == (
        ("worker-resource",),
    )
    per_stage = {"optimizer": {"running": "goodput"}}
    assert _route(state(stage="running", config=per_stage)).steps == (("goodput",),)
    assert _route(state(stage="create", config=per_stage)).steps == (("worker-create",),)


def test_config_optimizer_does_not_hide_an_oom() -> None:
    job = state(stage="running", config={"optimizer": "goodput"}, ooms={"worker-0": [oom("o")]})
    assert _route(job).steps == (("host-oom",),)


def test_explicit_optimizer_wins() -> None:
    job = state(stage="running", ooms={"worker-0": [oom("o")]})
    assert _route(job, "goodput").steps == (("goodput",),)


@pytest.mark.parametrize(
    ("config", "optimizer", "code"),
    [
        ({"optimizer": "nope"}, None, "unknown_optimizer"),
        ({}, "nope", "unknown_optimizer"),
        ({"optimizer": 3}, None, "invalid_config"),
        ({"optimizer": {"running": 3}}, None, "invalid_config"),
        ({"optimizer_params": {"goodput": 1}}, None, "invalid_config"),
        ({"optimizer_params": []}, None, "invalid_config"),
    ],
)
def test_bad_names_and_config_are_error_values(
    config: dict[str, Any], optimizer: str | None, code: str
) -> None:
    assert _error(state(stage="running", config=config), optimizer).code == code


def test_unknown_optimizer_error_lists_the_known_ones() -> None:
    assert "goodput" in _error(state(), "nope").message


def test_invalid_params_are_an_error_value() -> None:
    job = state(stage="running", config={"optimizer_params": {"goodput": {"min_efficiency": 7}}})
    result = decide(job, T0)
    assert isinstance(result, RouteError)
    assert result.code == "invalid_params"
    assert "min_efficiency" in result.message
    unknown_param = state(stage="running", config={"optimizer_params": {"goodput": {"x": 1}}})
    assert isinstance(decide(unknown_param, T0), RouteError)


def test_a_failing_user_optimizer_is_an_error_value() -> None:
    registry = REGISTRY.copy()

    @registry.register("boom", "always fails", NoParams)
    def boom(ctx: OptimizeContext, params: NoParams) -> Proposal | None:
        raise RuntimeError("kaput")

    result = decide(state(stage="running"), T0, optimizer="boom", registry=registry)
    assert isinstance(result, RouteError)
    assert result.code == "optimizer_failed"
    assert "boom" not in REGISTRY


def test_users_extend_a_registry_and_list_it() -> None:
    registry = REGISTRY.copy()

    @registry.register("two-workers", "always two workers", NoParams)
    def two(ctx: OptimizeContext, params: NoParams) -> Proposal | None:
        from schemas.plans import NodeGroupResource

        return Proposal(
            reason="two",
            resource=ResourcePlan(node_group_resources={WORKER: NodeGroupResource(count=2)}),
        )

    assert ("two-workers", "always two workers") in registry.describe()
    with pytest.raises(ValueError, match="already registered"):
        registry.register("two-workers", "again", NoParams)(two)
    job = state(stage="running", config={"optimizer": "two-workers"})
    assert isinstance(route(job), RouteError)  # not in the default registry
    result = decide(job, T0, registry=registry, caused_by="e1")
    assert isinstance(result, JobDecision)
    assert result.optimize_plan.optimizer == "two-workers"


def test_nothing_to_do_is_a_no_decision() -> None:
    result = decide(state(stage=Stage.RUNNING.value), T0)
    assert isinstance(result, NoDecision)
    assert result.optimizers == ("goodput", "worker-resource")
