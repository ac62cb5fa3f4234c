"""The two calls an informer makes of the API server, on kubernetes-asyncio, as plain JSON
dicts: list (items and the list's resourceVersion) and watch (from a resourceVersion).

Dicts rather than the client's models: the deciding code reads what the server sent,
field for field, and custom objects are dicts anyway. ``func`` is any of the client's
``list_*`` methods (the same one serves both calls, as a watch is a list with watch=true).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from kubernetes_asyncio import watch
from kubernetes_asyncio.client.rest import ApiException

#: A list call of kubernetes-asyncio (CoreV1Api.list_namespaced_pod, ...).
ListCall = Callable[..., Awaitable[Any]]


def api_error(e: ApiException) -> str:
    """The API server's own message (its Status body), not the client's repr."""
    try:
        body = json.loads(e.body or "")
        message = body.get("message") or ""
    except (TypeError, ValueError, AttributeError):
        message = ""
    return f"{e.status} {e.reason}: {message}" if message else f"{e.status} {e.reason}"


async def list_raw(func: ListCall, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """The list's JSON as the server sent it (not deserialized into models: faster, and
    what the callers read)."""
    resp = await func(*args, _preload_content=False, **kwargs)
    try:
        body = await resp.read()
        if not 200 <= resp.status <= 299:
            # unread, the client does not check the status: a refusal (403, ...) would
            # pass as a list without items
            refused = ApiException(status=resp.status, reason=resp.reason)
            refused.body = body.decode(errors="replace")  # the server's Status: api_error
            raise refused
        got: dict[str, Any] = json.loads(body)
    finally:
        resp.release()
    return got


async def list_objects(
    func: ListCall, *args: Any, **kwargs: Any
) -> tuple[list[dict[str, Any]], str]:
    """The items, and the list's resourceVersion (where a watch goes on from)."""
    got = await list_raw(func, *args, **kwargs)
    return list(got.get("items") or []), str(got["metadata"]["resourceVersion"])


async def watch_objects(
    func: ListCall, *args: Any, resource_version: str, timeout_s: int, **kwargs: Any
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """(type, object) from ``resource_version`` on, until the server ends the watch.

    Bookmarks come through (type BOOKMARK: only their resourceVersion counts). An ERROR
    event, a 410 Gone included (the version was compacted away: events were lost), is
    raised as an ApiException; the caller lists again.
    """
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


__all__ = ["ListCall", "api_error", "list_objects", "list_raw", "watch_objects"]
