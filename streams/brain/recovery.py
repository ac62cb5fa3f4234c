"""What a brain learns from the broker before it resumes partitions from its checkpoint.

Two things: where each log ends, and which plans a crashed brain published after its
last checkpoint (so replaying the events after it does not publish them again).

A log that ends before the offset a checkpoint holds for it was restarted: the embedded
broker keeps topics in memory, so after its restart every topic begins again at offset 0
while Postgres still holds the old, higher offsets. Resuming from those would skip every
new record below them, silently. Such an offset is said so, loudly, and the partition is
read from the log's beginning (`stale_offsets` decides; the caller overwrites the stored
offset).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, TopicPartition

from dlrover_events.settings import Settings
from schemas.codec import CodecError, decode
from schemas.plans import OptimizePlan, ScalePlan
from streams.brain.checkpoint import Offsets
from streams.brain.faust_glue import refresh_metadata

log = logging.getLogger(__name__)

TP = tuple[str, int]


def stale_offsets(stored: Mapping[TP, int], ends: Mapping[TP, int]) -> dict[TP, tuple[int, int]]:
    """The stored offsets beyond their log's end, as (stored, end): their log restarted.
    A partition whose end is unknown is not judged."""
    return {
        tp: (offset, ends[tp]) for tp, offset in stored.items() if tp in ends and offset > ends[tp]
    }


def warn_stale(stale: Mapping[TP, tuple[int, int]], what: str) -> None:
    for (name, part), (offset, end) in sorted(stale.items()):
        log.warning(
            "%s %s[%d]: the checkpoint holds offset %d but the log ends at %d (the broker's "
            "log restarted?); reading it from the beginning",
            what,
            name,
            part,
            offset,
            end,
        )


@dataclass
class Recovered:
    """`ends`: the end offset of every partition asked about; `published`: plan ids on the
    outputs after the checkpointed offsets; `stale_outputs`: output offsets the
    checkpoint holds beyond their log's end (read from the beginning instead)."""

    ends: dict[TP, int] = field(default_factory=dict)
    published: set[str] = field(default_factory=set)
    stale_outputs: dict[TP, tuple[int, int]] = field(default_factory=dict)


def _consumer(settings: Settings) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap_servers,
        client_id=f"{settings.client_id}-brain-recovery",
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        request_timeout_ms=settings.request_timeout_ms,
    )


async def recover(
    settings: Settings,
    inputs: Iterable[TP],
    outputs: Sequence[str],
    since: Offsets,
    timeout_s: float = 30.0,
) -> Recovered:
    """The ends of `inputs`, and the plan ids on `outputs` from the checkpointed offsets
    `since` to their end (from the start where none was checkpointed, or where the
    checkpointed one is beyond the end)."""
    consumer = _consumer(settings)
    await consumer.start()
    try:
        await refresh_metadata(consumer)
        outs = [
            TopicPartition(name, p)
            for name in outputs
            for p in sorted(consumer.partitions_for_topic(name) or ())
        ]
        ins = [TopicPartition(name, p) for name, p in inputs]
        asked = list(dict.fromkeys([*ins, *outs]))
        ends_tp = await consumer.end_offsets(asked) if asked else {}
        ends = {(tp.topic, tp.partition): end for tp, end in ends_tp.items()}
        out_ends = {(tp.topic, tp.partition): ends[(tp.topic, tp.partition)] for tp in outs}
        stale = stale_offsets({tp: o for tp, o in since.items() if tp in out_ends}, out_ends)
        start = {tp: 0 if tp in stale else since.get(tp, 0) for tp in out_ends}
        found = await _plan_ids(consumer, start, out_ends, timeout_s)
        return Recovered(ends, found, stale)
    finally:
        await consumer.stop()


async def _plan_ids(
    consumer: AIOKafkaConsumer, start: Mapping[TP, int], ends: Mapping[TP, int], timeout_s: float
) -> set[str]:
    todo = {TopicPartition(*tp): ends[tp] for tp in start if start[tp] < ends[tp]}
    if not todo:
        return set()
    consumer.assign(list(todo))
    for tp in todo:
        consumer.seek(tp, start[(tp.topic, tp.partition)])
    found: set[str] = set()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while todo and loop.time() < deadline:
        batch = await consumer.getmany(timeout_ms=200)
        for tp, records in batch.items():
            for record in records:
                try:
                    event = decode(record.value)
                except CodecError:
                    continue
                if isinstance(event, OptimizePlan | ScalePlan):
                    found.add(event.plan_id)
            if records and records[-1].offset + 1 >= todo.get(tp, 0):
                todo.pop(tp, None)
    if todo:
        log.warning("brain recovery did not reach the end of %s", sorted(map(str, todo)))
    return found


async def published_since(
    settings: Settings, topics: Sequence[str], since: Offsets, timeout_s: float = 30.0
) -> set[str]:
    """Plan ids on `topics` from the checkpointed offsets to the end: what a crashed
    brain published after its last checkpoint."""
    return (await recover(settings, (), topics, since, timeout_s)).published
