"""A training job's client of the config gateway: fetch, cache, long-poll; never fail.

A job must not die because the gateway is down, slow or misconfigured: every call returns
a ``ConfigSnapshot``, which is the last good config (from memory, or from ``cache_path``
across restarts, or ``default``) when the gateway cannot answer, with ``stale=True`` and
the reason in ``error``. The outage is logged once when it starts and once when it ends.

Both clients take the job's attributes (user, group, cluster, job, ``labels.<name>``, ...)
as the gateway's query parameters. ``from_env`` reads DLROVER_EVENTS_GATEWAY_URL and
DLROVER_EVENTS_GATEWAY_TOKEN, which is how an operator hands them to a job's pods.

The blocking side (one GET, a long-poll thread with back-off, outage logged once) is
``SyncPoller`` over a ``GatewayResource``, so the SDK's plan follower reads its job's plan
through the same code as the config, not through a second HTTP loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, Protocol, Self, TypeVar

import aiohttp

from dlrover_events.backoff import Backoff

log = logging.getLogger(__name__)

URL_ENV = "DLROVER_EVENTS_GATEWAY_URL"
TOKEN_ENV = "DLROVER_EVENTS_GATEWAY_TOKEN"

Attributes = Mapping[str, str | Sequence[str]]


@dataclass(frozen=True)
class ConfigSnapshot:
    """What the job should use now, and how much to trust it."""

    config: dict[str, Any]
    #: the documents it came from, the winner first (as the gateway said).
    sources: list[dict[str, Any]] = field(default_factory=list)
    etag: str | None = None
    #: False when this is the answer the gateway just gave (or confirmed unchanged).
    stale: bool = True
    #: why the gateway's answer could not be had, when stale.
    error: str | None = None
    #: wall-clock time the gateway last gave or confirmed it; None if it never did.
    fetched_at: float | None = None

    @property
    def ok(self) -> bool:
        return not self.stale


class Outage:
    """Says an outage once when it starts and once when it ends, not once per retry: a
    job long-polling for days must not fill its log with one line per back-off."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.down = False

    def failed(self, reason: str, keeping: str) -> None:
        if not self.down:
            self.down = True
            log.warning("%s gateway unavailable (%s); keeping %s", self.what, reason, keeping)

    def recovered(self) -> None:
        if self.down:
            self.down = False
            log.warning("%s gateway reachable again", self.what)


def gateway_headers(token: str | None, etag: str | None) -> dict[str, str]:
    """Bearer token and, for an ETag the gateway gave, ``If-None-Match`` (a 304 then)."""
    h = {"Accept": "application/json"}
    if token:
        h["Authorization"] = f"Bearer {token}"
    if etag:
        h["If-None-Match"] = etag
    return h


class _Core:
    """The state both clients share: last good snapshot, cache file, outage logging."""

    def __init__(
        self,
        url: str,
        token: str | None,
        attributes: Attributes,
        cache_path: Path | None,
        default: Mapping[str, Any] | None,
    ) -> None:
        self.base = url.rstrip("/")
        self.token = token
        self.params: list[tuple[str, str]] = [
            (k, v) for k, vs in attributes.items() for v in ([vs] if isinstance(vs, str) else vs)
        ]
        self.cache_path = cache_path
        self.last = self._load_cache() or ConfigSnapshot(
            dict(default or {}), error="not fetched yet"
        )
        self._outage = Outage("config")

    def url(self, wait_s: float | None) -> str:
        params = list(self.params)
        if wait_s:
            params.append(("wait", f"{wait_s:g}"))
        return f"{self.base}/v1/config?{urllib.parse.urlencode(params)}"

    def headers(self, conditional: bool) -> dict[str, str]:
        # Only an ETag the gateway gave (now or before a restart, via the cache file).
        given = conditional and self.last.fetched_at is not None
        return gateway_headers(self.token, self.last.etag if given else None)

    def got(self, status: int, body: bytes, etag: str | None) -> ConfigSnapshot:
        now = time.time()
        if status == 304 and self.last.fetched_at is not None:
            return self._good(replace(self.last, stale=False, error=None, fetched_at=now))
        if status == 200:
            try:
                data = json.loads(body)
                snap = ConfigSnapshot(
                    config=dict(data["config"]),
                    sources=list(data.get("sources", [])),
                    etag=etag,
                    stale=False,
                    fetched_at=now,
                )
            except (ValueError, KeyError, TypeError) as err:
                return self.failed(f"the gateway's answer is not a config ({err})")
            self._save_cache(snap)
            return self._good(snap)
        return self.failed(f"the gateway answered {status}: {_message(body)}")

    def failed(self, reason: str) -> ConfigSnapshot:
        age = (
            f"from {time.ctime(self.last.fetched_at)}"
            if self.last.fetched_at
            else "never fetched: defaults"
        )
        self._outage.failed(reason, f"the last good config ({age})")
        self.last = replace(self.last, stale=True, error=reason)
        return self.last

    def _good(self, snap: ConfigSnapshot) -> ConfigSnapshot:
        self._outage.recovered()
        self.last = snap
        return snap

    def _load_cache(self) -> ConfigSnapshot | None:
        if self.cache_path is None or not self.cache_path.exists():
            return None
        try:
            data = json.loads(self.cache_path.read_text("utf-8"))
            return ConfigSnapshot(
                config=dict(data["config"]),
                sources=list(data.get("sources", [])),
                etag=data.get("etag"),
                stale=True,
                error="from the cache file; not confirmed by the gateway yet",
                fetched_at=data.get("fetched_at"),
            )
        except (OSError, ValueError, KeyError, TypeError) as err:
            log.warning("ignoring unreadable config cache %s: %s", self.cache_path, err)
            return None

    def _save_cache(self, snap: ConfigSnapshot) -> None:
        if self.cache_path is None:
            return
        body = {
            "config": snap.config,
            "sources": snap.sources,
            "etag": snap.etag,
            "fetched_at": snap.fetched_at,
        }
        tmp = self.cache_path.with_name(self.cache_path.name + ".tmp")
        try:
            self.cache_path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(body), "utf-8")
            tmp.replace(self.cache_path)
        except OSError as err:
            log.warning("cannot write the config cache %s: %s", self.cache_path, err)


