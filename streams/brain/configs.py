"""The config service's say in the brain's decisions: which optimizer, with which parameters.

Operators target jobs with config documents (Include / Exclude / Configure, on the
compacted ``<env>.config.changes``), and a job's config may name its optimizer and its
parameters (``optimizer``, ``optimizer_params``). The gateway hands those documents to the
job's processes; the router must see the same ones, so the brain keeps its own copy of the
env's documents, matched with the gateway's matcher on the gateway's job attributes
(``dlrover_events.config_matching``).

What the router decides with, lowest first, key by key (nested objects such as
``optimizer_params`` merge key by key, anything else is replaced whole):

1. the env's default (``Policy.job_config``): what makes one A/B arm's brain differ from
   another's;
2. the config service's documents that match the job, merged as the gateway merges them:
   what operators set for a user, a group, a scenario, one job;
3. the job's own config (``JobSubmitted.config``, then each ``OptimizeRequest.config``):
   what whoever submitted or asked for it said about this very job.

``ConfigIndex`` is pure and synchronous (the brain asks it on every decision, so the
answer for a job is cached until a document changes); ``ConfigFollower`` is the only I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from dlrover_events.config_feed import ConfigFeed
from dlrover_events.config_matching import Change, Index, deep_merge, job_attributes, make_job
from dlrover_events.lifecycle import AsyncResource, wait_for_any
from dlrover_events.settings import Settings
from schemas.jobs import JobMeta

log = logging.getLogger(__name__)

#: Past this many distinct jobs the cache is dropped whole: jobs come and go, and
#: recomputing an answer costs a few microseconds.
CACHE_LIMIT = 50_000

_NOTHING: Mapping[str, Any] = MappingProxyType({})


def effective_config(
    env_default: Mapping[str, Any], service: Mapping[str, Any], own: Mapping[str, Any]
) -> dict[str, Any]:
    """The config the router decides with: ``own`` over ``service`` over ``env_default``.

    A new dict; nested objects the inputs do not both have are shared with them, so treat
    it as read-only, as the router does.
    """
    return deep_merge(deep_merge(env_default, service), own)


class ConfigIndex:
    """The env's documents by name, built from the change feed, and each job's share.

    Changes apply exactly as the gateway applies them (``Index.apply``): per name the
    topic's order is the truth, so a lower version after a higher one (the gateway's
    reconcile putting Postgres' state back) replaces it, and only an exact replay of what
    is held is skipped (and keeps the cache).
    """

    def __init__(self) -> None:
        self.index = Index()
        #: changes that changed a document, and exact replays skipped.
        self.applied = 0
        self.ignored = 0
        self._cache: dict[str, tuple[JobMeta, Mapping[str, Any]]] = {}

    def __len__(self) -> int:
        return len(self.index)

    def apply(self, changes: Iterable[Change]) -> int:
        """Apply changes in topic order; returns how many changed a document."""
        changed = 0
        for change in changes:
            applied = self.index.apply(change)
            if applied == "replay":
                self.ignored += 1
            elif applied == "changed":
                changed += 1
        if changed:
            self.applied += changed
            self._cache.clear()
        return changed

    def config_for(self, job: JobMeta) -> Mapping[str, Any]:
        """The merged Configure of the documents matching ``job``; read-only, shared.

        The job is matched on its own attributes (``job_attributes``): documents that
        also need a process's ``role`` or ``rank`` reach that job's processes through the
        gateway, not the brain, which decides for the job as a whole.
        """
        if not self.index:
            return _NOTHING
        found = self._cache.get(job.uuid)
        # A job's meta is one object from fold to fold; equality covers a restored state.
        if found is not None and (found[0] is job or found[0] == job):
            return found[1]
        config = self.index.resolve(make_job(job_attributes(job))).config
        if len(self._cache) >= CACHE_LIMIT:
            self._cache.clear()
        self._cache[job.uuid] = (job, config)
        return config


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
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
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
