"""The ConfigMap watch of a gateway: cluster credentials, list, watch, re-list.

Only loaded when DLROVER_EVENTS_GATEWAY_CONFIGMAPS is on, so a gateway without a cluster
(`make run`) never needs credentials. The credentials are the gateway's own
(DLROVER_EVENTS_GATEWAY_KUBECONFIG, then $KUBECONFIG / ~/.kube/config, else the pod's
service account: deploy/rbac/gateway.yaml grants it configmaps get/list/watch only), never
the operator's.

List, then watch from the list's resourceVersion; a watch that ends is resumed from the
last version seen, and any failure (410 Gone included: events were lost) is followed by a
fresh list, which ``ConfigMapSync`` turns into exactly the writes still missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.rest import ApiException

from dlrover_events.errors import UserError
from handlers.gateway.configmaps import ConfigMapSync, SyncReport, selector

log = logging.getLogger(__name__)

SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def _kubeconfig(path: Path | None) -> Path | None:
    if path is not None:
        return path.expanduser()
    if env := os.environ.get("KUBECONFIG"):
        return Path(env.split(os.pathsep)[0]).expanduser()
    default = Path.home() / ".kube" / "config"
    return default if default.exists() else None


async def connect(
    kubeconfig: Path | None, context: str | None, namespace: str | None
) -> tuple[client.ApiClient, str]:
    """An ApiClient with the gateway's cluster credentials, and the namespace to watch."""
    path = _kubeconfig(kubeconfig)
    if path is not None:
        if not path.exists():
            raise UserError(f"kubeconfig {path} does not exist")
        api = await config.new_client_from_config(config_file=str(path), context=context)
        if namespace is None:
            contexts, active = config.list_kube_config_contexts(config_file=str(path))
            chosen = next((c for c in contexts if c["name"] == context), active)
            namespace = ((chosen or {}).get("context") or {}).get("namespace")
        return api, namespace or "default"
    try:
        config.load_incluster_config()
    except config.ConfigException as e:
        raise UserError(
            f"ConfigMaps are on but there are no cluster credentials ({e}); set "
            "DLROVER_EVENTS_GATEWAY_KUBECONFIG, or DLROVER_EVENTS_GATEWAY_CONFIGMAPS=false"
        ) from None
    if namespace is None:
        namespace = await asyncio.to_thread(_pod_namespace)
    return client.ApiClient(), namespace


def _pod_namespace() -> str:
    return SA_NAMESPACE.read_text().strip() if SA_NAMESPACE.exists() else "default"


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
        self.retry_s = retry_s
        #: set once the first list has been written through: the store holds the cluster's
        #: ConfigMaps as of then.
        self.synced = asyncio.Event()
        self.relists = 0

    async def relist(self) -> tuple[SyncReport, str]:
        """Every labelled ConfigMap, synced whole; returns the list's resourceVersion."""
        raw: Callable[..., Awaitable[Any]] = self.core.list_namespaced_config_map
        resp = await raw(self.namespace, label_selector=selector(), _preload_content=False)
        try:
            got = json.loads(await resp.read())
        finally:
            resp.release()
        report = await self.sync.replace_all(got.get("items") or [])
        self.relists += 1
        if report.changes:
            log.info(
                "ConfigMaps of %s listed: %d created, %d updated, %d deleted",
                self.namespace,
                report.created,
                report.updated,
                report.deleted,
            )
        return report, str(got["metadata"]["resourceVersion"])

    async def events(self, resource_version: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(type, object) from ``resource_version`` until the server ends the watch."""
        w = watch.Watch(return_type="object")
        async with w:
            stream = w.stream(
                self.core.list_namespaced_config_map,
                self.namespace,
                label_selector=selector(),
                resource_version=resource_version,
                timeout_seconds=self.watch_timeout_s,
                allow_watch_bookmarks=True,
            )
            async for event in stream:
                yield event["type"], event["raw_object"]

    async def run(self, stop: asyncio.Event) -> None:
        """Until ``stop``; the cluster or the store away is logged and retried, never fatal."""
        backoff = self.retry_s
        while not stop.is_set():
            try:
                _, version = await self.relist()
                self.synced.set()
                backoff = self.retry_s
                while not stop.is_set():
                    version = await self._watch(version)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                gone = isinstance(err, ApiException) and err.status == 410
                log.warning(
                    "ConfigMap watch of %s: %s; listing again in %.1fs",
                    self.namespace,
                    "resourceVersion too old (410)" if gone else repr(err),
                    backoff,
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), backoff)
                backoff = min(backoff * 2, 30.0)

    async def _watch(self, version: str) -> str:
        async for kind, obj in self.events(version):
            meta = obj.get("metadata") or {}
            if kind == "ERROR":
                status = obj.get("code")
                raise ApiException(status=status, reason=str(obj.get("message")))
            version = str(meta.get("resourceVersion") or version)
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                await self.sync.observe(kind, obj)
        return version
