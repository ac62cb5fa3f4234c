"""The platform conformance suite: what every platform of handlers.operator.platform.api
keeps, checked through the port's public calls only, as the reconciler and the `job` doors
make them.

The model is Optuna's ``StorageTestCase`` (one class run over every storage, open to
storages outside the repository) and torch elastic's out-of-tree rendezvous tests: a
platform proves it keeps the contract by subclassing ``PlatformConformance`` and giving it
its fixtures; the reconciler, which cannot tell the platforms apart, then works on it.

    class TestMyPlatform(PlatformConformance):
        @pytest.fixture
        async def platform(self, tmp_path) -> AsyncIterator[Platform]:
            ...  # started, with no jobs, its pods run (a kubelet played where none runs)

        @pytest.fixture
        def hosts(self) -> Hosts | None:
            return Hosts({"host-a": 8})  # what its capacity lists; None: not a CapacitySource

Where a platform legitimately lacks something, it says so in a class attribute of its
subclass (``watch_resumes``, ``stale_writes_conflict``, ``keeps_status``), or the port's
own declarations say it (``capabilities``, ``creates_pods``), and the suite checks that it
behaves as declared instead: no check is skipped. What each check covers is its docstring; a failure
says which part of the contract broke, with what was seen.

Runs: tests/integration/local/test_local_conformance.py (processes on this machine),
tests/integration/k8s/test_kube_conformance.py (the test kube-apiserver, its kubelet played
by the test), tests/integration/k8s/test_pytorchjob_conformance.py (Kubernetes on Kubeflow's
PyTorchJobs, the training-operator played too); tests/integration/local/
test_broken_platforms.py shows the suite failing on platforms broken on purpose.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import pytest

from handlers.operator.platform.api import JobEntry, Platform, WatchEvent, WatchKind
from handlers.operator.platform.bodies import (
    ADMITTED,
    RUNNING,
    SUSPENDED,
    Bookmark,
    Host,
    JobAdmission,
    JobCondition,
    JobSpecChange,
    JobView,
    NewPod,
    OperatorJobStatus,
    PlatformCapabilities,
    PodView,
    Resources,
    pod_name,
)
from handlers.operator.platform.errors import (
    Conflict,
    Expired,
    Invalid,
    NotLeader,
    ObjectNotFound,
)
from handlers.operator.platform.fencing import FencedPlatform

#: Generous: a loaded 2-core machine slows everything; no check depends on how long
#: anything took, only on it happening at all.
DEADLINE_S = 120.0
#: A watch's own timeout here: short, so that a watch ending at it (and being watched
#: again) is part of every run.
WATCH_TIMEOUT_S = 3
#: A cancelled watch ends within this: far less than its own timeout (the informer's
#: stop cancels it), and a lot for what it has to do (close a connection at most).
CANCEL_S = 10.0
GiB = 2**30
#: The env a pod is told it runs in.
ENV = "conformance"
WORKER = "worker"
#: A pod's resources as the suite asks for them.
POD_RESOURCES = Resources(cpu_milli=500, memory=GiB)


def unique(prefix: str) -> str:
    """A job name of this run alone (a DNS label): platforms may be shared by runs."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class Hosts:
    """What a platform's capacity (its ``CapacitySource``) says during a run."""

    #: the schedulable hosts it lists, by name, and their GPUs
    listed: Mapping[str, int]
    #: makes one listed host unschedulable (a Node cordoned) and gives its name; None: its
    #: hosts do not change while it runs (the local platform's slots are a setting), and
    #: the suite checks that a watch of them says nothing new
    cordon: Callable[[], Awaitable[str]] | None = None


def _version(obj: object) -> str:
    return str(getattr(obj, "resource_version", "") or "")


def _named(obj: object) -> str:
    return str(getattr(obj, "name", ""))


