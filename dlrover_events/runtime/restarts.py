"""A consumer service that outlives its failures: one copy of the loop the archiver, the
searcher and the experiments recorder run.

Under `up`, a service that raises stops the stack; a consumer's failure (Postgres or the
broker away, a record the broker refuses) must instead be one log line and a new attempt
from where its group (or checkpoint) left off, after a backoff that starts over once an
attempt got healthy.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from dlrover_events.backoff import Backoff
from dlrover_events.lifecycle import wait_or_stop

log = logging.getLogger(__name__)

#: The delays between attempts of a consumer service.
RESTART = Backoff(initial_s=0.5, max_s=10.0)


async def restart_until_stopped(
    stop: asyncio.Event,
    attempt: Callable[[asyncio.Event], Awaitable[None]],
    *,
    what: str,
    resumes_from: str = "its last commit",
    backoff: Backoff = RESTART,
) -> None:
    """Run ``attempt(healthy)`` until ``stop``; an attempt that raises is logged (with its
    traceback the first time in a row) and made again after the backoff. An attempt sets
    ``healthy`` once it works, so a later failure waits the shortest delay again."""
    failures = 0
    while not stop.is_set():
        healthy = asyncio.Event()
        try:
            await attempt(healthy)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            failures = 1 if healthy.is_set() else failures + 1
            delay = backoff.delay(failures)
            log.error(
                "%s failed (%s: %s); starting again from %s in %.1f s",
                what,
                type(err).__name__,
                err,
                resumes_from,
                delay,
                exc_info=failures == 1,
            )
            await wait_or_stop(stop, delay)


__all__ = ["RESTART", "restart_until_stopped"]
