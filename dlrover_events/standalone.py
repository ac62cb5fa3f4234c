"""A service run as its own command (`brain`, `operator`, `gateway`, `console`, `replay`)
gets what `up` gives the services it runs: it is fenced to its env (it stops when the env
is deleted), its metrics are served on 127.0.0.1, and SIGINT/SIGTERM stop it cleanly.

One place for it, so a new command cannot forget one of the three.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator

from dlrover_events.fence import fenced
from dlrover_events.metrics import MetricsServer
from dlrover_events.services import ServiceContext

log = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def standalone(ctx: ServiceContext, *, signals: bool = True) -> AsyncIterator[None]:
    """Run a command's service inside this: fenced, metrics served, stopped by signals.

    The metrics port is `DLROVER_EVENTS_METRICS_PORT` (as for `up`); when it is taken
    (by `up`, or another command) the command says so and serves them on a free port.
    """
    if signals:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, ctx.stop.set)
    settings = ctx.settings
    server = MetricsServer(settings.metrics_host, settings.metrics_port)
    server.add(ctx.metrics)
    try:
        await server.start()
    except OSError as err:
        log.warning(
            "metrics port %s:%d is taken (%s); serving them on a free port instead",
            settings.metrics_host,
            settings.metrics_port,
            err.strerror or err,
        )
        server = MetricsServer(settings.metrics_host, 0)
        server.add(ctx.metrics)
        await server.start()
    ctx.endpoints["metrics"] = server.url
    try:
        async with fenced(ctx):
            yield
    finally:
        await server.stop()


__all__ = ["standalone"]