class Watching:
    """A watch followed in the background as the reconciler's informer follows one: watched
    again from the last version seen each time it ends at its timeout. What it yields is
    kept in order; an error it raises (Expired) is raised to whoever waits on it."""

    def __init__(self, platform: Platform, kind: WatchKind, version: str) -> None:
        self.platform = platform
        self.kind = kind
        self.version = version
        self.events: list[WatchEvent] = []
        self._news = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Watching:
        self._task = asyncio.create_task(self._follow())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        if not await ended_when_cancelled(self._task):
            pytest.fail(f"a {self.kind} watch went on after it was cancelled")

    async def _follow(self) -> None:
        try:
            while True:
                watch = self.platform.watch(self.kind, self.version, WATCH_TIMEOUT_S)
                async with contextlib.aclosing(watch) as events:
                    async for event in events:
                        self.events.append(event)
                        self.version = _version(event[1]) or self.version
                        self._news.set()
        finally:
            self._news.set()

    async def until(self, what: str, found: Callable[[WatchEvent], bool]) -> WatchEvent:
        """The first event (from the watch's start) that ``found`` accepts; fails naming
        ``what`` and listing what the watch yielded when none comes in time."""
        assert self._task is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE_S
        while True:
            for event in self.events:
                if found(event):
                    return event
            if self._task.done():
                self._task.result()  # its error, as the platform raised it
                pytest.fail(f"the {self.kind} watch ended before {what}")
            left = deadline - loop.time()
            if left <= 0:
                seen = [(typ, _named(obj), _version(obj)) for typ, obj in self.events]
                pytest.fail(
                    f"the {self.kind} watch did not show {what} in {DEADLINE_S:.0f}s; it "
                    f"showed: {seen}"
                )
            self._news.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._news.wait(), left)


async def ended_when_cancelled(task: asyncio.Task[Any]) -> bool:
    """Cancel ``task``; whether it ended within CANCEL_S (a watch that lost the
    cancellation is cancelled again until it ends, so that none outlives its test)."""
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=CANCEL_S)
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=1)
    if not task.cancelled():
        task.exception()  # retrieved: what a cancelled watch raised is no news here
    return bool(done)


