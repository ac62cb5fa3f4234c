"""Follow the job's own plan from the gateway, so a training process can act on it.

A job learns what the brain wants for it (training knobs above all: only the training
process can change its micro-batch) without reading the bus: it long-polls
``GET /v1/jobs/{job}/plan?wait=30`` with the last ETag, through the same blocking poller
as the config client (``dlrover_events.config.client.SyncPoller``), in a daemon thread.

The follower never blocks or fails training: with the gateway away it keeps the last plan,
backs off, and logs the outage once; a job the gateway has not seen yet (404) is no
outage, only no plan yet. Callbacks run on the follower's thread; what they raise is
logged, never passed on. (The SDK's other follower, ``follow_real``, follows which env is
the real one, for the reporter.)

    follower = PlanFollower.from_env(identity).start()
    follower.on_plan(lambda plan: ...)
    follower.current()  # the latest JobPlan, or None
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Self

from pydantic import ValidationError

from dlrover_events.config.client import (
    TOKEN_ENV,
    URL_ENV,
    Outage,
    SyncPoller,
    gateway_headers,
)
from dlrover_events.sdk.identity import JobIdentity
from schemas.plans import JobPlan

log = logging.getLogger(__name__)

#: Seconds the gateway may hold a plan request open waiting for a change.
DEFAULT_WAIT_S = 30.0
#: Callbacks registered at most: a bounded list, a job registers a handful.
MAX_CALLBACKS = 64

PlanCallback = Callable[[JobPlan], object]


@dataclass(frozen=True)
class PlanSnapshot:
    """The job's plan as last heard, and how much to trust it."""

    plan: JobPlan | None
    etag: str | None = None
    #: False when this is the gateway's answer just now (or its 304 confirming it).
    stale: bool = True
    #: why the gateway's answer could not be had, when stale.
    error: str | None = None
    #: wall-clock time the gateway last gave or confirmed a plan; None if it never did.
    fetched_at: float | None = None


class PlanResource:
    """``GET /v1/jobs/{job}/plan`` as a ``GatewayResource``: pure, no I/O of its own."""

    def __init__(self, url: str, token: str | None, job_uuid: str) -> None:
        self.base = url.rstrip("/")
        self.token = token
        self.job_uuid = job_uuid
        self.last = PlanSnapshot(None, error="not fetched yet")
        self._outage = Outage("plan")
        self._unknown_said = False

    def url(self, wait_s: float | None) -> str:
        path = f"{self.base}/v1/jobs/{urllib.parse.quote(self.job_uuid, safe='')}/plan"
        return f"{path}?wait={wait_s:g}" if wait_s else path

    def headers(self, conditional: bool) -> dict[str, str]:
        given = conditional and self.last.fetched_at is not None
        return gateway_headers(self.token, self.last.etag if given else None)

    def got(self, status: int, body: bytes, etag: str | None) -> PlanSnapshot:
        now = time.time()
        if status == 304 and self.last.fetched_at is not None:
            return self._good(replace(self.last, stale=False, error=None, fetched_at=now))
        if status == 404:
            # The gateway has not seen the job on the bus yet: normal for a new job, so it
            # is said once at INFO and retried with back-off, and is no outage.
            self._outage.recovered()
            if not self._unknown_said:
                self._unknown_said = True
                log.info("the gateway has no plan for job %s yet", self.job_uuid)
            self.last = replace(self.last, stale=True, error="the gateway has no plan yet")
            return self.last
        if status == 200:
            try:
                plan = JobPlan.model_validate_json(body)
            except ValidationError as err:
                return self.failed(
                    f"the gateway's answer is not a JobPlan ({err.error_count()} errors)"
                )
            if plan.job.uuid != self.job_uuid:
                return self.failed(f"the gateway answered with job {plan.job.uuid!r}'s plan")
            return self._good(PlanSnapshot(plan, etag=etag, stale=False, fetched_at=now))
        return self.failed(f"the gateway answered {status}: {_message(body)}")

    def failed(self, reason: str) -> PlanSnapshot:
        held = "no plan" if self.last.plan is None else "the last plan"
        self._outage.failed(reason, held)
        self.last = replace(self.last, stale=True, error=reason)
        return self.last

    def _good(self, snap: PlanSnapshot) -> PlanSnapshot:
        self._outage.recovered()
        self._unknown_said = False
        self.last = snap
        return snap


