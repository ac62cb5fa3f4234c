"""The cluster as processes: the install of deploy/README.md (the prod overlay and the
standby overlay, `kubectl apply`'d to the test API server, and the Postgres DSN's Secret),
then each container of the rendered manifests run as a process, as the kubelet would run
it: the command and args of the bootstrap Job and of every Deployment's pods, with the
environment the kubelet gives it (envFrom and env, ConfigMap, Secret and field references
resolved from what the API server holds, `$(VAR)` expanded). The bootstrap succeeds, and
every service answers 200 on its readiness probe's path at the port its Service names,
and the real env's console acts on a TrainingJob of the cluster with its own account's
token (a suspend the operator applies, a delete).

What differs from a cluster, each in `as_a_process` and nowhere else:
- the network: each pod has its own; here the processes share one host, so every named
  container port is given a free port (through the variable that sets it) and binds
  127.0.0.1 instead of the ConfigMap's 0.0.0.0 (nothing of a test listens beyond loopback);
- the bus: DLROVER_EVENTS_BOOTSTRAP_SERVERS is this test's broker, not the ConfigMap's
  kafka:9092; and the consumer group timeouts are the suite's (tansu delays a join by
  half the session timeout);
- volumes: the emptyDir at the container's workingDir (DLROVER_EVENTS_DATA_DIR, HOME) is a
  fresh folder;
- the ServiceAccount token the kubelet mounts into a pod that automounts one is a
  kubeconfig (KUBECONFIG) with a token of the same ServiceAccount (TokenRequest) and the
  pod's namespace; a pod that mounts none gets no credentials at all;
- the image: `dlrover-events` is the suite's own install (the image's PATH).
The Postgres DSN is not overridden: it comes from the Secret made as the README says.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]
from kubernetes_asyncio import client

from dlrover_events.envs.bootstrap import TOKEN_SECRETS
from dlrover_events.envs.tokens import Scope
from dlrover_events.runtime.embedded import Broker, free_port
from tests.integration.deploy.manifests import (
    BIND_VARIABLES,
    Doc,
    kubectl,
    of_kind,
    overlay,
    pod_spec,
    port_variable,
    service_of,
    with_component,
)
from tests.integration.deploy.promql import base_name, expressions, parse

from .kube import server_of
from .kubelet_env import command_line, container_environment, expand
from .test_manifests import NAMESPACE, apply

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

#: the install, in the order deploy/README.md applies it
INSTALL = ["prod", "standby"]
READY_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 30.0  # a pod's default terminationGracePeriodSeconds
#: the image's PATH: the suite's own install of dlrover-events
IMAGE_PATH = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"


def test_expand_as_kubernetes_does() -> None:
    env = {"ENV": "prod", "EMPTY": ""}
    assert expand("$(ENV)", env) == "prod"
    assert expand("--env=$(ENV)/$(EMPTY)x", env) == "--env=prod/x"
    assert expand("$(UNDEFINED) stays", env) == "$(UNDEFINED) stays"
    assert expand("$$(ENV) is escaped, $$ is a dollar", env) == "$(ENV) is escaped, $ is a dollar"
    assert expand("$ENV and $( unclosed", env) == "$ENV and $( unclosed"


@dataclass
class Pod:
    """One container of a workload, run as a process."""

    name: str
    workload: Doc
    argv: list[str]
    env: dict[str, str]
    #: container port name -> where this process serves it
    ports: dict[str, int]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    _out: Any = field(default=None, repr=False)

    def start(self) -> None:
        self._out = self.log.open("wb")
        executable = shutil.which(self.argv[0], path=self.env["PATH"])
        assert executable, f"{self.argv[0]} not on the image's PATH"
        self.proc = subprocess.Popen(
            [executable, *self.argv[1:]],
            env=self.env,
            cwd=self.env["HOME"],
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def said(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after the grace period, as the kubelet stops a pod."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self._out is not None:
            self._out.close()
        return self.proc.returncode


def kubectl_json(kubeconfig: Path, *args: str) -> Any:
    done = subprocess.run(
        [kubectl(), "--kubeconfig", str(kubeconfig), *args, "-o", "json"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def create_postgres_secret(kubeconfig: Path, dsn: str) -> None:
    """deploy/README.md's step: the Secret `dlrover-events-postgres` with key `dsn`."""
    made = subprocess.run(
        [kubectl(), "create", "secret", "generic", "dlrover-events-postgres", "-n", NAMESPACE,
         f"--from-literal=dsn={dsn}", "--dry-run=client", "-o", "yaml"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    done = subprocess.run(
        [kubectl(), "--kubeconfig", str(kubeconfig), "apply", "-f", "-"],
        input=made, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def cluster_objects(
    kubeconfig: Path,
) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]]:
    """The namespace's ConfigMaps and Secrets as the kubelet reads them."""
    config_maps = {
        cm["metadata"]["name"]: cm.get("data", {})
        for cm in kubectl_json(kubeconfig, "get", "configmaps", "-n", NAMESPACE)["items"]
    }
    secrets = {
        s["metadata"]["name"]: {
            k: base64.b64decode(v).decode() for k, v in (s.get("data") or {}).items()
        }
        for s in kubectl_json(kubeconfig, "get", "secrets", "-n", NAMESPACE)["items"]
    }
    return config_maps, secrets


async def token_kubeconfig(api: client.ApiClient, account: str, path: Path) -> Path:
    """What the kubelet mounts for a pod of ServiceAccount `account`, as a kubeconfig: a
    token of that account (TokenRequest) and the pod's namespace."""
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))
    got = await client.CoreV1Api(api).create_namespaced_service_account_token(
        account, NAMESPACE, request
    )
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "c", "cluster": {"server": server_of(api), "insecure-skip-tls-verify": True}}
        ],
        "users": [{"name": account, "user": {"token": got.status.token}}],
        "contexts": [
            {"name": "c", "context": {"cluster": "c", "user": account, "namespace": NAMESPACE}}
        ],
        "current-context": "c",
    }
    await asyncio.to_thread(write_private, path, yaml.safe_dump(config))
    return path


