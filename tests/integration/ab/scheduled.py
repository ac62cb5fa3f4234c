"""What a scheduler arm's env says on the bus, for the A/B tests that check its plans."""

from __future__ import annotations

from dlrover_events.bus.topic_reader import read_topic
from dlrover_events.bus.topics import SCALE_PLANS, SCALE_RESULTS, topic
from dlrover_events.settings import Settings
from schemas.codec import decode
from schemas.plans import ScalePlan, ScaleResult


async def plans_and_results(
    settings: Settings, env: str
) -> tuple[list[ScalePlan], list[ScaleResult]]:
    """Every ScalePlan the env's brain published, and every answer its operator gave."""
    plans = [decode(r.value) for r in await read_topic(settings, topic(env, SCALE_PLANS))]
    results = [decode(r.value) for r in await read_topic(settings, topic(env, SCALE_RESULTS))]
    return (
        [p for p in plans if isinstance(p, ScalePlan)],
        [r for r in results if isinstance(r, ScaleResult)],
    )
