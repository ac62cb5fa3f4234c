"""Helpers for tests against the real kube-apiserver of deploy/testenv/kube-testenv.sh.

There is no kubelet, scheduler or controller-manager: tests create a Node object, bind
pods to it and write pod status themselves (`FakeKubelet`), and use a fresh namespace
each (namespaces stay Terminating without the namespace controller).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import yaml  # type: ignore[import-untyped,unused-ignore]
from kubernetes_asyncio import client, utils
from kubernetes_asyncio.client.rest import ApiException

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy"
SCRIPT = DEPLOY / "testenv" / "kube-testenv.sh"
CRD_FILE = DEPLOY / "crds" / "trainingjobs.yaml"
PYTORCHJOB_CRD_FILE = DEPLOY / "crds" / "pytorchjobs.yaml"
# Where kube-testenv.sh keeps what it builds and extracts (same defaults as the script).
CACHE = Path(
    os.environ.get("KUBE_TESTENV_CACHE", Path.home() / ".cache" / "dlrover-events")
).expanduser()
APISERVER = Path(
    os.environ.get("KUBE_APISERVER", CACHE / "kube-apiserver-v1.20.2" / "kube-apiserver")
)

GROUP = "dlrover-events.io"
VERSION = "v1alpha1"
PLURAL = "trainingjobs"
CRD_NAME = f"{PLURAL}.{GROUP}"
MERGE_PATCH = "application/merge-patch+json"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"

T = TypeVar("T")


async def merge_patch(method: Callable[..., Awaitable[T]], *args: Any, body: Any) -> T:
    """`method(*args, body)` as a JSON merge patch (RFC 7386).

    kubernetes-asyncio sends a dict body as a strategic-merge patch, which custom
    resources do not accept (415): they need `_content_type="application/merge-patch+json"`.
    Its type stubs leave `_content_type` out, hence this one typed door for it.
    """
    return await method(*args, body, _content_type=MERGE_PATCH)


def run_script(*args: str, timeout: float, env: Mapping[str, str] | None = None) -> str:
    """Run kube-testenv.sh; its progress goes to our stderr, its stdout is returned."""
    proc = subprocess.run(
        ["bash", str(SCRIPT), *args],
        stdout=subprocess.PIPE,
        text=True,
        timeout=timeout,
        check=True,
        env={**os.environ, **(env or {})},
    )
    return proc.stdout


def _decode_address(hex_address: str) -> tuple[str, int]:
    """An address of /proc/net/tcp{,6}: host bytes in 32-bit little-endian words, port."""
    host_hex, port_hex = hex_address.split(":")
    raw = bytes.fromhex(host_hex)
    host = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(host) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, host), int(port_hex, 16)


def listening_addresses(pid: int) -> set[tuple[str, int]]:
    """(address, port) of each listening TCP socket of process `pid` (Linux /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: TCP_LISTEN
                found.add(_decode_address(local))
    return found


def parse_yaml_documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def load_yaml_documents(path: Path) -> list[dict[str, Any]]:
    return parse_yaml_documents(path.read_text())


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def apply_crd(api: client.ApiClient, path: Path = CRD_FILE) -> dict[str, Any]:
    """Create the CRD of `path` (merge-patch it when it exists); wait until Established."""
    (crd,) = load_yaml_documents(path)
    ext = client.ApiextensionsV1Api(api)
    name = crd["metadata"]["name"]
    try:
        await utils.create_from_dict(api, crd)
    except utils.FailToCreateError as e:
        if any(exc.status != 409 for exc in e.api_exceptions):
            raise
        await merge_patch(ext.patch_custom_resource_definition, name, body=crd)
    for _ in range(100):
        got = await ext.read_custom_resource_definition(name)
        conditions = got.status.conditions or []
        if any(c.type == "Established" and c.status == "True" for c in conditions):
            return crd
        await asyncio.sleep(0.1)
    raise TimeoutError(f"CRD {name} not Established after 10 s")


async def create_namespace(api: client.ApiClient, prefix: str = "t") -> str:
    name = unique_name(prefix)
    await client.CoreV1Api(api).create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name))
    )
    return name


async def create_node(
    api: client.ApiClient,
    name: str | None = None,
    *,
    cpu: str = "32",
    memory: str = "256Gi",
    gpus: int = 4,
    labels: Mapping[str, str] | None = None,
) -> str:
    """A Node object that looks Ready and schedulable (there is no kubelet behind it).

    The API server's admission adds the `node.kubernetes.io/not-ready` NoSchedule taint
    to every new Node; a kubelet would clear it when it reports Ready. We do both.
    """
    name = name or unique_name("fake-node")
    core = client.CoreV1Api(api)
    meta = client.V1ObjectMeta(name=name, labels={"kubernetes.io/hostname": name, **(labels or {})})
    await core.create_node(client.V1Node(metadata=meta))
    node = await core.read_node(name)
    taints = [
        {"key": t.key, "value": t.value, "effect": t.effect}
        for t in node.spec.taints or []
        if t.key != NOT_READY_TAINT
    ]
    await merge_patch(core.patch_node, name, body={"spec": {"taints": taints or None}})
    capacity = {"cpu": cpu, "memory": memory, "pods": "110", "nvidia.com/gpu": str(gpus)}
    await merge_patch(
        core.patch_node_status,
        name,
        body={
            "status": {
                "capacity": capacity,
                "allocatable": capacity,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "played by the test's FakeKubelet",
                        "lastHeartbeatTime": now(),
                        "lastTransitionTime": now(),
                    }
                ],
            }
        },
    )
    return name


