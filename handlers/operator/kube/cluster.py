"""The platform port on a Kubernetes cluster: ``KubeCluster`` adapts the API server
(``client.KubeApi``: JSON dicts, ApiException) and a workload adapter (TrainingJob,
PyTorchJob) to handlers.operator.platform.api's typed calls and errors.

Everything Kubernetes-shaped stays on this side: objects are read into the port's views
by the workload adapter, the port's changes written back as its merge patches, a pod made
from its manifest, and an API error said as the port's error (404 ObjectNotFound, 409
Conflict, 400/403/422 Invalid, 410 Expired, anything else Unavailable) with the API
server's own message. An elastic job's pods meet at a headless Service per role, which
``prepare`` makes before them and ``release`` deletes after the job.

An in-place role's warm spares (``elastic.spares``) are pods of the role kept waiting,
which a new pod of the role admits instead of starting cold (``spares.py``); they are not
the job's nodes, and go with the job.

It suspends a job through its workload's field (TrainingJob ``spec.suspend``, PyTorchJob
``spec.runPolicy.suspend``), and is a ``CapacitySource``: the cluster's Nodes as hosts
(``nodes.parse_node``: allocatable GPUs, cordoned or NotReady ones not schedulable),
those of ``node_selector`` only when one is given.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

from kubernetes_asyncio.client.rest import ApiException

from dlrover_events.kube.api import api_error
from handlers.operator.kube import spares
from handlers.operator.kube.adapter import PodCreatingAdapter
from handlers.operator.kube.client import KubeApi
from handlers.operator.kube.experiment import with_owner
from handlers.operator.kube.experiments import owner_of
from handlers.operator.kube.nodes import DEFAULT_GPU_RESOURCE, parse_node
from handlers.operator.kube.pods import LABEL_JOB, LABEL_MANAGED_BY, MANAGED_BY
from handlers.operator.kube.trainingjob import service_changes
from handlers.operator.platform.api import HostChange, JobEntry, WatchEvent, WatchKind
from handlers.operator.platform.bodies import (
    Bookmark,
    Host,
    JobSpecChange,
    JobView,
    NewPod,
    OperatorJobStatus,
    PlanChange,
    PlatformCapabilities,
    PodView,
    UnreadableJob,
)
from handlers.operator.platform.errors import (
    Conflict,
    Expired,
    Invalid,
    InvalidJob,
    ObjectNotFound,
    PlatformError,
    Unavailable,
)
from schemas.plans import NotApplied, ScalePlan

log = logging.getLogger(__name__)

#: The API server's answer -> the port's error; any other status is Unavailable.
_ERRORS: Mapping[int, type[PlatformError]] = {
    404: ObjectNotFound,
    409: Conflict,
    400: Invalid,
    403: Invalid,
    422: Invalid,
    410: Expired,
}


def platform_error(e: ApiException) -> PlatformError:
    """An API error as the port says it, with the server's own message."""
    status = e.status if isinstance(e.status, int) else 0
    return _ERRORS.get(status, Unavailable)(api_error(e))


@contextlib.contextmanager
def _said_as_port_errors() -> Iterator[None]:
    try:
        yield
    except ApiException as e:
        raise platform_error(e) from None


def _owned_by(job: str) -> str:
    """Label selector of what this operator made for a job besides its pods."""
    return f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_JOB}={job}"


