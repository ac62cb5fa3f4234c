"""A lockstep tick's acknowledgements are outputs a checkpoint covers (streams/brain/runtime/
courier.py `produced`): a checkpoint past a tick's barrier waits, beside `up`'s journaled
broker, until the journal has copied the tick's ack. Before, only plans counted: a
checkpoint was written with the ack still in the broker's memory, a kill of `up` lost it,
the brain started again past the barrier and never sent it again, and the operator waited
for it for good (issue 37's chaos test of the stack)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry

from dlrover_events.runtime.metrics import BrainMetrics
from dlrover_events.settings import Settings
from schemas.jobs import JobMeta
from schemas.lockstep import BarrierAck
from schemas.plans import ScalePlan
from streams.brain.core.processor import Output
from streams.brain.runtime.courier import Courier

ENV = "ca"
PLANS = f"{ENV}.scale.plans"


@dataclass
class Written:
    topic: str
    partition: int
    offset: int


async def test_a_ticks_acks_are_in_what_a_checkpoint_covers() -> None:
    ends: dict[tuple[str, int], int] = {}

    async def send(name: str, key: bytes | None, value: bytes, partition: int | None) -> Written:
        part = 0 if partition is None else partition
        offset = ends.get((name, part), 0)
        ends[(name, part)] = offset + 1
        return Written(name, part, offset)

    courier = Courier(
        Settings(), ENV, send, BrainMetrics(CollectorRegistry(), ENV), asyncio.Event()
    )
    courier._partitions[PLANS] = [0, 1, 2]  # (asked of the broker otherwise)
    at = datetime(2026, 3, 1, tzinfo=UTC)
    out = Output()
    out.add([ScalePlan(env=ENV, job=JobMeta(uuid="j"), plan_id="p1")], None)
    out.acks.append(BarrierAck(env=ENV, occurred_at=at, source="b", tick=36, sim_at=at))
    await courier.publish(out)
    assert courier.produced == {(PLANS, 0): 2, (PLANS, 1): 1, (PLANS, 2): 1}
