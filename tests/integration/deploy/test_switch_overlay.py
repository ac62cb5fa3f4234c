"""The real/virtual switch in the rendered install (`kubectl kustomize`): the operator that
holds the cluster's credentials (prod's) follows the real env, so a promotion of the
standby reaches the cluster; the standby's own operator stays the simulator, with no
credentials; the watchdog's standby is the env the standby overlay runs, and the
bootstrap makes it. That the switch then happens is test_reconciler_promotion.py (an
operator that follows the real env) and tests/integration/local/test_up_switch.py.
"""

from __future__ import annotations

import os

import pytest

from dlrover_events.settings import ENV_PREFIX
from handlers.operator.kube.runner import KubeSettings
from handlers.operator.wiring.modes import follows_real
from tests.integration.deploy.manifests import Doc, of_kind, overlay, pod_spec
from tests.integration.k8s.kubelet_env import container_environment

pytestmark = pytest.mark.integration


def environment(docs: list[Doc], deployment: str) -> dict[str, str]:
    """A container's variables as the kubelet gives them (envFrom, then env)."""
    (container,) = pod_spec(of_kind(docs, "Deployment")[deployment])["containers"]
    config_maps = {
        d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"
    }
    return container_environment(
        container,
        fields={"metadata.name": f"{deployment}-0"},
        config_maps=config_maps,
        secrets={"dlrover-events-postgres": {"dsn": "postgresql://db/x"}},
    )


def as_the_pod(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for name in [n for n in os.environ if n.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def test_prod_s_operator_follows_the_real_env_and_the_standby_s_stays_the_simulator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prod, standby = overlay("prod"), overlay("standby")

    operator = environment(prod, "dlrover-events-operator")
    as_the_pod(monkeypatch, operator)
    assert follows_real({}), "prod's operator must act for whichever env is real"
    assert KubeSettings().follow_real
    pod = pod_spec(of_kind(prod, "Deployment")["dlrover-events-operator"])
    assert pod["serviceAccountName"] == "dlrover-events-operator"
    assert pod.get("automountServiceAccountToken", True), "it acts with the cluster's rights"
    # the env it is started for is prod; it acts for standby once that one is promoted
    assert operator["ENV"] == "prod"
    assert operator["DLROVER_EVENTS_WATCHDOG_STANDBY"] == "standby"

    simulator = environment(standby, "standby-dlrover-events-operator")
    as_the_pod(monkeypatch, simulator)
    assert simulator["ENV"] == "standby"
    assert not follows_real({}), "the standby's operator is its simulator, until promoted"
    pod = pod_spec(of_kind(standby, "Deployment")["standby-dlrover-events-operator"])
    assert pod["automountServiceAccountToken"] is False, "the standby holds no credentials"

    # the standby the watchdog promotes is the env the standby overlay runs, and prod's
    # bootstrap makes it (with prod's settings, unless told others)
    watchdog = environment(prod, "dlrover-events-watchdog")
    assert watchdog["DLROVER_EVENTS_WATCHDOG_STANDBY"] == simulator["ENV"]
    (job,) = of_kind(prod, "Job").values()
    (container,) = pod_spec(job)["containers"]
    boot = container_environment(
        container,
        fields={"metadata.name": "bootstrap-0"},
        config_maps={
            d["metadata"]["name"]: d.get("data", {}) for d in prod if d["kind"] == "ConfigMap"
        },
        secrets={"dlrover-events-postgres": {"dsn": "postgresql://db/x"}},
    )
    assert boot["DLROVER_EVENTS_WATCHDOG_STANDBY"] == "standby"
    assert container["args"][0] == "bootstrap"
    # the standby's processes are not told to follow: its operator would then be a real one
    for name in of_kind(standby, "Deployment"):
        assert "DLROVER_EVENTS_OPERATOR_FOLLOW_REAL" not in environment(standby, name), name
