"""One gateway instance's view of every job's latest plan, kept from the bus, in bounded
memory: at most ``max_jobs`` jobs (finished ones evicted first, then the longest idle)
and at most ``max_waiters`` requests waiting on it (long-polls and optimize requests).

Requests read only this: an answer per job, serialised once per change, and a wake-up
per job so a long-poll returns as soon as its job's plan changes, not on every event.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator

from dlrover_events.lifecycle import Stopping
from handlers.gateway.plans import JobPlans, PlanAnswer, fold, render
from schemas.jobs import JobEvent
from schemas.plans import OptimizePlan

MAX_JOBS = 20_000
MAX_WAITERS = 10_000


class Busy(Exception):
    """Too many requests are waiting already; the caller should answer 503."""


class _Tick:
    """Set once when a job's view changes; shared by that job's waiters."""

    __slots__ = ("event", "waiters")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.waiters = 0


class PlanBook:
    def __init__(self, env: str, *, max_jobs: int = MAX_JOBS, max_waiters: int = MAX_WAITERS):
        if max_jobs < 1 or max_waiters < 0:
            raise ValueError("max_jobs must be at least 1 and max_waiters at least 0")
        self.env = env
        self.max_jobs = max_jobs
        self.max_waiters = max_waiters
        self.ready = asyncio.Event()
        self.waiting = 0
        self.applied = 0
        self.evicted = 0
        self.rejected = 0
        #: oldest change first; a job leaves ``_active`` for ``_finished`` when it ends
        self._active: OrderedDict[str, JobPlans] = OrderedDict()
        self._finished: OrderedDict[str, JobPlans] = OrderedDict()
        self._answers: dict[str, PlanAnswer] = {}
        self._ticks: dict[str, _Tick] = {}
        self._pending: dict[str, asyncio.Future[OptimizePlan]] = {}
        #: set by ``close``: waiters are answered at once
        self.closing = False

    def __len__(self) -> int:
        return len(self._active) + len(self._finished)

    def view(self, job: str) -> JobPlans | None:
        return self._active.get(job) or self._finished.get(job)

    def apply(self, events: Iterable[JobEvent]) -> int:
        """Fold a batch of events in the order read; wakes each changed job's waiters
        once. Returns how many events changed a view."""
        changed: set[str] = set()
        count = 0
        for event in events:
            if isinstance(event, OptimizePlan) and event.caused_by is not None:
                self._answer_request(event)
            job = event.job.uuid
            before = self.view(job)
            after = fold(before, event)
            if after is None or after == before:
                continue
            self._store(job, after)
            changed.add(job)
            count += 1
        self.applied += count
        self._evict()
        for job in changed:
            self._answers.pop(job, None)
            self._wake(job)
        return count

    def answer(self, job: str) -> PlanAnswer | None:
        found = self._answers.get(job)
        if found is not None:
            return found
        view = self.view(job)
        if view is None:
            return None
        found = self._answers[job] = render(view)
        return found

    def close(self) -> None:
        """The gateway stops: plan long-polls are answered now with the job's answer as it
        is, and optimize requests still waiting for their plan end with ``Stopping`` (the
        request stays published; the brain may answer it, and the job's plan shows it),
        so that the HTTP server's shutdown does not sit out their waits."""
        self.closing = True
        for job in list(self._ticks):
            self._wake(job)
        for request_id, future in list(self._pending.items()):
            if not future.done():
                future.set_exception(Stopping(f"the gateway stopped before {request_id}'s plan"))

    @contextlib.contextmanager
    def admit(self) -> Iterator[None]:
        """A place among the waiters, or Busy."""
        if self.waiting >= self.max_waiters:
            raise Busy(f"{self.waiting} requests are waiting already (at most {self.max_waiters})")
        self.waiting += 1
        try:
            yield
        finally:
            self.waiting -= 1

    async def wait_for_change(
        self, job: str, seen: Collection[str], wait_s: float
    ) -> PlanAnswer | None:
        """The job's answer once its tag is not in ``seen`` (None: the job was evicted),
        or the same answer after ``wait_s`` or once the gateway is closing. Call within
        ``admit``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            current = self.answer(job)
            remaining = deadline - loop.time()
            if current is None or current.etag not in seen or remaining <= 0 or self.closing:
                return current
            tick = self._ticks.get(job)
            if tick is None:
                tick = self._ticks[job] = _Tick()
            tick.waiters += 1
            try:
                await asyncio.wait_for(tick.event.wait(), remaining)
            except TimeoutError:
                return self.answer(job)
            finally:
                tick.waiters -= 1
                if tick.waiters == 0 and self._ticks.get(job) is tick:
                    del self._ticks[job]

    def expect(self, request_id: str) -> asyncio.Future[OptimizePlan]:
        """A future for the OptimizePlan caused by ``request_id``: register it before
        publishing the request, so a fast answer cannot be missed (``Stopping`` once the
        gateway is closing). Call within ``admit`` and ``forget`` it after."""
        if self.closing:
            raise Stopping("the gateway is stopping")
        future: asyncio.Future[OptimizePlan] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        return future

    def forget(self, request_id: str) -> None:
        self._pending.pop(request_id, None)

    def _answer_request(self, plan: OptimizePlan) -> None:
        assert plan.caused_by is not None
        future = self._pending.pop(plan.caused_by, None)
        if future is not None and not future.done():
            future.set_result(plan)

    def _store(self, job: str, view: JobPlans) -> None:
        self._active.pop(job, None)
        self._finished.pop(job, None)
        (self._finished if view.finished else self._active)[job] = view

    def _evict(self) -> None:
        while len(self) > self.max_jobs:
            oldest = self._finished if self._finished else self._active
            job, _ = oldest.popitem(last=False)
            self._answers.pop(job, None)
            self._wake(job)
            self.evicted += 1

    def _wake(self, job: str) -> None:
        tick = self._ticks.pop(job, None)
        if tick is not None:
            tick.event.set()