def write_private(path: Path, text: str) -> None:
    path.touch(mode=0o600)
    path.write_text(text)


async def as_a_process(
    api: client.ApiClient,
    workload: Doc,
    pod_name: str,
    objects: tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]],
    broker: Broker,
    workdir: Path,
) -> Pod:
    """The pod's one container as a process (the module's docstring lists each override)."""
    spec = pod_spec(workload)
    (container,) = spec["containers"]
    config_maps, secrets = objects
    env = container_environment(
        container,
        fields={"metadata.name": pod_name, "metadata.namespace": NAMESPACE},
        config_maps=config_maps,
        secrets=secrets,
    )
    home = workdir / pod_name
    home.mkdir(parents=True)
    ports = {}
    for port in container.get("ports", []):
        variable = port_variable(workload, port["name"])
        assert env[variable] == str(port["containerPort"]), (variable, port)
        ports[port["name"]] = free_port()
        env[variable] = str(ports[port["name"]])
        assert env[BIND_VARIABLES[variable]] == "0.0.0.0"
        env[BIND_VARIABLES[variable]] = "127.0.0.1"
    env.update(
        DLROVER_EVENTS_BOOTSTRAP_SERVERS=broker.bootstrap_servers,
        DLROVER_EVENTS_SESSION_TIMEOUT_MS="2000",
        DLROVER_EVENTS_HEARTBEAT_INTERVAL_MS="300",
        DLROVER_EVENTS_DATA_DIR=str(home),
        HOME=str(home),
        PATH=IMAGE_PATH,
        PYTHONUNBUFFERED="1",
    )
    assert container["workingDir"] == "/var/lib/dlrover-events"
    if spec.get("automountServiceAccountToken"):
        account = spec["serviceAccountName"]
        env["KUBECONFIG"] = str(await token_kubeconfig(api, account, home / "token.kubeconfig"))
    argv = command_line(container, env)
    return Pod(pod_name, workload, argv, env, ports, workdir / f"{pod_name}.log")


async def answers(url: str) -> int | None:
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
            session.get(url) as resp,
        ):
            return resp.status
    except (aiohttp.ClientError, TimeoutError):
        return None


