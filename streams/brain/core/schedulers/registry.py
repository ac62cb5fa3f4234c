"""The cluster schedulers by name: the one registry the brain, a dry run, the A/B presets
and the tests read. Apart from the package, so that importing the contract (`api.py`)
or a model beside it never loads the schedulers themselves."""

from __future__ import annotations

from dlrover_events.registry import Registry
from streams.brain.core.schedulers.api import SchedulerSpec, UnknownScheduler
from streams.brain.core.schedulers.goodput_cluster import GoodputClusterParams, schedule
from streams.brain.core.schedulers.tiresias import TiresiasParams, tiresias

SCHEDULERS: Registry[SchedulerSpec] = Registry.of(
    "scheduler",
    SchedulerSpec(
        "goodput-cluster",
        "all arrived jobs at once: GPUs and batch sizes for the most fairness-weighted "
        "goodput (Pollux's p=-1 power mean of speedups over a fair share), restart "
        "penalty and hysteresis, whole nodes for multi-node jobs, admission and "
        "preemption",
        GoodputClusterParams,
        schedule,
    ),
    SchedulerSpec(
        "tiresias",
        "the Pollux artifact's Tiresias baseline: two-queue least-attained-service "
        "(16 GPU-hours), each job's requested GPUs or none, preemption, batch untouched",
        TiresiasParams,
        tiresias,
    ),
    unknown=UnknownScheduler,
)


def get_scheduler(name: str) -> SchedulerSpec:
    """The registered scheduler; a one-line UnknownScheduler (a KeyError) naming the
    known ones otherwise."""
    return SCHEDULERS[name]


__all__ = ["SCHEDULERS", "get_scheduler"]
