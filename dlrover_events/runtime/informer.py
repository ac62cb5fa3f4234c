"""One informer: list, then watch from the list's version; list again when events were lost.

What every watcher of a changing set of objects needs, written once (the operator's jobs
and pods on any platform, the gateway's ConfigMaps): a watch alone loses events whenever
it breaks, and only a fresh list says what the objects are now. So:

- the first list is handed over whole (``on_list``) and ``synced`` is set: the caller's
  view is the source's as of then;
- a watch goes on from the list's version; one that the source ends (its timeout) is
  resumed from the last version seen, bookmarks included, and each change is handed
  over (``on_event``: ADDED, MODIFIED, DELETED);
- a watch that lost events (``expired``: Kubernetes' 410 Gone, the platform port's
  Expired) lists again at once; any other failure (the source away, the caller's own
  store away) is logged with why, and followed by a list after a backoff
  (``dlrover_events.backoff``: doubling from its initial delay to its bound, starting
  again after a good list). It never gives up: a source restarts, and the caller's ``on_list`` must
  converge from any state.

The informer keeps no objects: what the caller keeps per object is the caller's to drop
when the object goes (DELETED, or missing from a list). It talks to its source only
through the callables it is given, and reads an object's version with ``version_of``:
the platform port's typed views by default (their ``resource_version``), Kubernetes' JSON
in dlrover_events.kube.informer, which sets the Kubernetes errors too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Generic, TypeVar

from dlrover_events.backoff import Backoff
from dlrover_events.lifecycle import Stopping, unless

log = logging.getLogger(__name__)

T = TypeVar("T")
CHANGES = frozenset({"ADDED", "MODIFIED", "DELETED"})


def resource_version(obj: object) -> str | None:
    """The version a typed object carries (``resource_version``), None when it has none."""
    version = getattr(obj, "resource_version", None)
    return str(version) if version else None


def never(error: BaseException) -> bool:
    return False


def away(error: BaseException) -> str | None:
    """A network or OS failure in one line; None (a bug: its traceback is the why) else."""
    return repr(error) if isinstance(error, (OSError, TimeoutError)) else None


def no_error(typ: str, obj: object) -> BaseException | None:
    return None


@dataclass(eq=False)
class Informer(Generic[T]):
    #: how the logs name what is watched ("env prod: jobs", "ConfigMaps of ns")
    what: str
    #: items and the version a watch goes on from
    list_: Callable[[], Awaitable[tuple[list[T], str]]]
    #: (type, object) from a version until the source ends the watch
    watch: Callable[[str], AsyncIterator[tuple[str, T]]]
    _: KW_ONLY
    on_list: Callable[[list[T]], Awaitable[object]]
    on_event: Callable[[str, T], Awaitable[object]]
    backoff: Backoff = field(default_factory=lambda: Backoff(initial_s=1.0))
    #: the version an object was seen at (None: it says none, the last one stands)
    version_of: Callable[[T], str | None] = resource_version
    #: whether a failure says the watch lost events (then a list follows at once)
    expired: Callable[[BaseException], bool] = never
    #: what the log says of it (Kubernetes: "410 Gone: events lost")
    expired_says: str = "events lost"
    #: a failure of the source in one line (logged without a traceback); None for any
    #: other failure, whose traceback is the why
    unavailable: Callable[[BaseException], str | None] = away
    #: the error a watch passes through as an event (Kubernetes' ERROR), raised here
    error_event: Callable[[str, T], BaseException | None] = no_error
    logger: logging.Logger = field(default=log, repr=False)
    #: set once the first list has been handed over
    synced: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    #: lists handed over so far (the first included)
    lists: int = field(default=0, init=False)

    async def list_once(self) -> str:
        """List, hand the items over; returns the list's version."""
        items, version = await self.list_()
        await self.on_list(items)
        self.lists += 1
        self.synced.set()
        return version

    async def watch_from(self, version: str) -> str:
        """Hand over each change from ``version`` until the source ends the watch; returns
        the last version seen (where the next watch resumes)."""
        async for typ, obj in self.watch(version):
            error = self.error_event(typ, obj)
            if error is not None:
                raise error
            version = self.version_of(obj) or version
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
            except Exception as e:
                if self.expired(e):
                    self.logger.info(
                        "%s: watch expired (%s); listing again", self.what, self.expired_says
                    )
                    continue
                failures += 1
                why = self.unavailable(e)
                self._failed(repr(e) if why is None else why, failures, traceback=why is None)
            await asyncio.sleep(self.backoff.delay(failures))

    def _failed(self, why: str, failures: int, *, traceback: bool) -> None:
        self.logger.warning(
            "%s: list/watch failed (%s); listing again in %.3g s",
            self.what,
            why,
            self.backoff.delay(failures),
            exc_info=traceback,
        )


__all__ = ["CHANGES", "Informer", "away", "resource_version"]
