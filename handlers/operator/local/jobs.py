"""The local platform's `job` door (platform.registry): an env's job store opened without a
node agent (the env's operator runs the pods), and the check that an operator runs the env,
so a submitted job would start."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from dlrover_events.errors import UserError
from dlrover_events.runtime.embedded import resolve_postgres
from dlrover_events.runtime.fence import serving
from dlrover_events.settings import Settings
from dlrover_events.store.database import connect
from handlers.operator.local.cluster import LocalCluster
from handlers.operator.local.runner import platform_root
from handlers.operator.platform.api import Platform
from handlers.operator.platform.registry import NoOptions

#: What runs an env's TrainingJobs on the local platform: `up`'s service, or the `operator`
#: command (each holds its service's lock while it runs: dlrover_events.runtime.fence).
LOCAL_OPERATORS = ("local", "operator")


@contextlib.asynccontextmanager
async def open_jobs(settings: Settings, env: str, options: NoOptions) -> AsyncIterator[Platform]:
    """The env's local jobs: its job store only, no node agent."""
    yield LocalCluster(platform_root(settings, env))


async def check_operator(settings: Settings, env: str, options: NoOptions) -> None:
    """Refuse, in one line, a local job that no operator would start."""
    conn = await connect((await resolve_postgres(settings)).dsn)
    try:
        running = await serving(conn, env, LOCAL_OPERATORS)
    finally:
        await conn.close()
    if not running:
        raise UserError(
            f"no operator runs env {env!r}, so nothing would start the job: start one "
            f"(`dlrover-events up`, or `dlrover-events operator --env {env} --platform "
            "local`), or pass --queue to create it now and let it wait for one"
        )


__all__ = ["LOCAL_OPERATORS", "check_operator", "open_jobs"]
