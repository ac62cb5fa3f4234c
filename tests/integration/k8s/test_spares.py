"""Warm spares of an in-place role on the real kube-apiserver v1.20.2 (``elastic.spares``).

The operator keeps N spare pods of the role (labelled as spares: no node, not in the job's
replicas or status, no node events); a grow plan admits one instead of creating a pod cold
(the spare becomes the new rank's pod, once), another spare is started, a restarted
operator finds them as they are, and they go with the job (deleted, suspended, ended).
Last, the admission reaches a real worker: the example run as a process with a spare
pod's environment leaves ``wait_admitted`` when the annotation's file changes, and joins
the job's group in place.

The test plays kubelet and scheduler (there are none): pods are bound and started as they
come, a deletion is confirmed at once, and, for the processes, the admission's
downward-API file is written as the kubelet writes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from dlrover_events.bus.producer import Producer
from dlrover_events.runtime.embedded import free_port
from dlrover_events.sdk.identity import ELASTIC_ADMIT_ENV, ELASTIC_STORE_ENV, RANK_ENV
from dlrover_events.settings import Settings
from handlers.operator.kube.client import KubeApi
from handlers.operator.kube.cluster import KubeCluster
from handlers.operator.kube.pods import LABEL_RANK
from handlers.operator.kube.spares import (
    ADMISSION_PATH,
    ANN_SPARE_ADMISSION,
    LABEL_SPARE,
    selector,
)
from handlers.operator.kube.trainingjob import TRAINING_JOB, rendezvous_service
from handlers.operator.kube.wiring import pod_wiring
from handlers.operator.reconcile.events import job_meta
from schemas.jobs import NodeEvent, NodeStarted
from schemas.plans import NodeGroupResource, RescaleMode, ScalePlan, ScaleStatus
from tests.integration.tap import Tap

from .kube import GROUP, PLURAL, VERSION, FakeKubelet
from .kubelet_env import command_line, container_environment
from .test_elastic_jobs import OPERATOR_SA, create_job, elastic_worker
from .test_kube_testenv import apply_rbac, service_account_client
from .test_reconciler import result_of
from .test_reconciler_support import Cluster, until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
async def tap(settings: Settings, env: str) -> AsyncIterator[Tap]:
    t = Tap(settings, env)
    await t.start()
    try:
        yield t
    finally:
        await t.stop()


@pytest.fixture
async def producer(settings: Settings) -> AsyncIterator[Producer]:
    async with Producer(settings) as p:
        yield p


def in_place_worker(replicas: int, spares: int, **elastic: Any) -> dict[str, Any]:
    worker = elastic_worker(replicas)
    worker["elastic"] = {**worker["elastic"], "mode": "inPlace", "spares": spares, **elastic}
    return worker


async def spares_of(cluster: Cluster, job: str, count: int | None = None) -> list[Any] | None:
    """The job's spare pods that are not being deleted (by name); None while there are
    not ``count`` of them."""
    items, _ = await cluster.kube.list_pods(selector(job))
    found = sorted(
        (p for p in items if not p["metadata"].get("deletionTimestamp")),
        key=lambda p: p["metadata"]["name"],
    )
    if count is not None and len(found) != count:
        return None
    return found


async def no_spares(cluster: Cluster, job: str) -> bool:
    return await spares_of(cluster, job, 0) == []


async def running_spares(cluster: Cluster, job: str, count: int) -> list[Any] | None:
    found = await spares_of(cluster, job, count)
    if found is None or not all((p.get("status") or {}).get("phase") == "Running" for p in found):
        return None
    return found


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}


def names_of(events: list[NodeEvent]) -> set[str]:
    return {e.node.name for e in events}


def plan(env: str, cluster_job: Any, plan_id: str, **fields: Any) -> ScalePlan:
    return ScalePlan(env=env, job=job_meta(cluster_job), source="test", plan_id=plan_id, **fields)


def to(replicas: int) -> dict[str, NodeGroupResource]:
    return {"worker": NodeGroupResource(count=replicas)}


async def test_spares_are_kept_admitted_by_a_grow_plan_and_go_with_the_job(
    cluster: Cluster, api: client.ApiClient, env: str, tap: Tap, producer: Producer
) -> None:
    # as the operator's ServiceAccount: its Role must allow the admission's patch
    await apply_rbac(api, cluster.namespace, "operator.yaml")
    sa = await service_account_client(api, cluster.namespace, OPERATOR_SA)
    async with sa:
        cluster.kube = KubeApi(sa, TRAINING_JOB, cluster.namespace)
        operator = await cluster.start(env)
        name = await create_job(cluster, {"worker": in_place_worker(2, spares=1)})
        await until(lambda: cluster.workers_running(name, 2), "2 running workers")
        (spare,) = await until(lambda: running_spares(cluster, name, 1), "a running spare")
        spare_name = spare["metadata"]["name"]
        assert spare_name == f"{name}-worker-spare-0"
        labels = spare["metadata"]["labels"]
        assert labels[LABEL_SPARE] == "true" and LABEL_RANK not in labels
        (container,) = spare["spec"]["containers"]
        variables = env_of(container)
        assert variables[ELASTIC_ADMIT_ENV] == ADMISSION_PATH and RANK_ENV not in variables
        assert container["command"][:2] == ["torchrun", "--standalone"]
        node = await cluster.raw_pod(f"{name}-worker-1")  # what it would be: its requests
        assert container["resources"]["requests"] == node.spec.containers[0].resources.requests

        # not one of the job's nodes: neither in its pods, nor its status, nor its events
        job = await cluster.job(name)
        assert job is not None
        assert {p.name for p in await cluster.all_pods(name)} == {
            f"{name}-worker-0",
            f"{name}-worker-1",
        }

        async def status_says(running: int) -> bool:
            got = await cluster.job(name)
            roles = got.status.roles if got is not None and got.status is not None else {}
            return roles.get("worker", {}).get("running") == running

        await until(lambda: status_says(2), "the status counting 2 running workers")
        got = await cluster.job(name)
        assert got is not None and got.status is not None
        assert sum(got.status.roles["worker"].values()) == 2

        # a grow plan admits the spare: it becomes rank 2's pod; another spare is started
        grow = plan(env, job, "to-3", node_group_resources=to(3))
        await producer.publish(grow)
        (result,) = await result_of(tap, "to-3")
        assert result.status is ScaleStatus.APPLIED, result.reason
        assert result.rescale_mode is RescaleMode.IN_PLACE
        pods = await until(lambda: cluster.workers_running(name, 3), "3 running workers")
        assert [(p.rank, p.name) for p in pods] == [
            (0, f"{name}-worker-0"),
            (1, f"{name}-worker-1"),
            (2, spare_name),
        ]
        admitted = await cluster.raw_pod(spare_name)
        assert LABEL_SPARE not in admitted.metadata.labels
        told = json.loads(admitted.metadata.annotations[ANN_SPARE_ADMISSION])
        assert told["pod"] == spare_name and told["env"][RANK_ENV] == "2"
        (second,) = await until(lambda: running_spares(cluster, name, 1), "a new spare")
        assert second["metadata"]["name"] == f"{name}-worker-spare-1"
        started = await tap.until(
            lambda: len(tap.of(NodeStarted, job.uid)) >= 3 and tap.of(NodeStarted, job.uid),
            "3 node.started",
        )
        assert sorted((e.node.id, e.node.name) for e in started) == [
            (0, f"{name}-worker-0"),
            (1, f"{name}-worker-1"),
            (2, spare_name),
        ]

        # the plan delivered again is answered as the first time, and takes no spare
        await producer.publish(grow)
        _, again = await result_of(tap, "to-3", count=2)
        assert again.status is ScaleStatus.APPLIED, again.reason
        assert len(await cluster.pods(name)) == 3

        # a restarted operator finds the spare as it is: it keeps it and makes no other,
        # and a shrink (which removes rank 2, the admitted spare) changes nothing of it
        await operator.kill()
        await cluster.start(env)
        shrink = plan(env, job, "to-2", node_group_resources=to(2))
        await producer.publish(shrink)
        (result,) = await result_of(tap, "to-2")
        assert result.status is ScaleStatus.APPLIED, result.reason
        pods = await until(lambda: cluster.workers_running(name, 2), "2 running workers")
        assert spare_name not in {p.name for p in pods}
        (kept,) = await until(lambda: running_spares(cluster, name, 1), "the spare kept")
        assert kept["metadata"]["uid"] == second["metadata"]["uid"]
        spares = {f"{name}-worker-spare-1"}
        assert not names_of(tap.of(NodeEvent, job.uid)) & spares, "a spare's node event"

        # deleted with the job
        await client.CustomObjectsApi(api).delete_namespaced_custom_object(
            GROUP, VERSION, cluster.namespace, PLURAL, name
        )
        await until(lambda: _none_left(cluster, name), "the job's pods and spares gone")


async def _none_left(cluster: Cluster, name: str) -> bool:
    items, _ = await cluster.kube.list_pods(f"dlrover-events.io/job={name}")
    return not items


async def test_a_suspended_or_ended_job_keeps_no_spares(
    cluster: Cluster, kubelet: FakeKubelet, env: str, tap: Tap, producer: Producer
) -> None:
    await cluster.start(env)
    name = await create_job(cluster, {"worker": in_place_worker(1, spares=2)})
    await until(lambda: cluster.workers_running(name, 1), "a running worker")
    await until(lambda: running_spares(cluster, name, 2), "2 running spares")
    job = await cluster.job(name)
    assert job is not None

    await producer.publish(plan(env, job, "suspend", suspend=True))
    (result,) = await result_of(tap, "suspend")
    assert result.status is ScaleStatus.APPLIED, result.reason
    await until(lambda: no_spares(cluster, name), "no spare while suspended")
    await producer.publish(plan(env, job, "resume", node_group_resources=to(1)))
    (result,) = await result_of(tap, "resume")
    assert result.status is ScaleStatus.APPLIED, result.reason
    await until(lambda: running_spares(cluster, name, 2), "2 spares again")

    (pod,) = await until(lambda: cluster.workers_running(name, 1), "the worker back")
    await kubelet.succeeded(cluster.namespace, pod.name)

    async def ended() -> bool:
        got = await cluster.job(name)
        return got is not None and got.status is not None and got.status.phase == "Succeeded"

    await until(ended, "the job Succeeded")
    await until(lambda: no_spares(cluster, name), "no spare once the job ended")


# -- a spare's worker, admitted, as a process -------------------------------------------


def kubelet_writes(folder: Path, text: str, generation: int) -> None:
    """A downward-API volume's file, as the kubelet's AtomicWriter changes it: a new
    data folder, then one rename of the ``..data`` link the file's link points through."""
    data = folder / f"..{generation}"
    data.mkdir()
    (data / Path(ADMISSION_PATH).name).write_text(text)
    link = folder / "..data_tmp"
    link.symlink_to(data.name)
    link.replace(folder / "..data")
    file = folder / Path(ADMISSION_PATH).name
    if not file.is_symlink():
        file.symlink_to(f"..data/{file.name}")


