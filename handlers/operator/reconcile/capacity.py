"""The cluster's capacity as events: what a real env's platform has for jobs, published on
``<env>.cluster.capacity`` at the operator's start and at every change.

A cluster scheduler must give out the GPUs the cluster has now: a Node added, cordoned,
NotReady or deleted changes them, and so do the local platform's slots. The platform's
hosts (a ``CapacitySource``: Kubernetes' Nodes, this machine) are listed and watched with
the one informer (dlrover_events.runtime.informer), kept here by name, and each time the
picture changes the whole of it is published (``CapacityReported``, keyed alike on a
compacted topic, so a brain that starts reads the latest picture and nothing older). A
re-list that finds what was already said publishes nothing.

Every report also says what the platform can apply (its ``PlatformCapabilities``), so
the brain plans only that. A platform that does not count its hosts (the local platform
without slots, Kubernetes without its Node report) still says it, once at the start, in
a report whose hosts are not counted: the brain then keeps its settings' cluster.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from dlrover_events.backoff import Backoff
from dlrover_events.runtime.informer import Informer, away
from handlers.operator.platform.api import CapacitySource, HostChange
from handlers.operator.platform.bodies import Bookmark, Host, PlatformCapabilities
from handlers.operator.platform.errors import Expired, PlatformError
from handlers.operator.reconcile.events import SOURCE
from schemas.bounds import MAX_NODES
from schemas.cluster import CapacityReported, HostCapacity
from schemas.cluster import PlatformCapabilities as DeclaredCapabilities

log = logging.getLogger(__name__)


def _unavailable(error: BaseException) -> str | None:
    if isinstance(error, PlatformError):
        return str(error)
    return away(error)


def declared(capabilities: PlatformCapabilities) -> DeclaredCapabilities:
    """The platform's declaration as the bus carries it."""
    return DeclaredCapabilities(
        gpu_types=capabilities.gpu_types,
        spares=capabilities.spares,
        suspend=capabilities.suspend,
        migrates_nodes=capabilities.migrates_nodes,
        replaces_rendezvous_host=capabilities.replaces_rendezvous_host,
    )


def report(
    env: str,
    platform: str,
    hosts: dict[str, Host],
    capabilities: PlatformCapabilities | None = None,
    *,
    counted: bool = True,
) -> CapacityReported:
    """The whole picture, hosts by name (at most MAX_NODES: a larger cluster is cut, and
    the operator says so), with what the platform can apply; ``counted`` False: the
    platform does not count its hosts, and the report says only what it can apply."""
    named = sorted(hosts.values(), key=lambda h: h.name)
    if len(named) > MAX_NODES:
        log.error(
            "env %s: %d hosts, more than a capacity report holds (%d): the rest are left out",
            env,
            len(named),
            MAX_NODES,
        )
        named = named[:MAX_NODES]
    return CapacityReported(
        env=env,
        source=SOURCE,
        platform=platform,
        hosts=[
            HostCapacity(name=h.name, gpus=h.gpus, schedulable=h.schedulable, gpu_type=h.gpu_type)
            for h in named
        ],
        hosts_counted=counted,
        capabilities=None if capabilities is None else declared(capabilities),
    )


class CapacityReporter:
    """Follows a platform's hosts and publishes its capacity when it changes, with what
    the platform can apply (``capabilities``); without a ``source`` (hosts not counted),
    publishes what it can apply once, at the start."""

    def __init__(
        self,
        env: str,
        platform: str,
        source: CapacitySource | None,
        publish: Callable[[CapacityReported], Awaitable[None]],
        *,
        capabilities: PlatformCapabilities | None = None,
        watch_timeout_s: int = 60,
        retry_s: float = 2.0,
    ) -> None:
        self.env = env
        self.platform = platform
        self.source = source
        self.publish = publish
        self.capabilities = capabilities
        self.hosts: dict[str, Host] = {}
        #: the last picture published (None: none yet)
        self.said: CapacityReported | None = None
        self.informer: Informer[Any] | None = (
            Informer(
                f"env {env}: hosts",
                source.list_hosts,
                self._watch,
                on_list=self._listed,
                on_event=self._changed,
                backoff=Backoff(initial_s=retry_s),
                expired=lambda e: isinstance(e, Expired),
                unavailable=_unavailable,
            )
            if source is not None
            else None
        )
        self._timeout_s = watch_timeout_s

    def _watch(self, version: str) -> AsyncIterator[HostChange]:
        assert self.source is not None  # (the informer exists only with a source)
        return self.source.watch_hosts(version, self._timeout_s)

    async def run(self) -> None:
        if self.informer is not None:
            await self.informer.run()
            return
        # Hosts not counted: what the platform can apply is all there is to say, and it
        # does not change while the operator runs; then nothing more until cancelled.
        await self._say()
        await asyncio.Event().wait()

    async def _listed(self, items: list[Host | Bookmark]) -> None:
        self.hosts = {h.name: h for h in items if isinstance(h, Host)}
        await self._say()

    async def _changed(self, typ: str, host: Host | Bookmark) -> None:
        if not isinstance(host, Host):
            return
        if typ == "DELETED":
            self.hosts.pop(host.name, None)
        else:
            self.hosts[host.name] = host
        await self._say()

    async def _say(self) -> None:
        counted = self.source is not None
        now = report(self.env, self.platform, self.hosts, self.capabilities, counted=counted)
        if self.said is not None and now.hosts == self.said.hosts:
            return
        await self.publish(now)
        self.said = now
        if not counted:
            log.info("env %s: platform %s: hosts not counted", self.env, self.platform)
            return
        log.info(
            "env %s: capacity %d GPUs on %d schedulable of %d hosts",
            self.env,
            now.gpus,
            sum(h.schedulable for h in now.hosts),
            len(now.hosts),
        )


__all__ = ["CapacityReporter", "declared", "report"]
