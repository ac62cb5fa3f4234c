"""What a reallocation costs a training job, by how its processes take it (pure).

One table, read by the two places that price a reallocation: the simulator charges it to
every simulated job whose GPUs change (the virtual operator's `restart_delay` and
`in_place_delay` default to it, schemas/env_settings.py), and the goodput-cluster
scheduler weighs it against the gain of a change (its restart penalty,
streams/brain/core/schedulers/goodput_cluster.py). Each figure is kept with where it comes from;
a better measurement replaces the number and its source together.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.plans import RescaleMode


@dataclass(frozen=True)
class RescaleCost:
    """Seconds a job trains nothing when its allocation changes, and their source."""

    seconds: float
    source: str


RESCALE_COSTS: dict[RescaleMode, RescaleCost] = {
    RescaleMode.RESTART: RescaleCost(
        30.0,
        "the Pollux OSDI'21 artifact's simulator (RESTART_DELAY: checkpoint, restart and "
        "restore of its GPU jobs), which the published JCTs the A/B tests compare with "
        "assume; `dlrover-events bench elastic` measures 12-17 s for the small example on "
        "the local platform (a cold torchrun restart of a 2-core machine)",
    ),
    RescaleMode.IN_PLACE: RescaleCost(
        0.224,
        "`dlrover-events bench elastic --mode in_place --resizes 12` (2026-11, the project's "
        "shared 2-core machine under load, gloo on CPU): median of 6 scale-ups with a warm "
        "spare, from the plan's publication to the end of the first step at the new size "
        "(the 6 scale-downs: 0.197 s). The example's model is small and NCCL was not "
        "measured: a GPU job's group re-form and state transfer may cost more",
    ),
}


def rescale_cost_s(mode: RescaleMode | str) -> float:
    """The seconds of a reallocation in ``mode`` (``restart`` or ``in_place``)."""
    return RESCALE_COSTS[RescaleMode(mode)].seconds


__all__ = ["RESCALE_COSTS", "RescaleCost", "rescale_cost_s"]
