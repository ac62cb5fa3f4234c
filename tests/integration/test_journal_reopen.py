"""A journal that a new `up` takes over is said refilling from the moment it is owned
(dlrover_events/runtime/broker_journal.py `BrokerJournal.open`), until its refill ends, on
a real tansu broker and a real Postgres. Before, it said so only from `say_restarting`,
when `up` starts its new broker: in between (a new `up` starting after kill -9 of the last
one) a producer found the journal owned, not refilling and nothing lost, published, and
its records, held by its client until a broker answered, could take the offsets of lost
records that readers had read (issue 37's chaos test)."""

from __future__ import annotations

import asyncpg
import pytest

from dlrover_events.runtime.broker_journal import BrokerJournal, journal_view
from dlrover_events.runtime.embedded import Broker
from dlrover_events.settings import Settings
from tests.conftest import ARTIFACTS

pytestmark = pytest.mark.integration


async def test_a_journal_taken_over_is_refilling_until_refilled(own_pg: str) -> None:
    broker = Broker("127.0.0.1", log_dir=ARTIFACTS / "logs")
    broker.start()
    servers = broker.bootstrap_servers
    conn = await asyncpg.connect(own_pg)
    try:
        first = await BrokerJournal.open(Settings(), own_pg)
        await first.attach(servers)
        await first.refill()
        view = await journal_view(conn, servers, [])
        assert view is not None and not view.refilling
        await first.close()  # (its `up` gone: no owner)
        assert await journal_view(conn, servers, []) is None

        second = await BrokerJournal.open(Settings(), own_pg)  # a new `up`
        try:
            view = await journal_view(conn, servers, [])
            assert view is not None and view.refilling, "owned again, said not refilling"
            await second.attach(servers)
            await second.refill()
            view = await journal_view(conn, servers, [])
            assert view is not None and not view.refilling
        finally:
            await second.close()
    finally:
        await conn.close()
        broker.stop()