async def metric_names(url: str) -> set[str]:
    """The metrics a /metrics page declares (its `# TYPE` lines), with or without series."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        session.get(url) as resp,
    ):
        assert resp.status == 200, url
        text = await resp.text()
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


async def until_ready(pod: Pod, path: str, port: int) -> None:
    url = f"http://127.0.0.1:{port}{path}"
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        assert pod.proc is not None
        code = pod.proc.poll()
        assert code is None, f"{pod.name} exited {code} before it was ready:\n{pod.said()}"
        if await answers(url) == 200:
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"{pod.name}: {url} not 200 after {READY_TIMEOUT_S} s:\n{pod.said()}")


TRAINING_JOB = {
    "apiVersion": "dlrover-events.io/v1alpha1",
    "kind": "TrainingJob",
    "metadata": {"name": "from-the-console", "namespace": NAMESPACE},
    "spec": {"roles": {"worker": {"replicas": 1, "template": {"spec": {"containers": [
        {"name": "main", "image": "train:1", "command": ["python", "-m", "train"]}]}}}}},
}  # fmt: skip


def kubectl_do(
    kubeconfig: Path, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [kubectl(), "--kubeconfig", str(kubeconfig), *args],
        input=stdin, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


async def console_acts_on_a_training_job(kube: Path, console: Pod) -> None:
    """A suspend and a delete from the console, with the admin token the bootstrap wrote:
    the console reads the job as its ServiceAccount, the operator applies the plan."""
    secret = kubectl_json(kube, "get", "secret", TOKEN_SECRETS[Scope.ADMIN], "-n", NAMESPACE)
    token = base64.b64decode(secret["data"]["prod"]).decode()
    done = await asyncio.to_thread(
        kubectl_do, kube, "apply", "-f", "-", stdin=json.dumps(TRAINING_JOB)
    )
    assert done.returncode == 0, done.stderr
    name = TRAINING_JOB["metadata"]["name"]
    base = f"http://127.0.0.1:{console.ports['http']}/v1/envs/prod/jobs/{name}"
    auth = {"Authorization": f"Bearer {token}"}

    def suspended() -> bool:
        job = kubectl_json(kube, "get", "trainingjob", name, "-n", NAMESPACE)
        return bool(job["spec"].get("suspend"))

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        async with http.post(f"{base}/suspend", headers=auth) as r:
            said = await r.json()
            assert r.status == 202, (said, console.said())
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not await asyncio.to_thread(suspended):
            assert time.monotonic() < deadline, f"plan {said['plan_id']} not applied"
            await asyncio.sleep(0.5)
        async with http.delete(base, headers=auth) as r:
            assert r.status == 200, (await r.text(), console.said())
    gone = await asyncio.to_thread(kubectl_do, kube, "get", "trainingjob", name, "-n", NAMESPACE)
    assert gone.returncode != 0 and "NotFound" in gone.stderr, gone


async def test_the_cluster_as_processes(
    kube: Path, api: client.ApiClient, own_pg: str, tmp_path: Path
) -> None:
    broker = Broker("127.0.0.1", log_dir=tmp_path / "broker")
    broker.start()
    pods: list[Pod] = []
    try:
        docs = {name: overlay(name) for name in INSTALL}
        for name in INSTALL:
            apply(kube, docs[name])
        create_postgres_secret(kube, own_pg)
        objects = cluster_objects(kube)

        # The bootstrap Job: its pod runs to completion.
        (job,) = of_kind(docs["prod"], "Job").values()
        bootstrap = await as_a_process(
            api, job, f"{job['metadata']['name']}-0", objects, broker, tmp_path
        )
        assert bootstrap.argv[:2] == ["dlrover-events", "bootstrap"]
        bootstrap.start()
        assert bootstrap.proc is not None
        code = await asyncio.to_thread(bootstrap.proc.wait, 180)
        assert code == 0, bootstrap.said()
        assert "bootstrap: done" in bootstrap.said()

        # Every Deployment's pods (the Secrets the bootstrap wrote are there now).
        objects = cluster_objects(kube)
        probes = []
        for name in INSTALL:
            for deployment in of_kind(docs[name], "Deployment").values():
                service = service_of(docs[name], deployment)
                named = {p["targetPort"] for p in service["spec"]["ports"]}
                (container,) = pod_spec(deployment)["containers"]
                for i in range(deployment["spec"]["replicas"]):
                    pod = await as_a_process(
                        api,
                        deployment,
                        f"{deployment['metadata']['name']}-{i}",
                        objects,
                        broker,
                        tmp_path,
                    )
                    pod.start()
                    pods.append(pod)
                    for probe in ("readinessProbe", "livenessProbe"):
                        get = container[probe]["httpGet"]
                        assert get["port"] in named, (service["metadata"]["name"], get)
                        probes.append((pod, get["path"], pod.ports[get["port"]]))
        assert len({p.workload["metadata"]["name"] for p in pods}) == 19
        await asyncio.gather(*(until_ready(pod, path, port) for pod, path, port in probes))

        # Every metric the monitoring asks for is served by a running service.
        served: set[str] = set()
        for pod in pods:
            served |= await metric_names(f"http://127.0.0.1:{pod.ports['metrics']}/metrics")
        asked = {
            base_name(s.name)
            for where, expr in expressions(with_component("monitoring", tmp_path / "monitoring"))
            for s in parse(where, expr).selectors
        }
        assert asked - {"up"} <= served, sorted(asked - {"up"} - served)

        # The operator's two replicas: one holds the Lease, each named by its pod.
        lease = kubectl_json(kube, "get", "lease", "dlrover-events-operator", "-n", NAMESPACE)
        holder = lease["spec"]["holderIdentity"]
        replicas = [
            p.name for p in pods if p.workload["metadata"]["name"] == "dlrover-events-operator"
        ]
        assert len(replicas) == 2
        assert [r for r in replicas if holder.startswith(f"{r}_")], (holder, replicas)

        # The real env's console acts on the cluster's TrainingJobs with its own token.
        (console,) = [p for p in pods if p.name == "dlrover-events-console-0"]
        await console_acts_on_a_training_job(kube, console)
    finally:
        stopped = {pod.name: pod.stop() for pod in reversed(pods)}
        broker.stop()
    unclean = {name: code for name, code in stopped.items() if code != 0}
    assert not unclean, {
        name: (code, next(p for p in pods if p.name == name).said())
        for name, code in unclean.items()
    }
