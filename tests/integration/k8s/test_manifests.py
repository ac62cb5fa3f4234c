"""The rendered manifests on the real kube-apiserver: every overlay of deploy/overlays,
and every component of deploy/components over the prod overlay, applied with
`kubectl apply` (the machine's kubectl, as `kubectl apply -k` would) and accepted, all
into the one namespace an install uses, as an install would (prod first: it makes the
namespace; the standby env, a virtual env, beside it).

One translation, for the test's API server only: it is v1.20, which serves
PodDisruptionBudget as policy/v1beta1 (policy/v1 is GA in v1.21); the manifests target
current clusters with policy/v1, and the two versions share every field they use
(minAvailable, selector). See `for_v1_20`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import subprocess
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

from tests.integration.deploy.manifests import (
    COMPONENTS,
    DEPLOY,
    INSTALL,
    OVERLAYS,
    Doc,
    kubectl,
    of_kind,
    overlay,
    parse,
    pod_spec,
    render,
    with_component,
)

from .kube import create_namespace, create_node, service_account_client, unique_name
from .test_kube_testenv import eventually_allowed, expect_forbidden

pytestmark = pytest.mark.integration

NAMESPACE = "dlrover-events"
#: the kinds of the monitoring and of the Strimzi topics (see the file's header)
THIRD_PARTY_CRDS = Path(__file__).resolve().parent / "crds" / "third-party.yaml"


def for_v1_20(doc: Doc) -> Doc:
    """The document as the v1.20 API server of the tests takes it (module docstring)."""
    if doc["kind"] == "PodDisruptionBudget" and doc["apiVersion"] == "policy/v1":
        doc = copy.deepcopy(doc)
        doc["apiVersion"] = "policy/v1beta1"
    return doc


def apply(kubeconfig: Path, docs: list[Doc]) -> list[str]:
    """`kubectl apply` of the documents; the names kubectl says it applied. A Job among
    them is deleted first, as deploy/README.md's upgrade says: its pod template cannot
    change, and it does whenever the ConfigMap does (the ConfigMap's name is a hash of
    its content)."""
    for job in (d for d in docs if d["kind"] == "Job"):
        namespace = job["metadata"].get("namespace", NAMESPACE)
        delete = [kubectl(), "--kubeconfig", str(kubeconfig), "delete", "job", "-n", namespace,
                  job["metadata"]["name"], "--ignore-not-found"]  # fmt: skip
        done = subprocess.run(delete, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
    done = subprocess.run(
        [kubectl(), "--kubeconfig", str(kubeconfig), "apply", "-o", "name", "-f", "-"],
        input=yaml.safe_dump_all([for_v1_20(d) for d in docs]),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def withdraw_cluster_rights(kubeconfig: Path, docs: list[Doc]) -> None:
    """Delete the cluster-wide RBAC a test applied: the grants of one test must not make
    another's denials pass or fail. What the install itself grants cluster-wide (the
    operator's read-only nodes ClusterRole) stays: the install stays."""
    kinds = ("ClusterRole", "ClusterRoleBinding")
    installed = {(d["kind"], d["metadata"]["name"]) for d in overlay(INSTALL) if d["kind"] in kinds}
    cluster_wide = [
        d
        for d in docs
        if d["kind"] in kinds and (d["kind"], d["metadata"]["name"]) not in installed
    ]
    if cluster_wide:
        done = subprocess.run(
            [kubectl(), "--kubeconfig", str(kubeconfig), "delete", "-f", "-"],
            input=yaml.safe_dump_all(cluster_wide),
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr


def applied_names(docs: list[Doc]) -> list[str]:
    """What `kubectl apply -o name` prints for the documents: kind.group/name."""
    names = []
    for d in docs:
        group = d["apiVersion"].rpartition("/")[0]
        kind = d["kind"].lower() + (f".{group}" if group else "")
        names.append(f"{kind}/{d['metadata']['name']}")
    return names


def kubectl_run(kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        [kubectl(), "--kubeconfig", str(kubeconfig), *args],
        input=stdin, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def third_party_crds(kube: Path) -> list[Doc]:
    docs = parse(THIRD_PARTY_CRDS.read_text())
    apply(kube, docs)
    names = [f"crd/{d['metadata']['name']}" for d in docs]
    kubectl_run(kube, "wait", "--for", "condition=established", "--timeout", "60s", *names)
    return docs


@pytest.fixture(scope="module")
def install(kube: Path, third_party_crds: list[Doc]) -> list[Doc]:
    """The prod overlay, applied (it makes the namespace every overlay installs into)."""
    docs = overlay(INSTALL)
    assert sorted(apply(kube, docs)) == sorted(applied_names(docs))
    return docs


@pytest.mark.parametrize("name", OVERLAYS)
async def test_every_overlay_is_accepted(
    kube: Path, install: list[Doc], api: client.ApiClient, name: str
) -> None:
    docs = overlay(name)
    assert sorted(apply(kube, docs)) == sorted(applied_names(docs))
    apps = client.AppsV1Api(api)
    for deployment in of_kind(docs, "Deployment").values():
        got = await apps.read_namespaced_deployment(deployment["metadata"]["name"], NAMESPACE)
        assert got.spec.replicas == deployment["spec"]["replicas"]
        (container,) = got.spec.template.spec.containers
        assert container.readiness_probe.http_get.path == "/readyz"
        assert container.liveness_probe.http_get.path == "/healthz"
        assert got.spec.template.spec.security_context.run_as_non_root is True
    core = client.CoreV1Api(api)
    for service in of_kind(docs, "Service").values():
        got_service = await core.read_namespaced_service(service["metadata"]["name"], NAMESPACE)
        assert {p.name for p in got_service.spec.ports} >= {"metrics"}
    # policy/v1beta1: the client library has no typed API for it any more (for_v1_20).
    custom = client.CustomObjectsApi(api)
    for budget in of_kind(docs, "PodDisruptionBudget").values():
        got_budget = await custom.get_namespaced_custom_object(
            "policy", "v1beta1", NAMESPACE, "poddisruptionbudgets", budget["metadata"]["name"]
        )
        assert got_budget["spec"] == budget["spec"]


@pytest.mark.parametrize("component", COMPONENTS)
def test_every_component_is_accepted_over_the_install(
    kube: Path, install: list[Doc], tmp_path: Path, component: str
) -> None:
    docs = with_component(component, tmp_path)
    try:
        assert sorted(apply(kube, docs)) == sorted(applied_names(docs))
    finally:
        withdraw_cluster_rights(kube, docs)


def test_strimzi_topics_are_accepted(kube: Path, third_party_crds: list[Doc]) -> None:
    docs = render(DEPLOY / "kafka-topics")
    (namespace,) = {d["metadata"]["namespace"] for d in docs}
    made = subprocess.run(
        [kubectl(), "create", "namespace", namespace, "--dry-run=client", "-o", "yaml"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    kubectl_run(kube, "apply", "-f", "-", stdin=made)
    assert sorted(apply(kube, docs)) == sorted(applied_names(docs))
    listed = json.loads(kubectl_run(kube, "get", "kafkatopics", "-n", namespace, "-o", "json"))
    assert {t["spec"]["topicName"] for t in listed["items"]} >= {
        d["spec"]["topicName"] for d in docs
    }


async def test_prod_tokens_go_to_the_operator_gateway_console_and_bootstrap_only(
    api: client.ApiClient, install: list[Doc]
) -> None:
    apps = client.AppsV1Api(api)
    listed = await apps.list_namespaced_deployment(
        NAMESPACE, label_selector="dlrover-events.io/env=prod"
    )
    tokens = {
        d.metadata.name: d.spec.template.spec.service_account_name
        for d in listed.items
        if d.spec.template.spec.automount_service_account_token
    }
    assert tokens == {
        "dlrover-events-operator": "dlrover-events-operator",
        "dlrover-events-gateway": "dlrover-events-gateway",
        "dlrover-events-console": "dlrover-events-console",
    }
    assert len(listed.items) == 10  # the services of deploy/base, the watchdog among them
    job = await client.BatchV1Api(api).read_namespaced_job("dlrover-events-bootstrap", NAMESPACE)
    assert job.spec.template.spec.service_account_name == "dlrover-events-bootstrap"
    bindings = await client.RbacAuthorizationV1Api(api).list_namespaced_role_binding(
        NAMESPACE, label_selector="dlrover-events.io/env=prod"
    )
    subjects = {s.name for b in bindings.items for s in b.subjects}
    assert subjects == {
        "dlrover-events-operator", "dlrover-events-gateway", "dlrover-events-console",
        "dlrover-events-bootstrap",
    }  # fmt: skip


async def test_the_bootstrap_writes_its_two_secrets_and_reads_no_other(
    api: client.ApiClient, install: list[Doc]
) -> None:
    """The bootstrap's own token: create, read and patch the token Secrets; never read the
    Postgres DSN's Secret (the kubelet gives the pod that value), list or delete."""
    admin = client.CoreV1Api(api)
    with contextlib.suppress(ApiException):  # another test may have made it (409)
        await admin.create_namespaced_secret(
            NAMESPACE,
            client.V1Secret(
                metadata=client.V1ObjectMeta(name="dlrover-events-postgres"),
                string_data={"dsn": "postgresql://nobody@nowhere/none"},
            ),
        )
    account = "dlrover-events-bootstrap"
    name = "dlrover-events-gateway-read"
    async with await service_account_client(api, NAMESPACE, account) as sa:
        core = client.CoreV1Api(sa)
        body = client.V1Secret(metadata=client.V1ObjectMeta(name=name), string_data={"t": "1"})
        try:
            await eventually_allowed(lambda: core.create_namespaced_secret(NAMESPACE, body))
        except ApiException as e:
            assert e.status == 409, e.body  # made by a bootstrap already: still ours to patch
        await core.read_namespaced_secret(name, NAMESPACE)
        await core.patch_namespaced_secret(name, NAMESPACE, {"stringData": {"t": "2"}})
        denied = [
            core.read_namespaced_secret("dlrover-events-postgres", NAMESPACE),
            core.list_namespaced_secret(NAMESPACE),
            core.delete_namespaced_secret(name, NAMESPACE),
            core.read_namespaced_config_map("dlrover-events", NAMESPACE),
        ]
        for call in denied:
            await expect_forbidden(call, NAMESPACE, account)


async def test_the_operator_acts_in_its_namespace_only_without_cluster_rbac(
    api: client.ApiClient, install: list[Doc]
) -> None:
    """As installed (a Role), the operator's own token lists pods in the install's
    namespace and nowhere else."""
    other = await create_namespace(api)
    account = "dlrover-events-operator"
    async with await service_account_client(api, NAMESPACE, account) as sa:
        core = client.CoreV1Api(sa)
        await eventually_allowed(lambda: core.list_namespaced_pod(NAMESPACE))
        await expect_forbidden(core.list_namespaced_pod(other), NAMESPACE, account)


def training_job(name: str) -> Doc:
    return {
        "apiVersion": "dlrover-events.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {"roles": {"worker": {"replicas": 1, "template": {"spec": {"containers": [
            {"name": "main", "image": "train:1"}]}}}}},
    }  # fmt: skip


