"""Cluster-wide schedulers: one allocation of an env's GPUs across all its arrived jobs.

Per-job optimizers (streams.brain.core.optimizers) answer what happened to one job; a
scheduler answers who gets which GPUs, once per tick, and so must see every arrived job
at once. Schedulers are pure functions registered here by name, explicitly (no import
side effects), so the brain, a dry run and the tests find the same ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from schemas.envelope import Model
from streams.brain.core.schedulers.goodput_cluster import (
    Cluster,
    GoodputClusterParams,
    JobInput,
    Schedule,
    schedule,
)
from streams.brain.core.schedulers.tiresias import TiresiasParams, tiresias

#: (now, cluster, jobs, params) -> the tick's schedule
ScheduleFn = Callable[[float, Cluster, Sequence[JobInput], Any], Schedule]


@dataclass(frozen=True, slots=True)
class SchedulerSpec:
    name: str
    description: str
    params: type[Model]
    run: ScheduleFn

    def parse(self, raw: Mapping[str, object] | None) -> Model:
        """The scheduler's parameters from a settings document (pydantic errors for
        unknown or out-of-range fields)."""
        return self.params.model_validate(raw or {})


SCHEDULERS: Mapping[str, SchedulerSpec] = MappingProxyType(
    {
        "goodput-cluster": SchedulerSpec(
            "goodput-cluster",
            "all arrived jobs at once: GPUs and batch sizes for the most fairness-weighted "
            "goodput (Pollux's p=-1 power mean of speedups over a fair share), restart "
            "penalty and hysteresis, whole nodes for multi-node jobs, admission and "
            "preemption",
            GoodputClusterParams,
            schedule,
        ),
        "tiresias": SchedulerSpec(
            "tiresias",
            "the Pollux artifact's Tiresias baseline: two-queue least-attained-service "
            "(16 GPU-hours), each job's requested GPUs or none, preemption, batch untouched",
            TiresiasParams,
            tiresias,
        ),
    }
)


def get_scheduler(name: str) -> SchedulerSpec:
    """The registered scheduler; a one-line KeyError naming the known ones otherwise."""
    try:
        return SCHEDULERS[name]
    except KeyError:
        raise KeyError(
            f"unknown scheduler {name!r} (known: {', '.join(sorted(SCHEDULERS))})"
        ) from None


__all__ = ["SCHEDULERS", "ScheduleFn", "SchedulerSpec", "get_scheduler"]