def simple_pod(
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    image: str = "registry.example.com/train:1.0",
    memory: str = "1Gi",
) -> client.V1Pod:
    container = client.V1Container(
        name="main",
        image=image,
        resources=client.V1ResourceRequirements(
            requests={"cpu": "1", "memory": memory}, limits={"memory": memory}
        ),
    )
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=dict(labels or {})),
        spec=client.V1PodSpec(restart_policy="Never", containers=[container]),
    )


@dataclass
class FakeKubelet:
    """Plays the kubelet of one fake node: binds pods to it and reports their status."""

    api: client.ApiClient
    node: str

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    async def bind(self, namespace: str, pod: str) -> None:
        """What the scheduler does: a Binding of the pod to this node."""
        body = client.V1Binding(
            metadata=client.V1ObjectMeta(name=pod),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=self.node),
        )
        # The API answers a Status, which the client fails to read as the V1Binding its
        # schema promises (target must not be None): take the raw response and check it.
        resp: Any = await self.core.create_namespaced_pod_binding(
            pod, namespace, body, _preload_content=False
        )
        try:
            if not 200 <= resp.status <= 299:
                raise ApiException(status=resp.status, reason=await resp.text())
        finally:
            resp.release()

    async def _container_names(self, namespace: str, pod: str) -> list[str]:
        got = await self.core.read_namespaced_pod(pod, namespace)
        return [c.name for c in got.spec.containers]

    async def _set_status(
        self,
        namespace: str,
        pod: str,
        phase: str,
        state: dict[str, Any],
        *,
        ready: bool,
        names: Sequence[str] | None = None,
    ) -> client.V1Pod:
        names = names or await self._container_names(namespace, pod)
        status = {
            "phase": phase,
            "hostIP": "10.1.0.1",
            "podIP": "10.2.0.1",
            "startTime": now(),
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now()},
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "lastTransitionTime": now(),
                },
            ],
            "containerStatuses": [
                {
                    "name": name,
                    "ready": ready,
                    "started": ready,
                    "restartCount": 0,
                    "image": "registry.example.com/train:1.0",
                    "imageID": "registry.example.com/train@sha256:" + "0" * 64,
                    "containerID": f"containerd://{uuid.uuid4().hex}",
                    "state": state,
                }
                for name in names
            ],
        }
        return await merge_patch(
            self.core.patch_namespaced_pod_status, pod, namespace, body={"status": status}
        )

    async def running(self, namespace: str, pod: str) -> client.V1Pod:
        return await self._set_status(
            namespace, pod, "Running", {"running": {"startedAt": now()}}, ready=True
        )

    async def terminated(
        self, namespace: str, pod: str, *, exit_code: int, reason: str
    ) -> client.V1Pod:
        phase = "Succeeded" if exit_code == 0 else "Failed"
        state = {
            "terminated": {
                "exitCode": exit_code,
                "reason": reason,
                "startedAt": now(),
                "finishedAt": now(),
            }
        }
        return await self._set_status(namespace, pod, phase, state, ready=False)

    async def succeeded(self, namespace: str, pod: str) -> client.V1Pod:
        return await self.terminated(namespace, pod, exit_code=0, reason="Completed")

    async def failed(self, namespace: str, pod: str, exit_code: int = 1) -> client.V1Pod:
        return await self.terminated(namespace, pod, exit_code=exit_code, reason="Error")

    async def oom_killed(self, namespace: str, pod: str) -> client.V1Pod:
        """The kernel's OOM killer ended the container: reason OOMKilled, exit code 137."""
        return await self.terminated(namespace, pod, exit_code=137, reason="OOMKilled")

    async def force_delete(self, namespace: str, pod: str) -> None:
        """Pods bound to a node only go away when its kubelet confirms: delete with grace 0."""
        await self.core.delete_namespaced_pod(pod, namespace, grace_period_seconds=0)


def server_of(api: client.ApiClient) -> str:
    host = api.configuration.host
    assert host, "ApiClient without a host"
    return host


async def service_account_client(
    admin: client.ApiClient, namespace: str, service_account: str
) -> client.ApiClient:
    """An ApiClient that authenticates as system:serviceaccount:<namespace>:<name>.

    The token comes from the TokenRequest API (serviceaccounts/token, GA in v1.20), signed
    with the API server's --service-account-signing-key-file: the same kind of token a
    pod of that ServiceAccount gets mounted. (A kubernetes.io/service-account-token Secret
    would need the controller-manager's token controller to be filled in.)
    """
    # No audiences: the API server's own (--api-audiences, default: the issuer).
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))
    got = await client.CoreV1Api(admin).create_namespaced_service_account_token(
        service_account, namespace, request
    )
    config = client.Configuration(host=server_of(admin))
    config.verify_ssl = False
    config.api_key = {"BearerToken": got.status.token}
    config.api_key_prefix = {"BearerToken": "Bearer"}
    return client.ApiClient(config)