def _message(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body[:200].decode("utf-8", "replace")


class PlanFollower:
    """The job's latest plan, kept current by a daemon thread.

    ``current()`` is a read of one attribute; callbacks registered with ``on_plan`` get
    each new plan (a plan equal to the last one delivered is not delivered again).
    Without a gateway URL the follower is off: ``current()`` stays None, said once.
    """

    def __init__(
        self,
        job_uuid: str,
        *,
        url: str | None = None,
        token: str | None = None,
        wait_s: float = DEFAULT_WAIT_S,
        timeout_s: float = 5.0,
    ) -> None:
        self.job_uuid = job_uuid
        self.url = url if url is not None else os.environ.get(URL_ENV, "").strip() or None
        self._token = token if token is not None else os.environ.get(TOKEN_ENV)
        self.wait_s = wait_s
        self._resource = PlanResource(self.url or "", self._token, job_uuid)
        self._poller = SyncPoller(self._resource, timeout_s=timeout_s, name="dlrover-plan")
        self._callbacks: list[PlanCallback] = []
        self._lock = threading.Lock()
        self._delivered: JobPlan | None = None
        self._started = False

    @classmethod
    def from_env(
        cls, identity: JobIdentity | None = None, *, wait_s: float = DEFAULT_WAIT_S
    ) -> PlanFollower:
        """The follower of this pod's job (DLROVER_EVENTS_JOB_ID, _GATEWAY_URL, _TOKEN)."""
        ident = identity or JobIdentity.from_env()
        return cls(ident.job.uuid, wait_s=wait_s)

    @property
    def enabled(self) -> bool:
        return bool(self.url)

    def current(self) -> JobPlan | None:
        """The latest plan the gateway gave (kept while it is away), or None."""
        return self._resource.last.plan

    def snapshot(self) -> PlanSnapshot:
        return self._resource.last

    def on_plan(self, callback: PlanCallback) -> None:
        """Call ``callback(plan)`` with each new plan, on the follower's thread.

        A callback registered once a plan is held gets that plan at once, on the calling
        thread, so none misses the plan in force. It must be quick (it delays the next
        poll, not training) and what it raises is logged.
        """
        with self._lock:
            if len(self._callbacks) >= MAX_CALLBACKS:
                raise ValueError(f"at most {MAX_CALLBACKS} plan callbacks")
            self._callbacks.append(callback)
            held = self._delivered
        if held is not None:
            _call(callback, held)

    def start(self) -> Self:
        if self._started:
            return self
        self._started = True
        if not self.enabled:
            log.info("no %s: not following job %s's plans", URL_ENV, self.job_uuid)
            return self
        self._poller.start_watching(self._changed, self.wait_s)
        return self

    def close(self, timeout_s: float = 0.0) -> None:
        """Stop following; the thread ends when its long-poll in flight returns (daemon)."""
        self._poller.stop_watching(timeout_s)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _changed(self, snap: PlanSnapshot) -> None:
        plan = snap.plan
        with self._lock:
            if plan is None or plan == self._delivered:
                return
            self._delivered = plan
            callbacks = list(self._callbacks)
        for callback in callbacks:
            _call(callback, plan)


def _call(callback: PlanCallback, plan: JobPlan) -> None:
    try:
        callback(plan)
    except Exception:
        log.exception("a plan callback (%r) failed; following goes on", callback)


__all__ = ["PlanFollower", "PlanResource", "PlanSnapshot"]
