"""The test control plane and the deploy/ manifests, on a real kube-apiserver v1.20.2.

- The TrainingJob CRD applies, is structural, and its schema is enforced (422).
- TrainingJobs are created, read back, merge-patched, and their status subresource works.
- A pod can be created, bound to a fake node and reported OOMKilled (exit 137), and a
  watch sees each step (what the operator's pod watch will rely on).
- The operator's and the gateway's RBAC (deploy/rbac) allow what they call and nothing
  else: RBAC is really enforced, with real ServiceAccount tokens.

The deploy/ overlays on this API server: test_manifests.py.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, utils, watch
from kubernetes_asyncio.client.rest import ApiException

from .kube import (
    CRD_NAME,
    DEPLOY,
    GROUP,
    PLURAL,
    VERSION,
    FakeKubelet,
    apply_crd,
    create_namespace,
    listening_addresses,
    load_yaml_documents,
    merge_patch,
    parse_yaml_documents,
    service_account_client,
    simple_pod,
    unique_name,
)

pytestmark = pytest.mark.integration

EXAMPLES = sorted((DEPLOY / "examples").glob("trainingjob-*.yaml"))


def trainingjob(name: str, roles: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {"roles": roles},
    }


def worker_role(**overrides: Any) -> dict[str, Any]:
    role: dict[str, Any] = {
        "replicas": 2,
        "minReplicas": 1,
        "maxReplicas": 4,
        "resources": {"cpu": 4, "memory": "16Gi", "nvidia.com/gpu": 1},
        "restartPolicy": "ExitCode",
        "template": {"spec": {"containers": [{"name": "main", "image": "train:1.0"}]}},
    }
    role.update(overrides)
    return role


async def expect_status(call: Awaitable[Any], status: int) -> ApiException:
    with pytest.raises(ApiException) as info:
        await call
    assert info.value.status == status, info.value.body
    return info.value


async def expect_forbidden(call: Awaitable[Any], namespace: str, service_account: str) -> None:
    """403 for that ServiceAccount (not for system:anonymous: a token that did not count
    would make every denial pass for the wrong reason)."""
    error = await expect_status(call, 403)
    user = f"system:serviceaccount:{namespace}:{service_account}"
    assert f'User \\"{user}\\"' in str(error.body), error.body


# -------------------------------------------------------------------------- control plane


def test_control_plane_listens_on_loopback_only(kube: Path) -> None:
    config = parse_yaml_documents(kube.read_text())[0]
    api_port = int(config["clusters"][0]["cluster"]["server"].rsplit(":", 1)[1])
    listening = {}
    for name in ("etcd", "kube-apiserver"):
        pid = int((kube.parent / f"{name}.pid").read_text())
        listening[name] = listening_addresses(pid)
        assert listening[name], f"{name} listens nowhere?"
        assert {host for host, _ in listening[name]} == {"127.0.0.1"}, listening
    assert listening["kube-apiserver"] == {("127.0.0.1", api_port)}  # --insecure-port=0
    assert len(listening["etcd"]) == 2  # client and peer


# ------------------------------------------------------------------------------------ CRD


async def test_crd_applies_and_is_structural(api: client.ApiClient, trainingjob_crd: str) -> None:
    ext = client.ApiextensionsV1Api(api)
    crd = await ext.read_custom_resource_definition(trainingjob_crd)
    conditions = {c.type: c.status for c in crd.status.conditions}
    assert conditions["Established"] == "True"
    assert conditions["NamesAccepted"] == "True"
    assert "NonStructuralSchema" not in conditions, crd.status.conditions
    (version,) = crd.spec.versions
    assert version.name == VERSION
    assert version.subresources.status is not None
    columns = [c.name for c in version.additional_printer_columns]
    assert columns == ["Phase", "Workers", "Running", "PS", "Last-Plan", "Suspended", "Age"]
    # Applying again is a replace, not an error.
    await apply_crd(api)
    assert trainingjob_crd == CRD_NAME


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
async def test_example_trainingjobs_are_valid(
    api: client.ApiClient, trainingjob_crd: str, namespace: str, example: Path
) -> None:
    custom = client.CustomObjectsApi(api)
    (job,) = load_yaml_documents(example)
    name = job["metadata"]["name"]
    await custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job)
    got = await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    assert set(got["spec"]["roles"]) == set(job["spec"]["roles"])
    for role, spec in got["spec"]["roles"].items():
        assert spec["replicas"] == job["spec"]["roles"][role]["replicas"]
        # The schema's default applies to roles that do not say.
        assert spec["restartPolicy"] == job["spec"]["roles"][role].get("restartPolicy", "OnFailure")


async def test_trainingjob_created_read_back_patched(
    api: client.ApiClient, trainingjob_crd: str, namespace: str
) -> None:
    custom = client.CustomObjectsApi(api)
    name = unique_name("job")
    roles = {
        "worker": worker_role(),
        "ps": worker_role(replicas=1, resources={"cpu": "2500m", "memory": 8 * 2**30}),
        "learner": worker_role(replicas=1, restartPolicy="Never"),
    }
    created = await custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, trainingjob(name, roles)
    )
    got = await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    assert got["spec"] == {"roles": roles}
    assert got["metadata"]["uid"] == created["metadata"]["uid"]

    # A ScalePlan's change to one role is a merge patch of one key of the roles map.
    patched = await patch_job(
        custom,
        namespace,
        name,
        {"spec": {"roles": {"worker": {"replicas": 4, "resources": {"memory": "32Gi"}}}}},
    )
    worker = patched["spec"]["roles"]["worker"]
    assert worker["replicas"] == 4
    assert worker["resources"] == {"cpu": 4, "memory": "32Gi", "nvidia.com/gpu": 1}
    assert patched["spec"]["roles"]["ps"] == roles["ps"]
    assert patched["metadata"]["generation"] == 2

    # Status goes through the status subresource only ...
    status = {
        "phase": "Running",
        "observedGeneration": 2,
        "roles": {
            "worker": {"pending": 1, "running": 3, "succeeded": 0, "failed": 0},
            "ps": {"pending": 0, "running": 1, "succeeded": 0, "failed": 0},
        },
        "lastPlanId": "plan-0001",
        "lastPlanTime": "2025-01-01T00:00:00Z",
        "conditions": [{"type": "Ready", "status": "True", "reason": "AllRolesRunning"}],
    }
    await patch_job_status(custom, namespace, name, {"status": status})
    got = await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    assert got["status"] == status
    assert got["metadata"]["generation"] == 2  # a status write is not a spec change

    # ... and the main resource ignores status (and the status subresource ignores spec).
    await patch_job(custom, namespace, name, {"status": {"lastPlanId": "sneaky"}})
    await patch_job_status(
        custom, namespace, name, {"spec": {"roles": {"worker": {"replicas": 99}}}}
    )
    got = await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    assert got["status"]["lastPlanId"] == "plan-0001"
    assert got["spec"]["roles"]["worker"]["replicas"] == 4

    listed = await custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
    assert [j["metadata"]["name"] for j in listed["items"]] == [name]


async def patch_job(
    custom: client.CustomObjectsApi, namespace: str, name: str, body: dict[str, Any]
) -> dict[str, Any]:
    result: dict[str, Any] = await merge_patch(
        custom.patch_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name, body=body
    )
    return result


async def patch_job_status(
    custom: client.CustomObjectsApi, namespace: str, name: str, body: dict[str, Any]
) -> dict[str, Any]:
    result: dict[str, Any] = await merge_patch(
        custom.patch_namespaced_custom_object_status,
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        name,
        body=body,
    )
    return result


def _invalid(mutate: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    roles = {"worker": worker_role()}
    mutate(roles)
    return roles


INVALID_ROLES: dict[str, tuple[dict[str, Any], str]] = {
    "replicas-wrong-type": (
        _invalid(lambda r: r["worker"].update(replicas="four")),
        "spec.roles.worker.replicas",
    ),
    "replicas-negative": (
        _invalid(lambda r: r["worker"].update(replicas=-1)),
        "spec.roles.worker.replicas",
    ),
    "gpu-not-an-integer": (
        _invalid(lambda r: r["worker"]["resources"].update({"nvidia.com/gpu": "one"})),
        "nvidia.com/gpu",
    ),
    "memory-not-a-quantity": (
        _invalid(lambda r: r["worker"]["resources"].update(memory="lots")),
        "spec.roles.worker.resources.memory",
    ),
    "unknown-restart-policy": (
        _invalid(lambda r: r["worker"].update(restartPolicy="Sometimes")),
        "spec.roles.worker.restartPolicy",
    ),
    "no-template": (
        _invalid(lambda r: r["worker"].pop("template")),
        "spec.roles.worker.template",
    ),
    "no-containers": (
        _invalid(lambda r: r["worker"]["template"]["spec"].update(containers=[])),
        "spec.roles.worker.template.spec.containers",
    ),
    "no-roles": (_invalid(lambda r: r.clear()), "spec.roles"),
}


@pytest.mark.parametrize("case", sorted(INVALID_ROLES))
async def test_invalid_trainingjob_rejected_with_422(
    api: client.ApiClient, trainingjob_crd: str, namespace: str, case: str
) -> None:
    roles, field = INVALID_ROLES[case]
    custom = client.CustomObjectsApi(api)
    name = unique_name("bad")
    error = await expect_status(
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, trainingjob(name, roles)
        ),
        422,
    )
    assert "Invalid" in str(error.body)
    assert field in str(error.body), error.body
    listed = await custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
    assert listed["items"] == []


async def test_merge_patch_to_invalid_is_rejected(
    api: client.ApiClient, trainingjob_crd: str, namespace: str
) -> None:
    custom = client.CustomObjectsApi(api)
    name = unique_name("job")
    await custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, trainingjob(name, {"worker": worker_role()})
    )
    await expect_status(
        patch_job(custom, namespace, name, {"spec": {"roles": {"worker": {"replicas": "many"}}}}),
        422,
    )
    await expect_status(
        patch_job_status(
            custom, namespace, name, {"status": {"roles": {"worker": {"running": -1}}}}
        ),
        422,
    )
    got = await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    assert got["spec"]["roles"]["worker"]["replicas"] == 2
    assert "status" not in got


# ------------------------------------------------------------------------ pods, kubelet


class PodWatch:
    """Collects the watch events of one namespace's pods in the background."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self.events: list[tuple[str, client.V1Pod]] = []
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        listed = await self.core.list_namespaced_pod(self.namespace)
        self._task = asyncio.create_task(self._run(listed.metadata.resource_version))

    async def _run(self, resource_version: str) -> None:
        async with watch.Watch().stream(
            self.core.list_namespaced_pod,
            self.namespace,
            resource_version=resource_version,
            timeout_seconds=60,
        ) as stream:
            async for event in stream:
                async with self._changed:
                    self.events.append((event["type"], event["object"]))
                    self._changed.notify_all()

    async def wait_for(
        self, predicate: Callable[[str, client.V1Pod], bool]
    ) -> tuple[str, client.V1Pod]:
        """The first event so far, or to come within 10 s, that matches."""
        async with asyncio.timeout(10), self._changed:
            while True:
                for kind, pod in self.events:
                    if predicate(kind, pod):
                        return kind, pod
                await self._changed.wait()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await self._task