async def until(what: str, check: Callable[[], Awaitable[Any]]) -> Any:
    """``check()`` once it gives something truthy; fails naming ``what`` at the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    last: Any = None
    while loop.time() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(0.1)
    pytest.fail(f"no {what} within {DEADLINE_S:.0f}s (last seen: {last!r})")


async def watch_once(platform: Platform, kind: WatchKind, version: str) -> list[WatchEvent]:
    """Everything one watch yields until it ends at its timeout (bounded: a watch that
    never ends fails)."""
    events: list[WatchEvent] = []
    try:
        async with asyncio.timeout(DEADLINE_S):
            async with contextlib.aclosing(platform.watch(kind, version, 1)) as watch:
                async for event in watch:
                    events.append(event)
    except TimeoutError:
        pytest.fail(f"a {kind} watch with a timeout of 1 s did not end in {DEADLINE_S:.0f}s")
    return events


async def watch_hosts_once(source: Any, version: str) -> list[tuple[str, Host | Bookmark]]:
    """Everything one watch of hosts yields until it ends at its timeout (bounded)."""
    try:
        async with asyncio.timeout(DEADLINE_S):
            return [event async for event in source.watch_hosts(version, 1)]
    except TimeoutError:
        pytest.fail(f"a watch of hosts with a timeout of 1 s did not end in {DEADLINE_S:.0f}s")


def _shows(job: JobView) -> Callable[[WatchEvent], bool]:
    """Whether an event shows ``job`` at the version it was read at."""
    return lambda e: _named(e[1]) == job.name and _version(e[1]) == job.resource_version


async def _until_unschedulable(source: Any, version: str, host: str) -> None:
    """Watch the hosts of ``source`` (again at each timeout) until ``host`` is shown
    unschedulable."""
    while True:
        async with contextlib.aclosing(source.watch_hosts(version, WATCH_TIMEOUT_S)) as changes:
            async for _, obj in changes:
                version = _version(obj) or version
                if isinstance(obj, Host) and obj.name == host and not obj.schedulable:
                    return


def _job(entry: JobEntry | None) -> JobView:
    assert isinstance(entry, JobView), f"expected a readable job, got {entry!r}"
    return entry


class PlatformConformance:
    """The contract of ``Platform`` (and ``CapacitySource``), one check per test.

    A subclass gives the fixture ``platform``: the platform under test, started, on a
    namespace (or root) of its own with no jobs, whose pods come to run by themselves (a
    kubelet played by the test where none runs). It may give ``hosts`` (what its capacity
    lists; the default says it is not a CapacitySource) and override ``document`` (a job
    of its kind that its pods can run).
    """

    # -- what the platform declares -------------------------------------------------------

    #: A watch goes on from the version a list (or an earlier watch) gave: it yields only
    #: what changed after it. False: versions mean nothing to its watch, which starts with
    #: every current object (MODIFIED) whatever version it is given, so nothing is lost
    #: either way (the local platform).
    watch_resumes: ClassVar[bool] = True
    #: The oldest version a watch can be given.
    old_version: ClassVar[str] = "1"
    #: The watches ("jobs", "pods", "hosts") whose ``old_version`` the platform has let go
    #: by the time a check runs: a watch of it is Expired (the caller lists again). Any
    #: other watch from ``old_version`` must lose nothing instead: it shows every object
    #: there is now (the events since, or the objects as they are).
    expires: ClassVar[frozenset[str]] = frozenset({"jobs", "pods", "hosts"})
    #: A change written on a job read at an older version is refused (Conflict). False:
    #: the platform has no versions to compare, and the last change wins.
    stale_writes_conflict: ClassVar[bool] = True
    #: ``set_status`` is kept on the job and read back. False: the job's own controller
    #: keeps its status, and ``set_status`` changes nothing.
    keeps_status: ClassVar[bool] = True

    # -- fixtures a subclass gives --------------------------------------------------------

    @pytest.fixture
    def platform(self) -> Platform:
        pytest.fail(f"{type(self).__name__} must give the fixture `platform`")

    @pytest.fixture
    def hosts(self) -> Hosts | None:
        """What its capacity lists; None: the platform is no CapacitySource."""
        return None

    def document(self, name: str, replicas: int = 2, **spec: Any) -> dict[str, Any]:
        """A job of the platform's kind: one role, ``worker``, whose pods would sleep (a
        container with an image, for a cluster, and a command, for this machine)."""
        worker = {
            "replicas": replicas,
            "minReplicas": 1,
            "maxReplicas": 4,
            "resources": {"cpu": 1, "memory": "1Gi"},
            "restartPolicy": "Never",
            "template": {
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.example.com/conformance:1.0",
                            "command": [sys.executable, "-c", "import time; time.sleep(600)"],
                        }
                    ],
                }
            },
        }
        return {
            "apiVersion": "dlrover-events.io/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": name},
            "spec": {"roles": {WORKER: worker}, **spec},
        }

    def broken_document(self, breaks: str) -> dict[str, Any]:
        """A job of the platform's kind that it must refuse, broken as ``breaks`` says:
        ``min-over-max`` (the worker role's minReplicas 3 over its maxReplicas 1),
        ``no-roles``, ``name-not-a-label``. A platform that overrides ``document``
        overrides this too."""
        document = self.document(unique("bad"))
        if breaks == "min-over-max":
            document["spec"]["roles"][WORKER].update(minReplicas=3, maxReplicas=1)
        elif breaks == "no-roles":
            document["spec"]["roles"] = {}
        else:
            document["metadata"]["name"] = f"Not_A_Label_{uuid.uuid4().hex[:6]}"
        return document

    async def submit(self, platform: Platform, prefix: str = "job", **spec: Any) -> JobView:
        return await platform.submit_job(self.document(unique(prefix), **spec))

    # -- the port's own declarations ------------------------------------------------------

    async def test_it_says_what_it_is(self, platform: Platform) -> None:
        """The attributes the reconciler reads before it calls anything, and capabilities
        that agree with them: the brain plans by the capabilities and the reconciler acts by
        them (a suspend, a migration), so a platform that says one thing in each gets plans
        it rejects."""
        assert isinstance(platform.name, str) and platform.name
        assert isinstance(platform.namespace, str) and platform.namespace
        assert isinstance(platform.creates_pods, bool)
        can = platform.capabilities
        assert isinstance(can, PlatformCapabilities), can
        assert platform.creates_pods or not can.migrates_nodes, (
            "it migrates nodes, but another controller creates its pods"
        )

    # -- create, get, list ----------------------------------------------------------------

    async def test_a_submitted_job_is_got_and_listed(self, platform: Platform) -> None:
        """A submission reads back as its document said, by name and in the list, at the
        version the submission answered; a name never used is None."""
        job = await self.submit(platform)
        assert job.uid and job.resource_version, job
        assert job.namespace == platform.namespace
        role = job.roles[WORKER]
        assert (role.replicas, role.min_replicas, role.max_replicas) == (2, 1, 4)
        assert role.resources == Resources(cpu_milli=1000, memory=GiB)
        assert not job.suspended and job.applied_plans == ()

        got = _job(await platform.get_job(job.name))
        assert (got.uid, got.resource_version, got.roles) == (
            job.uid,
            job.resource_version,
            job.roles,
        )
        listed, version = await platform.list_jobs()
        assert isinstance(version, str)
        assert [e.uid for e in listed if e.name == job.name] == [job.uid]
        assert await platform.get_job(unique("never")) is None

    async def test_a_taken_name_is_a_conflict(self, platform: Platform) -> None:
        """A second job of a name is refused, and the first is left as it was."""
        job = await self.submit(platform)
        with pytest.raises(Conflict):
            await platform.submit_job(self.document(job.name, replicas=3))
        got = _job(await platform.get_job(job.name))
        assert (got.uid, got.roles[WORKER].replicas) == (job.uid, 2)

    @pytest.mark.parametrize(
        "breaks",
        ["min-over-max", "no-roles", "name-not-a-label"],
    )
    async def test_a_document_it_refuses_is_invalid_and_not_kept(
        self, platform: Platform, breaks: str
    ) -> None:
        """A job the decisions could not read (min over max, no roles) or the platform
        cannot name is refused with Invalid, and nothing of it is kept: a refusal made
        after storing it would leave a job no one submitted."""
        document = self.broken_document(breaks)
        name = document["metadata"]["name"]
        with pytest.raises(Invalid):
            await platform.submit_job(document)
        listed, _ = await platform.list_jobs()
        assert name not in [e.name for e in listed]

    # -- change and status ----------------------------------------------------------------

    async def test_a_change_is_written_whole_and_read_back(self, platform: Platform) -> None:
        """Every part of a JobSpecChange lands in one write: replicas, a role's and a
        node's resources, the ranks removed first and the plans applied; the job's version
        and generation move on.

        Where another controller makes the pods (``creates_pods`` False), one template per
        role and removing the highest indexes itself, the ranks removed first are not
        kept (they would say what no one does); where no node can have resources of its
        own (``capabilities.migrates_nodes`` False), a change that gives one some is
        refused (Invalid) and changes nothing, rather than kept and never honoured."""
        job = await self.submit(platform)
        change = JobSpecChange(
            resource_version=job.resource_version,
            applied_plans=("conformance-1",),
            replicas={WORKER: 3},
            resources={WORKER: Resources(cpu_milli=1500, memory=2 * GiB)},
            node_resources={WORKER: {1: Resources(cpu_milli=2000, memory=4 * GiB)}},
            remove_first={WORKER: (1,)},
        )
        if not platform.capabilities.migrates_nodes:
            with pytest.raises(Invalid):
                await platform.change_job(job, change)
            got = _job(await platform.get_job(job.name))
            assert (got.resource_version, got.roles) == (job.resource_version, job.roles)
            change = replace(change, node_resources={})
        changed = await platform.change_job(job, change)
        kept_removals = change.remove_first if platform.creates_pods else {}
        for view in (changed, _job(await platform.get_job(job.name))):
            assert view.uid == job.uid
            assert view.roles[WORKER].replicas == 3
            assert view.roles[WORKER].resources == Resources(cpu_milli=1500, memory=2 * GiB)
            assert view.node_resources == change.node_resources
            assert view.remove_first == kept_removals
            assert view.applied_plans == ("conformance-1",)
            assert view.resource_version != job.resource_version
            assert view.generation > job.generation
        assert changed.resource_version == _version(await platform.get_job(job.name))

    async def test_a_change_on_a_stale_version(self, platform: Platform) -> None:
        """Two changes decided on the same read: the second is refused (Conflict) and the
        first stays, so a plan is never applied on top of one it did not see. Declared
        otherwise (no versions), the last change wins."""
        job = await self.submit(platform)
        first = JobSpecChange(job.resource_version, ("first",), replicas={WORKER: 3})
        second = JobSpecChange(job.resource_version, ("second",), replicas={WORKER: 1})
        await platform.change_job(job, first)
        if self.stale_writes_conflict:
            with pytest.raises(Conflict):
                await platform.change_job(job, second)
            expected = (3, ("first",))
        else:
            await platform.change_job(job, second)
            expected = (1, ("second",))
        got = _job(await platform.get_job(job.name))
        assert (got.roles[WORKER].replicas, got.applied_plans) == expected

    async def test_a_status_is_said_on_the_job(self, platform: Platform) -> None:
        """What the operator says of a job reads back whole, and leaves its spec alone.
        Declared otherwise (its own controller's status), it changes nothing."""
        job = await self.submit(platform)
        status = OperatorJobStatus(
            phase=RUNNING,
            roles={WORKER: {"pending": 0, "running": 2, "succeeded": 0, "failed": 0}},
            observed_generation=job.generation,
            last_plan_id="conformance-1",
            last_plan_time="2026-01-01T00:00:00Z",
            suspended=JobCondition(
                "Suspended", False, "Admitted", "admitted by the suite", "2026-01-01T00:00:00Z"
            ),
        )
        await platform.set_status(job, status)
        got = _job(await platform.get_job(job.name))
        if self.keeps_status:
            assert got.status == status
            assert (got.phase, got.last_plan_id) == (RUNNING, "conformance-1")
        else:
            assert got.status == job.status
        assert (got.roles, got.generation) == (job.roles, job.generation)

    # -- suspend and resume ---------------------------------------------------------------

    async def test_suspend_and_resume(self, platform: Platform) -> None:
        """Where the platform can suspend (``capabilities.suspend``): a suspend keeps the job
        and its size and says who suspended it, in one write; a resume undoes it; a job
        submitted suspended reads so (queued). Where it does not, a suspend is refused or
        leaves the job running."""
        job = await self.submit(platform)
        stop = JobAdmission(SUSPENDED, "Preempted", "suspended by the suite", "suite-suspend")
        suspend = JobSpecChange(
            job.resource_version, ("suite-suspend",), suspend=True, admission=stop
        )
        if not platform.capabilities.suspend:
            with contextlib.suppress(Invalid):
                await platform.change_job(job, suspend)
            assert not _job(await platform.get_job(job.name)).suspended
            return
        suspended = await platform.change_job(job, suspend)
        for view in (suspended, _job(await platform.get_job(job.name))):
            assert view.suspended
            assert view.admission == stop
            assert view.roles[WORKER].replicas == 2
            assert view.applied_plans == ("suite-suspend",)

        go = JobAdmission(ADMITTED, "Resumed", "resumed by the suite", "suite-resume")
        resume = JobSpecChange(
            suspended.resource_version,
            ("suite-suspend", "suite-resume"),
            suspend=False,
            admission=go,
        )
        resumed = await platform.change_job(suspended, resume)
        for view in (resumed, _job(await platform.get_job(job.name))):
            assert not view.suspended
            assert view.admission == go
            assert view.roles[WORKER].replicas == 2

        queued = await self.submit(platform, "queued", suspend=True)
        assert queued.suspended
        assert _job(await platform.get_job(queued.name)).suspended

    # -- delete ---------------------------------------------------------------------------

    async def test_a_deleted_job_is_gone_and_its_pods_can_be_ended(
        self, platform: Platform
    ) -> None:
        """A deleted job is not got nor listed, a second delete says False, and a change or
        status on it is ObjectNotFound (a status where the platform keeps one: else
        ``set_status`` is a no-op, on a job or none). What remains are its pods, for the
        reconciler to delete (a platform's own collector may take them first); its name is
        free again."""
        job = await self.submit(platform)
        pods = await self._pods(platform, job, 2)
        assert await platform.delete_job(job.name) is True
        assert await platform.get_job(job.name) is None
        listed, _ = await platform.list_jobs()
        assert job.name not in [e.name for e in listed]
        assert await platform.delete_job(job.name) is False
        with pytest.raises(ObjectNotFound):
            await platform.change_job(job, JobSpecChange(job.resource_version, ("late",)))
        gone = OperatorJobStatus(RUNNING, {}, job.generation)
        if self.keeps_status:
            with pytest.raises(ObjectNotFound):
                await platform.set_status(job, gone)
        else:
            await platform.set_status(job, gone)
            assert await platform.get_job(job.name) is None

        for name in pods:
            assert await platform.delete_pod(name) in (True, False)
        await until(f"no pods of deleted job {job.name}", lambda: self._none_of(platform, job))
        await platform.release(job.name)
        again = await platform.submit_job(self.document(job.name))
        assert again.uid != job.uid
        assert await platform.delete_job(unique("never")) is False

    # -- pods -----------------------------------------------------------------------------

    async def _pods(self, platform: Platform, job: JobView, n: int) -> list[str]:
        """``n`` pods of the job's worker role, created (where another controller makes
        them, made by it: waited for); their names."""
        names = []
        for rank in range(n):
            new = NewPod(WORKER, rank, rank, POD_RESOURCES)
            if platform.creates_pods:
                assert await platform.create_pod(job, new, ENV) is True
            names.append(new.name(job.name))
        if not platform.creates_pods:

            async def made() -> bool:
                pods, _ = await platform.list_pods(job.name)
                return set(names) <= {p.name for p in pods}

            await until(f"pods {names} made by the job's controller", made)
        return names

    @staticmethod
    async def _none_of(platform: Platform, job: JobView) -> bool:
        pods, _ = await platform.list_pods(job.name)
        return not pods

    @staticmethod
    async def _running(platform: Platform, job: JobView, n: int) -> list[PodView] | None:
        pods, _ = await platform.list_pods(job.name)
        up = [p for p in pods if p.running and not p.deleting]
        return up if len(up) == n else None

    async def test_pods_are_created_once_listed_by_job_and_run(self, platform: Platform) -> None:
        """A pod of a decided name is created once (a repeat says False), listed under its
        job with its node (role, rank, index) and resources, and comes to run. Where the
        platform ``creates_pods`` is False, another controller makes them: create_pod is
        Invalid."""
        job = await self.submit(platform)
        first = NewPod(WORKER, 0, 0, POD_RESOURCES)
        if not platform.creates_pods:
            with pytest.raises(Invalid):
                await platform.create_pod(job, first, ENV)
            return
        assert await platform.create_pod(job, first, ENV) is True
        assert await platform.create_pod(job, first, ENV) is False
        assert await platform.create_pod(job, NewPod(WORKER, 1, 3, POD_RESOURCES), ENV) is True
        other = await self.submit(platform, "other")
        await self._pods(platform, other, 1)

        pods, version = await platform.list_pods(job.name)
        assert isinstance(version, str)
        by_name = {p.name: p for p in pods}
        assert set(by_name) == {pod_name(job.name, WORKER, 0), pod_name(job.name, WORKER, 3)}
        for pod, (rank, index) in zip(
            sorted(pods, key=lambda p: p.rank), [(0, 0), (1, 3)], strict=True
        ):
            assert (pod.job, pod.job_uid, pod.role) == (job.name, job.uid, WORKER)
            assert (pod.rank, pod.index) == (rank, index)
            assert pod.resources.covers(POD_RESOURCES), pod.resources
        everyone, _ = await platform.list_pods()
        assert set(by_name) | {pod_name(other.name, WORKER, 0)} <= {p.name for p in everyone}
        await until(f"2 running pods of {job.name}", lambda: self._running(platform, job, 2))

    async def test_a_deleted_pod_goes(self, platform: Platform) -> None:
        """delete_pod ends a pod (with its own grace period, or the one given), which then
        leaves the list; a delete of a pod that is gone, or never was, says False."""
        job = await self.submit(platform)
        if not platform.creates_pods:
            assert await platform.delete_pod(unique("never")) is False
            return
        names = await self._pods(platform, job, 2)
        await until(f"2 running pods of {job.name}", lambda: self._running(platform, job, 2))
        assert await platform.delete_pod(names[0]) is True
        assert await platform.delete_pod(names[1], grace_s=1) is True

        await until(f"no pods of {job.name}", lambda: self._none_of(platform, job))
        assert await platform.delete_pod(names[0]) is False
        assert await platform.delete_pod(pod_name(unique("never"), WORKER, 0)) is False

    async def test_prepare_and_release_can_be_repeated(self, platform: Platform) -> None:
        """What a job's pods need before they start is made and removed by calls that a
        restarted operator may repeat."""
        job = await self.submit(platform)
        await platform.prepare(job)
        await platform.prepare(job)
        await platform.keep_spares(job, [], ENV)
        assert await platform.delete_job(job.name)
        await platform.release(job.name)
        await platform.release(job.name)

    # -- watches --------------------------------------------------------------------------

    async def test_a_watch_of_jobs_follows_them(self, platform: Platform) -> None:
        """A watch from a list's version shows a new job, its change (at the version the
        change answered) and its deletion, across the watch's own timeouts."""
        _, version = await platform.list_jobs()
        async with Watching(platform, "jobs", version) as watch:
            job = await self.submit(platform)
            await watch.until(
                f"job {job.name}", lambda e: e[0] != "DELETED" and _named(e[1]) == job.name
            )
            change = JobSpecChange(job.resource_version, ("watched",), replicas={WORKER: 3})
            changed = await platform.change_job(job, change)
            _, seen = await watch.until(
                f"the change of {job.name}",
                lambda e: e[0] == "MODIFIED" and _version(e[1]) == changed.resource_version,
            )
            assert isinstance(seen, JobView) and seen.roles[WORKER].replicas == 3, seen
            await platform.delete_job(job.name)
            await watch.until(
                f"the deletion of {job.name}",
                lambda e: e[0] == "DELETED" and _named(e[1]) == job.name,
            )

    async def test_a_watch_of_pods_follows_them(self, platform: Platform) -> None:
        """A watch of pods shows a new pod, its running, and its end once deleted."""
        job = await self.submit(platform)
        _, version = await platform.list_pods()
        async with Watching(platform, "pods", version) as watch:
            (name,) = await self._pods(platform, job, 1)

            def running(e: WatchEvent) -> bool:
                return isinstance(e[1], PodView) and e[1].name == name and e[1].running

            await watch.until(f"pod {name} running", running)
            if platform.creates_pods:
                await platform.delete_pod(name)
            else:
                await platform.delete_job(job.name)
            await watch.until(
                f"the end of pod {name}", lambda e: e[0] == "DELETED" and _named(e[1]) == name
            )

    async def test_a_watch_goes_on_from_a_version(self, platform: Platform) -> None:
        """Where ``watch_resumes``: what changed after a list's version, and only that, is
        shown to a watch opened later (a job unchanged since is not). Otherwise the watch
        starts with every job as it is now, whatever version it was given."""
        kept = await self.submit(platform, "kept")
        changed = await self.submit(platform, "changed")
        _, version = await platform.list_jobs()
        now = await platform.change_job(
            changed, JobSpecChange(changed.resource_version, ("later",), replicas={WORKER: 3})
        )
        added = await self.submit(platform, "added")
        async with Watching(platform, "jobs", version) as watch:
            for job in (now, added):
                await watch.until(f"job {job.name} at {job.resource_version}", _shows(job))
            if self.watch_resumes:
                names = [_named(obj) for typ, obj in watch.events if typ != "BOOKMARK"]
                assert kept.name not in names, "a job unchanged since the version was shown"
                assert (changed.name, changed.resource_version) not in [
                    (_named(obj), _version(obj)) for _, obj in watch.events
                ], "a job shown as it was before the version"
            else:
                await watch.until(f"job {kept.name}", lambda e: _named(e[1]) == kept.name)

    async def test_a_watch_from_an_old_version_loses_nothing(
        self, platform: Platform, hosts: Hosts | None
    ) -> None:
        """A watch from a version the platform let go is Expired (``expires``), and one
        from an old version it still keeps shows every object there is now: never a
        silent gap, where an informer would miss a job, a pod or a host for good. Hosts
        that never change (``Hosts.cordon`` None) cannot be missed, and are not asked."""
        job = await self.submit(platform)
        names = {"jobs": {job.name}, "pods": set(await self._pods(platform, job, 1))}
        if hosts is not None and hosts.cordon is not None:
            names["hosts"] = set(hosts.listed)
        for kind, there in names.items():
            if kind in self.expires:
                with pytest.raises(Expired):
                    await self._watch_once(platform, kind, self.old_version)
                continue
            events = await self._watch_once(platform, kind, self.old_version)
            shown = {_named(obj) for typ, obj in events if typ != "DELETED"}
            assert there <= shown, f"a {kind} watch from {self.old_version} missed {there - shown}"

    @staticmethod
    async def _watch_once(platform: Platform, kind: str, version: str) -> list[Any]:
        if kind == "hosts":
            return await watch_hosts_once(platform, version)
        return await watch_once(platform, "jobs" if kind == "jobs" else "pods", version)

    async def test_a_cancelled_watch_ends(self, platform: Platform) -> None:
        """A watch whose reader is cancelled while changes stream in ends at once: the
        informer stops a watch by cancelling it, and a watch that lost the cancellation
        would go on (and its operator never stop). Tried at a few points of the stream."""
        for attempt in range(3):
            assert await self._cancelled_in_a_stream(platform, attempt), (
                f"the watch went on after it was cancelled ({attempt} turns of the event "
                f"loop after it showed its first change)"
            )

    async def _cancelled_in_a_stream(self, platform: Platform, turns: int) -> bool:
        """Whether a watch of jobs, cancelled ``turns`` turns of the event loop after it
        showed the first of a burst of new jobs, ended."""
        _, version = await platform.list_jobs()
        first = asyncio.Event()

        async def follow() -> None:
            async with contextlib.aclosing(platform.watch("jobs", version, 600)) as watch:
                async for _ in watch:
                    first.set()

        reader = asyncio.create_task(follow())
        for _ in range(6):
            await self.submit(platform, "burst")
        try:
            await asyncio.wait_for(first.wait(), DEADLINE_S)
        except TimeoutError:
            pytest.fail(f"the watch showed none of 6 new jobs in {DEADLINE_S:.0f}s")
        for _ in range(turns):
            await asyncio.sleep(0)  # turn by turn: cancelled while the burst is being read
        return await ended_when_cancelled(reader)

    async def test_a_watch_ends_at_its_timeout(self, platform: Platform) -> None:
        """A watch with nothing to say ends at its timeout (the informer then watches
        again), saying at most bookmarks and, where it does not resume, what is there."""
        for kind in ("jobs", "pods"):
            _, version = await (platform.list_jobs() if kind == "jobs" else platform.list_pods())
            events = await watch_once(platform, kind, version)
            if self.watch_resumes:
                assert all(isinstance(obj, Bookmark) for _, obj in events), events

    # -- fencing --------------------------------------------------------------------------

    async def test_a_fenced_platform_refuses_writes_and_reads_on(self, platform: Platform) -> None:
        """Behind FencedPlatform, while ``may_act`` says no, every write is NotLeader and
        changes nothing; reads go on; once it says yes, writes pass. (One replica: where
        another controller makes the pods, it makes just the one the check names.)"""
        job = await self.submit(platform, replicas=1)
        pods = await self._pods(platform, job, 1)
        allowed = False
        fenced = FencedPlatform(platform, lambda: allowed)
        assert (
            fenced.name,
            fenced.namespace,
            fenced.creates_pods,
            fenced.capabilities,
        ) == (
            platform.name,
            platform.namespace,
            platform.creates_pods,
            platform.capabilities,
        )
        change = JobSpecChange(job.resource_version, ("fenced",), replicas={WORKER: 3})
        late = NewPod(WORKER, 1, 1, POD_RESOURCES)
        writes: dict[str, Callable[[], Awaitable[object]]] = {
            "submit_job": lambda: fenced.submit_job(self.document(unique("fenced"))),
            "change_job": lambda: fenced.change_job(job, change),
            "set_status": lambda: fenced.set_status(job, OperatorJobStatus(RUNNING, {}, 1)),
            "delete_job": lambda: fenced.delete_job(job.name),
            "create_pod": lambda: fenced.create_pod(job, late, ENV),
            "delete_pod": lambda: fenced.delete_pod(pods[0]),
            "prepare": lambda: fenced.prepare(job),
            "release": lambda: fenced.release(job.name),
            "keep_spares": lambda: fenced.keep_spares(job, [], ENV),
        }
        for call, write in writes.items():
            with pytest.raises(NotLeader):
                await write()
            got = _job(await fenced.get_job(job.name))
            assert got.resource_version == job.resource_version, f"{call} changed the job"
        listed, version = await fenced.list_jobs()
        assert [e.name for e in listed] == [job.name], "a fenced submit made a job"
        pods_now, _ = await fenced.list_pods(job.name)
        assert [p.name for p in pods_now if not p.deleting] == pods
        await watch_once(fenced, "jobs", version)

        allowed = True
        changed = await fenced.change_job(job, change)
        assert changed.roles[WORKER].replicas == 3

    # -- capacity -------------------------------------------------------------------------

    async def test_capacity_lists_and_watches_hosts(
        self, platform: Platform, hosts: Hosts | None
    ) -> None:
        """A CapacitySource lists its hosts and their GPUs; a host that turns
        unschedulable is shown to a watch, or, declared unchanging, a watch says nothing
        new. A platform declared without capacity has no list_hosts to call."""
        if hosts is None:
            assert not hasattr(platform, "list_hosts"), "list_hosts, but no hosts declared"
            return
        source: Any = platform  # a CapacitySource, as declared
        listed, version = await source.list_hosts()
        assert all(isinstance(h, Host) for h in listed)
        assert {h.name: h.gpus for h in listed if h.schedulable} == dict(hosts.listed)
        if hosts.cordon is None:
            events = await watch_hosts_once(source, version)
            assert all(isinstance(obj, Bookmark) for _, obj in events), events
            return
        name = await hosts.cordon()
        try:
            async with asyncio.timeout(DEADLINE_S):
                await _until_unschedulable(source, version, name)
        except TimeoutError:
            pytest.fail(f"no watch of hosts showed {name} unschedulable in {DEADLINE_S:.0f}s")
        after, _ = await source.list_hosts()
        assert name not in {h.name for h in after if h.schedulable}


__all__ = [
    "DEADLINE_S",
    "Hosts",
    "PlatformConformance",
    "Watching",
    "ended_when_cancelled",
    "unique",
    "until",
]
