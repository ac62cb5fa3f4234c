"""The brain's checkpoint in the env's Postgres: job states and the offsets they cover.

Hot state lives in memory; writing it per event (a changelog) is what makes naive stream
processors slow. Instead the processor writes, every few seconds and when it stops, the
states that changed together with the next input offset of every partition, in one
transaction. A restart loads both and skips what the states already include; the events
after the checkpoint are decided again and, plan ids being derived from their cause,
yield the same plans.

What a checkpoint holds and which sample chunks it writes are decided in
`streams.brain.core.snapshot`; this is the SQL.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

from dlrover_events.store import EnvStore
from schemas.plans import OptimizePlan, ScalePlan
from streams.brain.core.samples import Sample
from streams.brain.core.snapshot import (
    Loaded,
    Offsets,
    SampleWrite,
    Snapshot,
    StoredSamples,
    sample_write,
    stored_samples,
)
from streams.brain.core.state import FINISHED, JobState, JobStatus
from streams.brain.core.state_json import samples_from_json, samples_json, state_json

#: The states a load reads whole: jobs not finished, and the newest completed jobs of each
#: scenario (what a brain keeps as history), oldest first, as they were remembered. Every
#: other finished job is only named: finished jobs pile up for as long as the env lives,
#: and reading all their states made every start and rebalance slower than the last.
_STATES = """
SELECT job_uuid, partition, state::text AS state FROM job_states
WHERE partition = ANY($1::int[])
  AND (NOT state->>'status' = ANY($3::text[]) OR job_uuid IN (
    SELECT job_uuid FROM (
      SELECT job_uuid, row_number() OVER (
        PARTITION BY state->'job'->>'scenario'
        ORDER BY (state->>'completed_at')::timestamptz DESC NULLS LAST, job_uuid DESC
      ) AS newest
      FROM job_states
      WHERE partition = ANY($1::int[]) AND state->>'status' = $4
        AND coalesce(state->'job'->>'scenario', '') <> ''
    ) ranked WHERE newest <= $2))
