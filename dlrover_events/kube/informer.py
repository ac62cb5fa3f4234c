"""One informer: list, then watch from the list's resourceVersion; list again on 410 Gone.

What every watcher of a cluster needs, written once (the operator's jobs and pods, the
gateway's ConfigMaps): a watch alone loses events whenever it breaks, and only a fresh
list says what the objects are now. So:

- the first list is handed over whole (``on_list``) and ``synced`` is set: the caller's
  view is the cluster's as of then;
- a watch goes on from the list's version; one that the server ends (its timeout) is
  resumed from the last version seen, bookmarks included, and each change is handed
  over (``on_event``: ADDED, MODIFIED, DELETED);
- a 410 Gone (the version was compacted away, events were lost in between) lists again
  at once; any other failure (the API server away, the caller's own store away) is
  logged with why, and followed by a list after a backoff (``dlrover_events.backoff``: doubling
  from its initial delay to its bound, starting again after a good list). It never gives
  up: an API server restarts, and the caller's ``on_list`` must converge from any state.

The informer keeps no objects: what the caller keeps per object is the caller's to drop
when the object goes (DELETED, or missing from a list). It talks to the cluster only
through the two callables it is given, so a platform that is not Kubernetes (the local
one) is watched the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import aiohttp
from kubernetes_asyncio.client.rest import ApiException

from dlrover_events.backoff import Backoff
from dlrover_events.kube.api import api_error
from dlrover_events.lifecycle import Stopping, unless

log = logging.getLogger(__name__)

Object = dict[str, Any]
#: items and the list's resourceVersion
Lister = Callable[[], Awaitable[tuple[list[Object], str]]]
#: (type, object) from a resourceVersion until the server ends the watch
Watcher = Callable[[str], AsyncIterator[tuple[str, Object]]]
OnList = Callable[[list[Object]], Awaitable[object]]
OnEvent = Callable[[str, Object], Awaitable[object]]

#: a cluster, its network or its client away: said in one line (anything else is a bug
#: of ours, and its traceback is the why)
UNAVAILABLE: tuple[type[BaseException], ...] = (
    ApiException,
    aiohttp.ClientError,
    OSError,
    TimeoutError,
)
CHANGES = frozenset({"ADDED", "MODIFIED", "DELETED"})


@dataclass(eq=False)
class Informer:
    #: how the logs name what is watched ("env prod: jobs", "ConfigMaps of ns")
    what: str
    list_: Lister
    watch: Watcher
    _: KW_ONLY
    on_list: OnList
    on_event: OnEvent
    backoff: Backoff = field(default_factory=lambda: Backoff(initial_s=1.0))
    #: set once the first list has been handed over
    synced: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    #: lists handed over so far (the first included)
    lists: int = field(default=0, init=False)

    async def list_once(self) -> str:
        """List, hand the items over; returns the list's resourceVersion."""
        items, version = await self.list_()
        await self.on_list(items)
        self.lists += 1
        self.synced.set()
        return version

    async def watch_from(self, version: str) -> str:
        """Hand over each change from ``version`` until the server ends the watch; returns
        the last version seen (where the next watch resumes)."""
        async for typ, obj in self.watch(version):
            if typ == "ERROR":  # a watch that passes the server's Status through
                raise ApiException(status=obj.get("code"), reason=str(obj.get("message")))
            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
            if typ in CHANGES:
                await self.on_event(typ, obj)
        return version

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Until ``stop`` is set (a watch in flight is cut at once) or the task is
        cancelled."""
        with contextlib.suppress(Stopping):
            await unless(stop or asyncio.Event(), self._loop(), f"informer: {self.what}")

    async def _loop(self) -> None:
        failures = 0
        while True:
            try:
                version = await self.list_once()
                failures = 0
                while True:
                    version = await self.watch_from(version)
            except asyncio.CancelledError:
                raise
            except ApiException as e:
                if e.status == 410:
                    log.info("%s: watch expired (410 Gone: events lost); listing again", self.what)
                    continue
                failures += 1
                self._failed(api_error(e), failures, traceback=False)
            except Exception as e:
                failures += 1
                self._failed(repr(e), failures, traceback=not isinstance(e, UNAVAILABLE))
            await asyncio.sleep(self.backoff.delay(failures))

    def _failed(self, why: str, failures: int, *, traceback: bool) -> None:
        log.warning(
            "%s: list/watch failed (%s); listing again in %.3g s",
            self.what,
            why,
            self.backoff.delay(failures),
            exc_info=traceback,
        )


__all__ = ["UNAVAILABLE", "Informer", "Lister", "Watcher"]
