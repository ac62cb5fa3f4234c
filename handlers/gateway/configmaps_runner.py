"""The ConfigMap watch of a gateway: cluster credentials, and the informer that feeds
``ConfigMapSync``.

Only loaded when DLROVER_EVENTS_GATEWAY_CONFIGMAPS is on, so a gateway without a cluster
(`make run`) never needs credentials. The credentials are the gateway's own
(DLROVER_EVENTS_GATEWAY_KUBECONFIG, then $KUBECONFIG / ~/.kube/config, else the pod's
service account: deploy/rbac/gateway.yaml grants it configmaps get/list/watch only), never
the operator's; they are loaded as every service loads them (dlrover_events.kube).

The informer (dlrover_events.kube.informer) lists, then watches from the list's
resourceVersion, and lists again after any failure (410 Gone included: events were lost);
``ConfigMapSync`` turns each list into exactly the writes still missing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from dlrover_events.backoff import Backoff
from dlrover_events.kube import credentials
from dlrover_events.kube.api import list_objects, watch_objects
from dlrover_events.kube.informer import KubeInformer
from handlers.gateway.configmaps import ConfigMapSync, SyncReport, selector

log = logging.getLogger(__name__)


async def connect(
    kubeconfig: Path | None, context: str | None, namespace: str | None
) -> tuple[client.ApiClient, str]:
    """An ApiClient with the gateway's cluster credentials, and the namespace to watch."""
    return await credentials.connect(
        kubeconfig,
        context,
        namespace,
        hint="ConfigMaps are on: set DLROVER_EVENTS_GATEWAY_KUBECONFIG, or "
        "DLROVER_EVENTS_GATEWAY_CONFIGMAPS=false",
    )


class ConfigMapWatcher:
    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        sync: ConfigMapSync,
        *,
        watch_timeout_s: int = 60,
        retry_s: float = 1.0,
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self.sync = sync
        self.watch_timeout_s = watch_timeout_s
        self.informer = KubeInformer(
            f"ConfigMaps of {namespace}",
            self._list,
            self._watch,
            on_list=self._listed,
            on_event=self.sync.observe,
            backoff=Backoff(initial_s=retry_s),
        )
        #: set once the first list has been written through: the store holds the cluster's
        #: ConfigMaps as of then.
        self.synced: asyncio.Event = self.informer.synced

    async def _list(self) -> tuple[list[dict[str, Any]], str]:
        return await list_objects(
            self.core.list_namespaced_config_map, self.namespace, label_selector=selector()
        )

    def _watch(self, version: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        return watch_objects(
            self.core.list_namespaced_config_map,
            self.namespace,
            label_selector=selector(),
            resource_version=version,
            timeout_s=self.watch_timeout_s,
        )

    async def _listed(self, items: list[dict[str, Any]]) -> SyncReport:
        """Every labelled ConfigMap, synced whole."""
        report = await self.sync.replace_all(items)
        if report.changes:
            log.info(
                "ConfigMaps of %s listed: %d created, %d updated, %d deleted",
                self.namespace,
                report.created,
                report.updated,
                report.deleted,
            )
        return report

    async def relist(self) -> tuple[SyncReport, str]:
        """A list synced whole now, outside the informer; returns its resourceVersion."""
        items, version = await self._list()
        return await self._listed(items), version

    async def run(self, stop: asyncio.Event) -> None:
        """Until ``stop``; the cluster or the store away is logged and retried, never fatal."""
        await self.informer.run(stop)
