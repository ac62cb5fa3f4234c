"""A TrainingJob's pod is wired, end to end, on the real kube-apiserver: `bootstrap` keeps
the tokens in Secrets, the operator (its own process, as a Deployment runs it) creates the
job's pod, and the pod's environment, taken from the pod spec only (its Secret
references resolved from the Secrets on the apiserver), is given to a real process running
the example's training job: it fetches its config from the gateway with the pod's token and
publishes samples that the env's brain folds."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from dlrover_events.config.client import TOKEN_ENV, URL_ENV
from dlrover_events.settings import Settings
from handlers.gateway.runtime import GatewayServer, GatewaySettings
from streams.brain.runtime.app import Brain
from tests.conftest import REPO, cli_environ, unique_env
from tests.integration.test_bootstrap import bootstrap

from .kube import FakeKubelet
from .test_reconciler_support import Cluster, KubeletLoop, role, until

pytestmark = pytest.mark.integration

EXAMPLE = REPO / "examples" / "train_mnist_like.py"


async def resolved_env(
    api: client.ApiClient, namespace: str, container: dict[str, Any]
) -> dict[str, str]:
    """The container's environment as a kubelet makes it: values, and Secret keys read
    from the apiserver; any other source is not expected here."""
    core = client.CoreV1Api(api)
    found: dict[str, str] = {}
    for var in container.get("env") or []:
        if "value" in var:
            found[var["name"]] = var["value"]
            continue
        ref = (var.get("valueFrom") or {}).get("secretKeyRef")
        assert ref is not None, f"unexpected source of {var['name']}: {var}"
        secret = await core.read_namespaced_secret(ref["name"], namespace)
        found[var["name"]] = base64.b64decode(secret.data[ref["key"]]).decode()
    return found


def config_requests(gateway: GatewayServer, status: str) -> float:
    return sum(
        sample.value
        for metric in gateway.registry.collect()
        for sample in metric.samples
        if sample.name == "dlrover_events_gateway_requests_total"
        and sample.labels.get("status") == status
        and "config" in sample.labels.get("route", "")
    )


async def test_a_trainingjobs_pod_reports_with_only_what_its_spec_says(
    own_settings: Settings,
    own_pg: str,
    kube: Path,
    api: client.ApiClient,
    trainingjob_crd: str,
    namespace: str,
    kubelet: FakeKubelet,
    tmp_path: Path,
) -> None:
    conf = own_settings  # its real env is announced to no other test's operator
    environ = cli_environ(conf, own_pg)
    environ.pop("KUBECONFIG", None)
    env = unique_env("prod")
    args = ["--env", env, "--tokens", "kubernetes", "--kubeconfig", str(kube), "-n", namespace]
    code, out = await bootstrap(environ, *args)
    assert code == 0, out

    gateway = GatewayServer(conf, env, own_pg, GatewaySettings(port=0))
    brain = Brain(conf, env, own_pg)
    loop = KubeletLoop(kubelet, namespace)
    operator: asyncio.subprocess.Process | None = None
    log = tmp_path / "operator.log"
    async with gateway:
        await gateway.wait_ready()
        await brain.start()
        await loop.start()
        try:
            with log.open("w") as sink:
                operator = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-c",
                    "from dlrover_events.cli.app import main; main()",
                    "operator",
                    "--env",
                    env,
                    "--kubeconfig",
                    str(kube),
                    "-n",
                    namespace,
                    env={
                        **environ,
                        "DLROVER_EVENTS_METRICS_PORT": "0",
                        "DLROVER_EVENTS_OPERATOR_LEADER_ELECT": "false",
                        "DLROVER_EVENTS_OPERATOR_GATEWAY_URL": gateway.url,
                    },
                    stdout=sink,
                    stderr=asyncio.subprocess.STDOUT,
                )
            cluster = Cluster(conf, own_pg, api, namespace)
            name = await cluster.create_job({"worker": role(1)})
            pods = await until(lambda: cluster.pods(name), f"the pod of {name}; {log.read_text()}")
            job = await cluster.job(name)
            assert job is not None
            raw = await client.CoreV1Api(api).read_namespaced_pod(pods[0].name, namespace)
            spec = api.sanitize_for_serialization(raw.spec)
            pod_env = await resolved_env(api, namespace, spec["containers"][0])
            assert pod_env["DLROVER_EVENTS_BOOTSTRAP_SERVERS"] == conf.bootstrap_servers
            assert pod_env[URL_ENV] == gateway.url
            assert pod_env[TOKEN_ENV].startswith(f"dle.{env}.")
            plain = {v["name"] for v in spec["containers"][0]["env"] if "value" in v}
            assert TOKEN_ENV not in plain, "the token is a Secret reference, not a value"

            # the training process gets the pod's environment and nothing of the test's
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                str(EXAMPLE),
                "--steps",
                "400",
                "--interval-s",
                "0.2",
                cwd=tmp_path,
                env={**pod_env, "PATH": os.defpath, "HOME": str(tmp_path)},
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            async with asyncio.timeout(180):
                stdout, stderr = await proc.communicate()
            assert proc.returncode == 0, stderr.decode()
            summary = json.loads(stdout.decode().strip().splitlines()[-1])
            assert summary["job"] == job.uid and summary["env"] == env
            assert summary["published"] > 0 and summary["dropped"] == 0, summary
            assert "training with the default config" not in stderr.decode(), stderr.decode()
            assert config_requests(gateway, "200") >= 1, "the job read its config with the token"

            async def folded() -> int:
                state = brain.processor.states.get(job.uid)
                return len(state.samples) if state is not None else 0

            await until(folded, "the job's samples in the brain's state")
        finally:
            if operator is not None and operator.returncode is None:
                operator.terminate()
                await operator.wait()
            await loop.stop()
            await brain.stop()