ORDER BY (state->>'completed_at')::timestamptz NULLS FIRST, job_uuid
"""

#: the statuses of FINISHED as the state documents hold them
_FINISHED = sorted(status.value for status in FINISHED)

#: where `brain_offsets` keeps a lockstep env's latest tick decided, per partition (as its
#: `next_offset`): no topic has this name (env topics are `<env>.<name>`)
TICKS = "lockstep.decided"


class BrainStore:
    """Reads and writes the checkpoint through the env's store (plans via EnvStore, so
    they land in the same `plans` and `scale_plans` tables as anyone else's)."""

    def __init__(self, store: EnvStore) -> None:
        self.store = store
        #: per job of the partitions loaded: what its sample chunks hold
        self._stored: dict[str, StoredSamples] = {}

    def forget(self, partitions: Iterable[int]) -> None:
        """Partitions another instance now writes: what their chunks hold is its to know."""
        gone = set(partitions)
        self._stored = {u: s for u, s in self._stored.items() if s.partition not in gone}

    async def load(
        self, partitions: Iterable[int], topics: Iterable[str], *, history_per_scenario: int
    ) -> Loaded:
        """The jobs of `partitions` (see `Loaded`; `history_per_scenario`: how many
        completed jobs of each scenario to read whole) and the offsets of `topics` there."""
        parts = sorted(set(partitions))
        async with self.store.pool.acquire() as conn:
            rows = await conn.fetch(
                _STATES, parts, history_per_scenario, _FINISHED, JobStatus.COMPLETED.value
            )
            chunk_rows = await conn.fetch(
                "SELECT job_uuid, seq, samples::text AS samples FROM job_sample_chunks"
                " WHERE job_uuid = ANY($1::text[]) ORDER BY job_uuid, seq",
                [r["job_uuid"] for r in rows],
            )
            finished = await conn.fetch(
                "SELECT job_uuid, partition FROM job_states WHERE partition = ANY($1::int[])"
                " AND state->>'status' = ANY($2::text[])",
                parts,
                _FINISHED,
            )
            offsets = await conn.fetch(
                "SELECT topic, partition, next_offset FROM brain_offsets"
                " WHERE partition = ANY($1::int[]) AND topic = ANY($2::text[])",
                parts,
                [*topics, TICKS],
            )
        chunks: dict[str, list[tuple[int, list[Sample]]]] = {}
        for r in chunk_rows:
            chunks.setdefault(r["job_uuid"], []).append((r["seq"], samples_from_json(r["samples"])))
        # whatever this process knew of these partitions' chunks, Postgres now says
        self.forget(parts)
        states: dict[str, tuple[int, JobState]] = {}
        for r in rows:
            job_uuid, partition = r["job_uuid"], r["partition"]
            state = JobState.model_validate_json(r["state"])
            state, stored = stored_samples(state, partition, chunks.get(job_uuid, ()))
            states[job_uuid] = (partition, state)
            if stored is not None and state.status not in FINISHED:
                self._stored[job_uuid] = stored
        return Loaded(
            states,
            {
                (r["topic"], r["partition"]): r["next_offset"]
                for r in offsets
                if r["topic"] != TICKS
            },
            {r["job_uuid"]: r["partition"] for r in finished},
            {r["partition"]: r["next_offset"] for r in offsets if r["topic"] == TICKS},
        )

    async def rebuild(
        self, loaded: Loaded, partitions: Iterable[int], topics: Iterable[str]
    ) -> Offsets:
        """Drop what the checkpoint holds of `partitions`, in Postgres and in `loaded`:
        their jobs' states and samples, and the offsets of `topics` there, set to 0; a
        brain then reads those partitions again from offset 0 (their logs end before the
        checkpoint). Returns the offsets dropped.

        In Postgres too, not only in what was loaded: the first checkpoint of the replay
        writes the offsets it reached and the states of the jobs it met so far, and a load
        after it (a restart, a rebalance, a rewind while the replay goes on) read the old
        states of every job the replay had not met yet beside those offsets. A job already
        finished in them ignored its events of the replay, a running one folded them a
        second time, and the plans of a replay from offset 0 were not those of the run
        without kills (issue 37's chaos test of the stack: 2 goodput plans more)."""
        parts = sorted(set(partitions))
        names = sorted(set(topics))
        dropped = {
            (name, part): offset
            for (name, part), offset in loaded.offsets.items()
            if part in parts and name in names
        }
        async with self.store.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "DELETE FROM job_sample_chunks WHERE job_uuid IN"
                " (SELECT job_uuid FROM job_states WHERE partition = ANY($1::int[]))",
                parts,
            )
            await conn.execute("DELETE FROM job_states WHERE partition = ANY($1::int[])", parts)
            reset = {(name, part): 0 for name in names for part in parts}
            await conn.execute(_UPSERT, *_columns(reset))
            await conn.execute(
                "DELETE FROM brain_offsets WHERE topic = $1 AND partition = ANY($2::int[])",
                TICKS,
                parts,
            )
        self.forget(parts)
        loaded.states = {u: sp for u, sp in loaded.states.items() if sp[0] not in parts}
        loaded.finished = {u: p for u, p in loaded.finished.items() if p not in parts}
        loaded.ticks = {p: t for p, t in loaded.ticks.items() if p not in parts}
        for tp in dropped:
            del loaded.offsets[tp]
        return dropped

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
        if not (snapshot.states or snapshot.offsets or snapshot.reset or snapshot.ticks):
            return
        docs: list[tuple[str, int, str]] = []
        writes: dict[str, SampleWrite] = {}
        for job_uuid, (partition, state) in snapshot.states.items():
            docs.append((job_uuid, partition, state_json(state, with_samples=False)))
            writes[job_uuid] = sample_write(state.samples, self._stored.get(job_uuid), partition)
            await asyncio.sleep(0)  # a running job costs a fraction of a ms: go on between
        added = [(u, w.seq, samples_json(w.new)) for u, w in writes.items() if w.new]
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
            stale = [(u, w.keep_from) for u, w in writes.items() if w.keep_from > 0]
            if stale:
                await conn.execute(
                    """
                    DELETE FROM job_sample_chunks c
                    USING unnest($1::text[], $2::bigint[]) AS d(u, keep_from)
                    WHERE c.job_uuid = d.u AND c.seq < d.keep_from
                    """,
                    [u for u, _ in stale],
                    [k for _, k in stale],
                )
            if added:
                await conn.execute(
                    """
                    INSERT INTO job_sample_chunks (job_uuid, seq, samples)
                    SELECT u, q, s::jsonb
                    FROM unnest($1::text[], $2::bigint[], $3::text[]) AS t(u, q, s)
                    ON CONFLICT (job_uuid, seq) DO UPDATE SET samples = EXCLUDED.samples
                    """,
                    [u for u, _, _ in added],
                    [q for _, q, _ in added],
                    [t for _, _, t in added],
                )
            # the greatest of stored and new, so that nothing moves an offset back; except
            # where the log restarted: there the stored offset is wrong
            kept = {tp: o for tp, o in snapshot.offsets.items() if tp not in snapshot.reset}
            kept.update({(TICKS, part): tick for part, tick in snapshot.ticks.items()})
            reset = {tp: snapshot.offsets.get(tp, o) for tp, o in snapshot.reset.items()}
            if kept:
                await conn.execute(_UPSERT_GREATEST, *_columns(kept))
            if reset:
                await conn.execute(_UPSERT, *_columns(reset))
        # written: from now on what Postgres holds (a finished job's state is not
        # written again, and a write after all would start its chunks anew)
        for job_uuid, write in writes.items():
            partition, state = snapshot.states[job_uuid]
            if write.stored is None or state.status in FINISHED:
                self._stored.pop(job_uuid, None)
            else:
                self._stored[job_uuid] = write.stored

    async def save_plans(self, plans: Sequence[OptimizePlan | ScalePlan]) -> None:
        await self.store.save_plans([p for p in plans if isinstance(p, OptimizePlan)])
        await self.store.save_scale_plans([p for p in plans if isinstance(p, ScalePlan)])


_UPSERT = """
INSERT INTO brain_offsets (topic, partition, next_offset, updated_at)
SELECT t, p, o, now() FROM unnest($1::text[], $2::int[], $3::bigint[]) AS x(t, p, o)
ON CONFLICT (topic, partition) DO UPDATE
SET next_offset = EXCLUDED.next_offset, updated_at = EXCLUDED.updated_at
"""
_UPSERT_GREATEST = _UPSERT.replace(
    "SET next_offset = EXCLUDED.next_offset",
    "SET next_offset = GREATEST(brain_offsets.next_offset, EXCLUDED.next_offset)",
)


def _columns(offsets: Offsets) -> tuple[list[str], list[int], list[int]]:
    return (
        [t for t, _ in offsets],
        [p for _, p in offsets],
        list(offsets.values()),
    )
