"""The config service's documents as the brain's router sees them: pure, no I/O.

``ConfigIndex`` holds the env's documents (Include / Exclude / Configure), applied from the
change feed exactly as the gateway applies them, and answers a job's share of them;
``effective_config`` is the order in which the router takes configs (see
``streams.brain.runtime.configs`` for the precedence, and for ``ConfigFollower``, the I/O that
keeps an index current). The brain's pure side (triggers, processor) imports this module
only, never the follower and its Kafka consumer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from dlrover_events.config.matching import Change, Index, deep_merge, job_attributes, make_job
from schemas.jobs import JobMeta

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