@pytest.fixture
async def pod_watch(api: client.ApiClient, namespace: str) -> AsyncIterator[PodWatch]:
    w = PodWatch(api, namespace)
    await w.start()
    yield w
    await w.stop()


def _terminated(pod: client.V1Pod) -> client.V1ContainerStateTerminated | None:
    statuses = pod.status.container_statuses or []
    return statuses[0].state.terminated if statuses else None


async def test_pod_bound_running_oom_killed_seen_by_watch(
    api: client.ApiClient, namespace: str, node: str, kubelet: FakeKubelet, pod_watch: PodWatch
) -> None:
    core = client.CoreV1Api(api)
    name = "job-worker-0"
    labels = {"dlrover-events.io/job": "job", "dlrover-events.io/role": "worker"}
    await core.create_namespaced_pod(namespace, simple_pod(name, labels=labels))
    kind, pod = await pod_watch.wait_for(lambda k, p: k == "ADDED")
    assert pod.metadata.name == name
    assert pod.status.phase == "Pending"
    assert pod.spec.node_name is None

    await kubelet.bind(namespace, name)
    kind, pod = await pod_watch.wait_for(lambda k, p: k == "MODIFIED" and p.spec.node_name == node)
    assert pod.status.phase == "Pending"

    await kubelet.running(namespace, name)
    kind, pod = await pod_watch.wait_for(lambda k, p: p.status.phase == "Running")
    assert kind == "MODIFIED"
    assert pod.status.container_statuses[0].state.running is not None

    await kubelet.oom_killed(namespace, name)
    kind, pod = await pod_watch.wait_for(lambda k, p: p.status.phase == "Failed")
    assert kind == "MODIFIED"
    terminated = _terminated(pod)
    assert terminated is not None
    assert (terminated.reason, terminated.exit_code) == ("OOMKilled", 137)
    assert pod.spec.node_name == node
    assert pod.metadata.labels == labels

    await kubelet.force_delete(namespace, name)
    kind, pod = await pod_watch.wait_for(lambda k, p: k == "DELETED")
    assert pod.metadata.name == name
    await expect_status(core.read_namespaced_pod(name, namespace), 404)


