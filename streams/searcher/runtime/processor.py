"""The searcher's I/O shell: a batch of inputs decided in one Postgres transaction, then
published, then committed.

For each batch the consumer hands over (dlrover_events.bus.consumer: what does not decode
is dead-lettered there, with the reason), in one transaction:

1. the stored offsets of the batch's partitions are locked and every record below them
   skipped (the state already includes it: a restart, or another instance, got there);
2. the experiments the batch concerns are locked and loaded (from this process's copy when
   its version is current), and what an earlier instance decided for them and did not
   publish (a crash) is published first, so an experiment's events go out in order;
3. each record is stepped in the order read (`step.py`, pure);
4. the new states, the events to publish (the outbox) and the offsets are written.

Then the events are published from the outbox and deleted from it, and the consumer
commits the offsets. A searcher killed at any point resumes correctly: before the commit,
nothing was published and the records are decided again (whatever order the partitions
are read in then); after it, the outbox holds exactly what was decided, published at the
next start, and the records are skipped. Publishing an event twice (a crash before the
outbox's delete) duplicates nothing: decisions carry their ``(experiment, seq)`` and id,
requests their ``request_id``, plans their ``plan_id``, which consumers keep once.

Postgres or the broker away: the batch is tried again after a backoff, for as long as it
takes (an input must not be dead-lettered for an outage); a stop cancels the wait. An
input the core fails on is raised to the consumer, which dead-letters it with the reason
and goes on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import asyncpg
from aiokafka import TopicPartition
from aiokafka.errors import KafkaError
from asyncpg.pool import PoolConnectionProxy

from dlrover_events.backoff import Backoff
from dlrover_events.bus.consumer import Received
from dlrover_events.bus.producer import Producer, event_key
from dlrover_events.bus.topic_reader import TopicReader
from dlrover_events.bus.topics import topic_of
from dlrover_events.errors import BusUnavailable
from dlrover_events.runtime.logs import log_fields
from dlrover_events.runtime.metrics import SearcherMetrics
from schemas.codec import encode
from schemas.envelope import Event
from schemas.experiments import ExperimentSubmitted, TrialDecision
from streams.brain.runtime.recovery import stale_offsets, warn_stale
from streams.searcher.runtime.step import SOURCE, Experiment, experiment_of, start, step

log = logging.getLogger(__name__)

TP = tuple[str, int]
#: A connection of the env's pool, in a transaction.
Connection = asyncpg.Connection | PoolConnectionProxy

#: What may fail for a while and mend (Postgres or the broker away, a lock's victim):
#: the batch is tried again, never dead-lettered for it.
OUTAGES = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.DeadlockDetectedError,
    asyncpg.exceptions.SerializationError,
    KafkaError,
    BusUnavailable,
)
RETRY = Backoff(initial_s=0.2, max_s=10.0)


@dataclass(frozen=True)
class Outgoing:
    """An event on its way out, as the outbox holds it."""

    id: int
    experiment: str
    topic: str
    key: bytes | None
    value: bytes


class SearcherProcessor:
    """Decides an env's experiments from its inputs; `handle` is the consumer's handler.

    One instance per env is the plan (`up` runs one; the command runs one), but two are
    safe: each batch locks its partitions' offsets and its experiments' rows, and
    publishes what another left in the outbox for them before deciding on them."""

    def __init__(
        self,
        env: str,
        pool: asyncpg.Pool,
        producer: Producer,
        *,
        source: str = SOURCE,
        metrics: SearcherMetrics | None = None,
    ) -> None:
        self.env = env
        self.pool = pool
        self.producer = producer
        self.source = source
        self.metrics = metrics
        #: experiment -> (version, experiment) as this process last wrote or read it
        self._known: dict[str, tuple[int, Experiment]] = {}
        #: the outbox may hold events (a start, a publish that failed)
        self._outbox_dirty = True
        #: what this process did (tests and the log read it)
        self.decisions = 0
        self.published = 0
        self.skipped = 0

    # -- the consumer's handler ----------------------------------------------------------

    async def handle(self, batch: list[Received]) -> None:
        """Decide ``batch``, publish what it decided, and return (the consumer commits).
        An outage is waited out; an error of the decisions is raised."""
        attempt = 0
        while True:
            try:
                if self._outbox_dirty:
                    await self.flush_outbox()
                outgoing = await self._decide(batch)
                await self._publish(outgoing)
                return
            except OUTAGES as err:
                attempt += 1
                delay = RETRY.delay(attempt)
                log.warning(
                    "searcher of %s: a batch of %d not done (%s: %s); trying again in %.1f s",
                    self.env,
                    len(batch),
                    type(err).__name__,
                    err,
                    delay,
                )
                await asyncio.sleep(delay)

    async def flush_outbox(self) -> int:
        """Publish what the outbox holds (what a crashed or failed run decided), in order,
        then forget it; how many were published."""
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT id, experiment, topic, key, value FROM searcher_outbox ORDER BY id"
            )
        pending = [_outgoing(r) for r in rows]
        self._outbox_dirty = True
        await self._publish(pending)
        self._outbox_dirty = False
        if pending:
            log.info(
                "searcher of %s: published %d events left in its outbox", self.env, len(pending)
            )
        return len(pending)

    # -- one batch in one transaction ----------------------------------------------------

    async def _decide(self, batch: Sequence[Received]) -> list[Outgoing]:
        concerned = [(r, experiment_of(r.event, source=self.source)) for r in batch]
        if all(name is None for _, name in concerned):
            # Nothing here for any experiment: no state to change, and the consumer's
            # commit may pass these records (the stored offsets only skip; they lag).
            return []
        ends: dict[TP, int] = {}
        for r in batch:
            tp = (r.topic, r.partition)
            ends[tp] = max(ends.get(tp, 0), r.offset + 1)
        names: list[str] = []
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                stored = await _lock_offsets(conn, sorted(ends))
                fresh = [
                    (r, n)
                    for r, n in concerned
                    if n is not None and r.offset >= stored.get((r.topic, r.partition), 0)
                ]
                names = sorted({n for _, n in fresh if n is not None})
                experiments = await self._load(conn, names)
                await self._publish_left(conn, names)
                changed, events = self._step_all(experiments, fresh)
                outgoing = await self._write(conn, changed, events)
                await _store_offsets(conn, ends)
        except BaseException:
            # what was stepped in memory may not be what is stored (a core that changes
            # its state in place): read them again next time
            for name in names:
                self._known.pop(name, None)
            raise
        for name, experiment in changed.items():
            version = self._known[name][0] if name in self._known else 0
            self._known[name] = (version + 1, experiment)
        self._count(sum(n is not None for _, n in concerned) - len(fresh), len(fresh), events)
        return outgoing

    def _count(self, skipped: int, decided: int, events: list[tuple[str, Event]]) -> None:
        made = [e for _, e in events if isinstance(e, TrialDecision)]
        self.skipped += skipped
        self.decisions += len(made)
        if self.metrics is not None:
            self.metrics.skipped.inc(skipped)
            self.metrics.inputs.inc(decided)
            for decision in made:
                self.metrics.decisions.labels(self.env, decision.decision.value).inc()

    def _step_all(
        self,
        experiments: dict[str, Experiment],
        fresh: Iterable[tuple[Received, str]],
    ) -> tuple[dict[str, Experiment], list[tuple[str, Event]]]:
        """Each record stepped in the order read; the experiments it changed and what it
        decided, in order, each with its experiment."""
        changed: dict[str, Experiment] = {}
        events: list[tuple[str, Event]] = []
        for record, name in fresh:
            event = record.event
            with log_fields(experiment=name):
                current = changed.get(name) or experiments.get(name)
                if current is None:
                    if not isinstance(event, ExperimentSubmitted):
                        log.info(
                            "searcher of %s: %s for experiment %s, which it has not begun: ignored",
                            self.env,
                            event.type,
                            name,
                        )
                        continue
                    after, out = start(event, source=self.source)
                else:
                    after, out = step(current, event, source=self.source)
            if after is not current:
                changed[name] = after
            events.extend((name, e) for e in out)
        return changed, events

    async def _publish_left(self, conn: Connection, names: list[str]) -> None:
        """What another instance decided for these (locked) experiments and did not
        publish yet: published before anything new is decided for them, so their events
        go out in the order they were decided (theirs again later, as no-ops)."""
        left = await conn.fetch(
            "SELECT id, experiment, topic, key, value FROM searcher_outbox"
            " WHERE experiment = ANY($1::text[]) ORDER BY id",
            names,
        )
        if left:
            await self._publish([_outgoing(r) for r in left], delete=False)
            await conn.execute(
                "DELETE FROM searcher_outbox WHERE id = ANY($1::bigint[])", [r["id"] for r in left]
            )

    async def _load(self, conn: Connection, names: list[str]) -> dict[str, Experiment]:
        """The experiments named, locked for this transaction: this process's copy where
        its version is the stored one, else read."""
        if not names:
            return {}
        rows = await conn.fetch(
            "SELECT experiment, version FROM searcher_state WHERE experiment = ANY($1::text[])"
            " ORDER BY experiment FOR UPDATE",
            names,
        )
        versions = {r["experiment"]: r["version"] for r in rows}
        stale = [n for n, v in versions.items() if self._known.get(n, (None,))[0] != v]
        if stale:
            for r in await conn.fetch(
                "SELECT experiment, version, state::text AS state, wing::text AS wing"
                " FROM searcher_state WHERE experiment = ANY($1::text[])",
                stale,
            ):
                name = r["experiment"]
                self._known[name] = (
                    r["version"],
                    Experiment.from_json(name, r["state"], r["wing"]),
                )
        for gone in set(self._known) & set(names) - set(versions):
            del self._known[gone]
        return {n: self._known[n][1] for n in versions}

    async def _write(
        self,
        conn: Connection,
        changed: dict[str, Experiment],
        events: list[tuple[str, Event]],
    ) -> list[Outgoing]:
        if changed:
            await conn.execute(
                """
                INSERT INTO searcher_state (experiment, state, wing, version, updated_at)
                SELECT e, s::jsonb, w::jsonb, 1, now()
                FROM unnest($1::text[], $2::text[], $3::text[]) AS t(e, s, w)
                ON CONFLICT (experiment) DO UPDATE
                SET state = EXCLUDED.state, wing = EXCLUDED.wing,
                    version = searcher_state.version + 1, updated_at = EXCLUDED.updated_at
                """,
                list(changed),
                [x.state_json() for x in changed.values()],
                [x.wing_json() for x in changed.values()],
            )
        if not events:
            return []
        # ids taken from the outbox's sequence and given in the order decided: the order
        # the outbox is published in after a crash
        ids = sorted(
            await conn.fetchval(
                "SELECT array_agg(nextval(pg_get_serial_sequence('searcher_outbox', 'id')))"
                " FROM generate_series(1, $1::int)",
                len(events),
            )
        )
        outgoing = [
            Outgoing(i, name, topic_of(e), event_key(e), encode(e))
            for i, (name, e) in zip(ids, events, strict=True)
        ]
        await conn.executemany(
            "INSERT INTO searcher_outbox (id, experiment, topic, key, value)"
            " VALUES ($1, $2, $3, $4, $5)",
            [(o.id, o.experiment, o.topic, _text(o.key), o.value) for o in outgoing],
        )
        return outgoing

    # -- publishing --------------------------------------------------------------------------

    async def _publish(self, outgoing: Sequence[Outgoing], *, delete: bool = True) -> None:
        """The events on the bus, in order (one producer: each partition keeps the order
        they were sent in), then out of the outbox (unless the caller deletes them)."""
        if not outgoing:
            return
        try:
            futures = [await self.producer.enqueue(o.topic, o.value, o.key) for o in outgoing]
            await asyncio.gather(*futures)
        except BaseException:
            self._outbox_dirty = True
            raise
        self.published += len(outgoing)
        if delete:
            try:
                await self.pool.execute(
                    "DELETE FROM searcher_outbox WHERE id = ANY($1::bigint[])",
                    [o.id for o in outgoing],
                )
            except BaseException:
                self._outbox_dirty = True  # published; published again later, as a no-op
                raise

    # -- a start ---------------------------------------------------------------------------

    async def check_offsets(self, reader: TopicReader) -> None:
        """Offsets stored beyond their log's end (a broker whose log restarted) are said
        and set back to 0, so the records now there are not skipped. ``reader`` reads the
        input topics (group-less)."""
        rows = await self.pool.fetch("SELECT topic, partition, next_offset FROM searcher_offsets")
        stored = {(r["topic"], r["partition"]): r["next_offset"] for r in rows}
        if not stored:
            return
        hints = {(tp.topic, tp.partition): end for tp, end in reader.end_hint.items()}
        suspects = {
            TopicPartition(*tp): offset
            for tp, offset in stored.items()
            if tp in hints and offset > hints[tp]
        }
        short = await reader.short_of(suspects)
        stale = stale_offsets(stored, {(tp.topic, tp.partition): end for tp, end in short.items()})
        if not stale:
            return
        warn_stale(stale, f"searcher of {self.env}: input")
        await self.pool.execute(
            """
            UPDATE searcher_offsets o SET next_offset = 0, updated_at = now()
            FROM unnest($1::text[], $2::int[]) AS s(t, p)
            WHERE o.topic = s.t AND o.partition = s.p
            """,
            [t for t, _ in stale],
            [p for _, p in stale],
        )


def _outgoing(row: asyncpg.Record) -> Outgoing:
    key = row["key"]
    return Outgoing(
        row["id"],
        row["experiment"],
        row["topic"],
        None if key is None else key.encode(),
        row["value"],
    )


def _text(key: bytes | None) -> str | None:
    return None if key is None else key.decode()


async def _lock_offsets(conn: Connection, parts: Sequence[TP]) -> dict[TP, int]:
    """The stored offsets of ``parts``, locked for the transaction (made at 0 where
    none is), so two instances never decide one partition's records at once."""
    topics, partitions = [t for t, _ in parts], [p for _, p in parts]
    await conn.execute(
        """
        INSERT INTO searcher_offsets (topic, partition, next_offset)
        SELECT t, p, 0 FROM unnest($1::text[], $2::int[]) AS x(t, p)
        ON CONFLICT (topic, partition) DO NOTHING
        """,
        topics,
        partitions,
    )
    rows = await conn.fetch(
        """
        SELECT o.topic, o.partition, o.next_offset FROM searcher_offsets o
        JOIN unnest($1::text[], $2::int[]) AS x(t, p) ON o.topic = x.t AND o.partition = x.p
        ORDER BY o.topic, o.partition FOR UPDATE OF o
        """,
        topics,
        partitions,
    )
    return {(r["topic"], r["partition"]): r["next_offset"] for r in rows}


async def _store_offsets(conn: Connection, ends: dict[TP, int]) -> None:
    """The next offset of each partition the batch read; never moved back."""
    await conn.execute(
        """
        UPDATE searcher_offsets o
        SET next_offset = GREATEST(o.next_offset, x.n), updated_at = now()
        FROM unnest($1::text[], $2::int[], $3::bigint[]) AS x(t, p, n)
        WHERE o.topic = x.t AND o.partition = x.p
        """,
        [t for t, _ in ends],
        [p for _, p in ends],
        list(ends.values()),
    )


__all__ = ["OUTAGES", "Outgoing", "SearcherProcessor"]