async def test_the_console_reads_and_deletes_training_jobs_and_nothing_else(
    api: client.ApiClient, install: list[Doc]
) -> None:
    """The real env's console (rbac/console.yaml): with its own token it reads a
    TrainingJob (to scale, suspend or resume it by a plan) and deletes one, in the
    install's namespace only; it patches none, lists none, and reaches no pod or Secret."""
    other = await create_namespace(api)
    name = unique_name("console-rbac")
    admin = client.CustomObjectsApi(api)
    tj = ("dlrover-events.io", "v1alpha1")
    for namespace in (NAMESPACE, other):
        await admin.create_namespaced_custom_object(
            *tj, namespace, "trainingjobs", training_job(name)
        )
    account = "dlrover-events-console"
    async with await service_account_client(api, NAMESPACE, account) as sa:
        jobs = client.CustomObjectsApi(sa)
        got = await eventually_allowed(
            lambda: jobs.get_namespaced_custom_object(*tj, NAMESPACE, "trainingjobs", name)
        )
        assert got["metadata"]["name"] == name
        core = client.CoreV1Api(sa)
        patch = {"spec": {"suspend": True}}
        denied = [
            jobs.patch_namespaced_custom_object(*tj, NAMESPACE, "trainingjobs", name, patch),
            jobs.list_namespaced_custom_object(*tj, NAMESPACE, "trainingjobs"),
            jobs.get_namespaced_custom_object(*tj, other, "trainingjobs", name),
            jobs.delete_namespaced_custom_object(*tj, other, "trainingjobs", name),
            core.list_namespaced_pod(NAMESPACE),
            core.read_namespaced_secret("dlrover-events-admin-token", NAMESPACE),
        ]
        for call in denied:
            await expect_forbidden(call, NAMESPACE, account)
        await jobs.delete_namespaced_custom_object(*tj, NAMESPACE, "trainingjobs", name)
    with pytest.raises(ApiException) as gone:
        await admin.get_namespaced_custom_object(*tj, NAMESPACE, "trainingjobs", name)
    assert gone.value.status == 404