class PodProcess:
    """A pod's training container run as a process: its command line and environment as
    the kubelet makes them (kubelet_env), and what differs here from a cluster:

    - the network: the role's Service (the membership store's host) is 127.0.0.1;
    - the admission volume: a folder of the test's, whose file the test writes from the
      pod's annotation as the kubelet does (empty while unset);
    - the image: the suite's own install, run from the repository's root.
    """

    def __init__(self, pod: Any, service: str, home: Path) -> None:
        (container,) = pod["spec"]["containers"]
        self.name = pod["metadata"]["name"]
        self.service = service
        self.volume = home / "admission"
        self.volume.mkdir(parents=True)
        self.log = home / "log"
        env = container_environment(container, fields={}, config_maps={}, secrets={})
        env = {k: self.local(v) for k, v in env.items()}
        if ELASTIC_ADMIT_ENV in env:
            env[ELASTIC_ADMIT_ENV] = str(self.volume / Path(ADMISSION_PATH).name)
            kubelet_writes(self.volume, "", 0)
        env.update(
            PATH=f"{Path(sys.executable).parent}:{os.defpath}",
            HOME=str(home),
            PYTHONUNBUFFERED="1",
        )
        argv = command_line(container, env)
        executable = shutil.which(argv[0], path=env["PATH"])
        assert executable, f"{argv[0]} not on the image's PATH"
        self._out = self.log.open("wb")
        self.proc = subprocess.Popen(
            [executable, *argv[1:]],
            env=env,
            cwd=REPO,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._written = ""
        self._generation = 0

    def local(self, text: str) -> str:
        return text.replace(f"{self.service}:", "127.0.0.1:")

    def sync(self, annotations: dict[str, str] | None) -> None:
        """The kubelet's sync of the admission volume."""
        text = self.local((annotations or {}).get(ANN_SPARE_ADMISSION, ""))
        if text != self._written:
            self._generation += 1
            kubelet_writes(self.volume, text, self._generation)
            self._written = text

    def printed(self, event: str) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith(f'{{"event": "{event}"'):
                out.append(json.loads(line))
        return out

    def said(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._out.close()


@pytest.mark.timeout(600)
async def test_an_admitted_spares_worker_leaves_its_wait_and_joins_in_place(
    settings: Settings,
    cluster: Cluster,
    api: client.ApiClient,
    env: str,
    tap: Tap,
    producer: Producer,
    tmp_path: Path,
) -> None:
    adapter = TRAINING_JOB.configured(gpu_type_label=None, wiring=pod_wiring(settings))
    await cluster.start(env, platform=KubeCluster(KubeApi(api, adapter, cluster.namespace)))
    worker = in_place_worker(
        1,
        spares=1,
        rendezvousPort=free_port(),
        command=[
            "python",
            "examples/elastic/train_elastic.py",
            "--steps=100000",
            "--interval-s=1",
            "--step-sleep-s=0.05",
        ],
    )
    worker["template"]["spec"]["containers"][0]["env"] = [{"name": "OMP_NUM_THREADS", "value": "1"}]
    name = await create_job(cluster, {"worker": worker})
    (pod,) = await until(lambda: cluster.workers_running(name, 1), "a running worker")
    (spare,) = await until(lambda: running_spares(cluster, name, 1), "a running spare")
    job = await cluster.job(name)
    assert job is not None
    service = rendezvous_service(job, "worker")
    core = client.CoreV1Api(api)
    raw = api.sanitize_for_serialization(
        await core.read_namespaced_pod(pod.name, cluster.namespace)
    )
    assert env_of(raw["spec"]["containers"][0])[ELASTIC_STORE_ENV].startswith(f"{service}:")
    processes: list[PodProcess] = []
    try:
        host = PodProcess(raw, service, tmp_path / pod.name)
        processes.append(host)
        waiting = PodProcess(spare, service, tmp_path / spare["metadata"]["name"])
        processes.append(waiting)

        async def printed(process: PodProcess, event: str, **fields: Any) -> Any:
            for p in processes:
                assert p.proc.poll() is None, f"{p.name} exited:\n{p.said()}"
            got = [e for e in process.printed(event) if fields.items() <= e.items()]
            return got or None

        await until(lambda: printed(host, "membership", world_size=1), "the job training")
        await until(lambda: printed(waiting, "spare"), "the spare's model built")

        async def kubelet_syncs() -> None:
            while True:
                got = await core.read_namespaced_pod(waiting.name, cluster.namespace)
                waiting.sync(got.metadata.annotations)
                await asyncio.sleep(0.2)

        syncing = asyncio.create_task(kubelet_syncs())
        try:
            await producer.publish(plan(env, job, "to-2", node_group_resources=to(2)))
            (result,) = await result_of(tap, "to-2")
            assert result.status is ScaleStatus.APPLIED, result.reason
            (joined,) = await until(
                lambda: printed(waiting, "membership", world_size=2), "the spare in the group"
            )
        finally:
            syncing.cancel()
        assert joined["spare"] is True and joined["node"] == 1
        assert joined["pid"] == waiting.printed("spare")[0]["pid"]  # the same process
        await until(lambda: printed(host, "membership", world_size=2), "the host re-formed")
        (rescaled,) = await until(
            lambda: printed(host, "rescaled", world_size=2), "the rescale reported"
        )
        assert rescaled["mode"] == "in_place", rescaled
    finally:
        for process in processes:
            process.stop()