class KubeCluster:
    """One namespace's jobs of one kind, and their pods."""

    name = "Kubernetes"
    #: where elastic pods find their rendezvous store: None, the job's headless Service
    rendezvous_host: str | None = None

    def __init__(
        self,
        api: KubeApi,
        *,
        gpu_resource: str = DEFAULT_GPU_RESOURCE,
        gpu_type_label: str | None = None,
        node_selector: str | None = None,
    ) -> None:
        self.api = api
        self.workload = api.adapter
        self.namespace = api.namespace
        self.creates_pods = self.workload.creates_pods
        #: how Nodes read as hosts: the resource GPUs are counted in, the label naming
        #: their type, and which Nodes are the env's (a label selector; None: all)
        self.gpu_resource = gpu_resource
        self.gpu_type_label = gpu_type_label
        self.node_selector = node_selector or None
        #: (job uid, role) -> when a warm spare of it last ended on its own (monotonic)
        self._spare_ended: dict[tuple[str, str], float] = {}

    @property
    def host(self) -> str:
        """The API server's address, as an error message names it."""
        return str(self.api.api.configuration.host)

    def _entry(self, obj: Mapping[str, Any]) -> JobEntry:
        try:
            return self.workload.parse(obj)
        except InvalidJob as e:
            meta = obj.get("metadata") or {}
            return UnreadableJob(
                name=str(meta.get("name", "")),
                uid=str(meta.get("uid", "")),
                resource_version=str(meta.get("resourceVersion", "")),
                reason=str(e),
            )

    def _readable(self, obj: Mapping[str, Any], what: str) -> JobView:
        entry = self._entry(obj)
        if isinstance(entry, UnreadableJob):
            raise Invalid(f"{what}, but it does not read as a {self.workload.kind}: {entry.reason}")
        return entry

    # -- jobs -----------------------------------------------------------------------------

    async def list_jobs(self) -> tuple[list[JobEntry], str]:
        with _said_as_port_errors():
            items, version = await self.api.list_jobs()
        return [self._entry(o) for o in items], version

    async def get_job(self, name: str) -> JobEntry | None:
        with _said_as_port_errors():
            obj = await self.api.get_job(name)
        return None if obj is None else self._entry(obj)

    async def submit_job(self, document: Mapping[str, Any]) -> JobView:
        """The job made from its document. One the decisions cannot read is refused
        (Invalid) before it is made: the CRD's schema cannot say every rule (minReplicas
        over maxReplicas), and a refusal after the create left a job no one submitted."""
        try:
            self.workload.parse(document)
        except InvalidJob as e:
            raise Invalid(f"invalid {self.workload.kind}: {e}") from None
        with _said_as_port_errors():
            # a trial's job is owned by its Experiment resource, if it has one
            owner = await owner_of(self.api.api, self.namespace, document)
            body = dict(document) if owner is None else with_owner(document, owner)
            obj = await self.api.create_job(body)
        return self._readable(obj, f"{self.workload.kind.lower()} created")

    async def change_job(self, job: JobView, change: JobSpecChange) -> JobView:
        with _said_as_port_errors():
            obj = await self.api.patch_job(job.name, self.workload.job_patch(job, change))
        return self._readable(obj, f"{self.workload.kind.lower()} {job.name} changed")

    async def set_status(self, job: JobView, status: OperatorJobStatus) -> None:
        patch = self.workload.status_patch(status)
        if patch is not None:
            with _said_as_port_errors():
                await self.api.patch_job_status(job.name, patch)

    async def delete_job(self, name: str) -> bool:
        with _said_as_port_errors():
            return await self.api.delete_job(name)

    # -- pods -----------------------------------------------------------------------------

    async def list_pods(self, job: str | None = None) -> tuple[list[PodView], str]:
        selector = self.workload.job_pod_selector(job) if job is not None else None
        with _said_as_port_errors():
            items, version = await self.api.list_pods(selector)
        return [p for p in map(self.workload.parse_pod, items) if p is not None], version

    async def create_pod(self, job: JobView, pod: NewPod, env: str) -> bool:
        """The node's pod: a warm spare of its role admitted (``spares.py``), else a new
        pod of its decided name (False when that exists)."""
        if not isinstance(self.workload, PodCreatingAdapter):
            raise Invalid(f"a {self.workload.kind}'s pods are its own controller's to create")
        manifest = self.workload.pod_manifest(job, pod, env, rendezvous_host=self.rendezvous_host)
        with _said_as_port_errors():
            takes_spare = pod.role in spares.wanted(job, ended=False)
            if takes_spare and await self._admit(job, pod, manifest):
                return True
            return await self.api.create_pod(manifest)

    async def _admit(self, job: JobView, pod: NewPod, manifest: Mapping[str, Any]) -> bool:
        """A warm spare made as ``manifest`` becomes the node's pod; False when none fits
        (or each that did changed meanwhile: another look admitted or deleted it)."""
        items, _ = await self.api.list_pods(spares.selector(job.name))
        found = [s for s in map(spares.parse_spare, items) if s is not None]
        for spare in spares.candidates(found, job, pod.role, spares.spare_key(manifest)):
            try:
                await self.api.patch_pod(spare.name, spares.admission_patch(spare, pod, manifest))
            except ApiException as e:
                if e.status in (404, 409):
                    continue
                raise
            log.info(
                "pod %s (%s rank %d) is warm spare %s, admitted",
                pod.name(job.name),
                pod.role,
                pod.rank,
                spare.name,
            )
            return True
        return False

    async def keep_spares(self, job: JobView, pods: Sequence[PodView], env: str) -> None:
        """As many spares per in-place role as it asks for (``spares.keep``), made as a pod
        of the role is made now; none once the job ended or is suspended. A role whose
        spare ended on its own gets the next one SPARE_BACKOFF_S later at the earliest."""
        roles = spares.in_place_roles(job)
        if not roles or not isinstance(self.workload, PodCreatingAdapter):
            return
        want = spares.wanted(job, ended=self.outcome(job, pods)[0] is not None)
        protos = {
            role: self.workload.pod_manifest(
                job, spares.prototype(job, role), env, rendezvous_host=self.rendezvous_host
            )
            for role in want
        }
        keys = {role: spares.spare_key(m) for role, m in protos.items()}
        with _said_as_port_errors():
            items, _ = await self.api.list_pods(spares.selector(job.name))
            found = [s for s in map(spares.parse_spare, items) if s is not None]
            actions = spares.keep(job, found, want, keys)
            now = time.monotonic()
            self._spare_ended = {
                k: t for k, t in self._spare_ended.items() if now - t < spares.SPARE_BACKOFF_S
            }
            for spare in actions.ended:
                log.warning(
                    "warm spare %s of job %s ended on its own: %s",
                    spare.name,
                    job.name,
                    spare.ended or spare.phase,
                )
                self._spare_ended[(job.uid, spare.role)] = now
            for name in actions.delete:
                if await self.api.delete_pod(name):
                    log.info("deleted warm spare %s", name)
            taken = {p.name for p in pods} | {s.name for s in found}
            for role, count in sorted(actions.create.items()):
                ended = self._spare_ended.get((job.uid, role))
                if ended is not None and now - ended < spares.SPARE_BACKOFF_S:
                    continue
                for _ in range(count):
                    name = spares.spare_name(job.name, role, taken)
                    taken.add(name)
                    try:
                        made = await self.api.create_pod(spares.spare_manifest(protos[role], name))
                    except ApiException as e:
                        error = platform_error(e)
                        if not isinstance(error, Invalid):
                            raise
                        # a quota or an admission refuses it: the job goes on without
                        log.warning("warm spare %s of job %s refused: %s", name, job.name, error)
                        self._spare_ended[(job.uid, role)] = now
                        break
                    if made:
                        log.info("started warm spare %s of job %s (%s)", name, job.name, role)

    async def delete_pod(self, name: str, grace_s: int | None = None) -> bool:
        with _said_as_port_errors():
            return await self.api.delete_pod(name, grace_s)

    async def prepare(self, job: JobView) -> None:
        """The job's Services, before its pods: every role's pods are found under one (and
        an elastic role's rendezvous host by another); and the annotations its pods carry
        as the job is now (the peers document), patched where they differ."""
        wanted = self.workload.services(job, rendezvous_host=self.rendezvous_host)
        annotations = self.workload.pod_annotations(job)
        if annotations:
            await self._annotate_pods(job, annotations)
        if not wanted:
            return
        with _said_as_port_errors():
            changes = service_changes(wanted, await self.api.list_services(_owned_by(job.name)))
            for name in changes.delete:
                if await self.api.delete_service(name):
                    log.info("deleted service %s", name)
            for svc in changes.create:
                if await self.api.create_service(svc):
                    log.info("created service %s", svc["metadata"]["name"])

    async def _annotate_pods(self, job: JobView, annotations: Mapping[str, str]) -> None:
        with _said_as_port_errors():
            items, _ = await self.api.list_pods(self.workload.job_pod_selector(job.name))
            for obj in items:
                meta = obj.get("metadata") or {}
                have = meta.get("annotations") or {}
                spare = (meta.get("labels") or {}).get(spares.LABEL_SPARE)
                if (
                    spare
                    or meta.get("deletionTimestamp")
                    or all(have.get(k) == v for k, v in annotations.items())
                ):
                    continue
                try:
                    await self.api.patch_pod(
                        meta["name"], {"metadata": {"annotations": dict(annotations)}}
                    )
                except ApiException as e:
                    if e.status != 404:  # gone meanwhile: nothing to say to it
                        raise

    async def release(self, job: str) -> None:
        """The job's Services and warm spares, once it is gone."""
        with _said_as_port_errors():
            items, _ = await self.api.list_pods(spares.selector(job))
            for spare in filter(None, map(spares.parse_spare, items)):
                if not spare.deleting and await self.api.delete_pod(spare.name):
                    log.info("deleted warm spare %s", spare.name)
            for svc in await self.api.list_services(_owned_by(job)):
                if await self.api.delete_service(svc["metadata"]["name"]):
                    log.info("deleted service %s", svc["metadata"]["name"])

    # -- watches --------------------------------------------------------------------------

    async def watch(
        self, kind: WatchKind, resource_version: str, timeout_s: int
    ) -> AsyncIterator[WatchEvent]:
        """The API server's watch, read into views. A watch that passes the server's
        Status through (an ERROR event) is raised: Expired for a 410 Gone. A pod that is
        none of a job's only moves the version on."""
        with _said_as_port_errors():
            async for typ, obj in self.api.watch(kind, resource_version, timeout_s):
                version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
                if typ == "ERROR":
                    raise platform_error(
                        ApiException(status=obj.get("code"), reason=str(obj.get("message")))
                    )
                if typ == "BOOKMARK":
                    yield typ, Bookmark(version)
                elif kind == "jobs":
                    yield typ, self._entry(obj)
                else:
                    pod = self.workload.parse_pod(obj)
                    yield (typ, pod) if pod is not None else ("BOOKMARK", Bookmark(version))

    # -- hosts (CapacitySource) ----------------------------------------------------------

    def _host(self, obj: Mapping[str, Any]) -> Host | None:
        return parse_node(obj, gpu_resource=self.gpu_resource, gpu_type_label=self.gpu_type_label)

    async def list_hosts(self) -> tuple[list[Host], str]:
        with _said_as_port_errors():
            items, version = await self.api.list_nodes(self.node_selector)
        return [h for h in map(self._host, items) if h is not None], version

    async def watch_hosts(self, resource_version: str, timeout_s: int) -> AsyncIterator[HostChange]:
        """The Nodes' changes as hosts'; a Node that has no GPUs (any more) is said
        DELETED, so a host that lost them leaves the picture."""
        with _said_as_port_errors():
            async for typ, obj in self.api.watch_nodes(
                resource_version, timeout_s, self.node_selector
            ):
                meta = obj.get("metadata") or {}
                version = str(meta.get("resourceVersion") or "")
                if typ == "ERROR":
                    raise platform_error(
                        ApiException(status=obj.get("code"), reason=str(obj.get("message")))
                    )
                if typ == "BOOKMARK":
                    yield typ, Bookmark(version)
                    continue
                host = self._host(obj)
                if host is None:
                    name = str(meta.get("name", ""))
                    yield "DELETED", Host(name, 0, False, resource_version=version)
                else:
                    yield typ, host

    # -- what its jobs can express --------------------------------------------------------

    @property
    def capabilities(self) -> PlatformCapabilities:
        """Its workload's (a TrainingJob's or a PyTorchJob's rules)."""
        return self.workload.capabilities

    def plan_change(self, job: JobView, pods: Sequence[PodView], plan: ScalePlan) -> PlanChange:
        return self.workload.plan_change(job, pods, plan)

    def not_applied(self, plan: ScalePlan) -> tuple[NotApplied, ...]:
        return self.workload.plan_not_applied(plan)

    def outcome(self, job: JobView, pods: Sequence[PodView]) -> tuple[str | None, str]:
        return self.workload.outcome(job, pods)


__all__ = ["KubeCluster", "platform_error"]
