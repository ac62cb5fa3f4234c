"""The local platform as the platform port: jobs, pods, watches on this machine.

``LocalCluster`` answers the port's calls (handlers.operator.platform.api) in its own terms,
so the one reconciler drives it as it drives Kubernetes: plan ids applied once through
the same ledger and job documents, pods made to match the job, node and job events
derived from pod states, ScaleResults. The brain cannot tell the two apart. Underneath,
a job is a typed job in a file (``store.JobStore``: read from its TrainingJob document once,
at submission; changed and said on as values by handlers.operator.platform.changes, with
no quantity string nor merge patch in between), and a pod is a process on this machine, a shim
(``dlrover_events.pods.shim``) around the node's command, with a record of what it is (``pod.json``:
its job, role, rank and resources, in numbers), whose pid file lets a restarted operator
adopt it and whose ``exit.json`` says how it ended. What a pod runs is the reconciler's
``launch`` (the training command, torchrun's for an elastic role, and the SDK's
variables), meeting the job's other pods at 127.0.0.1.

An in-place elastic role may ask for warm spares (``elastic.spares``): processes of the
role started ahead, which a new pod of the role takes instead of a cold start
(``spares.py``), kept by its collaborator ``spare_keeper.SpareKeeper``.

Slots (``slots``: the operator's ``--slots N``): what this machine has for jobs, as a
cluster has GPUs. A pod takes as many slots as the GPUs its resources name, one when it
names none (so a TrainingJob takes its replicas x its GPUs per pod, or one per pod); a
pending pod starts only once that many are free, as a cluster's scheduler keeps a pod
Pending until a node has room, and a pod holds its slots until its processes are gone
(a stopping pod too). The slots are the platform's capacity (one host: this machine).
Without ``slots`` nothing is counted and nothing waits. A suspended job's pods are ended
(SIGTERM, then the grace period) and its document kept; resumed, its pods start again
and its training resumes from its checkpoint.

A watch here starts with every current object (as MODIFIED) and then follows changes a
poller sees; the reconciler's handling is level-triggered and its events keyed by facts,
so a repeated object costs a look, never a duplicate effect.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from dlrover_events.lifecycle import cancel_and_wait
from dlrover_events.pods import shim
from dlrover_events.pods.memory import Enforcement
from dlrover_events.pods.shim import PID, POD, alive
from dlrover_events.sdk.identity import (
    JOB_TOKEN_ENV,
    JOBS_API_ENV,
    READY_FILE_ENV,
    VOLUME_ENV_PREFIX,
    env_suffix,
)
from handlers.operator.document import trainingjob
from handlers.operator.local.spare_keeper import SpareKeeper
from handlers.operator.local.store import NAMESPACE, JobStore, read_json, write_json
from handlers.operator.platform.api import HostChange, JobEntry, WatchEvent, WatchKind
from handlers.operator.platform.bodies import (
    DOMAIN,
    FAILED,
    PENDING,
    RUNNING,
    SUCCEEDED,
    Bookmark,
    Host,
    JobSpecChange,
    JobView,
    NewPod,
    OperatorJobStatus,
    PlanChange,
    PlatformCapabilities,
    PodView,
    Resources,
    Termination,
)
from handlers.operator.platform.errors import Expired, Invalid, InvalidJob
from handlers.operator.reconcile import planning
from handlers.operator.reconcile.launch import DLROVER_C10D, launch
from handlers.operator.reconcile.peers import Addressing, peers_document
from schemas.plans import NotApplied, ScalePlan

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 30.0
_WATCH_QUEUE = 10_000
_OVERFLOW = object()
#: The one "container" of a local pod, as a termination names it.
MAIN = "main"
#: On a job submitted here: JSON {role: first port}: its pods' ports, one per rank from
#: there (every pod of this machine shares 127.0.0.1; peers.Addressing "ports").
ANN_PORTS = f"{DOMAIN}/local-ports"
#: A pod's file that says it is ready (the SDK's ``ready()`` writes it).
READY = "ready"
#: The volume sources a job's pods can share here, as a host directory: a host path, or
#: a directory the platform keeps (per job for emptyDir; per claim name for a claim,
#: which outlives the job as a claim does).
LOCAL_VOLUMES = ("hostPath", "emptyDir", "persistentVolumeClaim")


class JobTokens(Protocol):
    """A job's own token (``job:<uid>``), for the pods of its roles that scale others:
    minted once per job, revoked once it is gone (the operator's, on the env's tokens)."""

    async def token(self, job: JobView) -> str: ...

    async def revoke(self, job: str) -> None: ...


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _resources(raw: Mapping[str, Any]) -> Resources:
    return Resources(
        cpu_milli=raw.get("cpu_milli"),
        memory=raw.get("memory"),
        gpu=raw.get("gpu"),
        gpu_type=raw.get("gpu_type"),
    )


def _record(job: JobView, pod: NewPod, resources: Resources) -> dict[str, Any]:
    """What a pod is, as its ``pod.json`` keeps it."""
    return {
        "name": pod.name(job.name),
        "uid": str(uuid.uuid4()),
        "job": job.name,
        "job_uid": job.uid,
        "role": pod.role,
        "rank": pod.rank,
        "index": pod.index,
        "resources": {
            "cpu_milli": resources.cpu_milli,
            "memory": resources.memory,
            "gpu": resources.gpu,
            "gpu_type": resources.gpu_type,
        },
        "created": _now(),
        "deleting": None,
    }


def host_name() -> str:
    """This machine, as a capacity report names it."""
    return socket.gethostname() or "local"


def slots_of(pod: PodView) -> int:
    """The slots a pod takes: the GPUs its resources name, else one."""
    return pod.resources.gpu or 1


class LocalCluster:
    """One env's TrainingJobs on this machine.

    ``runs_pods``: this instance is the platform's node agent (the operator): it starts
    pending pods, follows their processes and feeds watches. The `job` commands use an
    instance that only reads and writes job objects. ``slots``: what the machine has for
    pods (None: not counted).
    """

    name = "local"
    creates_pods = True
    #: a suspended job's pods are ended and its job kept (capabilities.suspend; a test
    #: turns it off to play a platform that cannot suspend)
    can_suspend = True
    #: where an elastic role's pods find their rendezvous store
    rendezvous_host = "127.0.0.1"
    #: the pods run this machine's torchrun, beside the SDK: a node stopped by a shrink
    #: leaves the rendezvous at once, the others need not wait for its heartbeat to lapse
    rendezvous_backend = DLROVER_C10D

    def __init__(
        self,
        root: Path,
        *,
        runs_pods: bool = False,
        base_env: Mapping[str, str] | None = None,
        enforcement: Enforcement = Enforcement.NONE,
        poll_s: float = 0.25,
        python: str = sys.executable,
        slots: int | None = None,
    ) -> None:
        self.store = JobStore(root)
        self.slots = slots
        self.namespace = NAMESPACE
        self.runs_pods = runs_pods
        self.base_env = dict(base_env or {})
        self.enforcement = enforcement
        self.poll_s = poll_s
        self.python = python
        self._shims: dict[str, subprocess.Popen[bytes]] = {}
        #: the warm spares of in-place roles (``spares.py``), kept at every scan
        self._spares = SpareKeeper(self.store.root, self.store.pods_dir, self._start)
        #: a job's own token, for the roles that scale others (the operator's; None here)
        self.job_tokens: JobTokens | None = None
        #: where those roles reach the jobs API (set once the operator serves it)
        self.jobs_api: str | None = None
        self._seen: dict[str, dict[str, tuple[object, Any]]] = {"jobs": {}, "pods": {}}
        self._subs: dict[str, set[asyncio.Queue[Any]]] = {"jobs": set(), "pods": set()}
        self._poller: asyncio.Task[None] | None = None

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        if self.runs_pods and self._poller is None:
            adopted = [n for n, r in self._pid_records().items() if alive(r)]
            if adopted:
                log.warning("local platform: adopted %d running node(s): %s", len(adopted), adopted)
            kept = [n for n, (_, running) in self._spares.every().items() if running]
            if kept:
                log.warning("local platform: adopted %d warm spare(s): %s", len(kept), kept)
            self._scan()
            self._poller = asyncio.create_task(self._poll(), name="local.poller")

    async def stop(self, *, end_pods: bool) -> None:
        """Stop following; with ``end_pods`` end every node's processes and forget the pods
        (the job objects stay: a later operator starts their pods again, and a job that
        checkpoints resumes)."""
        await cancel_and_wait(self._poller)
        self._poller = None
        if end_pods:
            await self._end_all()

    async def __aenter__(self) -> LocalCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop(end_pods=False)

    # -- jobs -----------------------------------------------------------------------------

    async def list_jobs(self) -> tuple[list[JobEntry], str]:
        return self.store.list(), "0"

    async def get_job(self, name: str) -> JobEntry | None:
        try:
            return self.store.get(name)
        except Invalid:  # not a name a job can have
            return None

    async def submit_job(self, document: Mapping[str, Any]) -> JobView:
        """The job, read from its document and stored; one the decisions cannot read is
        refused (Invalid) before it is stored, and so is one whose volumes this machine
        cannot give its pods."""
        body = with_peer_ports(with_rendezvous_ports(document), port_blocks(self.store.list()))
        try:
            job = trainingjob.parse_job(body)
        except InvalidJob as e:
            raise Invalid(f"invalid {trainingjob.KIND}: {e}") from None
        check_volumes(job)
        return self.store.create(body)

    async def change_job(self, job: JobView, change: JobSpecChange) -> JobView:
        return self.store.change(job.name, change)

    async def set_status(self, job: JobView, status: OperatorJobStatus) -> None:
        self.store.set_status(job.name, status)

    async def delete_job(self, name: str) -> bool:
        try:
            return self.store.delete(name)
        except Invalid:
            return False

    # -- pods -----------------------------------------------------------------------------

    def _pod_dir(self, name: str) -> Path:
        return self.store.pods_dir / name

    async def list_pods(self, job: str | None = None) -> tuple[list[PodView], str]:
        return [p for p in self._pods().values() if job is None or p.job == job], "0"

    async def create_pod(self, job: JobView, pod: NewPod, env: str) -> bool:
        """False when the pod exists: names are decided, so a repeat is the same pod."""
        name = pod.name(job.name)
        pod_dir = self._pod_dir(name)
        try:
            pod_dir.mkdir(parents=True)
        except FileExistsError:
            return False
        role = job.roles[pod.role]
        runs = launch(
            job, pod, env, self.rendezvous_host, self.rendezvous_backend, self.addressing(job)
        )
        command = runs.command or role.command
        if not command:
            shutil.rmtree(pod_dir, ignore_errors=True)
            raise Invalid(f"pod {name}: its container has no command: nothing to run locally")
        record = _record(job, pod, pod.resources.over(role.template_resources))
        extra = {READY_FILE_ENV: str(pod_dir / READY)}
        for mount in role.volumes:
            extra[VOLUME_ENV_PREFIX + env_suffix(mount.name)] = str(
                self.volume_dir(job, mount.name)
            )
        if role.scales and self.job_tokens is not None and self.jobs_api is not None:
            extra[JOB_TOKEN_ENV] = await self.job_tokens.token(job)
            extra[JOBS_API_ENV] = self.jobs_api
        spec = {
            "name": name,
            "command": list(command),
            "env": {**self.base_env, **role.env, **runs.env, **extra},
            "cwd": self._workdir(job.name) or os.getcwd(),
            "memory": record["resources"]["memory"],
            "enforcement": self.enforcement.value,
            "grace_s": float(DEFAULT_GRACE_S if role.grace_s is None else role.grace_s),
        }
        if self.runs_pods and self._spares.admit(name, record, spec):
            return True
        (pod_dir / shim.SPEC).write_text(json.dumps(spec))
        write_json(pod_dir / POD, record)
        if self.runs_pods and self.slots is None:
            self._start(name)  # counted slots: the next scan starts it once they are free
        return True

    def _workdir(self, job: str) -> str | None:
        """Where the job was submitted (`job submit`'s annotation on its document)."""
        obj = self.store.submitted(job) or {}
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        workdir = annotations.get(trainingjob.ANN_WORKDIR)
        return str(workdir) if workdir else None

    async def delete_pod(self, name: str, grace_s: int | None = None) -> bool:
        """The node's shim gets SIGTERM and ends it within the pod's own grace period
        (its role's terminationGracePeriodSeconds, which is what ``grace_s`` is made of
        too)."""
        pod_dir = self._pod_dir(name)
        record = read_json(pod_dir / POD)
        if record is None:
            return False
        if not record.get("deleting"):
            record["deleting"] = _now()
            write_json(pod_dir / POD, record)
        self._terminate(name)
        return True

    # -- where a job's pods find each other, and their volumes ----------------------------

    def peers_file(self, job: str) -> Path:
        return self.store.root / "peers" / f"{job}.json"

    def addressing(self, job: JobView) -> Addressing | None:
        """127.0.0.1 and the job's port blocks (None: a job submitted before it had any)."""
        ports = _annotation_ports(job.document)
        if ports is None:
            return None
        return Addressing("ports", str(self.peers_file(job.name)), ports=ports)

    def volume_dir(self, job: JobView, name: str) -> Path:
        """The host directory of the job's volume ``name`` (made when missing)."""
        source = job.volumes[name]
        if "hostPath" in source:
            path = Path(str(source["hostPath"].get("path") or ""))
        elif "persistentVolumeClaim" in source:
            claim = str(source["persistentVolumeClaim"].get("claimName") or name)
            path = self.store.root / "volumes" / "claims" / claim
        else:
            path = self.store.root / "volumes" / job.name / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    async def prepare(self, job: JobView) -> None:
        """The job's peers document, current with its replicas (elastic pods rendezvous at
        127.0.0.1, ``rendezvous_host``: nothing to make for them)."""
        addressing = self.addressing(job)
        if addressing is None:
            return
        path = self.peers_file(job.name)
        document = peers_document(job, addressing)
        if read_json(path) != document:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json(path, document)

    async def release(self, job: str) -> None:
        """The job's peers document, its emptyDir volumes and its own token go with it."""
        self.peers_file(job).unlink(missing_ok=True)
        shutil.rmtree(self.store.root / "volumes" / job, ignore_errors=True)
        if self.job_tokens is not None:
            await self.job_tokens.revoke(job)

    async def keep_spares(self, job: JobView, pods: Sequence[PodView], env: str) -> None:
        """Nothing: the node agent keeps each job's spares at every scan (``SpareKeeper``),
        where it sees its processes."""
        return None

    # -- hosts (CapacitySource): this machine and its slots --------------------------------

    async def list_hosts(self) -> tuple[list[Host], str]:
        if self.slots is None:
            return [], "0"
        return [Host(host_name(), self.slots, True, resource_version="0")], "0"

    async def watch_hosts(self, resource_version: str, timeout_s: int) -> AsyncIterator[HostChange]:
        """The slots change only with the operator's settings: a watch says nothing new
        until its timeout (a bookmark keeps the informer's version)."""
        await asyncio.sleep(timeout_s)
        yield "BOOKMARK", Bookmark(resource_version)

    # -- what its jobs can express --------------------------------------------------------

    @property
    def capabilities(self) -> PlatformCapabilities:
        """One machine: no GPU type to select; warm spares kept by the node agent; a job
        suspended as ``can_suspend`` says; any node replaced but an elastic role's
        rendezvous host, whose agent holds the c10d store the others meet at."""
        return PlatformCapabilities(
            gpu_types=False,
            spares=True,
            suspend=self.can_suspend,
            migrates_nodes=True,
            replaces_rendezvous_host=False,
        )

    def plan_change(self, job: JobView, pods: Sequence[PodView], plan: ScalePlan) -> PlanChange:
        """A TrainingJob's rules, held to what this platform declares."""
        return planning.plan_change(job, pods, plan, self.capabilities)

    def not_applied(self, plan: ScalePlan) -> tuple[NotApplied, ...]:
        return trainingjob.plan_not_applied(
            plan, gpu_types=self.capabilities.gpu_types, only_host=host_name()
        )

    def outcome(self, job: JobView, pods: Sequence[PodView]) -> tuple[str | None, str]:
        return planning.outcome(job, pods)

    def _start(self, name: str, pod_dir: Path | None = None) -> None:
        # a node outlives the operator (its own session); a later one re-adopts it
        proc = shim.start(pod_dir or self._pod_dir(name), self.python)
        self._shims[name] = proc
        log.info("local platform: started pod %s (pid %d)", name, proc.pid)

    def _terminate(self, name: str) -> None:
        record = read_json(self._pod_dir(name) / PID)
        if record is not None and alive(record):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(record["pid"]), signal.SIGTERM)

    def _remove(self, name: str) -> None:
        """A pod goes; its log stays (``logs/<pod>.log``), as a user wants after a failure.
        A name used again (a scale-down, then a scale-up) adds its log to the same file: the
        earlier pod's lines are not lost."""
        pod_dir = self._pod_dir(name)
        logs = self.store.root / "logs"
        logs.mkdir(exist_ok=True)
        kept = logs / f"{name}.log"
        with contextlib.suppress(OSError):
            if kept.exists():
                with open(pod_dir / shim.LOG, "rb") as src, open(kept, "ab") as dst:
                    shutil.copyfileobj(src, dst)
            else:
                os.replace(pod_dir / shim.LOG, kept)
        self._spares.forget_admission(pod_dir)
        shutil.rmtree(pod_dir, ignore_errors=True)

    def _pid_records(self) -> dict[str, dict[str, Any]]:
        out = {}
        for pod_dir in self.store.pods_dir.iterdir():
            record = read_json(pod_dir / PID)
            if record is not None:
                out[pod_dir.name] = record
        return out

    def _pods(self) -> dict[str, PodView]:
        """Every pod, its phase as its process tells it now."""
        out: dict[str, PodView] = {}
        for pod_dir in sorted(self.store.pods_dir.iterdir()):
            view = self._pod_view(pod_dir)
            if view is not None:
                out[pod_dir.name] = view
        return out

    def _pod_view(self, pod_dir: Path) -> PodView | None:
        record = read_json(pod_dir / POD)
        if record is None:
            return None
        phase, termination = self._state(pod_dir)
        ready = phase == RUNNING and (pod_dir / READY).exists()
        return PodView(
            name=record["name"],
            uid=record["uid"],
            job=record["job"],
            job_uid=record["job_uid"],
            role=record["role"],
            rank=int(record["rank"]),
            index=int(record["index"]),
            phase=phase,
            deleting=bool(record.get("deleting")),
            resources=_resources(record.get("resources") or {}),
            termination=termination,
            ready=ready,
        )

    def _state(self, pod_dir: Path) -> tuple[str, Termination | None]:
        """The pod's phase, and how it ended (or that its node was OOM-killed once)."""
        ended = read_json(pod_dir / shim.EXIT)
        if ended is not None:
            code = int(ended["exitCode"])
            return (SUCCEEDED if code == 0 else FAILED), Termination(
                MAIN, code, ended.get("reason") or ""
            )
        record = read_json(pod_dir / PID)
        if record is None:
            return PENDING, None
        if not alive(record):
            # The shim itself was killed: the node's ending is unknown, and its
            # processes were ended with it or by it.
            return FAILED, Termination(MAIN, 255, "NodeLost")
        if (pod_dir / shim.OOM).exists():
            return RUNNING, Termination(MAIN, 137, "OOMKilled")
        return RUNNING, None

    # -- watches --------------------------------------------------------------------------

    async def watch(
        self, kind: WatchKind, resource_version: str, timeout_s: int
    ) -> AsyncIterator[WatchEvent]:
        """Every current object, then the changes the poller sees, until ``timeout_s``.
        A watcher that falls too far behind is told so (Expired): list again."""
        queue: asyncio.Queue[Any] = asyncio.Queue(_WATCH_QUEUE)
        self._subs[kind].add(queue)
        try:
            current: Sequence[JobEntry | PodView] = (
                (await self.list_jobs())[0] if kind == "jobs" else list(self._pods().values())
            )
            for obj in current:
                yield "MODIFIED", obj
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            while (left := deadline - loop.time()) > 0:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns the item
                # when the reader is cancelled in the turn the item arrives, and the
                # watch went on (an informer cancelled in a burst of changes never ended)
                try:
                    async with asyncio.timeout(left):
                        item = await queue.get()
                except TimeoutError:
                    return
                if item is _OVERFLOW:
                    raise Expired("the watch fell behind; list again")
                yield item
        finally:
            self._subs[kind].discard(queue)

    def _emit(self, kind: str, typ: str, obj: JobEntry | PodView) -> None:
        for queue in self._subs[kind]:
            try:
                queue.put_nowait((typ, obj))
            except asyncio.QueueFull:
                with contextlib.suppress(asyncio.QueueEmpty):
                    queue.get_nowait()
                queue.put_nowait(_OVERFLOW)

    async def _poll(self) -> None:
        while True:
            try:
                self._scan()
            except Exception:  # a half-written file, a vanished dir: look again soon
                log.exception("local platform: scan failed")
            await asyncio.sleep(self.poll_s)

    def _scan(self) -> None:
        """Start pending pods, remove deleted ones that ended, tell watches what changed."""
        for name, proc in list(self._shims.items()):
            if proc.poll() is not None:
                del self._shims[name]
        jobs = {j.name: j for j in self.store.list()}
        self._diff("jobs", jobs, lambda j: j.resource_version)
        pods = self._pods()
        if self.runs_pods:
            self._spares.keep(jobs.values(), pods)
        for name, pod in list(pods.items()):
            if pod.deleting and pod.phase != RUNNING:
                self._terminate(name)  # not started yet, or already ended: nothing runs
                self._remove(name)
                del pods[name]
        if self.runs_pods:
            for name in self._startable(pods):
                self._start(name)
                view = self._pod_view(self._pod_dir(name))
                if view is not None:
                    pods[name] = view
        self._diff("pods", pods, lambda p: p)

    def _startable(self, pods: Mapping[str, PodView]) -> list[str]:
        """The pending pods to start now, oldest first: every one without slots, else as
        many as the slots that running pods leave free (a pod that does not fit waits,
        and so does every pod after it: no small job overtakes a waiting large one; one
        larger than the machine waits for ever, holding up no one)."""
        pending = sorted(
            (p for p in pods.values() if p.phase == PENDING and not p.deleting),
            key=lambda p: (self._created(p.name), p.name),
        )
        if self.slots is None:
            return [p.name for p in pending]
        free = self.slots - sum(slots_of(p) for p in pods.values() if p.phase == RUNNING)
        out = []
        for pod in pending:
            need = slots_of(pod)
            if need > self.slots:
                continue  # it never fits: it must not hold up the others
            if need > free:
                break
            free -= need
            out.append(pod.name)
        return out

    def _created(self, name: str) -> str:
        record = read_json(self._pod_dir(name) / POD) or {}
        return str(record.get("created") or "")

    def _diff(self, kind: str, now: Mapping[str, Any], version: Callable[[Any], object]) -> None:
        seen = self._seen[kind]
        current = {name: (version(obj), obj) for name, obj in now.items()}
        for name, (ver, obj) in current.items():
            if name not in seen or seen[name][0] != ver:
                self._emit(kind, "ADDED" if name not in seen else "MODIFIED", obj)
        for name in set(seen) - set(current):
            self._emit(kind, "DELETED", seen[name][1])
        self._seen[kind] = current

    async def _end_all(self, timeout_s: float = 60.0) -> None:
        names = list(self._pid_records())
        for name in names:
            self._terminate(name)
        kept = self._spares.end_all()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            if not any(alive(r) for r in self._pid_records().values()) and (
                not self._spares.any_running()
            ):
                break
            await asyncio.sleep(0.2)
        for name in names:
            self._remove(name)
        self._spares.remove(kept)
        log.warning(
            "local platform: ended %d node(s) and %d spare(s) on shutdown", len(names), len(kept)
        )


