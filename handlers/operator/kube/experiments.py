"""The Experiments of the operator's namespace, for the env it acts for: each new one
submitted to the env's bus once, each deleted one killed, and each one's status kept
(experiment.py decides, experiment_status.py folds; this is their I/O).

Two loops, run by the real operator beside the env's reconciler (runner.py), so only the
replica that holds the lease acts:

- the informer (dlrover_events.kube.informer, the one watch of a Kubernetes kind) hands
  over every Experiment; each is taken one step (hold and submit, say it is invalid, or
  kill and release). A write that fails raises: the informer lists again after its
  backoff, and the step is taken again from what the resource records;
- a follower reads ``<env>.experiments``, ``<env>.trial.decisions`` and
  ``<env>.trial.metrics`` from their beginning (a view, no offsets kept: a restart folds
  them again) and writes each submitted Experiment's status when what it shows changed.

Trial jobs: ``owned`` gives a trial's TrainingJob document its Experiment as owner
(experiment.owner_reference), which the Kubernetes platform asks for as it creates a job
(cluster.KubeCluster.submit_job), so a garbage collector deletes the trials with it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

from dlrover_events.backoff import Backoff
from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topic_reader import TopicReader
from dlrover_events.bus.topics import EXPERIMENTS, TRIAL_DECISIONS, TRIAL_METRICS, topic
from dlrover_events.kube.api import api_error, list_objects, watch_objects
from dlrover_events.kube.informer import KubeInformer
from dlrover_events.lifecycle import background, wait_for_any, wait_or_stop
from dlrover_events.settings import Settings
from handlers.operator.kube import experiment
from handlers.operator.kube.client import merge_patch
from handlers.operator.kube.experiment import Resource, Step
from handlers.operator.kube.experiment_status import ExperimentLogs
from handlers.operator.platform.errors import NotLeader
from schemas.codec import CodecError, decode
from schemas.envelope import Event
from schemas.experiments import ExperimentDocument

log = logging.getLogger(__name__)

SOURCE = "operator"
#: Tries to remove the finalizer against a resource that keeps changing (its status).
_RELEASE_TRIES = 5
_CRD = (experiment.GROUP, experiment.VERSION)


def _always() -> bool:
    return True


class ExperimentWatch:
    """One namespace's Experiments, for env ``env``."""

    def __init__(
        self,
        settings: Settings,
        env: str,
        api: client.ApiClient,
        namespace: str,
        *,
        may_act: Callable[[], bool] = _always,
        watch_timeout_s: int = 60,
        retry_s: float = 1.0,
        source: str = SOURCE,
    ) -> None:
        self.settings = settings
        self.env = env
        self.namespace = namespace
        self.custom = client.CustomObjectsApi(api)
        self.may_act = may_act
        self.watch_timeout_s = watch_timeout_s
        self.retry_s = retry_s
        self.source = source
        self.informer = KubeInformer(
            f"env {env}: Experiments of {namespace}",
            self._list,
            self._watch,
            on_list=self._listed,
            on_event=self._changed,
            backoff=Backoff(initial_s=retry_s),
        )
        #: the Experiments as last seen, by name
        self.known: dict[str, Resource] = {}
        self.logs = ExperimentLogs()
        #: the status last written from the bus, by (name, uid)
        self._written: dict[tuple[str, str], dict[str, Any]] = {}
        #: the uids this watch submitted, and those whose kill it published
        self._submitted: set[str] = set()
        self._killed: set[str] = set()
        #: whose status could not be written (the API server away): tried again
        self._unwritten: set[str] = set()
        #: set once the follower has read the topics to their end once
        self.caught_up = asyncio.Event()
        self._producer: Producer | None = None

    # -- the API server -------------------------------------------------------------------

    async def _list(self) -> tuple[list[dict[str, Any]], str]:
        return await list_objects(
            self.custom.list_namespaced_custom_object, *_CRD, self.namespace, experiment.PLURAL
        )

    def _watch(self, version: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        return watch_objects(
            self.custom.list_namespaced_custom_object,
            *_CRD,
            self.namespace,
            experiment.PLURAL,
            resource_version=version,
            timeout_s=self.watch_timeout_s,
        )

    def _check(self, what: str) -> None:
        if not self.may_act():
            raise NotLeader(f"not the leader any more: {what} refused")

    async def _patch(self, res: Resource, body: dict[str, Any]) -> Resource | None:
        """A merge patch of the resource; None when it is gone or changed meanwhile (404,
        409: its next event says what it is now)."""
        self._check(f"patch Experiment {res.name}")
        try:
            got = await merge_patch(
                self.custom.patch_namespaced_custom_object,
                *_CRD,
                self.namespace,
                experiment.PLURAL,
                res.name,
                body,
            )
        except ApiException as e:
            if e.status in (404, 409):
                return None
            raise
        return experiment.read(got)

    async def _patch_status(self, res: Resource, body: dict[str, Any]) -> bool:
        self._check(f"write the status of Experiment {res.name}")
        try:
            await merge_patch(
                self.custom.patch_namespaced_custom_object_status,
                *_CRD,
                self.namespace,
                experiment.PLURAL,
                res.name,
                body,
            )
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

    # -- the informer's side --------------------------------------------------------------

    async def _listed(self, items: list[dict[str, Any]]) -> None:
        seen = [experiment.read(o) for o in items]
        self.known = {r.name: r for r in seen}
        for res in seen:
            await self._take(res)

    async def _changed(self, typ: str, obj: dict[str, Any]) -> None:
        res = experiment.read(obj)
        if typ == "DELETED":
            if self.known.get(res.name, res).uid == res.uid:
                self.known.pop(res.name, None)
            return
        self.known[res.name] = res
        await self._take(res)

    async def _take(self, res: Resource) -> None:
        """One step for the Experiment, as experiment.step decides. A step this watch took
        already is not taken again for an event older than its own writes (an event of the
        finalizer's patch comes after the submission it preceded)."""
        if res.uid in self._submitted and not res.submitted:
            res = _with_status(res, experiment.submitted_status(self.env, res))
        what, doc = experiment.step(res)
        if what is Step.INVALID:
            assert isinstance(doc, str)
            log.warning("env %s: Experiment %s refused: %s", self.env, res.name, doc)
            await self._patch_status(res, experiment.invalid_status(doc))
        elif what is Step.SUBMIT:
            assert isinstance(doc, ExperimentDocument)
            if not res.held:
                held = await self._patch(res, experiment.hold_patch(res))
                if held is None:
                    return  # changed meanwhile: its next event comes
                res = self.known[res.name] = held
            await self._publish(experiment.submitted(self.env, res, doc, self.source))
            await self._patch_status(res, experiment.submitted_status(self.env, res))
            self._submitted.add(res.uid)
            log.info(
                "env %s: Experiment %s submitted (uid %s, searcher %s)",
                self.env,
                res.name,
                res.uid,
                doc.spec.searcher.name,
            )
            self.known[res.name] = _with_status(res, experiment.submitted_status(self.env, res))
            await self._show(res.name)
        elif what is Step.KILL:
            if res.uid not in self._killed:
                await self._publish(experiment.killed(self.env, res, self.source))
                self._killed.add(res.uid)
                log.info(
                    "env %s: Experiment %s deleted: its kill is on the bus", self.env, res.name
                )
            await self._release(res)
        elif res.submitted:
            await self._show(res.name)

    async def _release(self, res: Resource) -> None:
        """The finalizer removed. The patch is conditional on the version read, which the
        status written meanwhile may have moved on: read again, and again remove it."""
        for _ in range(_RELEASE_TRIES):
            if await self._patch(res, experiment.release_patch(res)) is not None:
                return
            try:
                got = await self.custom.get_namespaced_custom_object(
                    *_CRD, self.namespace, experiment.PLURAL, res.name
                )
            except ApiException as e:
                if e.status == 404:
                    return
                raise
            res = experiment.read(got)
            if not res.held:
                return
        # its next event takes the step again (the kill is not published twice)

    async def _publish(self, event: Event) -> None:
        self._check(f"publish {event.type}")
        if self._producer is None:
            raise RuntimeError("the experiment watch publishes only while it runs")
        await self._producer.publish(event)

    # -- the bus's side -------------------------------------------------------------------

    async def _show(self, name: str) -> None:
        """Write the Experiment's status from the bus, when it changed."""
        res = self.known.get(name)
        if res is None or res.deleting or not res.submitted:
            return
        if res.status.get("env") not in (None, self.env):
            return  # submitted to another env: that env's operator shows it
        status = self.logs.status(name)
        if status is None or self._written.get((name, res.uid)) == status:
            return
        try:
            written = await self._patch_status(res, {"status": status})
        except ApiException as e:
            # the API server away: written again at the next turn of the follower
            self._unwritten.add(name)
            why = api_error(e)
            log.warning("env %s: Experiment %s: status not written: %s", self.env, name, why)
            return
        self._unwritten.discard(name)
        if written:
            self._written[(name, res.uid)] = status

    async def _follow(self, stop: asyncio.Event) -> None:
        """Fold the experiments' topics into their statuses, until ``stop``; the bus away
        is logged and read again from the beginning after a backoff."""
        names = [topic(self.env, t) for t in (EXPERIMENTS, TRIAL_DECISIONS, TRIAL_METRICS)]
        backoff = Backoff(initial_s=self.retry_s)
        failures = 0
        while not stop.is_set():
            try:
                reader = TopicReader(
                    self.settings,
                    names,
                    client_id=f"{self.env}.operator.experiments",
                    missing=f"is env {self.env!r} created?",
                )
                self.logs = ExperimentLogs()
                async with reader:
                    failures = 0
                    await self._fold(reader, stop)
            except (asyncio.CancelledError, NotLeader):
                raise
            except Exception as e:
                failures += 1
                why = api_error(e) if isinstance(e, ApiException) else repr(e)
                log.warning(
                    "env %s: following the experiments' topics failed (%s); again in %.3g s",
                    self.env,
                    why,
                    backoff.delay(failures),
                )
                await wait_or_stop(stop, backoff.delay(failures))

    async def _fold(self, reader: TopicReader, stop: asyncio.Event) -> None:
        while not stop.is_set():
            changed: set[str] = set()
            records = await reader.fetch(timeout_ms=500)
            for record in records:
                try:
                    event = decode(record.value)
                except CodecError:
                    continue  # the searcher's consumer dead-letters it; a view skips it
                if event.env == self.env and (name := self.logs.apply(event)) is not None:
                    changed.add(name)
            if not records and not self.caught_up.is_set() and await reader.caught_up():
                self.caught_up.set()
            for name in sorted(changed | self._unwritten):
                await self._show(name)

    # -- running --------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Until ``stop``; the cluster or the bus away is logged and retried, never fatal.
        Losing the lease (NotLeader) ends it: the operator stops acting."""
        async with Producer(self.settings) as producer:
            self._producer = producer
            try:
                async with background(
                    self.informer.run(stop), self._follow(stop), name=f"{self.env}.experiments"
                ) as tasks:
                    await wait_for_any([stop], tasks)
                    tasks.raise_failure()
            finally:
                self._producer = None


def _with_status(res: Resource, patch: Mapping[str, Any]) -> Resource:
    status = {**res.status, **patch["status"]}
    return Resource(
        name=res.name,
        uid=res.uid,
        generation=res.generation,
        resource_version=res.resource_version,
        finalizers=res.finalizers,
        deleting=res.deleting,
        status=status,
        raw=res.raw,
    )


async def owner_of(
    api: client.ApiClient, namespace: str, document: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The owner reference of the Experiment a trial's job document is of (its label),
    or None: no label, no such Experiment (submitted otherwise than as a resource), or
    no right to read Experiments here (a user's `job submit`)."""
    name = experiment.experiment_of(document)
    if name is None:
        return None
    try:
        got = await client.CustomObjectsApi(api).get_namespaced_custom_object(
            *_CRD, namespace, experiment.PLURAL, name
        )
    except ApiException as e:
        if e.status in (403, 404):
            return None
        raise
    res = experiment.read(got)
    # one being deleted owns it all the same: a garbage collector then deletes the job
    # once the Experiment is gone, as it should
    return experiment.owner_reference(res.name, res.uid) if res.uid else None


__all__ = ["SOURCE", "ExperimentWatch", "owner_of"]