async def test_the_operator_reads_the_nodes_and_writes_none(
    api: client.ApiClient, install: list[Doc]
) -> None:
    """The nodes ClusterRole (rbac/operator-nodes.yaml): the operator lists and watches
    Nodes (the real env's capacity), and changes none."""
    account = "dlrover-events-operator"
    async with await service_account_client(api, NAMESPACE, account) as sa:
        core = client.CoreV1Api(sa)
        await eventually_allowed(lambda: core.list_node())
        name = await create_node(api)
        body = {"metadata": {"labels": {"touched": "yes"}}}
        await expect_forbidden(core.patch_node(name, body), NAMESPACE, account)
        await expect_forbidden(core.delete_node(name), NAMESPACE, account)


async def test_cluster_rbac_lets_the_operator_act_in_any_namespace(
    kube: Path, api: client.ApiClient, install: list[Doc], tmp_path: Path
) -> None:
    docs = with_component("cluster-rbac", tmp_path)
    apply(kube, docs)
    try:
        jobs = await create_namespace(api)  # where the TrainingJobs would live
        account = "dlrover-events-operator"
        async with await service_account_client(api, NAMESPACE, account) as sa:
            core = client.CoreV1Api(sa)
            pods = await eventually_allowed(lambda: core.list_namespaced_pod(jobs))
            assert pods.items == []
            leases = client.CoordinationV1Api(sa)
            lease = client.V1Lease(
                metadata=client.V1ObjectMeta(name="dlrover-events-operator"),
                spec=client.V1LeaseSpec(holder_identity="op-a", lease_duration_seconds=15),
            )
            await leases.create_namespaced_lease(jobs, lease)
            # Still only the operator's rules: no secrets, anywhere.
            await expect_forbidden(core.list_namespaced_secret(jobs), NAMESPACE, account)
        # ... and the bootstrap writes the read token's Secret there (training pods read it).
        account = "dlrover-events-bootstrap"
        async with await service_account_client(api, NAMESPACE, account) as sa:
            core = client.CoreV1Api(sa)
            body = client.V1Secret(
                metadata=client.V1ObjectMeta(name="dlrover-events-gateway-read"),
                string_data={"prod": "token"},
            )
            await eventually_allowed(lambda: core.create_namespaced_secret(jobs, body))
            await expect_forbidden(core.list_namespaced_secret(jobs), NAMESPACE, account)
    finally:
        withdraw_cluster_rights(kube, docs)


async def test_the_standby_env_holds_no_cluster_credentials(
    kube: Path, api: client.ApiClient, install: list[Doc]
) -> None:
    docs = overlay("standby")
    apply(kube, docs)
    (account,) = of_kind(docs, "ServiceAccount")
    core = client.CoreV1Api(api)
    sa = await core.read_namespaced_service_account(account, NAMESPACE)
    assert sa.automount_service_account_token is False
    for deployment in of_kind(docs, "Deployment").values():
        pod = pod_spec(deployment)
        assert pod["serviceAccountName"] == account
        assert pod["automountServiceAccountToken"] is False
    bindings = await client.RbacAuthorizationV1Api(api).list_namespaced_role_binding(NAMESPACE)
    assert account not in {s.name for b in bindings.items for s in b.subjects}
    # ... and that ServiceAccount can do nothing at all with a token of its own.
    async with await service_account_client(api, NAMESPACE, account) as sa_api:
        await expect_forbidden(
            client.CoreV1Api(sa_api).list_namespaced_pod(NAMESPACE), NAMESPACE, account
        )
