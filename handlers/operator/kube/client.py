"""The few API calls the operator makes, on kubernetes-asyncio, as plain JSON dicts
(lists and watches through dlrover_events.kube.api, as every watcher of the cluster);
``cluster.KubeCluster`` reads them into the platform port's views and errors.

Every call is one the operator's Role in deploy/rbac/operator.yaml allows; keep the two
in step.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

from dlrover_events.kube.api import list_objects, list_raw, watch_objects
from handlers.operator.kube.adapter import WorkloadAdapter

MERGE_PATCH = "application/merge-patch+json"


async def merge_patch(method: Callable[..., Awaitable[Any]], *args: Any) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386): custom resources refuse the client's default
    strategic-merge patch, and its type stubs leave ``_content_type`` out."""
    got: dict[str, Any] = await method(*args, _content_type=MERGE_PATCH)
    return got


async def _done_unless(
    status: int, call: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any
) -> bool:
    """True once ``call`` went through; False when the server answered ``status``: a
    create of a decided name that exists (409), a delete of what is gone (404)."""
    try:
        await call(*args, **kwargs)
    except ApiException as e:
        if e.status == status:
            return False
        raise
    return True


class KubeApi:
    def __init__(self, api: client.ApiClient, adapter: WorkloadAdapter, namespace: str) -> None:
        self.api = api
        self.adapter = adapter
        self.namespace = namespace
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    def _crd(self) -> tuple[str, str, str, str]:
        a = self.adapter
        return a.group, a.version, self.namespace, a.plural

    # -- jobs -----------------------------------------------------------------------------

    async def list_jobs(self) -> tuple[list[dict[str, Any]], str]:
        return await list_objects(self.custom.list_namespaced_custom_object, *self._crd())

    async def get_job(self, name: str) -> dict[str, Any] | None:
        try:
            got: dict[str, Any] = await self.custom.get_namespaced_custom_object(*self._crd(), name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return got

    async def patch_job(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return await merge_patch(
            self.custom.patch_namespaced_custom_object, *self._crd(), name, body
        )

    async def patch_job_status(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return await merge_patch(
            self.custom.patch_namespaced_custom_object_status, *self._crd(), name, body
        )

    async def create_job(self, body: dict[str, Any]) -> dict[str, Any]:
        got: dict[str, Any] = await self.custom.create_namespaced_custom_object(*self._crd(), body)
        return got

    async def delete_job(self, name: str) -> bool:
        return await _done_unless(
            404, self.custom.delete_namespaced_custom_object, *self._crd(), name
        )

    # -- pods -----------------------------------------------------------------------------

    async def list_pods(self, selector: str | None = None) -> tuple[list[dict[str, Any]], str]:
        return await list_objects(
            self.core.list_namespaced_pod,
            self.namespace,
            label_selector=selector or self.adapter.pod_selector(),
        )

    async def create_pod(self, manifest: dict[str, Any]) -> bool:
        """False when a pod of that name exists already: names are decided, not random, so
        a repeated create is the same pod, not a second one."""
        return await _done_unless(409, self.core.create_namespaced_pod, self.namespace, manifest)

    async def patch_pod(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """A merge patch of the pod's metadata (a warm spare's admission: its labels and
        annotation); a ``metadata.resourceVersion`` in ``body`` makes it conditional."""
        return await merge_patch(self.core.patch_namespaced_pod, name, self.namespace, body)

    async def delete_pod(self, name: str, grace_period_s: int | None = None) -> bool:
        """``grace_period_s``: how long its containers have after SIGTERM (None: the
        pod's own terminationGracePeriodSeconds)."""
        options: dict[str, Any] = {}
        if grace_period_s is not None:
            options["grace_period_seconds"] = grace_period_s
        return await _done_unless(
            404, self.core.delete_namespaced_pod, name, self.namespace, **options
        )

    # -- services -------------------------------------------------------------------------

    async def list_services(self, selector: str) -> list[dict[str, Any]]:
        got = await list_raw(
            self.core.list_namespaced_service, self.namespace, label_selector=selector
        )
        return list(got.get("items") or [])

    async def create_service(self, manifest: dict[str, Any]) -> bool:
        """False when a Service of that name exists already (decided names, as pods)."""
        return await _done_unless(
            409, self.core.create_namespaced_service, self.namespace, manifest
        )

    async def delete_service(self, name: str) -> bool:
        return await _done_unless(404, self.core.delete_namespaced_service, name, self.namespace)

    # -- nodes (cluster-wide: the operator's nodes ClusterRole) ---------------------------

    async def list_nodes(self, selector: str | None = None) -> tuple[list[dict[str, Any]], str]:
        kwargs = {"label_selector": selector} if selector else {}
        return await list_objects(self.core.list_node, **kwargs)

    async def watch_nodes(
        self, resource_version: str, timeout_s: int, selector: str | None = None
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """The Nodes' changes (of ``selector``) from ``resource_version`` on, as ``watch``."""
        kwargs = {"label_selector": selector} if selector else {}
        async for event in watch_objects(
            self.core.list_node, resource_version=resource_version, timeout_s=timeout_s, **kwargs
        ):
            yield event

    # -- watches --------------------------------------------------------------------------

    def _watchable(self, kind: str) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
        if kind == "jobs":
            return self.custom.list_namespaced_custom_object, self._crd(), {}
        return (
            self.core.list_namespaced_pod,
            (self.namespace,),
            {"label_selector": self.adapter.pod_selector()},
        )

    async def watch(
        self, kind: str, resource_version: str, timeout_s: int
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(type, object) from ``resource_version`` on, until the server ends the watch
        (a 410 Gone raised: the caller lists again)."""
        func, args, kwargs = self._watchable(kind)
        async for event in watch_objects(
            func, *args, resource_version=resource_version, timeout_s=timeout_s, **kwargs
        ):
            yield event


__all__ = ["MERGE_PATCH", "KubeApi", "merge_patch"]