async def test_kubelet_reports_succeeded_and_failed(
    api: client.ApiClient, namespace: str, node: str, kubelet: FakeKubelet
) -> None:
    core = client.CoreV1Api(api)
    for name in ("done", "crashed"):
        await core.create_namespaced_pod(namespace, simple_pod(name))
        await kubelet.bind(namespace, name)
        await kubelet.running(namespace, name)
    await kubelet.succeeded(namespace, "done")
    await kubelet.failed(namespace, "crashed", exit_code=3)

    done = await core.read_namespaced_pod_status("done", namespace)
    crashed = await core.read_namespaced_pod_status("crashed", namespace)
    assert done.status.phase == "Succeeded"
    assert crashed.status.phase == "Failed"
    done_state, crashed_state = _terminated(done), _terminated(crashed)
    assert done_state is not None
    assert crashed_state is not None
    assert (done_state.reason, done_state.exit_code) == ("Completed", 0)
    assert (crashed_state.reason, crashed_state.exit_code) == ("Error", 3)

    node_obj = await core.read_node(node)
    assert not [t for t in node_obj.spec.taints or [] if t.key == "node.kubernetes.io/not-ready"]
    assert node_obj.status.allocatable["nvidia.com/gpu"] == "4"


# ------------------------------------------------------------------------------- RBAC


