"""Retention of finished jobs in the brain's checkpoint: pruned after a while, their late
events still ignored.

Finished jobs' states and sample chunks piled up for as long as an env lived, and every
start or rebalance read the names of all of them. After `retention_s` (the env's `brain`
settings) a finished job is cut to a tombstone: its `job_states` row keeps only who it
was and when it ended (`pruned_at` set), and its sample chunks are deleted. The
tombstone is what keeps a late event of the job (a straggling sample, a result after the
end, a replay from the log's beginning) from starting a new job: the brain loads it as
finished, as before the pruning. Tombstones are bounded in turn: deleted `tombstone_s`
after, and only the newest `max_tombstones` of a brain's partitions kept. Past that, an
event of the job is one of an unknown job, as for any job the brain never saw. (A rule
on the event's age instead would drop the first events of a replay into a virtual env,
whose times are old.)

What to prune is the pure `streams.brain.core.retention.select`; `Pruner` reads the
finished jobs of the partitions its brain owns, writes the pruning in one transaction
and tells the processor which ids it no longer needs to remember. Its clock is the
brain's own event time (never ahead of the wall clock), so a virtual env replaying an
old trace prunes by the trace's time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from dlrover_events.store import EnvStore
from schemas.env_settings import BrainSettings
from streams.brain.core.processor import BrainProcessor
from streams.brain.core.retention import Finished, Pruned, Pruning, select
from streams.brain.core.state import FINISHED

log = logging.getLogger(__name__)


#: the statuses of FINISHED as the state documents hold them
_FINISHED = sorted(status.value for status in FINISHED)

_FINISHED_JOBS = """
SELECT job_uuid,
       coalesce((state->>'completed_at')::timestamptz, updated_at) AS finished_at,
       state->>'pruned_at' IS NOT NULL AS pruned
FROM job_states
WHERE partition = ANY($1::int[]) AND state->>'status' = ANY($2::text[])
"""

#: what a tombstone keeps of a state: a JobState, with every other field at its default
_TOMBSTONE = """
UPDATE job_states
SET state = jsonb_strip_nulls(jsonb_build_object(
        'env', state->'env', 'job', state->'job', 'distribution', state->'distribution',
        'status', state->'status', 'submitted_at', state->'submitted_at',
        'completed_at', state->'completed_at', 'pruned_at', to_jsonb($3::timestamptz))),
    updated_at = now()
WHERE job_uuid = ANY($1::text[]) AND partition = ANY($2::int[])
  AND state->>'status' = ANY($4::text[])
"""


async def prune(
    store: EnvStore, partitions: Iterable[int], now: datetime, rules: BrainSettings
) -> tuple[Pruning, Pruned]:
    """Prune the finished jobs of `partitions` as of `now`, in one transaction."""
    parts = sorted(set(partitions))
    if not parts:
        return Pruning(), Pruned()
    async with store.pool.acquire() as conn, conn.transaction():
        rows = await conn.fetch(_FINISHED_JOBS, parts, _FINISHED)
        chosen = select(
            (Finished(r["job_uuid"], r["finished_at"], r["pruned"]) for r in rows), now, rules
        )
        if not chosen:
            return chosen, Pruned()
        gone = [*chosen.tombstone, *chosen.delete]
        await conn.execute("DELETE FROM job_sample_chunks WHERE job_uuid = ANY($1::text[])", gone)
        cut = await conn.execute(_TOMBSTONE, list(chosen.tombstone), parts, now, _FINISHED)
        deleted = await conn.execute(
            "DELETE FROM job_states WHERE job_uuid = ANY($1::text[]) AND partition = ANY($2::int[])"
            " AND state->>'status' = ANY($3::text[])",
            list(chosen.delete),
            parts,
            _FINISHED,
        )
    return chosen, Pruned(_count(cut), _count(deleted))


def _count(status: str) -> int:
    """The row count of an asyncpg command status ('UPDATE 3', 'DELETE 0')."""
    return int(status.rsplit(" ", 1)[-1])


class Pruner:
    """Retention for one brain: `await pruner.maybe_prune()` after each checkpoint, under
    the lock that keeps rebalances out (the partitions it prunes are the brain's own).

    It prunes at most once per `prune_every_s` (of the monotonic clock), only the
    partitions the processor has loaded (another brain owns the others), and as of the
    processor's event time (not ahead of the wall clock); it does nothing before the
    processor has decided an event, or when the policy keeps finished jobs. A failure is
    logged and tried again later, never raised: pruning must not stop checkpoints."""

    def __init__(self, store: EnvStore, processor: BrainProcessor) -> None:
        self.store = store
        self.processor = processor
        self.totals = Pruned()
        self._last: float | None = None

    async def maybe_prune(self, wall: datetime | None = None) -> Pruned | None:
        rules = self.processor.policy.settings
        event_time = self.processor.event_time
        if rules.retention_s is None or event_time is None:
            return None
        now_s = time.monotonic()
        if self._last is not None and now_s - self._last < rules.prune_every_s:
            return None
        self._last = now_s
        now = min(event_time, wall or datetime.now(UTC))
        try:
            chosen, done = await prune(self.store, self.processor.loaded, now, rules)
        except Exception as exc:  # the next prune tries again; checkpoints go on meanwhile
            log.warning(
                "retention: pruning finished jobs failed, next try in %.0f s: %s: %s",
                rules.prune_every_s,
                type(exc).__name__,
                exc,
            )
            return None
        self.processor.forget(chosen.delete)
        self.totals = Pruned(
            self.totals.tombstones + done.tombstones, self.totals.deleted + done.deleted
        )
        if done.tombstones or done.deleted:
            log.info(
                "retention: %d finished job(s) pruned to tombstones, %d tombstone(s) deleted"
                " (finished before %s)",
                done.tombstones,
                done.deleted,
                (now - timedelta(seconds=rules.retention_s)).isoformat(),
            )
        return done
