"""The brain's checkpoint in the env's Postgres: job states and the offsets they cover.

Hot state lives in memory; writing it per event (a changelog) is what makes naive stream
processors slow. Instead the processor writes, every few seconds and when it stops, the
states that changed together with the next input offset of every partition, in one
transaction. A restart loads both and skips what the states already include; the events
after the checkpoint are decided again and, plan ids being derived from their cause,
yield the same plans.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from dlrover_events.store import EnvStore
from schemas.plans import OptimizePlan, ScalePlan
from streams.brain.state import JobState, state_json

#: (topic, partition) -> next offset to process
Offsets = dict[tuple[str, int], int]


@dataclass
class Snapshot:
    """What one checkpoint writes: changed states with their partition, the next offsets
    of the inputs they include and of the outputs published so far, and new plans.

    States are immutable (folds return new ones), so holding them here is a consistent
    copy even while the processor goes on."""

    states: dict[str, tuple[int, JobState]] = field(default_factory=dict)
    offsets: Offsets = field(default_factory=dict)
    plans: list[OptimizePlan | ScalePlan] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.states or self.offsets or self.plans)


@dataclass
class Loaded:
    states: dict[str, tuple[int, JobState]]
    offsets: Offsets


class BrainStore:
    """Reads and writes the checkpoint through the env's store (plans via EnvStore, so
    they land in the same `plans` and `scale_plans` tables as anyone else's)."""

    def __init__(self, store: EnvStore) -> None:
        self.store = store

    async def load(self, partitions: Iterable[int], topics: Iterable[str]) -> Loaded:
        """The states of the jobs in `partitions` and the offsets of `topics` there."""
        parts = sorted(set(partitions))
        async with self.store.pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT job_uuid, partition, state::text AS state FROM job_states"
                " WHERE partition = ANY($1::int[])",
                parts,
            )
            offsets = await conn.fetch(
                "SELECT topic, partition, next_offset FROM brain_offsets"
                " WHERE partition = ANY($1::int[]) AND topic = ANY($2::text[])",
                parts,
                list(topics),
            )
        states = {
            r["job_uuid"]: (r["partition"], JobState.model_validate_json(r["state"])) for r in rows
        }
        return Loaded(states, {(r["topic"], r["partition"]): r["next_offset"] for r in offsets})

    async def offsets(self, topics: Iterable[str]) -> Offsets:
        """Checkpointed offsets of whole topics (the brain's outputs, whatever partition)."""
        rows = await self.store.pool.fetch(
            "SELECT topic, partition, next_offset FROM brain_offsets WHERE topic = ANY($1::text[])",
            list(topics),
        )
        return {(r["topic"], r["partition"]): r["next_offset"] for r in rows}

    async def save(self, snapshot: Snapshot) -> None:
        """Plans first (idempotent by plan_id), then states and offsets atomically: a crash
        in between only means the plans are recorded again, as no-ops, after the replay."""
        await self.save_plans(snapshot.plans)
        if not (snapshot.states or snapshot.offsets):
            return
        docs: list[tuple[str, int, str]] = []
        for job_uuid, (partition, state) in snapshot.states.items():
            docs.append((job_uuid, partition, state_json(state)))
            await asyncio.sleep(0)  # ~0.5 ms per running job: let the stream go on between
        async with self.store.pool.acquire() as conn, conn.transaction():
            if docs:
                uuids, parts, texts = zip(*docs, strict=True)
                await conn.execute(
                    """
                    INSERT INTO job_states (job_uuid, partition, state, updated_at)
                    SELECT u, p, s::jsonb, now()
                    FROM unnest($1::text[], $2::int[], $3::text[]) AS t(u, p, s)
                    ON CONFLICT (job_uuid) DO UPDATE
                    SET partition = EXCLUDED.partition, state = EXCLUDED.state,
                        updated_at = EXCLUDED.updated_at
                    """,
                    list(uuids),
                    list(parts),
                    list(texts),
                )
            if snapshot.offsets:
                topics, parts, nexts = zip(
                    *((t, p, o) for (t, p), o in snapshot.offsets.items()), strict=True
                )
                await conn.execute(
                    """
                    INSERT INTO brain_offsets (topic, partition, next_offset, updated_at)
                    SELECT t, p, o, now()
                    FROM unnest($1::text[], $2::int[], $3::bigint[]) AS x(t, p, o)
                    ON CONFLICT (topic, partition) DO UPDATE
                    SET next_offset = GREATEST(brain_offsets.next_offset, EXCLUDED.next_offset),
                        updated_at = EXCLUDED.updated_at
                    """,
                    list(topics),
                    list(parts),
                    list(nexts),
                )

    async def save_plans(self, plans: Sequence[OptimizePlan | ScalePlan]) -> None:
        await self.store.save_plans([p for p in plans if isinstance(p, OptimizePlan)])
        await self.store.save_scale_plans([p for p in plans if isinstance(p, ScalePlan)])


def merge_offsets(into: Offsets, more: Mapping[tuple[str, int], int]) -> None:
    for tp, offset in more.items():
        if offset > into.get(tp, -1):
            into[tp] = offset