def _into_namespace(doc: dict[str, Any], namespace: str) -> dict[str, Any]:
    """What kustomize's `namespace:` does to our RBAC documents."""
    doc = copy.deepcopy(doc)
    doc["metadata"]["namespace"] = namespace
    for subject in doc.get("subjects", []):
        if subject["kind"] == "ServiceAccount":
            subject["namespace"] = namespace
    return doc


async def apply_rbac(api: client.ApiClient, namespace: str, file: str) -> None:
    for doc in load_yaml_documents(DEPLOY / "rbac" / file):
        await utils.create_from_dict(api, _into_namespace(doc, namespace), namespace=namespace)


async def eventually_allowed(call: Callable[[], Awaitable[Any]]) -> Any:
    """The RBAC authorizer reads Roles through an informer: a fresh RoleBinding takes a
    moment to count. Retry 403 briefly; any other error fails at once."""
    for _ in range(50):
        try:
            return await call()
        except ApiException as e:
            if e.status != 403:
                raise
            await asyncio.sleep(0.1)
    return await call()


async def test_operator_rbac_is_least_privilege(
    api: client.ApiClient, trainingjob_crd: str, namespace: str, node: str
) -> None:
    await apply_rbac(api, namespace, "operator.yaml")
    admin = client.CoreV1Api(api)
    await admin.create_namespaced_secret(
        namespace,
        client.V1Secret(metadata=client.V1ObjectMeta(name="db"), string_data={"pw": "hunter2"}),
    )
    await admin.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="cfg"), data={"k": "v"})
    )
    other = await create_namespace(api)
    job = unique_name("job")
    await client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, trainingjob(job, {"worker": worker_role()})
    )

    async with await service_account_client(api, namespace, "dlrover-events-operator") as sa:
        core = client.CoreV1Api(sa)
        custom = client.CustomObjectsApi(sa)

        # Allowed: exactly what the operator calls.
        pods = await eventually_allowed(lambda: core.list_namespaced_pod(namespace))
        assert pods.items == []
        await core.create_namespaced_pod(namespace, simple_pod("job-worker-0"))
        await core.read_namespaced_pod("job-worker-0", namespace)
        await core.read_namespaced_pod_status("job-worker-0", namespace)
        await core.delete_namespaced_pod("job-worker-0", namespace, grace_period_seconds=0)
        await custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
        await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job)
        await patch_job(custom, namespace, job, {"spec": {"roles": {"worker": {"replicas": 3}}}})
        await patch_job_status(custom, namespace, job, {"status": {"lastPlanId": "plan-1"}})
        await core.create_namespaced_event(
            namespace,
            client.CoreV1Event(
                metadata=client.V1ObjectMeta(name=unique_name("ev")),
                involved_object=client.V1ObjectReference(
                    api_version=f"{GROUP}/{VERSION}",
                    kind="TrainingJob",
                    name=job,
                    namespace=namespace,
                ),
                reason="PlanApplied",
                message="plan-1 applied",
                type="Normal",
            ),
        )

        # Leader election: its Lease, read, created, renewed (update); never deleted.
        leases = client.CoordinationV1Api(sa)
        lease = client.V1Lease(
            metadata=client.V1ObjectMeta(name="dlrover-events-operator"),
            spec=client.V1LeaseSpec(holder_identity="op-a", lease_duration_seconds=15),
        )
        await leases.create_namespaced_lease(namespace, lease)
        got = await leases.read_namespaced_lease("dlrover-events-operator", namespace)
        got.spec.holder_identity = "op-b"
        await leases.replace_namespaced_lease("dlrover-events-operator", namespace, got)

        # A job a stream processor asked for (a JobRequest): created in its own namespace,
        # and deleted when its owner asks (a JobDeletion: a killed experiment's trial).
        await custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, trainingjob("requested", {"worker": worker_role()})
        )
        await custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "requested")

        # Denied: secrets, configmaps (the gateway's), other namespaces, anything else.
        denied: list[Callable[[], Awaitable[Any]]] = [
            lambda: leases.delete_namespaced_lease("dlrover-events-operator", namespace),
            lambda: leases.list_namespaced_lease(other),
            lambda: core.read_namespaced_secret("db", namespace),
            lambda: core.list_namespaced_secret(namespace),
            lambda: core.read_namespaced_config_map("cfg", namespace),
            lambda: core.list_namespaced_pod(other),
            lambda: core.list_pod_for_all_namespaces(),
            lambda: merge_patch(
                core.patch_namespaced_pod_status, "any", namespace, body={"status": {}}
            ),
            lambda: core.list_node(),
            lambda: core.read_node(node),
            lambda: client.AppsV1Api(sa).list_namespaced_deployment(namespace),
            lambda: custom.create_namespaced_custom_object(
                GROUP, VERSION, other, PLURAL, trainingjob("other", {"worker": worker_role()})
            ),
            lambda: custom.delete_namespaced_custom_object(GROUP, VERSION, other, PLURAL, job),
            lambda: custom.list_namespaced_custom_object(GROUP, VERSION, other, PLURAL),
        ]
        for call in denied:
            await expect_forbidden(call(), namespace, "dlrover-events-operator")

    # The status the operator wrote is there; the job still exists.
    got = await client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, job
    )
    assert got["status"]["lastPlanId"] == "plan-1"
    assert got["spec"]["roles"]["worker"]["replicas"] == 3


async def test_gateway_rbac_reads_configmaps_only(api: client.ApiClient, namespace: str) -> None:
    await apply_rbac(api, namespace, "gateway.yaml")
    admin = client.CoreV1Api(api)
    await admin.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="cfg"), data={"k": "v"})
    )
    async with await service_account_client(api, namespace, "dlrover-events-gateway") as sa:
        core = client.CoreV1Api(sa)
        cms = await eventually_allowed(lambda: core.list_namespaced_config_map(namespace))
        assert [c.metadata.name for c in cms.items] == ["cfg"]
        assert (await core.read_namespaced_config_map("cfg", namespace)).data == {"k": "v"}
        denied: list[Callable[[], Awaitable[Any]]] = [
            lambda: merge_patch(
                core.patch_namespaced_config_map, "cfg", namespace, body={"data": {"k": "w"}}
            ),
            lambda: core.list_namespaced_pod(namespace),
            lambda: core.list_namespaced_secret(namespace),
        ]
        for call in denied:
            await expect_forbidden(call(), namespace, "dlrover-events-gateway")
