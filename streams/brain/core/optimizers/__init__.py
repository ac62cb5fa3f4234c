"""The optimizer registry with the built-in optimizers registered on it.

Extend it with the decorator, from any module imported before the brain starts:

    from streams.brain.core.optimizers import OptimizeContext, Proposal, register

    @register("my-optimizer", "what it is for", MyParams)
    def my_optimizer(ctx: OptimizeContext, params: MyParams) -> Proposal | None: ...

`REGISTRY.describe()` lists every name with its description.
"""

from streams.brain.core.optimizers import dlrover, gpu
from streams.brain.core.optimizers.base import (
    REGISTRY,
    NoParams,
    OptimizeContext,
    OptimizerSpec,
    Proposal,
    Registry,
    register,
)

__all__ = [
    "REGISTRY",
    "NoParams",
    "OptimizeContext",
    "OptimizerSpec",
    "Proposal",
    "Registry",
    "dlrover",
    "gpu",
    "register",
]
