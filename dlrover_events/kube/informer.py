"""The one informer (dlrover_events.runtime.informer) for a Kubernetes list/watch: objects
as the API server's JSON (their version in metadata.resourceVersion), a 410 Gone (raised,
or passed through as an ERROR event) lists again at once, and the API server, its
network or its client away is said in one line.

What every watcher of a cluster uses (the gateway's ConfigMaps); the operator watches its
jobs and pods through the platform port, with the same informer on the port's views.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from kubernetes_asyncio.client.rest import ApiException

from dlrover_events.kube.api import api_error
from dlrover_events.runtime import informer

log = logging.getLogger(__name__)

Object = dict[str, Any]

#: a cluster, its network or its client away: said in one line (anything else is a bug
#: of ours, and its traceback is the why)
UNAVAILABLE: tuple[type[BaseException], ...] = (
    ApiException,
    aiohttp.ClientError,
    OSError,
    TimeoutError,
)


def _version(obj: Object) -> str | None:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "") or None


def _gone(error: BaseException) -> bool:
    return isinstance(error, ApiException) and error.status == 410


def _unavailable(error: BaseException) -> str | None:
    if isinstance(error, ApiException):
        return api_error(error)
    return repr(error) if isinstance(error, UNAVAILABLE) else None


def _error_event(typ: str, obj: Object) -> BaseException | None:
    """A watch that passes the server's Status through."""
    if typ == "ERROR":
        return ApiException(status=obj.get("code"), reason=str(obj.get("message")))
    return None


@dataclass(eq=False)
class KubeInformer(informer.Informer[Object]):
    """The runtime informer with Kubernetes' versions, 410 Gone and errors filled in."""

    version_of: Callable[[Object], str | None] = field(default=_version, kw_only=True)
    expired: Callable[[BaseException], bool] = field(default=_gone, kw_only=True)
    expired_says: str = field(default="410 Gone: events lost", kw_only=True)
    unavailable: Callable[[BaseException], str | None] = field(default=_unavailable, kw_only=True)
    error_event: Callable[[str, Object], BaseException | None] = field(
        default=_error_event, kw_only=True
    )
    logger: logging.Logger = field(default=log, repr=False, kw_only=True)


__all__ = ["UNAVAILABLE", "KubeInformer"]
