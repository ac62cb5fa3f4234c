"""The hosts platform as the platform port: an env's TrainingJobs on plain machines, each
with an agent (handlers.agent) that the operator talks to only over the bus.

Jobs are the local platform's typed job files (handlers.operator.local.store.JobStore,
under the operator's data dir, shared with the `job` commands). A pod is a record in a
directory of its own (``pod.json``: its job, node, resources, what it runs, and where it
was placed), and a process tree on the host it was placed on. The operator:

- follows every agent's reports (``<env>.hosts.reports``, schemas.hosts.HostReported):
  a host's slots, its address and its pods' states. It times them itself, on its own
  clock: a host whose reports stop for ``lost_after_s`` is *lost*, its pods are Failed
  (NodeLost, exit 255) and the reconciler's own rules replace them (an elastic job goes on
  smaller until there is room again);
- places pending pods on live hosts with free slots (``placement.place``: a job's pods
  as a gang, spread over hosts) and tells each host what it should run in its orders
  (``<env>.hosts.orders``, keyed by host: the whole picture each time);
- derives each pod's phase from its host's latest report, and writes what it saw on the
  pod's record so the `job` commands (another process) can show it, with its host.

An elastic role's pods meet at the rendezvous hosted by its host rank's pod: on the
address its host's agent reports (``rendezvous_host``), filled into a pod's command and
variables once that pod is placed. The capacity is the live agents' slots, per host.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka import ConsumerRecord
from aiokafka.errors import KafkaError

from dlrover_events.bus.compacted import CompactedFollower
from dlrover_events.bus.dead_letters import dead_letter, log_dead_letters, send_dead_letters
from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import HOSTS_REPORTS, topic
from dlrover_events.lifecycle import cancel_and_wait
from dlrover_events.pods.files import read_json, write_json
from dlrover_events.settings import Settings
from handlers.operator.document import trainingjob
from handlers.operator.hosts.placement import Room, Wanted, free_slots, never_fits, place
from handlers.operator.local.cluster import with_rendezvous_ports
from handlers.operator.local.store import NAMESPACE, JobStore
from handlers.operator.platform.api import HostChange, JobEntry, WatchEvent, WatchKind
from handlers.operator.platform.bodies import (
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
from handlers.operator.platform.errors import Expired, Invalid
from handlers.operator.reconcile import planning
from handlers.operator.reconcile.launch import DLROVER_C10D, launch
from schemas.codec import CodecError, check_env, decode
from schemas.dlq import DeadLetter, FailureKind
from schemas.hosts import AgentPod, HostOrders, HostReported, OrderedPod
from schemas.plans import NotApplied, ScalePlan

log = logging.getLogger(__name__)

POD = "pod.json"
MAIN = "main"
DEFAULT_GRACE_S = 30.0
#: Stands for the rendezvous host's address in a pod's command and variables until the
#: pod is ordered (its host rank's pod placed by then): the address is its host's.
RENDEZVOUS = "{dlrover-events:rendezvous-host}"
#: Stands for the address of the pod's own host: torchrun's ``--local-addr``, so the
#: other nodes reach its workers there, not at whatever its host name resolves to.
NODE_ADDRESS = "{dlrover-events:node-address}"
#: A host's reports from two agents alternating within this many heartbeats: two
#: machines report under one name.
DUPLICATE_HEARTBEATS = 3
_WATCH_QUEUE = 10_000
_OVERFLOW = object()
#: What a pod's process learns of where it runs (the SDK's samples may carry it).
HOST_ENV = "DLROVER_EVENTS_NODE_HOST"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def slots_of(resources: Resources) -> int:
    """The slots a pod takes: the GPUs its resources name, else one."""
    return resources.gpu or 1


@dataclass
class Seen:
    """What the operator knows of one host: its latest report, and when (its own clock)."""

    report: HostReported
    at: float
    #: the agent run reporting before the latest one, and when it last did
    other_agent: str | None = None
    other_at: float = 0.0
    #: until when two agents are taken to report under this name
    duplicate_until: float = 0.0
    pods: dict[str, AgentPod] = field(default_factory=dict)


class HostsCluster:
    """One env's TrainingJobs on plain hosts.

    ``runs_pods``: this instance is the operator's (it follows the agents, places pods and
    orders them); the `job` commands use one that only reads and writes the files."""

    name = "hosts"
    creates_pods = True
    can_suspend = True
    #: the pods run the hosts' torchrun beside the SDK (the agent's install)
    rendezvous_backend = DLROVER_C10D

    def __init__(
        self,
        root: Path,
        *,
        settings: Settings | None = None,
        env: str = "",
        runs_pods: bool = False,
        base_env: Mapping[str, str] | None = None,
        poll_s: float = 0.25,
        lost_after_s: float = 6.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = JobStore(root)
        self.namespace = NAMESPACE
        self.settings = settings
        self.env = env
        self.runs_pods = runs_pods
        self.base_env = dict(base_env or {})
        self.poll_s = poll_s
        self.lost_after_s = lost_after_s
        self.clock = clock
        self.hosts: dict[str, Seen] = {}
        #: hosts declared lost (and when), so each loss is said once
        self.lost: dict[str, float] = {}
        #: no host is judged lost before this (every host went quiet at once: ``_judge``)
        self._hold_until = 0.0
        self._said_orders: dict[str, list[OrderedPod]] = {}
        self._said_hosts: dict[str, Host] = {}
        self._letters: list[DeadLetter] = []
        self._warned: set[str] = set()
        self._seen: dict[str, dict[str, tuple[object, Any]]] = {"jobs": {}, "pods": {}}
        self._subs: dict[str, set[asyncio.Queue[Any]]] = {
            "jobs": set(),
            "pods": set(),
            "hosts": set(),
        }
        self._poller: asyncio.Task[None] | None = None
        self._following: asyncio.Task[None] | None = None
        self._follower: CompactedFollower | None = None
        self._producer: Producer | None = None
        self._stop = asyncio.Event()

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self, catch_up_s: float = 30.0) -> None:
        """Follow the agents (their reports read to the end first, so no host is judged
        on half of them), then scan, place and order every ``poll_s``."""
        if not self.runs_pods or self._poller is not None:
            return
        assert self.settings is not None, "an operator's platform needs the bus"
        self._stop.clear()
        self._producer = Producer(self.settings)
        await self._producer.start()
        self._follower = CompactedFollower(
            self.settings,
            topic(self.env, HOSTS_REPORTS),
            self._take,
            client_id="operator-hosts",
            poll_ms=200,
        )
        await self._follower.start()
        self._following = asyncio.create_task(
            self._follower.run(self._stop), name=f"{self.env}.hosts.reports"
        )
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(catch_up_s):
                await self._follower.caught_up.wait()
        await self._step()
        self._poller = asyncio.create_task(self._poll(), name=f"{self.env}.hosts.poller")

    async def stop(self, *, end_pods: bool = False) -> None:
        """Stop following. ``end_pods``: order every host to stop its pods first and wait
        (bounded) for them to end; the jobs stay, and a later operator starts them again."""
        if end_pods and self._poller is not None:
            for pod_dir in self._pod_dirs():
                record = read_json(pod_dir / POD)
                if record is not None and not record.get("deleting"):
                    record["deleting"] = _now()
                    write_json(pod_dir / POD, record)
            for _ in range(round(60 / self.poll_s)):  # the hosts say it: polled, bounded
                if not self._pod_dirs():
                    break
                await asyncio.sleep(self.poll_s)
        self._stop.set()
        await cancel_and_wait(self._poller, self._following)
        self._poller = self._following = None
        if self._follower is not None:
            await self._follower.stop()
            self._follower = None
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    async def __aenter__(self) -> HostsCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- reports in -----------------------------------------------------------------------

    def _take(self, records: list[ConsumerRecord]) -> None:
        """Each report kept as its host's latest, seen now (a report read while catching
        up is as old as it says: a host that stopped before the operator started is not
        taken for alive)."""
        caught_up = self._follower is not None and self._follower.caught_up.is_set()
        for record in records:
            if record.value is None:
                continue
            try:
                event = check_env(decode(record.value), self.env, record.topic)
                if not isinstance(event, HostReported):
                    raise CodecError(FailureKind.INVALID, f"a {event.type}, not a host's report")
                if record.key != event.host.encode():
                    raise CodecError(
                        FailureKind.INVALID,
                        f"a report of host {event.host!r} keyed {record.key!r}: a host's "
                        "reports are keyed by its name",
                    )
            except CodecError as e:
                self._letters.append(dead_letter(self.env, record, e.kind, e.message, "operator"))
                continue
            now = self.clock()
            age = 0.0 if caught_up else max(0.0, time.time() - event.occurred_at.timestamp())
            self._seen_report(event, now - age)

    def _seen_report(self, report: HostReported, at: float) -> None:
        before = self.hosts.get(report.host)
        seen = Seen(report, at, pods={p.name: p for p in report.pods})
        if before is not None:
            seen.duplicate_until = before.duplicate_until
            if before.report.agent_id != report.agent_id:
                # a new run (a restarted agent), or a second machine of the same name: two
                # runs alternating is the second
                if (
                    before.other_agent == report.agent_id
                    and at - before.other_at < DUPLICATE_HEARTBEATS * report.heartbeat_s
                ):
                    seen.duplicate_until = at + self.lost_after_s
                    if report.host not in self._warned:
                        self._warned.add(report.host)
                        log.error(
                            "hosts platform: two agents report as host %s (at %s and %s): "
                            "it takes no new pods until one is renamed",
                            report.host,
                            before.report.address,
                            report.address,
                        )
                seen.other_agent, seen.other_at = before.report.agent_id, before.at
            else:
                seen.other_agent, seen.other_at = before.other_agent, before.other_at
        self.hosts[report.host] = seen
        if report.host in self.lost and self.alive(report.host):
            del self.lost[report.host]
            log.warning(
                "hosts platform: host %s is back (%d slots)", report.host, len(report.slots)
            )

    def alive(self, host: str) -> bool:
        """Reported within ``lost_after_s``; or not yet judged lost while the operator holds
        its judgement (every host quiet at once: see ``_judge``)."""
        seen = self.hosts.get(host)
        if seen is None:
            return False
        now = self.clock()
        return now - seen.at <= self.lost_after_s or (
            host not in self.lost and now < self._hold_until
        )

    def _judge(self, now: float) -> None:
        """Declare lost the hosts quiet for ``lost_after_s``, unless every host that was
        live went quiet at once: two machines or more do not fail in the same second as
        often as this operator's fetch stalls or the bus is away (a loaded machine, a
        broker restart), and declaring them all lost would end every job. Then no host is
        judged until ``lost_after_s`` after the reports come again (Kubernetes' node
        controller stops evicting in a full disruption for the same reason)."""
        live = {h: s for h, s in self.hosts.items() if h not in self.lost}
        quiet = [h for h, s in live.items() if now - s.at > self.lost_after_s]
        if len(live) >= 2 and len(quiet) == len(live):
            if now >= self._hold_until:
                log.warning(
                    "hosts platform: none of %d hosts has reported for %.1f s: the bus or "
                    "this operator is behind, not every host down; none is declared lost "
                    "until they report again",
                    len(live),
                    self.lost_after_s,
                )
            self._hold_until = now + self.lost_after_s
        for host, seen in self.hosts.items():
            if not self.alive(host) and host not in self.lost:
                self.lost[host] = now
                log.warning(
                    "hosts platform: host %s lost: no report for %.1f s (its pods are gone)",
                    host,
                    now - seen.at,
                )

    def schedulable(self, host: str) -> bool:
        seen = self.hosts.get(host)
        return self.alive(host) and seen is not None and self.clock() >= seen.duplicate_until

    # -- jobs -----------------------------------------------------------------------------

    async def list_jobs(self) -> tuple[list[JobEntry], str]:
        return self.store.list(), "0"

    async def get_job(self, name: str) -> JobEntry | None:
        try:
            return self.store.get(name)
        except Invalid:
            return None

    async def submit_job(self, document: Mapping[str, Any]) -> JobView:
        """Each elastic role that names no rendezvous port gets a free one now (pods of
        several jobs may share a host)."""
        return self.store.create(with_rendezvous_ports(document))

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

    def _pod_dirs(self) -> list[Path]:
        return [d for d in sorted(self.store.pods_dir.iterdir()) if (d / POD).exists()]

    async def list_pods(self, job: str | None = None) -> tuple[list[PodView], str]:
        pods = self._views() if self.runs_pods else self._recorded()
        return [p for p in pods.values() if job is None or p.job == job], "0"

    async def create_pod(self, job: JobView, pod: NewPod, env: str) -> bool:
        """A pod record, pending until the next scan places it; False when it exists."""
        name = pod.name(job.name)
        pod_dir = self._pod_dir(name)
        try:
            pod_dir.mkdir(parents=True)
        except FileExistsError:
            return False
        role = job.roles[pod.role]
        runs = launch(job, pod, env, RENDEZVOUS, self.rendezvous_backend, forked=True)
        command = runs.command or role.command
        if not command:
            shutil.rmtree(pod_dir, ignore_errors=True)
            raise Invalid(f"pod {name}: its container has no command: nothing for a host to run")
        if runs.command and runs.command[0] == "torchrun" and "--standalone" not in runs.command:
            command = (command[0], f"--local-addr={NODE_ADDRESS}", *command[1:])
        resources = pod.resources.over(role.template_resources)
        host_rank = role.elastic.host_rank if role.elastic is not None else None
        record = {
            "name": name,
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
            "runs": {
                "command": list(command),
                "variables": {**self.base_env, **role.env, **runs.env},
                "cwd": self._workdir(job.name),
                "memory": resources.memory,
                "grace_s": float(DEFAULT_GRACE_S if role.grace_s is None else role.grace_s),
            },
            #: the pod (by rank) of its role that hosts the rendezvous (None: none)
            "rendezvous_rank": host_rank,
            "host": None,
            "slots": [],
            "seen": None,
        }
        write_json(pod_dir / POD, record)
        return True

    def _workdir(self, job: str) -> str | None:
        obj = self.store.submitted(job) or {}
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        workdir = annotations.get(trainingjob.ANN_WORKDIR)
        return str(workdir) if workdir else None

    async def delete_pod(self, name: str, grace_s: int | None = None) -> bool:
        """Its host is ordered to stop it (SIGTERM, then its own grace period); it goes
        once its host says it ended, or at once where it runs nowhere (not placed yet, or
        its host lost)."""
        pod_dir = self._pod_dir(name)
        record = read_json(pod_dir / POD)
        if record is None:
            return False
        if not record.get("deleting"):
            record["deleting"] = _now()
            if grace_s is not None:
                record["runs"]["grace_s"] = float(grace_s)
            write_json(pod_dir / POD, record)
        return True

    async def prepare(self, job: JobView) -> None:
        return None

    async def release(self, job: str) -> None:
        return None

    async def keep_spares(self, job: JobView, pods: Sequence[PodView], env: str) -> None:
        return None  # no warm spares on plain hosts (capabilities.spares is False)

    # -- pod states -----------------------------------------------------------------------

    def _view(self, record: Mapping[str, Any], phase: str, term: Termination | None) -> PodView:
        raw = record.get("resources") or {}
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
            resources=Resources(
                cpu_milli=raw.get("cpu_milli"),
                memory=raw.get("memory"),
                gpu=raw.get("gpu"),
                gpu_type=raw.get("gpu_type"),
            ),
            termination=term,
            node_name=record.get("host"),
        )

    def _recorded(self) -> dict[str, PodView]:
        """Every pod as its record last said (the `job` commands: no agent to ask)."""
        out = {}
        for pod_dir in self._pod_dirs():
            record = read_json(pod_dir / POD)
            if record is None:
                continue
            seen = record.get("seen") or {}
            term = None
            if seen.get("exit_code") is not None:
                term = Termination(MAIN, int(seen["exit_code"]), str(seen.get("reason") or ""))
            out[pod_dir.name] = self._view(record, seen.get("phase") or PENDING, term)
        return out

    def _state(self, record: Mapping[str, Any]) -> tuple[str, Termination | None]:
        """A pod's phase as its host says now (see the module)."""
        host = record.get("host")
        if host is None:
            return PENDING, None
        if not self.alive(host):
            return FAILED, Termination(MAIN, 255, "NodeLost")
        got = self.hosts[host].pods.get(record["name"])
        if got is not None and got.uid is not None and got.uid != record["uid"]:
            got = None  # an earlier pod of its name, still going on its host
        if got is None:
            if (record.get("seen") or {}).get("phase") in (RUNNING, SUCCEEDED, FAILED):
                # its host ran it and knows it no more: its processes are gone
                return FAILED, Termination(MAIN, 255, "NodeLost")
            return PENDING, None
        if got.phase in (SUCCEEDED, FAILED):
            code = got.exit_code if got.exit_code is not None else 255
            return got.phase, Termination(MAIN, code, got.reason or "Error")
        if got.phase == RUNNING:
            if got.reason == "OOMKilled":
                return RUNNING, Termination(MAIN, 137, "OOMKilled")
            return RUNNING, None
        return PENDING, None

    def _views(self) -> dict[str, PodView]:
        out = {}
        for pod_dir in self._pod_dirs():
            record = read_json(pod_dir / POD)
            if record is None:
                continue
            phase, term = self._state(record)
            out[pod_dir.name] = self._view(record, phase, term)
        return out

    # -- the operator's loop --------------------------------------------------------------

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self._step()
            except asyncio.CancelledError:
                raise
            except Exception:  # a half-written file, a broker away: look again soon
                log.exception("hosts platform: scan failed")

    async def _step(self) -> None:
        orders = self._scan()
        await self._send(orders)

    def _scan(self) -> dict[str, list[OrderedPod]]:
        """Judge hosts, say pods' states, remove deleted pods that run nowhere, place
        pending ones, and decide each host's orders."""
        self._judge(self.clock())
        self._say_hosts()
        jobs = {j.name: j for j in self.store.list()}
        self._diff("jobs", jobs, lambda j: j.resource_version)
        records: dict[str, dict[str, Any]] = {}
        pods: dict[str, PodView] = {}
        for pod_dir in self._pod_dirs():
            record = read_json(pod_dir / POD)
            if record is None:
                continue
            phase, term = self._state(record)
            if record.get("deleting") and phase != RUNNING:
                # runs nowhere (an agent that gets it late stops what it was not ordered)
                shutil.rmtree(pod_dir, ignore_errors=True)
                continue
            said = {
                "phase": phase,
                "exit_code": None if term is None else term.exit_code,
                "reason": None if term is None else term.reason,
            }
            if record.get("seen") != said:
                record["seen"] = said
                write_json(pod_dir / POD, record)
            records[record["name"]] = record
            pods[record["name"]] = self._view(record, phase, term)
        self._place(records, pods)
        self._diff("pods", pods, lambda p: p)
        return self._orders(records)

    def _place(self, records: dict[str, dict[str, Any]], pods: Mapping[str, PodView]) -> None:
        slots = {
            h: [s.index for s in seen.report.slots]
            for h, seen in self.hosts.items()
            if self.schedulable(h)
        }
        holding = [
            (r["host"], r["slots"])
            for name, r in records.items()
            if r.get("host") is not None and not pods[name].finished
        ]
        free = free_slots(holding, slots)
        rooms = [Room(h, len(slots[h]), free[h]) for h in sorted(slots)]
        pending = [
            Wanted(name, r["job_uid"], slots_of(pods[name].resources), r["created"])
            for name, r in records.items()
            if r.get("host") is None and not r.get("deleting")
        ]
        for want in pending:
            if rooms and never_fits(want, rooms) and want.pod not in self._warned:
                self._warned.add(want.pod)
                log.error(
                    "hosts platform: pod %s asks for %d slots, more than any live host has "
                    "(at most %d): it waits for such a host",
                    want.pod,
                    want.slots,
                    max(r.slots for r in rooms),
                )
        for name, placed in place(pending, rooms).items():
            record = records[name]
            record["host"], record["slots"] = placed.host, list(placed.slots)
            write_json(self._pod_dir(name) / POD, record)
            log.info(
                "hosts platform: pod %s placed on %s (slots %s)", name, placed.host, placed.slots
            )

    def rendezvous_host(
        self, record: Mapping[str, Any], records: Mapping[str, Mapping[str, Any]]
    ) -> str | None:
        """The address of the host of the pod that hosts the rendezvous of ``record``'s role
        (None: it is not placed, or its host is not known)."""
        rank = record.get("rendezvous_rank")
        if rank is None:
            return ""
        for other in records.values():
            if (
                other["job_uid"] == record["job_uid"]
                and other["role"] == record["role"]
                and other["rank"] == rank
                and not other.get("deleting")
                and other.get("host") in self.hosts
            ):
                return self.hosts[other["host"]].report.address
        return None

    def _orders(self, records: Mapping[str, dict[str, Any]]) -> dict[str, list[OrderedPod]]:
        orders: dict[str, list[OrderedPod]] = {h: [] for h in self.hosts}
        for name, record in sorted(records.items()):
            host = record.get("host")
            if host is None or not self.alive(host):
                continue
            address = self.rendezvous_host(record, records)
            if address is None and not record.get("deleting"):
                continue  # its rendezvous host is not placed yet: it waits
            runs = record["runs"]
            fill = address or ""

            own = self.hosts[host].report.address

            def filled(text: str, fill: str = fill, own: str = own) -> str:
                return text.replace(RENDEZVOUS, fill).replace(NODE_ADDRESS, own)

            orders.setdefault(host, []).append(
                OrderedPod(
                    name=name,
                    uid=record["uid"],
                    command=[filled(a) for a in runs["command"]],
                    variables={
                        **{k: filled(v) for k, v in runs["variables"].items()},
                        HOST_ENV: host,
                    },
                    cwd=runs.get("cwd"),
                    slots=list(record.get("slots") or []),
                    memory=runs.get("memory"),
                    grace_s=float(runs.get("grace_s", DEFAULT_GRACE_S)),
                    deleting=bool(record.get("deleting")),
                )
            )
        return orders

    async def _send(self, orders: Mapping[str, list[OrderedPod]]) -> None:
        """Each host's orders, where they changed since last said."""
        assert self._producer is not None
        if self._letters:
            letters, self._letters = self._letters, []
            log_dead_letters(letters)
            await send_dead_letters(self._producer, letters)
        for host, pods in sorted(orders.items()):
            if self._said_orders.get(host) == pods:
                continue
            try:
                await self._producer.publish(
                    HostOrders(env=self.env, source="operator", host=host, pods=pods)
                )
            except KafkaError as e:
                log.warning("hosts platform: orders of host %s not sent: %s", host, e)
                continue
            self._said_orders[host] = pods

    # -- hosts (CapacitySource) -----------------------------------------------------------

    def _host(self, name: str, seen: Seen) -> Host:
        types = {s.name for s in seen.report.slots if s.name}
        return Host(
            name=name,
            gpus=len(seen.report.slots),
            schedulable=self.schedulable(name),
            gpu_type=types.pop() if len(types) == 1 else None,
            resource_version="0",
        )

    async def list_hosts(self) -> tuple[list[Host], str]:
        return [self._host(n, s) for n, s in sorted(self.hosts.items())], "0"

    def _say_hosts(self) -> None:
        now = {n: self._host(n, s) for n, s in self.hosts.items()}
        for name, host in now.items():
            before = self._said_hosts.get(name)
            if before != host:
                self._emit("hosts", "ADDED" if before is None else "MODIFIED", host)
        self._said_hosts = now

    async def watch_hosts(self, resource_version: str, timeout_s: int) -> AsyncIterator[HostChange]:
        """Every host as it is now, then what changed (one found, one lost or back), until
        ``timeout_s``."""
        current = [self._host(n, s) for n, s in sorted(self.hosts.items())]
        async for typ, obj in self._follow("hosts", current, timeout_s):
            yield typ, obj
        yield "BOOKMARK", Bookmark(resource_version)

    # -- what its jobs can express --------------------------------------------------------

    @property
    def capabilities(self) -> PlatformCapabilities:
        """Hosts of their own: no GPU type selected (a pod takes the slots it asks for on
        any host), no warm spares, suspend, any node replaced but an elastic role's
        rendezvous host (its agent holds the store the others meet at)."""
        return PlatformCapabilities(
            gpu_types=False,
            spares=False,
            suspend=self.can_suspend,
            migrates_nodes=True,
            replaces_rendezvous_host=False,
        )

    def plan_change(self, job: JobView, pods: Sequence[PodView], plan: ScalePlan) -> PlanChange:
        return planning.plan_change(job, pods, plan, self.capabilities)

    def not_applied(self, plan: ScalePlan) -> tuple[NotApplied, ...]:
        return trainingjob.plan_not_applied(plan, gpu_types=False)

    def outcome(self, job: JobView, pods: Sequence[PodView]) -> tuple[str | None, str]:
        return planning.outcome(job, pods)

    # -- watches --------------------------------------------------------------------------

    async def watch(
        self, kind: WatchKind, resource_version: str, timeout_s: int
    ) -> AsyncIterator[WatchEvent]:
        """Every current object, then the changes the scans see, until ``timeout_s``."""
        current: list[Any] = (
            (await self.list_jobs())[0] if kind == "jobs" else (await self.list_pods())[0]
        )
        async for item in self._follow(kind, current, timeout_s):
            yield item

    async def _follow(
        self, kind: str, current: Sequence[Any], timeout_s: int
    ) -> AsyncIterator[tuple[str, Any]]:
        queue: asyncio.Queue[Any] = asyncio.Queue(_WATCH_QUEUE)
        self._subs[kind].add(queue)
        try:
            for obj in current:
                yield "MODIFIED", obj
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            while (left := deadline - loop.time()) > 0:
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

    def _emit(self, kind: str, typ: str, obj: Any) -> None:
        for queue in self._subs[kind]:
            try:
                queue.put_nowait((typ, obj))
            except asyncio.QueueFull:
                with contextlib.suppress(asyncio.QueueEmpty):
                    queue.get_nowait()
                queue.put_nowait(_OVERFLOW)

    def _diff(self, kind: str, now: Mapping[str, Any], version: Callable[[Any], object]) -> None:
        seen = self._seen[kind]
        current = {name: (version(obj), obj) for name, obj in now.items()}
        for name, (ver, obj) in current.items():
            if name not in seen or seen[name][0] != ver:
                self._emit(kind, "ADDED" if name not in seen else "MODIFIED", obj)
        for name in set(seen) - set(current):
            self._emit(kind, "DELETED", seen[name][1])
        self._seen[kind] = current


__all__ = ["RENDEZVOUS", "HostsCluster", "slots_of"]
