"""The hosts platform's `job` door (platform.registry): an env's job store opened without
the agents (the env's operator places and follows the pods), and the check that an
operator runs the env, so a submitted job would start."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from dlrover_events.errors import UserError
from dlrover_events.runtime.embedded import resolve_postgres
from dlrover_events.runtime.fence import serving
from dlrover_events.settings import Settings
from dlrover_events.store.database import connect
from handlers.operator.hosts.cluster import HostsCluster
from handlers.operator.hosts.runner import platform_root
from handlers.operator.platform.api import Platform
from handlers.operator.platform.registry import NoOptions

#: What runs an env's jobs on plain hosts: the `operator` command (it holds its service's
#: lock while it runs: dlrover_events.runtime.fence).
HOSTS_OPERATORS = ("operator",)


@contextlib.asynccontextmanager
async def open_jobs(settings: Settings, env: str, options: NoOptions) -> AsyncIterator[Platform]:
    """The env's jobs on plain hosts: the job store and the pods as last seen."""
    yield HostsCluster(platform_root(settings, env))


async def check_operator(settings: Settings, env: str, options: NoOptions) -> None:
    """Refuse, in one line, a job that no operator would start."""
    conn = await connect((await resolve_postgres(settings)).dsn)
    try:
        running = await serving(conn, env, HOSTS_OPERATORS)
    finally:
        await conn.close()
    if not running:
        raise UserError(
            f"no operator runs env {env!r}, so nothing would place the job on a host: start "
            f"one (`dlrover-events operator --env {env} --platform hosts`), or pass --queue "
            "to create it now and let it wait for one"
        )


__all__ = ["HOSTS_OPERATORS", "check_operator", "open_jobs"]
