"""The few API calls the operator makes, on kubernetes-asyncio, as plain JSON dicts.

Dicts rather than the client's models: the pure decisions read what the API sent, field
for field, and custom objects are dicts anyway. Every call is one the operator's Role in
deploy/rbac/operator.yaml allows; keep the two in step.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.rest import ApiException

from handlers.operator.kube.adapter import WorkloadAdapter

MERGE_PATCH = "application/merge-patch+json"


def api_error(e: ApiException) -> str:
    """The API server's own message (its Status body), not the client's repr."""
    try:
        body = json.loads(e.body or "")
        message = body.get("message") or ""
    except (TypeError, ValueError, AttributeError):
        message = ""
    return f"{e.status} {e.reason}: {message}" if message else f"{e.status} {e.reason}"


async def _merge_patch(method: Callable[..., Awaitable[Any]], *args: Any) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386): custom resources refuse the client's default
    strategic-merge patch, and its type stubs leave ``_content_type`` out."""
    got: dict[str, Any] = await method(*args, _content_type=MERGE_PATCH)
    return got


class KubeApi:
    #: where elastic pods find their rendezvous store: None, the job's headless Service
    rendezvous_host: str | None = None

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
        got = await self.custom.list_namespaced_custom_object(*self._crd())
        return list(got.get("items") or []), got["metadata"]["resourceVersion"]

    async def get_job(self, name: str) -> dict[str, Any] | None:
        try:
            got: dict[str, Any] = await self.custom.get_namespaced_custom_object(*self._crd(), name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return got

    async def patch_job(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return await _merge_patch(
            self.custom.patch_namespaced_custom_object, *self._crd(), name, body
        )

    async def patch_job_status(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return await _merge_patch(
            self.custom.patch_namespaced_custom_object_status, *self._crd(), name, body
        )

    async def create_job(self, body: dict[str, Any]) -> dict[str, Any]:
        got: dict[str, Any] = await self.custom.create_namespaced_custom_object(*self._crd(), body)
        return got

    async def delete_job(self, name: str) -> bool:
        try:
            await self.custom.delete_namespaced_custom_object(*self._crd(), name)
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

    # -- pods -----------------------------------------------------------------------------

    async def list_pods(self, selector: str | None = None) -> tuple[list[dict[str, Any]], str]:
        raw: Callable[..., Awaitable[Any]] = self.core.list_namespaced_pod
        resp = await raw(
            self.namespace,
            label_selector=selector or self.adapter.pod_selector(),
            _preload_content=False,
        )
        try:
            got = json.loads(await resp.read())
        finally:
            resp.release()
        return list(got.get("items") or []), got["metadata"]["resourceVersion"]

    async def create_pod(self, manifest: dict[str, Any]) -> bool:
        """False when a pod of that name exists already: names are decided, not random, so
        a repeated create is the same pod, not a second one."""
        try:
            create: Callable[..., Awaitable[Any]] = self.core.create_namespaced_pod
            await create(self.namespace, manifest)
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        return True

    async def delete_pod(self, name: str, grace_period_s: int | None = None) -> bool:
        """``grace_period_s``: how long its containers have after SIGTERM (None: the
        pod's own terminationGracePeriodSeconds)."""
        options: dict[str, Any] = {}
        if grace_period_s is not None:
            options["grace_period_seconds"] = grace_period_s
        try:
            delete: Callable[..., Awaitable[Any]] = self.core.delete_namespaced_pod
            await delete(name, self.namespace, **options)
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

    # -- services -------------------------------------------------------------------------

    async def list_services(self, selector: str) -> list[dict[str, Any]]:
        raw: Callable[..., Awaitable[Any]] = self.core.list_namespaced_service
        resp = await raw(self.namespace, label_selector=selector, _preload_content=False)
        try:
            got = json.loads(await resp.read())
        finally:
            resp.release()
        return list(got.get("items") or [])

    async def create_service(self, manifest: dict[str, Any]) -> bool:
        """False when a Service of that name exists already (decided names, as pods)."""
        try:
            create: Callable[..., Awaitable[Any]] = self.core.create_namespaced_service
            await create(self.namespace, manifest)
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        return True

    async def delete_service(self, name: str) -> bool:
        try:
            await self.core.delete_namespaced_service(name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

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
        """(type, object) from ``resource_version`` on, until the server ends the watch.

        A 410 Gone (the version was compacted away) is raised as the ApiException it is:
        the caller must list again, since events were lost in between.
        """
        func, args, kwargs = self._watchable(kind)
        w = watch.Watch(return_type="object")
        async with w:
            stream = w.stream(
                func,
                *args,
                **kwargs,
                resource_version=resource_version,
                timeout_seconds=timeout_s,
                allow_watch_bookmarks=True,
            )
            async for event in stream:
                yield event["type"], event["raw_object"]


__all__ = ["MERGE_PATCH", "KubeApi", "api_error"]
