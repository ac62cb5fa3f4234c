"""The local platform as the reconciler sees a cluster: jobs, pods, watches.

``LocalCluster`` answers the same calls as ``KubeApi`` (list, get, patch, create and
delete jobs and pods, watch them), so the one reconciler drives both platforms: plan ids
applied once through the same ledger and job annotations, pods made to match the job,
node and job events derived from pod states, ScaleResults. The brain cannot tell the two
apart. What differs is underneath: job objects are files (``store.JobStore``), and a pod
is a process on this machine, a shim (``shim.py``) around the node's command, whose pid
file lets a restarted operator adopt it and whose ``exit.json`` says how it ended.

An in-place elastic role may ask for warm spares (``elastic.spares``): processes of the
role started ahead, which a new pod of the role takes instead of a cold start
(``spares.py``).

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
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from kubernetes_asyncio.client.rest import ApiException

from handlers.operator.kube.adapter import WorkloadAdapter
from handlers.operator.local import shim, spares
from handlers.operator.local.memory import Enforcement
from handlers.operator.local.store import (
    NAMESPACE,
    JobStore,
    StoreConflict,
    StoreInvalid,
    StoreNotFound,
    read_json,
    write_json,
)
from handlers.operator.quantity import QuantityError, Resources
from handlers.operator.trainingjob import LABEL_JOB, LABEL_JOB_UID, LABEL_ROLE, InvalidJob

log = logging.getLogger(__name__)

#: The directory a job's commands run in (set by `job submit`: where it was submitted).
ANN_WORKDIR = "dlrover-events.io/workdir"
POD = "pod.json"
PID = "pid"
DEFAULT_GRACE_S = 30.0
#: Seconds before a role's spare is started again after one ended on its own (a spare
#: that cannot start must not be started in a loop).
SPARE_BACKOFF_S = 10.0
_WATCH_QUEUE = 10_000
_OVERFLOW = object()


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _api_error(status: int, reason: str, message: str) -> ApiException:
    """The store's refusal as the API error the reconciler already handles."""
    err = ApiException(status=status, reason=reason)
    err.body = json.dumps({"message": message}).encode()
    return err


def _matches(labels: Mapping[str, str], selector: str | None) -> bool:
    """A label selector of ``k=v`` and ``k`` (exists) terms, comma-separated."""
    for term in (selector or "").split(","):
        term = term.strip()
        if not term:
            continue
        key, sep, value = term.partition("=")
        if sep and labels.get(key) != value:
            return False
        if not sep and key not in labels:
            return False
    return True


def _alive(record: Mapping[str, Any]) -> bool:
    """The process of a pid file is still the one we started (pids are reused)."""
    try:
        proc = psutil.Process(int(record["pid"]))
        if abs(proc.create_time() - float(record["create_time"])) > 0.05:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


