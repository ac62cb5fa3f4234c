"""Per-job optimizers: the contract (`api.py`), the optimizers beside it, and the brain's
registry of them, written out here by name (no import side effects register anything), so
the brain, the dry run and the tests find the same ones. `dlrover-events optimizers` lists
them.

A new optimizer is a pure function `(OptimizeContext, Params) -> Proposal | None` beside
the others, named below. A user's own go on a copy, which the brain is given:

    from streams.brain.core.optimizers import REGISTRY, OptimizeContext, Proposal

    mine = REGISTRY.copy()

    @mine.register("my-optimizer", "what it is for", MyParams)
    def my_optimizer(ctx: OptimizeContext, params: MyParams) -> Proposal | None: ...

    Policy.from_settings(settings, registry=mine)
"""

from streams.brain.core.optimizers import dlrover, gpu
from streams.brain.core.optimizers.api import (
    NoParams,
    OptimizeContext,
    OptimizerError,
    OptimizerNameError,
    OptimizerSpec,
    Proposal,
    Registry,
    UnknownOptimizer,
)

#: The brain's optimizers, by name.
REGISTRY = Registry.of(
    OptimizerSpec(
        "worker-create",
        "create stage: worker cpu/memory from completed jobs of the same scenario (7 days)",
        dlrover.WorkerCreateParams,
        dlrover.worker_create,
    ),
    OptimizerSpec(
        "worker-create-oom",
        "create stage after a worker OOM: memory from history (x1.2 for OOM nodes) or +4e9",
        dlrover.WorkerCreateOOMParams,
        dlrover.worker_create_oom,
    ),
    OptimizerSpec(
        "ps-create",
        "create stage: PS count/cpu/memory from the PS use of completed jobs of the scenario",
        dlrover.PSCreateParams,
        dlrover.ps_create,
    ),
    OptimizerSpec(
        "ps-cold-create",
        "create stage without history: a fixed PS group (4 x 12 cores x 16 GiB by default)",
        dlrover.PSColdCreateParams,
        dlrover.ps_cold_create,
    ),
    OptimizerSpec(
        "ps-oom",
        "PS ran out of host memory: double PS memory (imbalanced PS) or double the PS count",
        dlrover.PSOOMParams,
        dlrover.ps_oom,
    ),
    OptimizerSpec(
        "ps-init-adjust",
        "ps-initial stage: PS cpu from recv ops and use, PS count for the target worker count",
        dlrover.PSInitAdjustParams,
        dlrover.ps_init_adjust,
    ),
    OptimizerSpec(
        "hot-ps",
        "running: raise the cpu of every PS for the target worker count once a PS is hot",
        dlrover.HotPSParams,
        dlrover.hot_ps,
    ),
    OptimizerSpec(
        "ps-util",
        "running, long jobs under PS pressure: shrink the PS that are under 40 % used",
        dlrover.PSUtilParams,
        dlrover.ps_util,
    ),
    OptimizerSpec(
        "worker-resource",
        "worker-initial/running: worker count from PS headroom and speed, cpu/memory from use",
        dlrover.WorkerResourceParams,
        dlrover.worker_resource,
    ),
    OptimizerSpec(
        "goodput",
        "GPU all-reduce: fit step time vs GPUs and batch from the job's samples; pick the "
        "worker count with most goodput at acceptable per-GPU efficiency, within free GPUs",
        gpu.GoodputParams,
        gpu.goodput,
    ),
    OptimizerSpec(
        "gpu-oom",
        "GPU OOM: halve the micro-batch and raise gradient accumulation (same global batch), "
        "else more GPU memory per replica",
        gpu.GPUOOMParams,
        gpu.gpu_oom,
    ),
    OptimizerSpec(
        "host-oom",
        "host OOM: bump the memory of the nodes that ran out (x2, +2..8 GiB, <= 64 GiB), "
        "once per OOM event",
        gpu.HostOOMParams,
        gpu.host_oom,
    ),
    OptimizerSpec(
        "straggler",
        "replace the nodes whose step time is an outlier (> median + 3 MAD) in recent samples",
        gpu.StragglerParams,
        gpu.straggler,
    ),
)

__all__ = [
    "REGISTRY",
    "NoParams",
    "OptimizeContext",
    "OptimizerError",
    "OptimizerNameError",
    "OptimizerSpec",
    "Proposal",
    "Registry",
    "UnknownOptimizer",
]