def _message(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body[:200].decode("utf-8", "replace")


#: A gateway away is asked again after this (jittered: a job's pods do not come back at once).
RETRY = Backoff(initial_s=0.5, max_s=30.0, jitter=True)


class ConfigClient:
    """Async client (aiohttp). Use ``async with``, or call ``close()``."""

    def __init__(
        self,
        url: str,
        token: str | None,
        attributes: Attributes,
        *,
        timeout_s: float = 5.0,
        cache_path: Path | str | None = None,
        default: Mapping[str, Any] | None = None,
    ) -> None:
        self._core = _Core(
            url, token, attributes, Path(cache_path) if cache_path else None, default
        )
        self._timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_env(cls, attributes: Attributes, **kwargs: Any) -> ConfigClient:
        return cls(
            os.environ.get(URL_ENV, "http://127.0.0.1:8470"),
            os.environ.get(TOKEN_ENV),
            attributes,
            **kwargs,
        )

    @property
    def last(self) -> ConfigSnapshot:
        return self._core.last

    async def fetch(self) -> ConfigSnapshot:
        """The current config (a 304 confirms the one held)."""
        return await self._get(None)

    async def wait_for_change(self, wait_s: float = 30.0) -> ConfigSnapshot:
        """Long-poll once: returns on a change, or after ``wait_s`` with the same config."""
        return await self._get(wait_s)

    async def watch(self, wait_s: float = 30.0) -> AsyncIterator[ConfigSnapshot]:
        """Yield the config now and after every change; back off while the gateway is away."""
        snap = await self.fetch()
        yield snap
        failures = 0 if snap.ok else 1
        while True:
            before = self._core.last.etag
            snap = await self.wait_for_change(wait_s) if not snap.stale else await self.fetch()
            if snap.stale:
                failures += 1
                await asyncio.sleep(RETRY.delay(failures))
                continue
            if failures or snap.etag != before:
                yield snap
            failures = 0

    async def _get(self, wait_s: float | None) -> ConfigSnapshot:
        core = self._core
        if self._session is None:
            self._session = aiohttp.ClientSession()
        timeout = aiohttp.ClientTimeout(total=self._timeout_s + (wait_s or 0))
        try:
            async with self._session.get(
                core.url(wait_s), headers=core.headers(True), timeout=timeout
            ) as resp:
                body = await resp.read()
                return core.got(resp.status, body, resp.headers.get("ETag"))
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            return core.failed(f"{type(err).__name__}: {err}")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class GatewayAnswer(Protocol):
    """What a ``SyncPoller`` needs to know of an answer: whether it is the gateway's own."""

    @property
    def stale(self) -> bool: ...

    @property
    def etag(self) -> str | None: ...


A = TypeVar("A", bound=GatewayAnswer)
A_co = TypeVar("A_co", bound=GatewayAnswer, covariant=True)


class GatewayResource(Protocol[A_co]):
    """One thing a job reads from the gateway: where it is, and what an answer means.

    ``got`` and ``failed`` keep the last good answer and return what the caller should
    use now; they must not raise (a bad body is a failure, said in the answer).
    """

    def url(self, wait_s: float | None) -> str: ...

    def headers(self, conditional: bool) -> dict[str, str]: ...

    def got(self, status: int, body: bytes, etag: str | None) -> A_co: ...

    def failed(self, reason: str) -> A_co: ...


class SyncPoller(Generic[A]):
    """Blocking GETs and a long-poll thread for one gateway resource (standard library).

    The thread fetches, then long-polls while the gateway answers, and backs off (fetching
    again) while it does not; ``on_change`` gets the first answer, each changed one, and
    the first one after an outage. Nothing it meets stops the thread but ``stop_watching``.
    """

    def __init__(self, resource: GatewayResource[A], *, timeout_s: float, name: str) -> None:
        self.resource = resource
        self._timeout_s = timeout_s
        self._name = name
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def get(self, wait_s: float | None) -> A:
        # The lock guards the shared state, not the request: a fetch from the training
        # loop must not wait behind the watcher's 30 s long-poll.
        res = self.resource
        with self._lock:
            request = urllib.request.Request(res.url(wait_s), headers=res.headers(True))
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s + (wait_s or 0)) as r:
                status, body, etag = r.status, r.read(), r.headers.get("ETag")
        except urllib.error.HTTPError as err:
            status, etag = err.code, err.headers.get("ETag")
            body = err.read() if err.fp is not None else b""
        except (urllib.error.URLError, TimeoutError, OSError, ValueError) as err:
            with self._lock:
                return res.failed(f"{type(err).__name__}: {err}")
        with self._lock:
            return res.got(status, body, etag)

    def start_watching(self, on_change: Callable[[A], None], wait_s: float = 30.0) -> None:
        if self._thread is not None:
            raise RuntimeError("already watching")
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._watch, args=(on_change, wait_s), name=self._name, daemon=True
        )
        self._thread.start()

    def stop_watching(self, timeout_s: float | None = None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _watch(self, on_change: Callable[[A], None], wait_s: float) -> None:
        failures = 0
        before: str | None = None
        first = True
        while not self._stop.is_set():
            try:
                snap = self.get(wait_s) if not first and failures == 0 else self.get(None)
            except Exception:  # a bug of ours must not end the watch: retry later
                log.exception("%s: polling the gateway failed", self._name)
                failures += 1
                self._stop.wait(RETRY.delay(failures))
                continue
            if snap.stale:
                failures += 1
                self._stop.wait(RETRY.delay(failures))
                continue
            if first or failures or snap.etag != before:
                try:
                    on_change(snap)
                except Exception:
                    log.exception("%s: the change callback failed", self._name)
            first, failures, before = False, 0, snap.etag


class SyncConfigClient:
    """Blocking client (standard library only), for training scripts without an event loop.

    ``start_watching`` long-polls in a daemon thread and calls back on every change.
    """

    def __init__(
        self,
        url: str,
        token: str | None,
        attributes: Attributes,
        *,
        timeout_s: float = 5.0,
        cache_path: Path | str | None = None,
        default: Mapping[str, Any] | None = None,
    ) -> None:
        self._core = _Core(
            url, token, attributes, Path(cache_path) if cache_path else None, default
        )
        self._poller = SyncPoller(self._core, timeout_s=timeout_s, name="dlrover-config")

    @classmethod
    def from_env(cls, attributes: Attributes, **kwargs: Any) -> SyncConfigClient:
        return cls(
            os.environ.get(URL_ENV, "http://127.0.0.1:8470"),
            os.environ.get(TOKEN_ENV),
            attributes,
            **kwargs,
        )

    @property
    def last(self) -> ConfigSnapshot:
        return self._core.last

    def fetch(self) -> ConfigSnapshot:
        return self._poller.get(None)

    def wait_for_change(self, wait_s: float = 30.0) -> ConfigSnapshot:
        return self._poller.get(wait_s)

    def start_watching(
        self, on_change: Callable[[ConfigSnapshot], None], wait_s: float = 30.0
    ) -> None:
        """Call ``on_change`` with each new config (from a background thread)."""
        self._poller.start_watching(on_change, wait_s)

    def stop_watching(self, timeout_s: float | None = None) -> None:
        """Stops after the long-poll in flight returns (at most ``wait_s`` later)."""
        self._poller.stop_watching(timeout_s)


__all__ = [
    "ConfigClient",
    "ConfigSnapshot",
    "GatewayAnswer",
    "GatewayResource",
    "Outage",
    "SyncConfigClient",
    "SyncPoller",
    "gateway_headers",
]
