"""The deploy/ manifests as rendered (`kubectl kustomize`, kustomize v5), read: current
kustomize syntax; every service probed on a port its Service names; bind addresses set for
a cluster; the security posture of every pod; the operator's two replicas under leader
election. That the API server takes them is tests/integration/k8s/test_manifests.py; that
their containers run is test_cluster_as_processes.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]

from dlrover_events.envs.bootstrap import TOKEN_SECRETS
from dlrover_events.envs.tokens import Scope
from dlrover_events.settings import ENV_PREFIX, Settings
from handlers.console.runtime import ConsoleSettings
from handlers.operator.kube.runner import KubeSettings
from handlers.operator.kube.wiring import PodWiring, pod_wiring
from tests.integration.deploy.manifests import (
    BIND_VARIABLES,
    COMPONENTS,
    DEPLOY,
    OVERLAYS,
    Doc,
    component_of,
    kubectl,
    of_kind,
    overlay,
    parse,
    pod_spec,
    port_variable,
    render,
    service_of,
    with_component,
    workloads,
)
from tests.integration.k8s.kubelet_env import container_environment

#: kustomize's fields of old, which kustomize v5 warns about
OLD_FIELDS = {"bases", "commonLabels", "patchesJson6902", "patchesStrategicMerge", "vars",
              "imageTags"}  # fmt: skip
#: the Deployments of each env, by the name kustomize gives them
SERVICES = ["archiver", "brain", "checkpoints", "console", "evaluator", "experiments-recorder",
            "gateway", "operator", "searcher", "watchdog"]  # fmt: skip
#: who may hold a ServiceAccount token, per overlay
TOKENS = {
    "prod": {
        "dlrover-events-operator", "dlrover-events-gateway", "dlrover-events-console",
        "dlrover-events-bootstrap",
    },
    "standby": set(),
}  # fmt: skip


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[Doc]]:
    return request.param, overlay(request.param)


def config_map(docs: list[Doc]) -> dict[str, str]:
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and "ENV" in d.get("data", {})]
    data: dict[str, str] = cm["data"]
    return data


def test_kustomizations_use_current_fields_only() -> None:
    files = sorted(DEPLOY.glob("**/kustomization.yaml"))
    assert len(files) >= 6
    for file in files:
        fields = set(yaml.safe_load(file.read_text()))
        assert not fields & OLD_FIELDS, f"{file}: {sorted(fields & OLD_FIELDS)}"


@pytest.mark.parametrize("name", OVERLAYS)
def test_overlays_render_without_warnings(name: str) -> None:
    done = subprocess.run(
        [kubectl(), "kustomize", str(DEPLOY / "overlays" / name)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr


@pytest.mark.parametrize("component", COMPONENTS)
def test_components_render_over_the_install(component: str, tmp_path: Path) -> None:
    with_component(component, tmp_path)  # fails with kustomize's message


def test_cluster_rbac_gives_the_operator_its_rules_cluster_wide(tmp_path: Path) -> None:
    (role,) = [
        r for r in of_kind(overlay("prod"), "Role").values() if "operator" in r["metadata"]["name"]
    ]
    docs = with_component("cluster-rbac", tmp_path)
    assert sorted(of_kind(docs, "Role")) == ["dlrover-events-gateway"]
    cluster_role = of_kind(docs, "ClusterRole")["dlrover-events-operator"]
    assert cluster_role["rules"] == role["rules"]  # one copy of the rules
    binding = of_kind(docs, "ClusterRoleBinding")["dlrover-events-operator"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
        "name": "dlrover-events-operator",
    }  # fmt: skip
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "dlrover-events-operator", "namespace": "dlrover-events"}
    ]
    assert sorted(of_kind(docs, "RoleBinding")) == ["dlrover-events-gateway"]


def test_every_env_runs_each_service_once(rendered: tuple[str, list[Doc]]) -> None:
    name, docs = rendered
    deployments = of_kind(docs, "Deployment").values()
    expected = [s for s in SERVICES if name == "prod" or s != "watchdog"]
    assert sorted(of_kind(docs, "Job")) == (["dlrover-events-bootstrap"] if name == "prod" else [])
    assert sorted(component_of(d) for d in deployments) == expected
    prefix = "" if name == "prod" else f"{name}-"
    for d in deployments:
        assert d["metadata"]["name"] == f"{prefix}dlrover-events-{component_of(d)}"
        (container,) = pod_spec(d)["containers"]
        assert container["command"] == ["dlrover-events"]
        assert container["args"] == [component_of(d), "--env", "$(ENV)"]
        assert container["image"] == "dlrover-events:0.1.0"
        # Selectors keep each env's pods apart from the other envs' in one namespace.
        assert d["spec"]["selector"]["matchLabels"]["dlrover-events.io/env"] == name
    assert config_map(docs)["ENV"] == name


def test_every_service_is_probed_on_a_port_its_service_names(
    rendered: tuple[str, list[Doc]],
) -> None:
    _, docs = rendered
    settings = config_map(docs)
    for deployment in of_kind(docs, "Deployment").values():
        (container,) = pod_spec(deployment)["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        service = service_of(docs, deployment)
        named = {p["targetPort"]: p["port"] for p in service["spec"]["ports"]}
        assert set(named) == set(ports), (service["metadata"]["name"], named, ports)
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
        for port_name, number in ports.items():
            variable = port_variable(deployment, port_name)
            assert settings[variable] == str(number), (variable, number)
            assert named[port_name] == number


def test_bind_addresses_are_set_for_a_cluster(rendered: tuple[str, list[Doc]]) -> None:
    _, docs = rendered
    settings = config_map(docs)
    hosts = sorted(BIND_VARIABLES.values())
    assert {v: settings[v] for v in hosts} == dict.fromkeys(hosts, "0.0.0.0")


def test_security_posture(rendered: tuple[str, list[Doc]]) -> None:
    name, docs = rendered
    with_token = set()
    for workload in workloads(docs):
        pod = pod_spec(workload)
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 10001  # the image's USER
        assert pod["enableServiceLinks"] is False
        for container in pod["containers"]:
            ctx = container["securityContext"]
            assert ctx["readOnlyRootFilesystem"] is True
            assert ctx["allowPrivilegeEscalation"] is False
            assert ctx["capabilities"]["drop"] == ["ALL"]
        if pod["automountServiceAccountToken"]:
            with_token.add(pod["serviceAccountName"])
    assert with_token == TOKENS[name]
    dockerfile = (DEPLOY.parent / "Dockerfile").read_text()
    assert re.search(r"^USER 10001:10001$", dockerfile, flags=re.M)


def test_prod_operator_runs_two_replicas_under_leader_election() -> None:
    docs = overlay("prod")
    operator = of_kind(docs, "Deployment")["dlrover-events-operator"]
    assert operator["spec"]["replicas"] == 2
    assert operator["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    (container,) = pod_spec(operator)["containers"]
    env = {e["name"] for e in container["env"]} | set(config_map(docs))
    # Leader election is the operator's default (KubeSettings.leader_elect): nothing
    # may turn it off, and each replica names itself in the Lease by its pod.
    assert "DLROVER_EVENTS_OPERATOR_LEADER_ELECT" not in env
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in (
        container["env"]
    )
    budgets = of_kind(docs, "PodDisruptionBudget")
    assert sorted(budgets) == ["dlrover-events-gateway", "dlrover-events-operator"]
    for budget in budgets.values():
        assert budget["apiVersion"] == "policy/v1"
        assert budget["spec"]["minAvailable"] == 1
        target = of_kind(docs, "Deployment")[budget["metadata"]["name"]]
        assert budget["spec"]["selector"] == target["spec"]["selector"]
        assert target["spec"]["replicas"] == 2


def test_standby_operator_runs_alone_without_a_budget() -> None:
    docs = overlay("standby")
    operator = of_kind(docs, "Deployment")["standby-dlrover-events-operator"]
    assert operator["spec"]["replicas"] == 1
    assert operator["spec"]["strategy"] == {"type": "Recreate"}
    assert sorted(of_kind(docs, "PodDisruptionBudget")) == ["standby-dlrover-events-gateway"]


def console_settings(
    docs: list[Doc], deployment: str, monkeypatch: pytest.MonkeyPatch, **config: str
) -> ConsoleSettings:
    """The console's settings as its pod gets them (envFrom, then env; ``config`` added to
    the ConfigMap, as an overlay's literals would)."""
    (container,) = pod_spec(of_kind(docs, "Deployment")[deployment])["containers"]
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and "ENV" in d.get("data", {})]
    env = container_environment(
        container,
        fields={"metadata.name": "console-0"},
        config_maps={cm["metadata"]["name"]: {**cm["data"], **config}},
        secrets={"dlrover-events-postgres": {"dsn": "postgresql://db/x"}},
    )
    for name in [n for n in os.environ if n.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return ConsoleSettings()


def test_the_real_env_s_console_acts_on_the_cluster_as_its_own_account(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The prod console acts on the cluster's TrainingJobs (a scale, suspend, resume or
    delete on the local platform would answer "no trainingjob"), with a token of its own
    account that may read and delete TrainingJobs and nothing else, in the namespace the
    operator acts in; the standby env's console holds no credentials."""
    docs = overlay("prod")
    pod = pod_spec(of_kind(docs, "Deployment")["dlrover-events-console"])
    assert (pod["serviceAccountName"], pod["automountServiceAccountToken"]) == (
        "dlrover-events-console", True,
    )  # fmt: skip
    conf = console_settings(docs, "dlrover-events-console", monkeypatch)
    assert (conf.platform, conf.kubeconfig, conf.namespace) == ("kubernetes", None, None)
    moved = console_settings(
        docs, "dlrover-events-console", monkeypatch, DLROVER_EVENTS_OPERATOR_NAMESPACE="training"
    )
    assert moved.namespace == "training"  # where the operator's TrainingJobs are
    (rules,) = [r["rules"] for n, r in of_kind(docs, "Role").items() if "console" in n]
    assert rules == [
        {"apiGroups": ["dlrover-events.io"], "resources": ["trainingjobs"],
         "verbs": ["get", "delete"]},
    ]  # fmt: skip
    binding = of_kind(docs, "RoleBinding")["dlrover-events-console"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "dlrover-events-console", "namespace": "dlrover-events"}
    ]
    # cluster-rbac: the same rules for the TrainingJobs of another namespace
    cluster = with_component("cluster-rbac", tmp_path)
    assert of_kind(cluster, "ClusterRole")["dlrover-events-console"]["rules"] == rules
    standby = overlay("standby")
    pod = pod_spec(of_kind(standby, "Deployment")["standby-dlrover-events-console"])
    assert pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == "standby-no-cluster-credentials"
    conf = console_settings(standby, "standby-dlrover-events-console", monkeypatch)
    assert conf.platform == "local"  # it acts on no cluster


