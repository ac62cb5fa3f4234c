"""The reconciler of one env on its platform: ScalePlans in, pods made to match, results
and node/job events out. A thin adapter around planning.py and events.py, on any platform
that answers the port (handlers.operator.platform.api): Kubernetes and the local platform
alike, in the port's typed views and errors; it imports no platform.

- Watches jobs and pods with the one informer (dlrover_events.runtime.informer): list,
  watch from the list's version, list again when the watch lost events (Expired) and on
  any other failure after a backoff; a list re-derives every event, under the same ids,
  so nothing is lost and nothing duplicated.
- A plan is applied at most once: its id is written on the job object in the same patch
  as its change (a restarted operator finds the change made and only finishes the pods),
  in the env's ledger (scale_plans) and on the status (lastPlanId). A plan delivered
  again after it applied is answered as it was then (status, reason, parts not applied).
- ``applied`` only when every part of the plan was; ``partial`` lists the parts that were
  not (training knobs await the job's own confirmation; see planning.UNSUPPORTED).
- A plan's placement (pods pinned to named nodes) is listed not applied: the cluster's
  scheduler places pods (on the local platform's one host, a placement naming it is what
  happens anyway, and applied). A suspend (a cluster scheduler's preemption) suspends the job:
  its pods are deleted with their grace period (the training checkpoints on SIGTERM) and
  the plan is answered ``applied`` only once they are gone; a plan with a count resumes a
  suspended job (or admits a queued one), answered once its pods are back (created, as
  the platform says). A platform that cannot suspend (``capabilities.suspend`` false) rejects
  a suspend, nothing changed.
- With a cluster scheduler in the env's settings (brain.scheduler, followed live on
  dlrover.control), a new job is suspended before its first pod: queued until a plan
  admits it (planning.admission_change). A job Kueue manages is left to Kueue.
- A job's in-place roles keep the warm spares they ask for (``Platform.keep_spares``, at
  each look at the job); a new pod takes one where the platform has one that fits.
- Where the platform says what its cluster has (a ``CapacitySource``), its hosts are
  watched and the capacity published on the env's cluster.capacity (capacity.py).
- A plan that cannot apply gets a rejected (planning.PlanRejected, raised wherever the
  reason is found) or failed result with the reason; the consumer goes on. Pod
  decisions are re-made from a fresh list each time, never from a cache.
- Under leader election the platform is fenced (platform.FencedPlatform): once the lease
  is lost no write goes out, and a plan caught half-way is left, unanswered and
  uncommitted, to the next leader, whose ledger and the job's applied-plans annotation
  make sure it applies once.

Roles cut out of it, each its own module: waiting for a plan's pods to settle
(settle.py), saying each event once (outbox.py), answering job requests (intake.py),
the plans' ledger (ledger.py) and the capacity report (capacity.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dlrover_events.backoff import Backoff
from dlrover_events.bus.consumer import Consumer, Received
from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import JOB_REQUESTS, SCALE_PLANS
from dlrover_events.envs.control import SettingsFollower
from dlrover_events.envs.env_settings import EnvSettingsError, parse_settings
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.lifecycle import Beside, background, wait_for_any
from dlrover_events.runtime.informer import Informer, away
from dlrover_events.runtime.logs import log_fields
from dlrover_events.runtime.metrics import OperatorMetrics
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from handlers.operator.platform.api import CapacitySource, JobEntry, Platform, WatchKind
from handlers.operator.platform.bodies import JobView, PodView, UnreadableJob
from handlers.operator.platform.errors import (
    Conflict,
    Expired,
    Invalid,
    NotLeader,
    ObjectNotFound,
    PlanRejected,
    PlatformError,
)
from handlers.operator.reconcile import planning
from handlers.operator.reconcile.capacity import CapacityReporter
from handlers.operator.reconcile.events import (
    SOURCE,
    job_events,
    job_meta,
    node_events,
    submitted,
)
from handlers.operator.reconcile.intake import JobIntake, RequestLedger
from handlers.operator.reconcile.ledger import ALREADY_APPLIED, Answer, PlanLedger
from handlers.operator.reconcile.outbox import Outbox
from handlers.operator.reconcile.settle import SETTLE_MARGIN_S, Unsettled, settle
from schemas.control import EnvAnnouncement
from schemas.envelope import Event
from schemas.jobs import JobHeld, JobMeta
from schemas.plans import NotApplied, RescaleMode, ScalePlan, ScaleResult, ScaleStatus
from schemas.requests import JobDeletion, JobRequest

log = logging.getLogger(__name__)

GROUP = "operator"  # the env's operator group, whichever mode: one logical operator
RESUMED = "finished after a restart: the job already had the plan's change"
_RESULT_NAMESPACE = uuid.UUID("0d6f2a8c-5b1e-4c3a-9f7d-2e4b6a8c0e1f")

#: Called at the named points of a plan (after "patched"; after "pods": its pods made,
#: gone for a suspend, back for a resume): how a test stops the operator at an exact
#: point, the way a crash would.
StepHook = Callable[[str, ScalePlan], Awaitable[None]]


@dataclass(frozen=True)
class ApplyResult:
    status: ScaleStatus
    reason: str
    observed: dict[str, dict[str, int]]
    not_applied: tuple[NotApplied, ...] = ()


def answered_again(earlier: Answer, observed: dict[str, dict[str, int]]) -> ApplyResult:
    """A plan that already applied, answered as it was the first time, and saying so."""
    again = earlier.repeated()
    return ApplyResult(again.status, again.reason, observed, again.not_applied)


def accepted(
    reason: str, observed: dict[str, dict[str, int]], not_applied: tuple[NotApplied, ...]
) -> ApplyResult:
    """Applied when every part was, partial (with the parts) when some were not."""
    status = ScaleStatus.PARTIAL if not_applied else ScaleStatus.APPLIED
    return ApplyResult(status, reason, observed, not_applied)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def scheduler_of(stored: dict[str, Any]) -> str | None:
    """The cluster scheduler an env's stored settings name (brain.scheduler), None for
    none; settings that do not read name none (the brain says why)."""
    try:
        brain = parse_settings(stored).brain
    except EnvSettingsError:
        return None
    if brain is False or brain.scheduler is None:
        return None
    return brain.scheduler.name


def _unavailable(error: BaseException) -> str | None:
    """The platform or the network away, in one line (anything else is a bug of ours,
    and its traceback is the why)."""
    if isinstance(error, PlatformError):
        return str(error)
    return away(error)


class EnvReconciler:
    def __init__(
        self,
        settings: Settings,
        env: str,
        dsn: str,
        platform: Platform,
        *,
        resync_s: float = 30.0,
        watch_timeout_s: int = 60,
        retry_s: float = 2.0,
        on_step: StepHook | None = None,
        metrics: OperatorMetrics | None = None,
        capacity: CapacitySource | None = None,
        settle_margin_s: float = SETTLE_MARGIN_S,
    ) -> None:
        self.settings = settings
        #: plans answered by status, and how long from reading each to its result
        self.metrics = metrics
        self.env = env
        self.dsn = dsn
        self.platform = platform
        self.resync_s = resync_s
        self.watch_timeout_s = watch_timeout_s
        self.retry_s = retry_s
        self.on_step = on_step
        self.settle_margin_s = settle_margin_s
        #: what it says (events, results, capacity), each fact once
        self.outbox = Outbox()
        #: the env's cluster scheduler (brain.scheduler), as its settings say now: while
        #: one is named, new jobs are queued (created suspended) for it to admit
        self.scheduler: str | None = None
        #: publishes the platform's capacity (``capacity``: its hosts; None: not counted)
        #: and, with it, what the platform can apply, so the brain plans only that
        self.capacity = CapacityReporter(
            env,
            platform.name.lower(),
            capacity,
            self.outbox.publish_one,
            capabilities=platform.capabilities,
            watch_timeout_s=watch_timeout_s,
            retry_s=retry_s,
        )
        self.ready = asyncio.Event()
        self._jobs: dict[str, JobEntry] = {}
        #: job -> its lock and how many hold or await it: an entry lives only while work
        #: on the job is in flight, so the map does not grow with every job ever seen
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._informers: dict[str, Informer[Any]] = {
            "jobs": self._informer("jobs", self._jobs_listed, self._job_event),
            "pods": self._informer("pods", self._pods_listed, self._pod_event),
        }
        self._ledger: PlanLedger | None = None
        self._intake: JobIntake | None = None

    # -- lifecycle ------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Act on the cluster for this env until ``stop`` is set (or the task is cancelled:
        the supervisor's way of taking the cluster away from a demoted env)."""
        store = await EnvStore.open(self.dsn, self.env, max_size=2)
        try:
            self._ledger = PlanLedger(store.pool)
            self._intake = JobIntake(
                self.env, self.platform, RequestLedger(store.pool), self.outbox.publish_one, SOURCE
            )
            follower = await self._settings_follower()
            consumer = Consumer(
                self.settings, self.env, [SCALE_PLANS, JOB_REQUESTS], GROUP, self._handle
            )
            async with Producer(self.settings) as producer, background() as tasks:
                self.outbox.producer = producer
                for kind, informer in self._informers.items():
                    tasks.start(informer.run(), name=f"{self.env}.operator.{kind}")
                tasks.start(self._worker(), name=f"{self.env}.operator.reconcile")
                if follower is not None:
                    tasks.start(follower.run(stop), name=f"{self.env}.operator.settings")
                if self.capacity is not None:
                    tasks.start(self.capacity.run(), name=f"{self.env}.operator.capacity")
                if not await self._until_synced(tasks, stop):
                    return
                async with consumer:
                    self.ready.set()
                    tasks.start(self._consume(consumer, stop), name="plans")
                    await wait_for_any([stop], tasks)
                    tasks.raise_failure()
        finally:
            await store.close()

    async def _settings_follower(self) -> SettingsFollower | None:
        """The env's settings now (whether a cluster scheduler is named), and a follower
        of their changes; None for an env the registry does not hold."""
        record = await EnvRegistry(self.settings, self.dsn).get(self.env)
        if record is None:
            return None
        self._take_settings(record.settings)
        return SettingsFollower(
            self.settings,
            self.env,
            record.settings_version,
            lambda announced: self._announced(announced),
        )

    def _announced(self, announced: EnvAnnouncement) -> None:
        self._take_settings(announced.settings)

    def _take_settings(self, stored: dict[str, Any]) -> None:
        scheduler = scheduler_of(dict(stored))
        if scheduler == self.scheduler:
            return
        self.scheduler = scheduler
        log.warning(
            "env %s: %s",
            self.env,
            f"cluster scheduler {scheduler}: new jobs are queued until a plan admits them"
            if scheduler
            else "no cluster scheduler: jobs start as submitted",
        )
        self._mark(self._jobs)  # queued jobs are let go when none is named any more

    async def _until_synced(self, tasks: Beside, stop: asyncio.Event) -> bool:
        """Until both watches listed once (True), or ``stop`` (False): no plan is taken on a
        partial view. One of ``tasks`` failing first is raised (an informer that stopped
        before its first list)."""
        synced = [i.synced for i in self._informers.values()]
        while not all(e.is_set() for e in synced):
            running = [t for t in tasks if not t.done()]
            await wait_for_any([stop, *(e for e in synced if not e.is_set())], running)
            tasks.raise_failure()
            if stop.is_set():
                return False
        return True

    async def _consume(self, consumer: Consumer, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await consumer.poll(timeout_ms=500)

    # -- watches --------------------------------------------------------------------------

    def _informer(
        self,
        kind: WatchKind,
        on_list: Callable[[list[Any]], Awaitable[None]],
        on_event: Callable[[str, Any], Awaitable[None]],
    ) -> Informer[Any]:
        """The informer of ``kind`` (jobs, pods) of this env's platform."""

        async def list_() -> tuple[list[Any], str]:
            if kind == "jobs":
                return await self.platform.list_jobs()
            return await self.platform.list_pods()

        def watch(version: str) -> AsyncIterator[tuple[str, Any]]:
            return self.platform.watch(kind, version, self.watch_timeout_s)

        return Informer(
            f"env {self.env}: {kind}",
            list_,
            watch,
            on_list=on_list,
            on_event=on_event,
            backoff=Backoff(initial_s=self.retry_s),
            expired=lambda e: isinstance(e, Expired),
            unavailable=_unavailable,
        )

    async def _jobs_listed(self, items: list[JobEntry]) -> None:
        gone = set(self._jobs) - {i.name for i in items}
        self._jobs = {i.name: i for i in items}
        self._mark([*gone, *self._jobs])

    async def _job_event(self, typ: str, job: JobEntry) -> None:
        if typ == "DELETED":
            self._jobs.pop(job.name, None)
        else:
            self._jobs[job.name] = job
        self._mark([job.name])

    async def _pods_listed(self, pods: list[PodView]) -> None:
        events: list[Event] = []
        for pod in pods:
            events.extend(node_events(self.env, self._meta_of(pod), pod))
        await self._publish(events)
        self._mark({pod.job for pod in pods})

    async def _pod_event(self, typ: str, pod: PodView) -> None:
        if typ != "DELETED":
            await self._publish(node_events(self.env, self._meta_of(pod), pod))
        self._mark([pod.job])

    def _meta_of(self, pod: PodView) -> JobMeta:
        job = self._jobs.get(pod.job)
        if isinstance(job, JobView) and job.uid == pod.job_uid:
            return job_meta(job)
        return JobMeta(uuid=pod.job_uid or pod.job, name=pod.job, namespace=self.platform.namespace)

    # -- reconcile loop -------------------------------------------------------------------

    def _mark(self, names: Iterable[str]) -> None:
        self._dirty.update(names)
        self._wake.set()

    async def _worker(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.resync_s)
            self._wake.clear()
            names, self._dirty = self._dirty or set(self._jobs), set()
            for name in sorted(names):
                try:
                    await self.reconcile(name)
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    # The next watch event or resync tries again; one job never stops others.
                    msg = str(e) if isinstance(e, PlatformError) else repr(e)
                    log.warning("env %s: job %s not reconciled: %s", self.env, name, msg)

    @contextlib.asynccontextmanager
    async def _lock(self, name: str) -> AsyncIterator[None]:
        """One job's work at a time (a plan, a reconcile); the lock goes with its last user."""
        lock, users = self._locks.setdefault(name, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._locks[name]

    async def _pods_of(self, name: str) -> list[PodView]:
        pods, _ = await self.platform.list_pods(name)
        return pods

    async def reconcile(self, name: str) -> None:
        with log_fields(job=name):  # its lines ("created pod ...") say which job
            await self._reconcile(name)

    async def _reconcile(self, name: str) -> None:
        async with self._lock(name):
            job = await self.platform.get_job(name)
            if job is None:
                await self._clean_up(name)
                return
            if isinstance(job, UnreadableJob):
                log.warning("env %s: job %s is invalid: %s", self.env, name, job.reason)
                return
            await self._publish([submitted(self.env, job)])
            await self._converge(job)

    async def _clean_up(self, name: str) -> None:
        """A deleted job's pods go too (a cluster's garbage collector would do it through
        the owner reference; this does not wait for one), and what the platform made for
        them. Only pods this operator made: another controller's pods (a PyTorchJob's)
        are that controller's to delete."""
        if not self.platform.creates_pods:
            return
        going = [pod for pod in await self._pods_of(name) if not pod.deleting]
        await self._delete_pods([(pod.name, None) for pod in going])
        await self.platform.release(name)

    async def _converge(self, job: JobView, *, last_plan: str | None = None) -> list[PodView]:
        """Pods made to match the job, status and job events updated; returns the pods."""
        pods = await self._pods_of(job.name)
        if self.platform.capabilities.suspend:
            admission = planning.admission_change(job, pods, self.scheduler)
            if admission is not None and admission.admission is not None:
                job = await self.platform.change_job(job, admission)
                log.info(
                    "env %s: job %s %s: %s",
                    self.env,
                    job.name,
                    admission.admission.state,
                    admission.admission.message,
                )
        creates = self.platform.creates_pods
        actions = planning.diff(job, pods) if creates else planning.Actions()
        if creates and planning.outcome(job, pods)[0] is None:
            await self.platform.prepare(job)
        for new in actions.create:
            if await self.platform.create_pod(job, new, self.env):
                log.info("env %s: created pod %s", self.env, new.name(job.name))
        named = {p.name: p for p in pods}
        await self._delete_pods(
            [
                (name, planning.grace_seconds(job, named[name]) if name in named else None)
                for name in actions.delete
            ]
        )
        if actions:
            pods = await self._pods_of(job.name)
        if creates:
            await self.platform.keep_spares(job, pods, self.env)
        now = _now()
        status = planning.job_status(
            job, pods, last_plan=last_plan, last_plan_time=now if last_plan else None, now=now
        )
        if status is not None:
            with contextlib.suppress(ObjectNotFound):  # deleted meanwhile: its pods go next
                await self.platform.set_status(job, status)
        await self._publish(job_events(self.env, job, pods, self.platform.outcome(job, pods)))
        return pods

    async def _delete_pods(self, pods: list[tuple[str, int | None]]) -> None:
        """Delete the pods (name, grace) together: one after another, a plan's leavers get
        their SIGTERM an API call apart each, and an in-place job's survivors see them leave
        over as many of their step boundaries. Every delete is tried; the first error is
        then raised (the plan's batch is tried again, and a delete done is done)."""
        done = await asyncio.gather(
            *(self.platform.delete_pod(name, grace) for name, grace in pods),
            return_exceptions=True,
        )
        for (name, grace), deleted in zip(pods, done, strict=True):
            if deleted is True:
                log.info("env %s: deleted pod %s (grace %s s)", self.env, name, grace)
        for error in done:
            if isinstance(error, BaseException):
                raise error

    # -- plans ----------------------------------------------------------------------------

    async def _handle(self, batch: list[Received]) -> None:
        """Each job's plans in order, the jobs side by side: a suspend waits for its pods
        to be gone (their grace period), and must not hold up another job's plans. The
        job requests and deletions (intake.py) in the order read, beside them."""
        read_at = time.monotonic()
        by_job: dict[str, list[ScalePlan]] = {}
        asked: list[JobRequest | JobDeletion] = []
        for item in batch:
            if isinstance(item.event, ScalePlan):
                by_job.setdefault(item.event.job.uuid, []).append(item.event)
            elif isinstance(item.event, JobRequest | JobDeletion):
                asked.append(item.event)

        async def in_order(plans: list[ScalePlan]) -> None:
            for plan in plans:
                await self._answer(plan, read_at)

        work = [in_order(plans) for plans in by_job.values()]
        if asked:
            assert self._intake is not None
            work.append(self._intake.answer_all(asked))
        done = await asyncio.gather(*work, return_exceptions=True)
        lost = [e for e in done if isinstance(e, NotLeader)]
        if lost:
            # Neither answered nor dead-lettered: this replica's reconciler is being
            # stopped, and the new leader's consumer gets the plans again.
            log.warning("env %s: plans and requests left to the leader (%s)", self.env, lost[0])
            await asyncio.Future()  # parked until the operator cancels us
        for error in done:
            if isinstance(error, BaseException):
                raise error

    async def _answer(self, plan: ScalePlan, read_at: float) -> None:
        """Apply the plan once (or answer it as the first time), then publish its result;
        ``read_at``: when its batch was read (monotonic), for the apply latency."""
        with log_fields(job=plan.job.name or plan.job.uuid, plan_id=plan.plan_id):
            await self._answer_plan(plan, read_at)

    async def _answer_plan(self, plan: ScalePlan, read_at: float) -> None:
        assert self._ledger is not None
        earlier = await self._ledger.answer(plan.plan_id)
        if earlier is not None:
            outcome = answered_again(earlier, await self._observed(plan))
        else:
            try:
                outcome = await self._apply(plan)
            except (asyncio.CancelledError, PlatformError, OSError):
                # the platform, the network, or the lease lost (NotLeader): the consumer
                # (or the next leader's) tries the batch again; the ledger keeps no answer
                raise
            except Exception as e:
                log.exception("env %s: plan %s", self.env, plan.plan_id)
                outcome = ApplyResult(ScaleStatus.FAILED, f"operator error: {e!r}", {})
            if not await self._ledger.record(
                plan, outcome.status, outcome.reason, outcome.not_applied
            ):
                # another delivery recorded it first: answer as that one was answered
                earlier = await self._ledger.answer(plan.plan_id)
                outcome = (
                    answered_again(earlier, outcome.observed)
                    if earlier is not None
                    else ApplyResult(ScaleStatus.APPLIED, ALREADY_APPLIED, outcome.observed)
                )
        log.info(
            "env %s: plan %s of job %s %s: %s",
            self.env,
            plan.plan_id,
            plan.job.name or plan.job.uuid,
            outcome.status.value,
            outcome.reason,
        )
        mode = None
        if outcome.status in (ScaleStatus.APPLIED, ScaleStatus.PARTIAL):
            mode = await self._rescale_mode(plan)
        held: list[Event] = []
        if plan.hold is not None and outcome.status is ScaleStatus.APPLIED:
            # what a cluster scheduler reads to free a held job's GPUs in its view, and to
            # admit it again once released
            held.append(
                JobHeld(
                    env=self.env,
                    job=plan.job,
                    source=SOURCE,
                    event_id=uuid.uuid5(_RESULT_NAMESPACE, f"{self.env}/{plan.plan_id}/held"),
                    held=plan.hold,
                    plan_id=plan.plan_id,
                    reason=outcome.reason[:1024],
                )
            )
        await self._publish(
            [
                *held,
                ScaleResult(
                    env=self.env,
                    job=plan.job,
                    source=SOURCE,
                    # The same delivery answered the same way keeps its id.
                    event_id=uuid.uuid5(
                        _RESULT_NAMESPACE,
                        f"{self.env}/{plan.event_id}/{outcome.status.value}/{outcome.reason}",
                    ),
                    plan_id=plan.plan_id,
                    status=outcome.status,
                    reason=outcome.reason,
                    observed=outcome.observed,
                    not_applied=list(outcome.not_applied),
                    rescale_mode=mode,
                ),
            ],
            dedupe=False,
        )
        if self.metrics is not None:
            self.metrics.answered(outcome.status.value, time.monotonic() - read_at)

    async def _rescale_mode(self, plan: ScalePlan) -> RescaleMode | None:
        """How the job's processes take the plan (its roles' elastic mode), None when it
        resizes no elastic role or the job is gone."""
        try:
            job = await self._find(plan)
        except PlanRejected:
            return None
        return planning.rescale_mode(job, plan)

    async def _observed(self, plan: ScalePlan) -> dict[str, dict[str, int]]:
        try:
            job = await self._find(plan)
        except PlanRejected:
            return {}
        return planning.counts(job, await self._pods_of(job.name))

    async def _find(self, plan: ScalePlan) -> JobView:
        """The job the plan is for; PlanRejected says why there is none."""
        meta = plan.job
        namespace = self.platform.namespace
        if meta.namespace != namespace and meta.name:
            raise PlanRejected(
                f"job {meta.name} is in namespace {meta.namespace}; this operator serves "
                f"namespace {namespace}"
            )
        name = meta.name or next((n for n, j in self._jobs.items() if j.uid == meta.uuid), "")
        job = await self.platform.get_job(name) if name else None
        if job is None:
            who = meta.name or meta.uuid
            raise PlanRejected(
                f"job {who} not found in namespace {namespace}: deleted or never submitted"
            )
        if isinstance(job, UnreadableJob):
            raise PlanRejected(f"job {name} is invalid: {job.reason}")
        if job.uid != meta.uuid:
            raise PlanRejected(
                f"job {name} was deleted: the plan is for uid {meta.uuid}, the job of that "
                f"name now is uid {job.uid}"
            )
        return job

    async def _apply(self, plan: ScalePlan) -> ApplyResult:
        if plan.suspend and not self.platform.capabilities.suspend:
            # this platform cannot hold a job's place while its pods are gone
            reason = planning.cannot_suspend(self.platform.name)
            return ApplyResult(ScaleStatus.REJECTED, reason, {})
        try:
            job = await self._find(plan)
        except PlanRejected as e:
            return ApplyResult(ScaleStatus.REJECTED, str(e), {})
        changed = await self._change(plan, job)
        if isinstance(changed, ApplyResult):
            return changed
        job, reason, left_out, pods = changed
        # Outside the job's lock: its pods go (or come) in their own time, and the
        # reconcile loop must not wait for them meanwhile.
        settled = await self._settle(plan, job, pods)
        if isinstance(settled, ApplyResult):
            return settled
        await self._step("pods", plan)
        return accepted(reason, planning.counts(job, settled), left_out)

    async def _change(
        self, plan: ScalePlan, job: JobView
    ) -> ApplyResult | tuple[JobView, str, tuple[NotApplied, ...], list[PodView]]:
        """The plan's change of the job, written once, and its pods made to match: the
        job, the result's reason, the parts not applied and the pods; or the answer
        when the plan cannot apply."""
        async with self._lock(job.name):
            reason = RESUMED
            # what no change of the job applies; the same if the change was made before
            left_out = self.platform.not_applied(plan)
            for _ in range(10):
                if plan.plan_id in job.applied_plans:
                    break
                pods = await self._pods_of(job.name)
                try:
                    planned = self.platform.plan_change(job, pods, plan)
                except PlanRejected as e:
                    return ApplyResult(ScaleStatus.REJECTED, str(e), planning.counts(job, pods))
                try:
                    job = await self.platform.change_job(job, planned.change)
                except Conflict:  # changed meanwhile: decide again on what it is now
                    got = await self.platform.get_job(job.name)
                    if got is None:
                        return ApplyResult(ScaleStatus.REJECTED, f"job {job.name} was deleted", {})
                    if isinstance(got, UnreadableJob):
                        reason = f"job {job.name} is invalid: {got.reason}"
                        return ApplyResult(ScaleStatus.REJECTED, reason, {})
                    job = got
                    continue
                except ObjectNotFound:
                    return ApplyResult(ScaleStatus.REJECTED, f"job {job.name} was deleted", {})
                except Invalid as e:
                    return ApplyResult(ScaleStatus.REJECTED, str(e), {})
                reason = "; ".join([planned.summary, *planned.notes])
                break
            else:
                return ApplyResult(ScaleStatus.FAILED, "the job kept changing under the plan", {})
            await self._step("patched", plan)
            try:
                pods = await self._converge(job, last_plan=plan.plan_id)
            except Invalid as e:  # quota, admission, invalid pod
                return ApplyResult(ScaleStatus.FAILED, f"pods: {e}", {})
            return job, reason, left_out, pods

    async def _settle(
        self, plan: ScalePlan, job: JobView, pods: list[PodView]
    ) -> ApplyResult | list[PodView]:
        """The pods once they are as the plan wants them (settle.py: a suspended job's gone,
        a resumed one's back); failed, naming the pods, when they are not in time. A
        platform that cannot suspend has nothing to wait for."""
        if not self.platform.capabilities.suspend:
            return pods
        settled = await settle(plan, job, pods, self._pods_of, margin_s=self.settle_margin_s)
        if isinstance(settled, Unsettled):
            counts = planning.counts(job, settled.pods)
            return ApplyResult(ScaleStatus.FAILED, settled.reason, counts)
        return settled

    async def _step(self, name: str, plan: ScalePlan) -> None:
        if self.on_step is not None:
            await self.on_step(name, plan)

    # -- output ---------------------------------------------------------------------------

    async def _publish(self, events: Iterable[Event], *, dedupe: bool = True) -> None:
        await self.outbox.publish(events, dedupe=dedupe)


__all__ = [
    "ALREADY_APPLIED",
    "GROUP",
    "RESUMED",
    "SETTLE_MARGIN_S",
    "ApplyResult",
    "EnvReconciler",
    "StepHook",
    "accepted",
    "answered_again",
    "scheduler_of",
]
