"""Virtual operators (and brains) as processes of their own, started with the project's
command and killed with SIGKILL: what a crash does, which no in-process stop can show."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import pytest

from dlrover_events.settings import Settings
from tests.conftest import REPO, cli_environ
from tests.integration.tap import DEADLINE_S

CLI = "from dlrover_events.cli.app import main; main()"


def operator_lock(env: str) -> str:
    """The advisory lock that keeps a second virtual operator of an env out."""
    return f"dlrover-events/operator/{env}"


async def lock_free(pg_dsn: str, key: str) -> None:
    conn = await asyncpg.connect(pg_dsn)
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE_S
        while loop.time() < deadline:
            if await conn.fetchval("SELECT pg_try_advisory_lock(hashtextextended($1, 0))", key):
                await conn.fetchval("SELECT pg_advisory_unlock(hashtextextended($1, 0))", key)
                return
            await asyncio.sleep(0.1)
        pytest.fail(f"advisory lock {key} still held after {DEADLINE_S:.0f}s")
    finally:
        await conn.close()


@dataclass
class Service:
    """One command (``operator``, ``brain``) of one env, restartable, its output in a file."""

    settings: Settings
    pg_dsn: str
    command: Sequence[str]
    log: Path
    proc: asyncio.subprocess.Process | None = None
    starts: int = 0
    kills: int = 0
    extra_env: dict[str, str] = field(default_factory=dict)
    #: the advisory lock the command takes, if any
    lock_key: str | None = None

    async def start(self) -> None:
        """Start it, once the advisory lock a killed predecessor held is free (Postgres
        frees it when it sees that connection gone)."""
        if self.lock_key is not None:
            await lock_free(self.pg_dsn, self.lock_key)
        with self.log.open("ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                CLI,
                *self.command,
                cwd=REPO,
                env={**cli_environ(self.settings, self.pg_dsn), **self.extra_env},
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
            )
        self.starts += 1

    async def kill(self) -> None:
        """SIGKILL: no handler runs, nothing is flushed or committed."""
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            self.kills += 1
        await self.proc.wait()

    async def stop(self) -> None:
        """SIGTERM, and SIGKILL if it does not end in time (the test's cleanup)."""
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), 30)
        except TimeoutError:
            await self.kill()

    def alive(self) -> None:
        """Fail with its log if it died on its own."""
        if self.proc is not None and self.proc.returncode is not None:
            tail = self.log.read_text(errors="replace")[-4000:]
            pytest.fail(f"{' '.join(self.command)} died ({self.proc.returncode}):\n{tail}")