def with_rendezvous_ports(body: Mapping[str, Any]) -> dict[str, Any]:
    """Every job shares this machine's ports: an elastic role that names no rendezvous
    port gets a free one now, kept in its spec (on a cluster each job has its own
    Service, so the default port never collides there)."""
    out = json.loads(json.dumps(body))
    for role in ((out.get("spec") or {}).get("roles") or {}).values():
        elastic = role.get("elastic") if isinstance(role, dict) else None
        if isinstance(elastic, dict) and not elastic.get("rendezvousPort"):
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                elastic["rendezvousPort"] = sock.getsockname()[1]
    return out


#: Where a job's port blocks are taken from: below Linux's ephemeral ports (32768 up),
#: where a rendezvous port (``with_rendezvous_ports``) or a client's port is taken.
_PORTS_FROM, _PORTS_TO = 20000, 32000
#: Ports a role's block has at least (a role scaled beyond its maxReplicas cannot be).
_MIN_BLOCK = 4


def _annotation_ports(document: Mapping[str, Any]) -> dict[str, int] | None:
    text = ((document.get("metadata") or {}).get("annotations") or {}).get(ANN_PORTS)
    if not text:
        return None
    try:
        raw = json.loads(text)
        return {str(role): int(port) for role, port in raw.items()}
    except (ValueError, TypeError, AttributeError):
        return None


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_block(size: int, taken: set[int], rng: random.Random) -> int:
    """A first port of ``size`` free ports in a row, none of them ``taken``."""
    for _ in range(200):
        base = rng.randrange(_PORTS_FROM, _PORTS_TO - size)
        block = range(base, base + size)
        if not taken.intersection(block) and all(_free(p) for p in block):
            return base
    raise Invalid(f"no {size} free ports in a row on this machine for the job's pods")


