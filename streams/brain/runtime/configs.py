"""The config service's say in the brain's decisions: which optimizer, with which parameters.

Operators target jobs with config documents (Include / Exclude / Configure, on the
compacted ``<env>.config.changes``), and a job's config may name its optimizer and its
parameters (``optimizer``, ``optimizer_params``). The gateway hands those documents to the
job's processes; the router must see the same ones, so the brain keeps its own copy of the
env's documents, matched with the gateway's matcher on the gateway's job attributes
(``dlrover_events.config.matching``).

What the router decides with, lowest first, key by key (nested objects such as
``optimizer_params`` merge key by key, anything else is replaced whole):

1. the env's default (``Policy.job_config``): what makes one A/B arm's brain differ from
   another's;
2. the config service's documents that match the job, merged as the gateway merges them:
   what operators set for a user, a group, a scenario, one job;
3. the job's own config (``JobSubmitted.config``, then each ``OptimizeRequest.config``):
   what whoever submitted or asked for it said about this very job.

``ConfigIndex`` is pure and synchronous (the brain asks it on every decision, so the
answer for a job is cached until a document changes) and lives in
``streams.brain.core.config_index``; ``ConfigFollower`` here is the only I/O.
"""

from __future__ import annotations

import asyncio
import logging

from dlrover_events.config.feed import ConfigFeed
from dlrover_events.lifecycle import AsyncResource, cancel_and_wait, wait_for_any
from dlrover_events.settings import Settings
from streams.brain.core.config_index import ConfigIndex

log = logging.getLogger(__name__)


class ConfigFollower(AsyncResource):
    """Keeps a ``ConfigIndex`` of one env's documents current, in the background.

    Reads every partition of ``<env>.config.changes`` from the beginning without a
    consumer group (every brain needs every document), then follows it. ``caught_up()``
    returns once the documents that existed at ``start`` are in the index, so a brain that
    waits for it never routes a job without them.
    """

    def __init__(
        self,
        settings: Settings,
        env: str,
        index: ConfigIndex | None = None,
        *,
        poll_ms: int = 100,
    ) -> None:
        self.env = env
        self.index = index if index is not None else ConfigIndex()
        self._feed = ConfigFeed(
            settings, env, self.index.apply, client_id="brain-configs", poll_ms=poll_ms
        )
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def rejected(self) -> int:
        """Records of the topic that were not a change of this env (logged, skipped)."""
        return self._feed.rejected

    @property
    def is_caught_up(self) -> bool:
        return self._feed.caught_up.is_set()

    async def start(self) -> None:
        await self._feed.start()
        self._stop.clear()
        self._task = asyncio.create_task(self._follow(), name=f"{self.env}.brain-configs")

    async def stop(self) -> None:
        self._stop.set()
        await cancel_and_wait(self._task)
        self._task = None
        await self._feed.stop()

    async def caught_up(self, timeout_s: float | None = None) -> None:
        """Return once the backlog present at start is applied; TimeoutError past
        ``timeout_s``, RuntimeError if following stopped before that."""
        if self._task is None:
            raise RuntimeError("start() the follower first")
        async with asyncio.timeout(timeout_s):
            caught_up = await wait_for_any([self._feed.caught_up], [self._task])
        if not caught_up:
            raise RuntimeError(f"the config feed of env {self.env!r} stopped before catching up")

    async def _follow(self) -> None:
        try:
            await self._feed.run(self._stop)
        except Exception:
            # Routing goes on with the documents already read, rather than not at all.
            log.exception("stopped following the config documents of env %r", self.env)
