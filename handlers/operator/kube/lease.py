"""Leader election on a coordination.k8s.io/v1 Lease: of several operator replicas, one
acts on the cluster, and two never do at once.

A small loop of its own rather than kubernetes-asyncio's LeaderElection, which takes
whole seconds only (retry period >= 1 s), writes naive local timestamps, never releases
the lease on a clean stop, and lets a leader whose renewals hang go on acting until a
whole renew deadline of failed attempts has passed, with nothing to fence its writes.

Safety needs no two clocks to agree; each replica reads only its own monotonic clock:
- the leader holds the lease until ``renew_deadline`` after the *start* of its last
  successful write (create or renew); past that it acts no more (``held()`` is false, the
  platform's writes are fenced), whether or not an answer ever came;
- a candidate takes the lease only once the record it reads has stayed the same (same
  resourceVersion) for the record's leaseDurationSeconds, counted from when it first read
  it, or when nobody holds it (a clean stop releases it).
The holder's last write started before any candidate read its result, and
lease_duration > renew_deadline, so the old leader has stopped before anyone may take
over. Every write carries the resourceVersion it read: two candidates cannot both win.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

log = logging.getLogger(__name__)

DEFAULT_LEASE_NAME = "dlrover-events-operator"


def default_identity() -> str:
    """Who this replica is in the Lease: its pod (POD_NAME, else the host name, which is
    the pod's name in a pod) and pid, and a random part, so that a container restarted in
    the same pod, or two operators in one process, are never taken for each other."""
    host = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{host}_{os.getpid()}_{secrets.token_hex(3)}"


@dataclass(frozen=True)
class Timing:
    """lease_duration_s: how long a record unchanged means its holder is gone (written into
    the Lease, whole seconds as the API takes them); renew_deadline_s: how long the leader
    acts after the start of its last successful renewal; retry_period_s: between tries."""

    lease_duration_s: int = 15
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline < lease duration "
                f"(got {self.retry_period_s} s, {self.renew_deadline_s} s, "
                f"{self.lease_duration_s} s)"
            )


@dataclass(frozen=True)
class LeaseRecord:
    """The spec of a Lease as read, with the version a write must carry."""

    holder: str
    duration_s: int | None
    transitions: int
    acquire_time: str | None
    resource_version: str

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> LeaseRecord:
        spec = obj.get("spec") or {}
        duration = spec.get("leaseDurationSeconds")
        return cls(
            holder=spec.get("holderIdentity") or "",
            duration_s=int(duration) if duration else None,
            transitions=int(spec.get("leaseTransitions") or 0),
            acquire_time=spec.get("acquireTime"),
            resource_version=(obj.get("metadata") or {}).get("resourceVersion", ""),
        )


@dataclass(frozen=True)
class Seen:
    """A record as this replica read it, and since when (its own monotonic clock)."""

    record: LeaseRecord
    since: float


def observe(seen: Seen | None, record: LeaseRecord, now: float) -> Seen:
    """A record unchanged keeps the time it was first read; any write restarts it."""
    if seen is not None and seen.record.resource_version == record.resource_version:
        return seen
    return Seen(record, now)


def may_take(seen: Seen, me: str, now: float, timing: Timing) -> bool:
    """Whether ``me`` may write itself into the lease: it holds it, nobody does, or the
    holder has not renewed for the duration it promised (ours when it promised none)."""
    record = seen.record
    if record.holder in ("", me):
        return True
    duration = record.duration_s or timing.lease_duration_s
    return now >= seen.since + duration


def micro_time(at: datetime) -> str:
    """A MicroTime as the API writes it."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def taken(record: LeaseRecord | None, me: str, at: datetime, timing: Timing) -> dict[str, Any]:
    """The spec that says ``me`` holds the lease from ``at`` on: acquired now, or renewed
    (keeping the acquisition time) when it held it already."""
    renewing = record is not None and record.holder == me
    transitions = record.transitions if record is not None else 0
    if record is not None and not renewing:
        transitions += 1
    return {
        "holderIdentity": me,
        "leaseDurationSeconds": timing.lease_duration_s,
        "acquireTime": record.acquire_time if renewing and record is not None else micro_time(at),
        "renewTime": micro_time(at),
        "leaseTransitions": transitions,
    }


def released(record: LeaseRecord, at: datetime) -> dict[str, Any]:
    """The spec a leader leaves behind on a clean stop: no holder, so a candidate takes
    over at its next try instead of after a lease duration."""
    return {
        "holderIdentity": None,
        "leaseDurationSeconds": 1,
        "acquireTime": None,
        "renewTime": micro_time(at),
        "leaseTransitions": record.transitions,
    }


#: what a try that got no answer raises: the lease is then not renewed, nothing more
_UNANSWERED = (ApiException, OSError, TimeoutError, aiohttp.ClientError, ValueError)


class LeaseElector:
    """Campaigns for one Lease, renews it while it holds it, releases it on a clean stop.

    ``held()`` says, by this replica's clock, whether it may act now; listeners are called
    whenever that changes (from the loop, so they must not block)."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        *,
        name: str = DEFAULT_LEASE_NAME,
        identity: str | None = None,
        timing: Timing | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.leases = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.timing = timing or Timing()
        self.clock = clock
        self._listeners: list[Callable[[], None]] = []
        self._held_until: float | None = None
        self._seen: Seen | None = None
        self._said: str | None = None

    # -- what the operator asks -----------------------------------------------------------

    def held(self) -> bool:
        return self._held_until is not None and self.clock() < self._held_until

    def subscribe(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    @property
    def holder(self) -> str:
        """The holder as last read ('' when none, or nothing was read yet)."""
        return self._seen.record.holder if self._seen is not None else ""

    # -- the loop -------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Until ``stop``: take the lease when it may, renew it while held. Then release it,
        if held: the caller stops acting on the cluster before it sets ``stop``."""
        try:
            while not stop.is_set():
                started = self.clock()
                ok = await self._attempt(started)
                if ok:
                    self._lead(started + self.timing.renew_deadline_s)
                elif self._held_until is not None and (
                    not self.held() or self.holder not in ("", self.identity)
                ):
                    self._lose("another replica holds it now" if self.held() else None)
                self._say_follower()
                pause = self.timing.retry_period_s
                if self._held_until is not None:
                    pause = max(0.0, min(pause, self._held_until - self.clock()))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), pause)
                if self._held_until is not None and not self.held():
                    self._lose(None)
        finally:
            await self._release()

    async def _attempt(self, started: float) -> bool:
        """One try to take or renew the lease; False when it did not (and why is logged
        once). A leader's try is cut at its deadline: a hung call cannot extend it."""
        budget = self.timing.renew_deadline_s
        if self._held_until is not None:
            budget = self._held_until - started
        if budget <= 0:
            return False
        try:
            async with asyncio.timeout(budget):
                return await self._try()
        except asyncio.CancelledError:
            raise
        except _UNANSWERED as e:
            why = _why(e)
            if self._said != why:
                log.warning("lease %s/%s: %s; trying again", self.namespace, self.name, why)
                self._said = why
            return False

    async def _try(self) -> bool:
        at = datetime.now(UTC)
        obj = await self._read()
        if obj is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name},
                "spec": taken(None, self.identity, at, self.timing),
            }
            return await self._write(self.leases.create_namespaced_lease, self.namespace, body)
        record = LeaseRecord.of(obj)
        self._seen = observe(self._seen, record, self.clock())
        if not may_take(self._seen, self.identity, self.clock(), self.timing):
            return False
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "resourceVersion": record.resource_version},
            "spec": taken(record, self.identity, at, self.timing),
        }
        return await self._write(
            self.leases.replace_namespaced_lease, self.name, self.namespace, body
        )

    async def _read(self) -> dict[str, Any] | None:
        read: Callable[..., Awaitable[Any]] = self.leases.read_namespaced_lease
        resp = await read(self.name, self.namespace, _preload_content=False)
        try:
            if resp.status == 404:
                return None
            text = await resp.text()
            if not 200 <= resp.status <= 299:
                raise ApiException(status=resp.status, reason=resp.reason)
        finally:
            resp.release()
        got: dict[str, Any] = json.loads(text)
        return got

    async def _write(self, call: Callable[..., Any], *args: Any) -> bool:
        """True when written; False when another write came first (409: read again)."""
        resp = await call(*args, _preload_content=False)
        try:
            if resp.status == 409:
                return False
            if not 200 <= resp.status <= 299:
                raise ApiException(status=resp.status, reason=resp.reason)
            got = json.loads(await resp.text())
        finally:
            resp.release()
        self._seen = Seen(LeaseRecord.of(got), self.clock())
        self._said = None
        return True

    # -- transitions ----------------------------------------------------------------------

    def _lead(self, until: float) -> None:
        first = self._held_until is None
        self._held_until = until
        if first:
            log.warning(
                "%s holds lease %s/%s: this operator acts on the cluster",
                self.identity,
                self.namespace,
                self.name,
            )
            self._notify()

    def _lose(self, why: str | None) -> None:
        self._held_until = None
        log.warning(
            "%s lost lease %s/%s (%s): this operator stops acting on the cluster now",
            self.identity,
            self.namespace,
            self.name,
            why or f"not renewed within {self.timing.renew_deadline_s:g} s",
        )
        self._notify()

    def _say_follower(self) -> None:
        holder = self.holder
        if self._held_until is not None or holder in ("", self.identity):
            return
        said = f"held by {holder}"
        if self._said != said:
            promised = self._seen.record.duration_s if self._seen is not None else None
            log.warning(
                "lease %s/%s is held by %s: this operator waits (it takes over once the "
                "lease goes %d s unrenewed)",
                self.namespace,
                self.name,
                holder,
                promised or self.timing.lease_duration_s,
            )
            self._said = said

    def _notify(self) -> None:
        for listener in self._listeners:
            listener()

    async def _release(self) -> None:
        """Give the lease up (only if this replica still holds it), so that another takes
        over at its next try; bounded, and never an error: an expired lease does too."""
        if not self.held() or self._seen is None:
            self._held_until = None
            return
        record = self._seen.record
        self._held_until = None
        self._notify()
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "resourceVersion": record.resource_version},
            "spec": released(record, datetime.now(UTC)),
        }
        try:
            async with asyncio.timeout(self.timing.retry_period_s + 1):
                if await self._write(
                    self.leases.replace_namespaced_lease, self.name, self.namespace, body
                ):
                    log.warning("%s released lease %s/%s", self.identity, self.namespace, self.name)
        except _UNANSWERED as e:
            log.warning(
                "lease %s/%s not released (%s): it expires", self.namespace, self.name, _why(e)
            )


def _why(e: BaseException) -> str:
    if isinstance(e, ApiException):
        return f"the API server answered {e.status} {e.reason}"
    if isinstance(e, TimeoutError):
        return "no answer in time"
    return f"cannot reach the API server ({e!r})"


__all__ = [
    "DEFAULT_LEASE_NAME",
    "LeaseElector",
    "LeaseRecord",
    "Seen",
    "Timing",
    "default_identity",
    "may_take",
    "micro_time",
    "observe",
    "released",
    "taken",
]