def _block_size(replicas: Any, max_replicas: Any) -> int:
    sizes = [replicas, max_replicas, _MIN_BLOCK]
    return min(256, max(int(n) for n in sizes if isinstance(n, int) and not isinstance(n, bool)))


def port_blocks(jobs: Sequence[JobEntry]) -> set[int]:
    """The ports the local jobs' blocks hold (their pods may not listen yet)."""
    held: set[int] = set()
    for job in jobs:
        if not isinstance(job, JobView):
            continue
        for name, base in (_annotation_ports(job.document) or {}).items():
            role = job.roles.get(name)
            if role is not None:
                held.update(range(base, base + _block_size(role.replicas, role.max_replicas)))
    return held


def with_peer_ports(body: Mapping[str, Any], held: set[int] | None = None) -> dict[str, Any]:
    """Every pod of this machine shares 127.0.0.1: each role of a job gets a block of free
    ports now, one per rank up to its maxReplicas (a rank beyond a block's end would share
    another's port), kept on the job (ANN_PORTS), so a pod's address (127.0.0.1, its role's
    first port + its rank) stays its rank's for the job's life; ``held``: the ports other
    jobs' blocks hold, left out."""
    out = json.loads(json.dumps(body))
    meta = out.setdefault("metadata", {})
    annotations = meta.setdefault("annotations", {}) if isinstance(meta, dict) else None
    if not isinstance(annotations, dict) or _annotation_ports(out) is not None:
        return out
    roles = (out.get("spec") or {}).get("roles") if isinstance(out.get("spec"), dict) else None
    if not isinstance(roles, dict):
        return out  # not a TrainingJob's roles: the job's parser says what is wrong
    rng = random.Random()
    taken = set(held or ())
    ports: dict[str, int] = {}
    for name, role in sorted(roles.items()):
        if not isinstance(role, dict):
            continue
        size = _block_size(role.get("replicas"), role.get("maxReplicas"))
        base = _free_block(size, taken, rng)
        taken.update(range(base, base + size))
        ports[name] = base
    annotations[ANN_PORTS] = json.dumps(ports, sort_keys=True)
    return out


def check_volumes(job: JobView) -> None:
    """The job's volumes must be ones this machine can give its pods (a host directory);
    Invalid names the one it cannot, rather than run the pods without it."""
    for name, source in sorted(job.volumes.items()):
        kinds = [k for k in source if k != "name"]
        if not set(kinds) <= set(LOCAL_VOLUMES):
            raise Invalid(
                f"volume {name}: the local platform gives pods only {', '.join(LOCAL_VOLUMES)} "
                f"volumes (as a host directory), not {', '.join(kinds)}"
            )
        if "hostPath" in source:
            path = (source["hostPath"] or {}).get("path")
            if not isinstance(path, str) or not path.startswith("/"):
                raise Invalid(f"volume {name}: hostPath.path must be an absolute path")


__all__ = [
    "ANN_PORTS",
    "POD",
    "LocalCluster",
    "check_volumes",
    "port_blocks",
    "with_peer_ports",
    "with_rendezvous_ports",
]
