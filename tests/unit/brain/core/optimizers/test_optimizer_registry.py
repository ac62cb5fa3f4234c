"""The optimizer extension point (`streams/brain/core/optimizers/api.py`): the brain's
registry names its optimizers in one place, is read only, and says what is wrong with a
name in one line."""

from __future__ import annotations

import pytest

from streams.brain.core.optimizers import (
    REGISTRY,
    NoParams,
    OptimizeContext,
    OptimizerError,
    OptimizerNameError,
    OptimizerSpec,
    Proposal,
    UnknownOptimizer,
    dlrover,
    gpu,
)
from streams.brain.core.optimizers import api as contract


def _nothing(ctx: OptimizeContext, params: NoParams) -> Proposal | None:
    return None


def test_the_brains_optimizers_are_the_functions_beside_the_contract() -> None:
    assert REGISTRY.names() == sorted(
        [
            "goodput",
            "gpu-oom",
            "host-oom",
            "hot-ps",
            "ps-cold-create",
            "ps-create",
            "ps-init-adjust",
            "ps-oom",
            "ps-util",
            "straggler",
            "worker-create",
            "worker-create-oom",
            "worker-resource",
        ]
    )
    for spec in REGISTRY.values():
        assert spec.fn.__module__ in (dlrover.__name__, gpu.__name__), spec.name
        assert spec.description
    assert not hasattr(contract, "register")  # nothing registers by being imported


def test_the_brains_registry_is_read_only_and_a_copy_takes_more() -> None:
    spec = OptimizerSpec("mine", "a user's", NoParams, _nothing)
    with pytest.raises(OptimizerNameError, match="read only"):
        REGISTRY.add(spec)
    mine = REGISTRY.copy()
    mine.add(spec)
    assert "mine" in mine and "mine" not in REGISTRY
    with pytest.raises(OptimizerNameError, match="already registered"):
        mine.add(spec)
    with pytest.raises(OptimizerNameError, match="non-empty, no padding"):
        mine.add(OptimizerSpec(" padded", "", NoParams, _nothing))


def test_an_unknown_name_is_one_line_with_the_known_ones() -> None:
    with pytest.raises(UnknownOptimizer) as err:
        REGISTRY["no-such"]
    assert isinstance(err.value, KeyError) and isinstance(err.value, OptimizerError)
    assert str(err.value).startswith("unknown optimizer 'no-such'; known: goodput, gpu-oom")
    assert REGISTRY["goodput"].name == "goodput"
