"""Issue 15: a job state holds only what the contract allows, and a dry run of any state
or parameter ends in a plan or in one line that says what is wrong, never in Python's
OverflowError, a pydantic error of many lines, or a build of one object per replica."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlrover_events.errors import UserError
from schemas.bounds import MAX_BYTES, MAX_CPU, MAX_REPLICAS
from streams.brain.core.optimizers import REGISTRY
from streams.brain.core.optimizers.numeric import ceil_int
from streams.brain.core.state import PS, WORKER
from streams.brain.runtime.dry_run import dry_run, parse_state
from tests.unit.brain.builders import T0

GiB = 1024**3


def _state(cpu: float = 8, memory: int = 16 * GiB, **more: Any) -> dict[str, Any]:
    """A PS job as a state file holds it, with every resource at `cpu` and `memory`."""
    keys = [(role, i) for role in (PS, WORKER) for i in (0, 1)]
    return {
        "env": "test",
        "job": {"uuid": "job-1", "scenario": "s"},
        "distribution": "ps",
        "stage": "running",
        "total_steps": 10**6,
        "recv_op_count": 100,
        "roles": {
            PS: {"replicas": 2, "cpu": cpu, "memory": memory},
            WORKER: {"replicas": 2, "cpu": cpu, "memory": memory, "gpu_num": 1},
        },
        "nodes": {
            f"{r}-{i}": {"type": r, "id": i, "status": "running", "cpu": cpu, "memory": memory}
            for r, i in keys
        },
        "peaks": {f"{r}-{i}": {"type": r, "id": i, "cpu": cpu, "memory": memory} for r, i in keys},
        "samples": [
            {
                "event_id": f"s{n}",
                "at": f"2026-01-01T00:{n:02d}:00Z",
                "speed": 1 + n,
                "global_step": 10 * n,
                "nodes": [
                    {"type": r, "id": i, "cpu": min(cpu, MAX_CPU), "memory": min(memory, MAX_BYTES)}
                    for r, i in keys
                ],
            }
            for n in range(8)
        ],
        **more,
    }


@pytest.mark.parametrize(
    ("where", "value", "bound"),
    [
        ("roles.ps.replicas", 10**30, "10000"),
        ("roles.ps.min_replicas", 10**30, "10000"),
        ("roles.ps.cpu", 1e308, "1000000"),
        ("roles.ps.memory", 10**30, str(MAX_BYTES)),
        ("roles.worker.gpu_num", 10**6, "1024"),
        ("nodes.ps-0.cpu", 1e308, "1000000"),
        ("nodes.ps-0.memory", 10**400, str(MAX_BYTES)),
        ("nodes.ps-0.id", 2**31, str(2**31 - 1)),
        ("peaks.ps-0.cpu", 1e308, "1000000"),
        ("peaks.ps-0.memory", 10**30, str(MAX_BYTES)),
        ("pinned.ps.replicas", 10**30, "10000"),
        ("pinned.ps.memory", 10**30, str(MAX_BYTES)),
    ],
)
def test_a_state_past_the_contracts_bounds_is_one_line_naming_the_bound(
    where: str, value: float, bound: str
) -> None:
    doc = _state(pinned={PS: {}})
    *path, last = where.split(".")
    target = doc
    for part in path:
        target = target[part]
    target[last] = value
    with pytest.raises(UserError) as caught:
        parse_state(json.dumps(doc))
    message = str(caught.value)
    assert "\n" not in message
    assert where in message and bound in message


def test_a_computed_infinity_is_a_value_error_that_says_so() -> None:
    for value in (math.inf, -math.inf, math.nan):
        with pytest.raises(ValueError, match="out of range"):
            ceil_int(value)
    assert ceil_int(0.1 * 3 / 0.3) == 1


_EXTREMES = [1e308, 10**30, 1e-300, 0]


@settings(max_examples=150, deadline=None)
@given(
    resources=st.sampled_from([(MAX_CPU, MAX_BYTES), (0.5, 1), (32, 64 * GiB), (8, 16 * GiB)]),
    oom=st.booleans(),
    distribution=st.sampled_from(["ps", "allreduce"]),
    optimizer=st.sampled_from(REGISTRY.names()),
    param=st.data(),
)
def test_any_state_within_bounds_and_any_parameter_plans_or_says_why_in_one_line(
    resources: tuple[float, int], oom: bool, distribution: str, optimizer: str, param: Any
) -> None:
    cpu, memory = resources
    doc = _state(cpu, memory, distribution=distribution)
    if oom:
        at = "2026-01-01T00:00:00Z"
        doc["ooms"] = {
            key: [{"event_id": f"o-{key}", "kind": "host_memory", "at": at}]
            for key in ("ps-0", "worker-0")
        }
    spec = REGISTRY.get(optimizer)
    assert spec is not None
    fields = sorted(spec.params.model_fields)
    if fields:
        name = param.draw(st.sampled_from(fields))
        value = param.draw(st.sampled_from(_EXTREMES))
        doc["config"] = {"optimizer_params": {optimizer: {name: value}}}
    history = parse_state(
        json.dumps(
            {**doc, "job": {"uuid": "h", "scenario": "s"}, "status": "completed", "ooms": {}}
            | {"completed_at": "2025-12-31T00:00:00Z", "config": {}}
        )
    )
    try:
        out = dry_run(
            parse_state(json.dumps(doc)), T0, optimizer=optimizer, history=[history], free_gpus=8
        )
    except UserError as err:
        message = str(err)
        assert "\n" not in message
        assert "OverflowError" not in message
        return
    plan = out["scale_plan"]
    if plan is not None:
        for group in plan["node_group_resources"].values():
            assert group["count"] <= MAX_REPLICAS
        assert len(plan["launch_nodes"]) <= MAX_REPLICAS


@pytest.mark.parametrize("number", ["Infinity", "-Infinity", "NaN", "1e400", "-1e400"])
@pytest.mark.parametrize("where", ["roles.ps.cpu", "nodes.ps-0.cpu", "peaks.ps-0.cpu"])
def test_an_infinite_cpu_in_a_state_file_is_one_line_not_an_overflow(
    where: str, number: str
) -> None:
    doc = _state()
    *path, last = where.split(".")
    target = doc
    for part in path:
        target = target[part]
    target[last] = "__NUMBER__"
    text = json.dumps(doc).replace('"__NUMBER__"', number)
    with pytest.raises(UserError) as caught:
        parse_state(text)
    message = str(caught.value)
    assert "\n" not in message and where in message
    assert "OverflowError" not in message
