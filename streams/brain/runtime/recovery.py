"""What a brain learns from the broker before it resumes partitions from its checkpoint.

Two things: which checkpointed offsets lie beyond their log's end, and which plans a
crashed brain published after its last checkpoint (so replaying the events after it does
not publish them again).

A log that ends before the offset a checkpoint holds for it was restarted: an embedded
broker with memory storage begins every topic again at offset 0 after its restart while
Postgres still holds the old, higher offsets. Resuming from those would skip every new
record below them, silently. Such an offset is said so, loudly, and the partition is read
from the log's beginning (the caller overwrites the stored offset).

Whether a log ends before an offset is asked of its records (`TopicReader.short_of`),
not of the end the broker answers: tansu answers a lower bound (20,010 for 20,100), and a
caught-up brain restarted on it took its own checkpoint for a restarted log, read
everything again and reported thousands of records of lag with none pending. The cheap
end offsets only say which partitions to ask about.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from aiokafka import TopicPartition

from dlrover_events.bus.topic_reader import TopicReader
from dlrover_events.settings import Settings
from schemas.codec import CodecError, decode
from schemas.plans import OptimizePlan, ScalePlan
from streams.brain.core.snapshot import Offsets

log = logging.getLogger(__name__)

TP = tuple[str, int]


def stale_offsets(stored: Mapping[TP, int], ends: Mapping[TP, int]) -> dict[TP, tuple[int, int]]:
    """The stored offsets beyond their log's end, as (stored, end): their log restarted.
    `ends` must be true ends (a fetch's high watermark, `TopicReader.short_of`), not
    tansu's answer to ListOffsets. A partition whose end is unknown is not judged."""
    return {
        tp: (offset, ends[tp]) for tp, offset in stored.items() if tp in ends and offset > ends[tp]
    }


def warn_stale(stale: Mapping[TP, tuple[int, int]], what: str) -> None:
    for (name, part), (offset, end) in sorted(stale.items()):
        log.warning(
            "%s %s[%d]: the checkpoint holds offset %d but the log ends at %d (the broker's "
            "log restarted); reading it from the beginning",
            what,
            name,
            part,
            offset,
            end,
        )


@dataclass
class Recovered:
    """`published`: plan ids on the outputs after the checkpointed offsets;
    `stale_inputs`, `stale_outputs`: checkpointed offsets beyond their log's end, as
    (stored, end) (read from the beginning instead)."""

    published: set[str] = field(default_factory=set)
    stale_inputs: dict[TP, tuple[int, int]] = field(default_factory=dict)
    stale_outputs: dict[TP, tuple[int, int]] = field(default_factory=dict)


async def recover(
    settings: Settings,
    inputs: Mapping[TP, int],
    outputs: Sequence[str],
    since: Offsets,
    timeout_s: float = 30.0,
) -> Recovered:
    """Which checkpointed offsets of `inputs` (input partition -> offset) and of `outputs`
    (`since`) lie beyond their log's end, and the plan ids on `outputs` from `since` to
    their end (from the start where none was checkpointed, or where the checkpointed one
    is beyond the end)."""
    in_topics = sorted({name for name, _ in inputs} - set(outputs))
    async with TopicReader(
        settings, [*outputs, *in_topics], client_id="brain-recovery", require=False
    ) as reader:
        hints = {(tp.topic, tp.partition): end for tp, end in reader.end_hint.items()}
        held = {**{tp: o for tp, o in since.items() if tp[0] in outputs}, **inputs}
        # only an offset beyond the broker's (lower-bound) end can be beyond the true end
        suspects = {
            TopicPartition(*tp): offset
            for tp, offset in held.items()
            if tp in hints and offset > hints[tp]
        }
        short = await reader.short_of(suspects, timeout_s=timeout_s)
    ends = {(tp.topic, tp.partition): end for tp, end in short.items()}
    stale_in = stale_offsets(dict(inputs), ends)
    stale_out = stale_offsets({tp: o for tp, o in held.items() if tp[0] in outputs}, ends)
    out_parts = [tp for tp in hints if tp[0] in outputs]
    start = {tp: 0 if tp in stale_out else since.get(tp, 0) for tp in out_parts}
    found = await _plan_ids(settings, outputs, start, timeout_s)
    return Recovered(found, stale_in, stale_out)


async def _plan_ids(
    settings: Settings, outputs: Sequence[str], start: Mapping[TP, int], timeout_s: float
) -> set[str]:
    begin = {TopicPartition(*tp): offset for tp, offset in start.items()}
    found: set[str] = set()
    async with TopicReader(
        settings, outputs, client_id="brain-recovery", begin=begin, require=False
    ) as reader:
        for record in await reader.read_to_end(timeout_s=timeout_s):
            try:
                event = decode(record.value)
            except CodecError:
                continue
            if isinstance(event, OptimizePlan | ScalePlan):
                found.add(event.plan_id)
        if not await reader.caught_up():
            log.warning("brain recovery did not reach the end of %s", ", ".join(outputs))
    return found


async def published_since(
    settings: Settings, topics: Sequence[str], since: Offsets, timeout_s: float = 30.0
) -> set[str]:
    """Plan ids on `topics` from the checkpointed offsets to the end: what a crashed
    brain published after its last checkpoint."""
    return (await recover(settings, {}, topics, since, timeout_s)).published
