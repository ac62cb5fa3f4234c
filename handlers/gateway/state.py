"""One gateway instance's view of the env's documents, kept from the change feed.

Requests read only this (never Postgres): an inverted index, a cache of serialised
answers per job, and a tick that wakes long-polls when anything changed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

import orjson

from dlrover_events.config.matching import Change, Index, Job

#: The cache is dropped whole past this many distinct jobs; rebuilding is cheap and a
#: bound keeps a stream of one-off job ids from growing memory without end.
CACHE_LIMIT = 50_000

JobKey = tuple[tuple[str, tuple[str, ...]], ...]


def job_key(job: Job) -> JobKey:
    return tuple(sorted((k, tuple(sorted(v))) for k, v in job.items()))


@dataclass(frozen=True, slots=True)
class ConfigAnswer:
    """What the gateway answers a job with: its merged config, the config's ETag, and the
    index generation it was resolved at."""

    etag: str
    body: bytes
    generation: int


class GatewayState:
    def __init__(self, env: str) -> None:
        self.env = env
        self.index = Index()
        self.ready = asyncio.Event()
        self.applied = 0
        self.ignored = 0
        self._tick = asyncio.Event()
        self._cache: dict[JobKey, ConfigAnswer] = {}
        #: set by ``close``: long-polls answer at once instead of waiting
        self.closing = False

    @property
    def versions(self) -> Mapping[str, int]:
        """Last version seen per name, deletions included (``Index.apply`` keeps it)."""
        return self.index.versions

    def apply(self, changes: Iterable[Change]) -> int:
        """Apply a batch of changes (or ``(name, None)`` for a Kafka tombstone); wakes
        waiters once per batch. Returns how many changed the index."""
        changed = 0
        for change in changes:
            applied = self.index.apply(change)
            if applied == "replay":
                self.ignored += 1  # skipped only to keep the answer cache
            elif applied == "changed":
                changed += 1
        self.applied += changed
        if changed:
            self._cache.clear()
            tick, self._tick = self._tick, asyncio.Event()
            tick.set()
        return changed

    def answer(self, job: Job) -> ConfigAnswer:
        key = job_key(job)
        found = self._cache.get(key)
        if found is not None:
            return found
        res = self.index.resolve(job)
        body = orjson.dumps({"env": self.env, **res.as_json()})
        found = ConfigAnswer(res.etag(), body, self.index.generation)
        if len(self._cache) >= CACHE_LIMIT:
            self._cache.clear()
        self._cache[key] = found
        return found

    def close(self) -> None:
        """The gateway stops: every long-poll is answered now, with what it has (a job's
        SDK asks again, of this gateway once it is back or of another), so that the HTTP
        server's shutdown does not sit out their waits."""
        self.closing = True
        self._tick.set()

    async def wait_for_change(self, job: Job, seen: Collection[str], wait_s: float) -> ConfigAnswer:
        """The answer once its ETag is not in ``seen``, or the same answer after ``wait_s``
        or once the gateway is closing."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            tick = self._tick
            current = self.answer(job)
            if current.etag not in seen or self.closing:
                return current
            remaining = deadline - loop.time()
            if remaining <= 0:
                return current
            try:
                await asyncio.wait_for(tick.wait(), remaining)
            except TimeoutError:
                return self.answer(job)

    def known_versions(self) -> Mapping[str, int]:
        return dict(self.versions)