def operator_wiring(settings: Settings) -> PodWiring:
    """What the real env's operator tells TrainingJob pods, from the same environment
    (as handlers/operator/kube/runner.py makes it)."""
    conf = KubeSettings()
    return pod_wiring(
        settings,
        bootstrap_servers=conf.pod_bootstrap_servers,
        gateway_url=conf.gateway_url,
        token_secret=conf.gateway_token_secret,
        sasl_username=conf.pod_sasl_username,
        sasl_password_secret=conf.pod_sasl_password_secret,
        ca_secret=conf.pod_kafka_ca_secret,
        cert_secret=conf.pod_kafka_cert_secret,
    )


def test_training_pods_are_told_the_gateway_service(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = overlay("prod")
    wiring = operator_wiring(settings_of(docs, monkeypatch))
    assert not wiring.warnings
    url = dict(wiring.values)["DLROVER_EVENTS_GATEWAY_URL"]
    gateway = of_kind(docs, "Service")["dlrover-events-gateway"]
    (http,) = [p for p in gateway["spec"]["ports"] if p["name"] == "http"]
    namespace = gateway["metadata"]["namespace"]
    assert url == f"http://{gateway['metadata']['name']}.{namespace}.svc:{http['port']}"
    assert wiring.token_secret == TOKEN_SECRETS[Scope.READ]  # what the bootstrap writes


def settings_of(docs: list[Doc], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The Settings every process of the install gets from its ConfigMap (their own check
    that the values hold together included)."""
    for name in [n for n in os.environ if n.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(name)
    for name, value in config_map(docs).items():
        if name.startswith(ENV_PREFIX):
            monkeypatch.setenv(name, value)
    return Settings()


@pytest.mark.parametrize(
    ("component", "protocol"), [("kafka-tls", "SSL"), ("kafka-scram", "SASL_SSL")]
)
def test_kafka_security_components_hold_together(
    component: str, protocol: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = with_component(component, tmp_path)
    settings = settings_of(docs, monkeypatch)
    assert settings.security_protocol == protocol
    files = [
        f
        for f in (
            settings.ssl_cafile,
            settings.ssl_certfile,
            settings.ssl_keyfile,
            settings.sasl_password_file,
        )
        if f is not None
    ]
    assert settings.ssl_cafile in files
    secrets_of_files = {}
    for workload in workloads(docs):
        pod = pod_spec(workload)
        (container,) = pod["containers"]
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        for file in files:
            # every file the settings name is a key of a Secret mounted at its folder
            mount = mounts[str(file.parent)]
            assert mount["readOnly"] is True
            secret = volumes[mount["name"]]["secret"]
            keys = [i["path"] for i in secret.get("items", [])] or [file.name]
            assert file.name in keys, (workload["metadata"]["name"], file, secret)
            secrets_of_files[file] = secret["secretName"]
    # Training pods get the same Secrets from the operator (handlers/operator/kube/wiring.py),
    # which takes its settings without a word of warning.
    assert not operator_wiring(settings).warnings
    pods = config_map(docs)
    assert (
        pods["DLROVER_EVENTS_OPERATOR_POD_KAFKA_CA_SECRET"] == secrets_of_files[settings.ssl_cafile]
    )
    if settings.ssl_certfile is not None:
        assert (
            pods["DLROVER_EVENTS_OPERATOR_POD_KAFKA_CERT_SECRET"]
            == (secrets_of_files[settings.ssl_certfile])
        )
    if settings.sasl_password_file is not None:
        name, _, key = pods["DLROVER_EVENTS_OPERATOR_POD_SASL_PASSWORD_SECRET"].partition(":")
        assert (name, key) == (
            secrets_of_files[settings.sasl_password_file],
            settings.sasl_password_file.name,
        )


def test_strimzi_topics_are_the_command_s_output_for_the_install(tmp_path: Path) -> None:
    """deploy/kafka-topics/topics.yaml is what `env topics --strimzi` renders for the
    install's envs with the install's topic settings (it cannot drift from the code)."""
    install = overlay("prod")
    envs = [config_map(overlay(name))["ENV"] for name in ("prod", "standby")]
    environ = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    environ |= {k: v for k, v in config_map(install).items() if k.startswith(ENV_PREFIX)}
    cli = Path(sys.executable).parent / "dlrover-events"
    done = subprocess.run(
        [str(cli), "env", "topics", *envs, "--strimzi", "--cluster", "my-cluster"],
        capture_output=True, text=True, timeout=120, check=False, env=environ, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    committed = parse((DEPLOY / "kafka-topics" / "topics.yaml").read_text())
    assert committed == parse(done.stdout)
    rendered = render(DEPLOY / "kafka-topics")
    assert len(rendered) == len(committed)
    for topic in rendered:
        assert topic["metadata"]["namespace"] == "kafka"
        assert topic["metadata"]["labels"]["strimzi.io/cluster"] == "my-cluster"
    # Strimzi's topics replace the app's only with the app told not to make them.
    settings = config_map(with_component("strimzi-topics", tmp_path / "with"))
    assert settings["DLROVER_EVENTS_CREATE_TOPICS"] == "false"