class LocalCluster:
    """One env's TrainingJobs on this machine.

    ``runs_pods``: this instance is the platform's node agent (the operator): it starts
    pending pods, follows their processes and feeds watches. The `job` commands use an
    instance that only reads and writes job objects.
    """

    rendezvous_host: str | None = "127.0.0.1"

    def __init__(
        self,
        root: Path,
        adapter: WorkloadAdapter,
        *,
        runs_pods: bool = False,
        base_env: Mapping[str, str] | None = None,
        enforcement: Enforcement = Enforcement.NONE,
        poll_s: float = 0.25,
        python: str = sys.executable,
    ) -> None:
        self.store = JobStore(root)
        self.adapter = adapter
        self.namespace = NAMESPACE
        self.runs_pods = runs_pods
        self.base_env = dict(base_env or {})
        self.enforcement = enforcement
        self.poll_s = poll_s
        self.python = python
        self._shims: dict[str, subprocess.Popen[bytes]] = {}
        #: spares asked to end, and when a role's spare last ended on its own
        self._ending_spares: set[str] = set()
        self._spare_failed: dict[tuple[str, str], float] = {}
        self._seen: dict[str, dict[str, tuple[str, dict[str, Any]]]] = {"jobs": {}, "pods": {}}
        self._subs: dict[str, set[asyncio.Queue[Any]]] = {"jobs": set(), "pods": set()}
        self._poller: asyncio.Task[None] | None = None

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        if self.runs_pods and self._poller is None:
            adopted = [n for n, r in self._pid_records().items() if _alive(r)]
            if adopted:
                log.warning("local platform: adopted %d running node(s): %s", len(adopted), adopted)
            kept = [n for n, (_, alive) in self._spares().items() if alive]
            if kept:
                log.warning("local platform: adopted %d warm spare(s): %s", len(kept), kept)
            self._scan()
            self._poller = asyncio.create_task(self._poll(), name="local.poller")

    async def stop(self, *, end_pods: bool) -> None:
        """Stop following; with ``end_pods`` end every node's processes and forget the pods
        (the job objects stay: a later operator starts their pods again, and a job that
        checkpoints resumes)."""
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None
        if end_pods:
            await self._end_all()

    async def __aenter__(self) -> LocalCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop(end_pods=False)

    # -- jobs -----------------------------------------------------------------------------

    async def list_jobs(self) -> tuple[list[dict[str, Any]], str]:
        return self.store.list(), "0"

    async def get_job(self, name: str) -> dict[str, Any] | None:
        try:
            return self.store.get(name)
        except StoreInvalid:
            return None

    async def create_job(self, body: dict[str, Any]) -> dict[str, Any]:
        body = with_rendezvous_ports(body)
        try:
            return self.store.create(body)
        except StoreConflict as e:
            raise _api_error(409, "Conflict", str(e)) from None
        except StoreInvalid as e:
            raise _api_error(422, "Invalid", str(e)) from None

    async def patch_job(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._patch(name, body, status=False)

    async def patch_job_status(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._patch(name, body, status=True)

    def _patch(self, name: str, body: dict[str, Any], *, status: bool) -> dict[str, Any]:
        try:
            return self.store.patch(name, body, status=status)
        except StoreConflict as e:
            raise _api_error(409, "Conflict", str(e)) from None
        except StoreNotFound as e:
            raise _api_error(404, "NotFound", str(e)) from None

    async def delete_job(self, name: str) -> bool:
        try:
            return self.store.delete(name)
        except StoreInvalid:
            return False

    # -- pods -----------------------------------------------------------------------------

    def _pod_dir(self, name: str) -> Path:
        return self.store.pods_dir / name

    async def list_pods(self, selector: str | None = None) -> tuple[list[dict[str, Any]], str]:
        pods = [p for p in self._pods().values() if _matches(p["metadata"]["labels"], selector)]
        return pods, "0"

    async def create_pod(self, manifest: dict[str, Any]) -> bool:
        """False when the pod exists: names are decided, so a repeat is the same pod."""
        meta = manifest["metadata"]
        name = meta["name"]
        pod_dir = self._pod_dir(name)
        try:
            pod_dir.mkdir(parents=True)
        except FileExistsError:
            return False
        pod = json.loads(json.dumps(manifest))
        pod["metadata"].update(uid=str(uuid.uuid4()), namespace=NAMESPACE, creationTimestamp=_now())
        try:
            spec = self._shim_spec(pod)
        except (QuantityError, ValueError, KeyError) as e:
            shutil.rmtree(pod_dir, ignore_errors=True)
            raise _api_error(422, "Invalid", f"pod {name}: {e}") from None
        if self.runs_pods and self._admit_spare(name, pod, spec):
            return True
        (pod_dir / shim.SPEC).write_text(json.dumps(spec))
        write_json(pod_dir / POD, pod)
        if self.runs_pods:
            self._start(name)
        return True

    async def delete_pod(self, name: str, grace_period_s: int | None = None) -> bool:
        """The node's shim gets SIGTERM and ends it within the pod's own grace period
        (its spec's terminationGracePeriodSeconds, which is what ``grace_period_s`` is
        made of too)."""
        pod_dir = self._pod_dir(name)
        pod = read_json(pod_dir / POD)
        if pod is None:
            return False
        if not pod["metadata"].get("deletionTimestamp"):
            pod["metadata"]["deletionTimestamp"] = _now()
            write_json(pod_dir / POD, pod)
        self._terminate(name)
        return True

    # -- services -------------------------------------------------------------------------
    # Nodes here rendezvous at 127.0.0.1 (``rendezvous_host``), so the reconciler asks for
    # no Service; these answer as a cluster without any would.

    async def list_services(self, selector: str) -> list[dict[str, Any]]:
        return []

    async def create_service(self, manifest: dict[str, Any]) -> bool:
        return False

    async def delete_service(self, name: str) -> bool:
        return False

    def _shim_spec(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        """What the shim runs: the first container's command, its env on top of the
        platform's, in the job's directory, with the node's memory as its limit."""
        container = pod["spec"]["containers"][0]
        command = [*(container.get("command") or []), *(container.get("args") or [])]
        if not command:
            raise ValueError("its first container has no command: nothing to run locally")
        env = dict(self.base_env)
        for c in pod["spec"]["containers"]:
            for var in c.get("env") or []:
                if "value" in var:
                    env[var["name"]] = str(var["value"])
        job = self.store.get(pod["metadata"]["labels"][LABEL_JOB]) or {}
        workdir = ((job.get("metadata") or {}).get("annotations") or {}).get(ANN_WORKDIR)
        memory = Resources.from_container(container).memory
        grace = pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
        return {
            "name": pod["metadata"]["name"],
            "command": command,
            "env": env,
            "cwd": workdir or os.getcwd(),
            "memory": memory,
            "enforcement": self.enforcement.value,
            "grace_s": float(grace),
        }

    def _start(self, name: str, pod_dir: Path | None = None) -> None:
        pod_dir = pod_dir or self._pod_dir(name)
        proc = subprocess.Popen(
            [self.python, "-m", "handlers.operator.local.shim", str(pod_dir)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(pod_dir / "shim.log", "ab"),  # noqa: SIM115 - the shim's own
            start_new_session=True,  # a node outlives the operator; it is re-adopted
        )
        try:
            created = psutil.Process(proc.pid).create_time()
        except psutil.Error:
            created = 0.0
        write_json(pod_dir / PID, {"pid": proc.pid, "create_time": created})
        self._shims[name] = proc
        log.info("local platform: started pod %s (pid %d)", name, proc.pid)

    def _terminate(self, name: str) -> None:
        record = read_json(self._pod_dir(name) / PID)
        if record is not None and _alive(record):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(record["pid"]), signal.SIGTERM)

    def _remove(self, name: str) -> None:
        """A pod goes; its log stays (``logs/<pod>.log``), as a user wants after a failure."""
        pod_dir = self._pod_dir(name)
        logs = self.store.root / "logs"
        logs.mkdir(exist_ok=True)
        with contextlib.suppress(OSError):
            os.replace(pod_dir / shim.LOG, logs / f"{name}.log")
        self._forget_admission(pod_dir)
        shutil.rmtree(pod_dir, ignore_errors=True)

    # -- warm spares ----------------------------------------------------------------------

    @property
    def _spares_dir(self) -> Path:
        return self.store.root / spares.SPARES

    def _admission_file(self, spare: str) -> Path:
        return self.store.root / spares.ADMISSIONS / f"{spare}.json"

    def _forget_admission(self, node_dir: Path) -> None:
        record = read_json(node_dir / spares.SPARE)
        if record is not None:
            with contextlib.suppress(OSError):
                self._admission_file(str(record["name"])).unlink()

    def _spares(self) -> dict[str, tuple[spares.SpareKey, bool]]:
        """Every spare: what it was started for, and whether it still runs."""
        out: dict[str, tuple[spares.SpareKey, bool]] = {}
        if not self._spares_dir.is_dir():
            return out
        for spare_dir in sorted(self._spares_dir.iterdir()):
            record, pid = read_json(spare_dir / spares.SPARE), read_json(spare_dir / PID)
            if record is None:
                continue
            running = pid is not None and _alive(pid) and not (spare_dir / shim.EXIT).exists()
            out[spare_dir.name] = (spares.SpareKey.from_record(record), running)
        return out

    def _admit_spare(self, name: str, pod: dict[str, Any], spec: dict[str, Any]) -> bool:
        """A warm spare becomes the pod ``name`` (see ``spares.py``); False when none fits."""
        labels = pod["metadata"].get("labels") or {}
        if LABEL_JOB_UID not in labels or LABEL_ROLE not in labels:
            return False
        key = spares.SpareKey.of(labels[LABEL_JOB_UID], labels[LABEL_ROLE], spec)
        ending = self._ending_spares
        running = {n: k for n, (k, alive) in self._spares().items() if alive and n not in ending}
        spare = spares.take(running, key)
        if spare is None:
            return False
        pod_dir = self._pod_dir(name)
        try:
            os.rename(self._spares_dir / spare, pod_dir)  # onto the empty dir just made
        except OSError as err:
            log.warning("local platform: spare %s not admitted as %s: %s", spare, name, err)
            return False
        write_json(pod_dir / POD, pod)
        admit = self._admission_file(spare)
        admit.parent.mkdir(parents=True, exist_ok=True)
        write_json(admit, spares.admission(name, spec))
        log.info("local platform: pod %s admitted warm spare %s", name, spare)
        return True

    def _keep_spares(self, jobs: list[dict[str, Any]], pods: dict[str, dict[str, Any]]) -> None:
        """As many running spares per in-place role as it asks for; none for a job that
        ended or is gone, nor one started for what a pod of the role no longer runs."""
        views = []
        for obj in jobs:
            with contextlib.suppress(InvalidJob, KeyError, TypeError, ValueError):
                views.append(self.adapter.parse(obj))
        wanted = spares.wanted(views)
        by_uid = {v.uid: v for v in views}
        current: dict[tuple[str, str], spares.SpareKey] = {}
        for (uid, role), _ in wanted.items():
            template = self._template(pods, uid, role)
            if template is not None:
                current[(uid, role)] = spares.SpareKey.of(uid, role, template[1])
        keep: dict[tuple[str, str], int] = {}
        now = asyncio.get_running_loop().time()
        for name, (key, running) in self._spares().items():
            spare_dir = self._spares_dir / name
            where = (key.job_uid, key.role)
            if not running:
                if name not in self._ending_spares:
                    log.warning("local platform: warm spare %s ended on its own", name)
                    self._spare_failed[where] = now
                self._ending_spares.discard(name)
                self._forget_admission(spare_dir)
                shutil.rmtree(spare_dir, ignore_errors=True)
                continue
            if name in self._ending_spares:
                continue
            if current.get(where) != key or keep.get(where, 0) >= wanted.get(where, 0):
                self._end_spare(name)
                continue
            keep[where] = keep.get(where, 0) + 1
        for where, count in wanted.items():
            if where not in current or keep.get(where, 0) >= count:
                continue
            failed = self._spare_failed.get(where)
            if failed is not None and now - failed < SPARE_BACKOFF_S:
                continue
            template = self._template(pods, *where)
            if template is not None:
                self._start_spare(by_uid[where[0]].name, current[where], template[1])

    def _template(
        self, pods: dict[str, dict[str, Any]], uid: str, role: str
    ) -> tuple[str, dict[str, Any]] | None:
        """A pod of the role to make spares of (its shim spec), None before there is one."""
        for name, pod in sorted(pods.items()):
            labels = pod["metadata"].get("labels") or {}
            if labels.get(LABEL_JOB_UID) != uid or labels.get(LABEL_ROLE) != role:
                continue
            if pod["metadata"].get("deletionTimestamp"):
                continue
            spec = read_json(self._pod_dir(name) / shim.SPEC)
            if spec is not None:
                return name, spec
        return None

    def _start_spare(self, job: str, key: spares.SpareKey, template: dict[str, Any]) -> None:
        name = spares.spare_name(job, key.role)
        spare_dir = self._spares_dir / name
        spare_dir.mkdir(parents=True)
        spec = spares.spare_spec(template, name, self._admission_file(name))
        (spare_dir / shim.SPEC).write_text(json.dumps(spec))
        write_json(spare_dir / spares.SPARE, {"name": name, **key.as_record()})
        self._start(name, spare_dir)
        log.info("local platform: started warm spare %s of %s/%s", name, job, key.role)

    def _end_spare(self, name: str) -> None:
        record = read_json(self._spares_dir / name / PID)
        self._ending_spares.add(name)
        if record is not None and _alive(record):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(record["pid"]), signal.SIGTERM)

    def _pid_records(self) -> dict[str, dict[str, Any]]:
        out = {}
        for pod_dir in self.store.pods_dir.iterdir():
            record = read_json(pod_dir / PID)
            if record is not None:
                out[pod_dir.name] = record
        return out

    def _pods(self) -> dict[str, dict[str, Any]]:
        """Every pod with its status as its process tells it now."""
        out: dict[str, dict[str, Any]] = {}
        for pod_dir in sorted(self.store.pods_dir.iterdir()):
            pod = read_json(pod_dir / POD)
            if pod is not None:
                pod["status"] = self._status(pod_dir)
                out[pod_dir.name] = pod
        return out

    def _status(self, pod_dir: Path) -> dict[str, Any]:
        ended = read_json(pod_dir / shim.EXIT)
        record = read_json(pod_dir / PID)
        name = "main"
        if ended is not None:
            phase = "Succeeded" if ended["exitCode"] == 0 else "Failed"
            state = {
                "terminated": {"exitCode": ended["exitCode"], "reason": ended.get("reason", "")}
            }
            return {"phase": phase, "containerStatuses": [{"name": name, "state": state}]}
        if record is None:
            return {"phase": "Pending"}
        if not _alive(record):
            # The shim itself was killed: the node's ending is unknown, and its
            # processes were ended with it or by it.
            state = {"terminated": {"exitCode": 255, "reason": "NodeLost"}}
            return {"phase": "Failed", "containerStatuses": [{"name": name, "state": state}]}
        status: dict[str, Any] = {"name": name, "state": {"running": {}}}
        if (pod_dir / shim.OOM).exists():
            status["lastState"] = {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}
        return {"phase": "Running", "containerStatuses": [status]}

    # -- watches --------------------------------------------------------------------------

    async def watch(
        self, kind: str, resource_version: str, timeout_s: int
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Every current object, then the changes the poller sees, until ``timeout_s``.
        A watcher that falls too far behind gets a 410, as on a cluster: list again."""
        queue: asyncio.Queue[Any] = asyncio.Queue(_WATCH_QUEUE)
        self._subs[kind].add(queue)
        try:
            current = self.store.list() if kind == "jobs" else list(self._pods().values())
            for obj in current:
                yield "MODIFIED", obj
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            while (left := deadline - loop.time()) > 0:
                try:
                    item = await asyncio.wait_for(queue.get(), left)
                except TimeoutError:
                    return
                if item is _OVERFLOW:
                    raise _api_error(410, "Gone", "the watch fell behind; list again")
                yield item
        finally:
            self._subs[kind].discard(queue)

    def _emit(self, kind: str, typ: str, obj: dict[str, Any]) -> None:
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
        jobs = {o["metadata"]["name"]: o for o in self.store.list()}
        self._diff("jobs", jobs, lambda o: str(o["metadata"]["resourceVersion"]))
        pods = self._pods()
        if self.runs_pods:
            self._keep_spares(list(jobs.values()), pods)
        for name, pod in list(pods.items()):
            phase = pod["status"]["phase"]
            deleting = bool(pod["metadata"].get("deletionTimestamp"))
            if deleting and phase != "Running":
                self._terminate(name)  # not started yet, or already ended: nothing runs
                self._remove(name)
                del pods[name]
            elif phase == "Pending" and not deleting and self.runs_pods:
                self._start(name)
                pods[name]["status"] = self._status(self._pod_dir(name))
        self._diff("pods", pods, lambda o: json.dumps(o, sort_keys=True))

    def _diff(self, kind: str, now: dict[str, dict[str, Any]], version: Any) -> None:
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
        kept = list(self._spares())
        for name in kept:
            self._end_spare(name)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            if not any(_alive(r) for r in self._pid_records().values()) and not any(
                alive for _, alive in self._spares().values()
            ):
                break
            await asyncio.sleep(0.2)
        for name in names:
            self._remove(name)
        for name in kept:
            self._forget_admission(self._spares_dir / name)
            shutil.rmtree(self._spares_dir / name, ignore_errors=True)
        self._ending_spares.clear()
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


__all__ = ["ANN_WORKDIR", "LocalCluster"]
