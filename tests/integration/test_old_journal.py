"""The broker journal of before journals were their stack's (every stack's in the database
``dlrover_tansu``, tables in its public schema): `up` does not take it by itself (it records
no stack: a second stack took the first one's history as its own, issue 37), and says in
one line what it holds and how to bring it over; the command it gives does, and a broker
refilled afterwards has those records at their offsets."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from dlrover_events.runtime.broker_journal import BrokerJournal, old_journal
from dlrover_events.runtime.embedded import Broker, with_database
from dlrover_events.settings import Settings
from dlrover_events.store.database import quote_ident
from tests.conftest import ARTIFACTS, _admin
from tests.integration.test_broker_journal import read_all

pytestmark = pytest.mark.integration

#: the journal's tables as they were (dlrover_events/runtime/broker_journal.py, b8270861)
OLD_SCHEMA = """
CREATE TABLE broker_topics (name text PRIMARY KEY, partitions int NOT NULL, configs jsonb NOT NULL);
CREATE TABLE broker_records (
    topic text NOT NULL, part int NOT NULL, "offset" bigint NOT NULL, ts bigint NOT NULL,
    key bytea, value bytea, header_keys text[] NOT NULL, header_values bytea[] NOT NULL,
    PRIMARY KEY (topic, part, "offset")
);
CREATE TABLE broker_commits (
    grp text NOT NULL, topic text NOT NULL, part int NOT NULL, "offset" bigint NOT NULL,
    PRIMARY KEY (grp, topic, part)
);
"""


@pytest.fixture
async def old(pg_dsn: str) -> AsyncIterator[str]:
    """A database laid out as ``dlrover_tansu`` was, with 4 records of one env's topic."""
    name = f"dle_old_{uuid.uuid4().hex[:8]}"
    await _admin(pg_dsn, f"CREATE DATABASE {quote_ident(name)}")
    conn = await asyncpg.connect(with_database(pg_dsn, name))
    try:
        await conn.execute(OLD_SCHEMA)
        await conn.execute(
            "INSERT INTO broker_topics VALUES ('prod.job.events', 1, $1)",
            '{"retention.ms": "1000"}',
        )
        await conn.executemany(
            "INSERT INTO broker_records VALUES ('prod.job.events', 0, $1, $2, $3, $4, '{}', '{}')",
            [(i, 1_700_000_000_000 + i, b"k", f"old{i}".encode()) for i in range(4)],
        )
        await conn.execute(
            "INSERT INTO broker_commits VALUES ('prod.brain', 'prod.job.events', 0, 3)"
        )
    finally:
        await conn.close()
    yield name
    await _admin(pg_dsn, f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)")


async def test_the_old_journal_is_said_and_brought_over_by_the_command_said(
    own_pg: str, old: str
) -> None:
    journal = await BrokerJournal.open(Settings(), own_pg)
    try:
        said = await old_journal(journal._conn, own_pg, old)
        assert said is not None
        assert "\n" not in said
        assert f"database {old} holds a broker journal" in said
        assert "4 records of 1 topics, envs prod" in said
        assert "DROP SCHEMA" not in said  # this stack's journal is empty
        assert await journal._conn.fetchval("SELECT count(*) FROM broker_records") == 0
    finally:
        await journal.close()  # `up` stopped, as the line says

    command = re.search(r"run (pg_dump .*); or drop database", said)
    assert command, said
    proc = await asyncio.create_subprocess_shell(
        command.group(1), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, (out, err)

    journal = await BrokerJournal.open(Settings(), own_pg)
    broker = Broker("127.0.0.1", log_dir=ARTIFACTS / "logs")
    broker.start()
    try:
        await journal.attach(broker.bootstrap_servers)
        refill = await journal.refill()
        assert (refill.topics, refill.records, refill.groups) == (1, 4, 1)
        records = await read_all(broker.bootstrap_servers, "prod.job.events", 1)
        assert [(o, v) for _, o, _, _, v, _ in records] == [
            (i, f"old{i}".encode()) for i in range(4)
        ]
        # now that this stack's journal has records, the line says to drop them first
        assert await journal.drain()
        again = await old_journal(journal._conn, own_pg, old)
        assert again is not None and "DROP SCHEMA broker_journal CASCADE" in again
    finally:
        broker.stop()
        await journal.close()


async def test_no_old_journal_no_line(own_pg: str) -> None:
    journal = await BrokerJournal.open(Settings(), own_pg)
    try:
        assert await old_journal(journal._conn, own_pg, f"dle_none_{uuid.uuid4().hex[:8]}") is None
    finally:
        await journal.close()
