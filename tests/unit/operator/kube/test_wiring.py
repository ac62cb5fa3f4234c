"""What a TrainingJob's pod is told about the bus and the gateway (pure): the operator's
settings become variables, secretKeyRefs and Secret volumes; secrets never plain values;
the template's own variables win; a setting that leaves pods unable to connect is one
line at the start."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import SecretStr

from dlrover_events.errors import UserError
from dlrover_events.sdk.identity import CHECKPOINT_DIR_ENV
from dlrover_events.settings import Settings
from handlers.operator.document.trainingjob import parse_job
from handlers.operator.kube.runner import kube_settings
from handlers.operator.kube.trainingjob import PEERS_VOLUME, pod_manifest
from handlers.operator.kube.wiring import CA_DIR, CERT_DIR, PodWiring, pod_wiring
from handlers.operator.platform.bodies import NewPod
from tests.unit.operator.reconcile.test_planning import job_obj

PASSWORD = "s3cret-kafka-password"


def pod_env(wiring: PodWiring | None, env: str = "prod", **role: Any) -> dict[str, Any]:
    obj = job_obj(1, **role)
    j = parse_job(obj)
    res = j.roles["worker"].resources
    return pod_manifest(j, NewPod("worker", 0, 0, res), env, wiring=wiring)


def variables(manifest: dict[str, Any], container: int = 0) -> dict[str, Any]:
    found = manifest["spec"]["containers"][container]["env"]
    names = [e["name"] for e in found]
    assert len(names) == len(set(names)), f"a variable given twice: {names}"
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in found}


def test_a_pod_learns_the_bus_and_the_gateway_with_a_token_from_a_secret() -> None:
    wiring = pod_wiring(
        Settings(bootstrap_servers="kafka-0.kafka:9092"),
        gateway_url="http://dlrover-events-gateway.dlrover-events.svc:8470",
        token_secret="dlrover-events-gateway-read",
    )
    assert wiring.warnings == ()
    got = variables(pod_env(wiring, "prod"))
    assert got["DLROVER_EVENTS_BOOTSTRAP_SERVERS"] == "kafka-0.kafka:9092"
    assert (
        got["DLROVER_EVENTS_GATEWAY_URL"] == "http://dlrover-events-gateway.dlrover-events.svc:8470"
    )
    assert got["DLROVER_EVENTS_GATEWAY_TOKEN"] == {
        "secretKeyRef": {"name": "dlrover-events-gateway-read", "key": "prod"}
    }
    assert got["DLROVER_EVENTS_ENV"] == "prod", "its identity as before"
    # a job of another env (after a failover) reads that env's token
    other = variables(pod_env(wiring, "standby"))["DLROVER_EVENTS_GATEWAY_TOKEN"]
    assert other["secretKeyRef"]["key"] == "standby"


def test_without_a_gateway_url_the_pod_gets_the_bus_only_and_the_operator_says_so() -> None:
    wiring = pod_wiring(Settings(bootstrap_servers="kafka:9092"), token_secret="t")
    got = variables(pod_env(wiring))
    assert got["DLROVER_EVENTS_BOOTSTRAP_SERVERS"] == "kafka:9092"
    assert "DLROVER_EVENTS_GATEWAY_URL" not in got and "DLROVER_EVENTS_GATEWAY_TOKEN" not in got
    assert any("DLROVER_EVENTS_OPERATOR_GATEWAY_URL" in w for w in wiring.warnings)


def test_the_checkpoint_dir_reaches_every_pod_as_the_sdk_reads_it() -> None:
    """DLROVER_EVENTS_OPERATOR_CHECKPOINT_DIR becomes the SDK's default root in each pod, as
    the local and hosts platforms give theirs; unset, a pod gets none (the job's own)."""
    url = "s3://ckpt/team-a"
    wiring = pod_wiring(Settings(bootstrap_servers="kafka:9092"), checkpoint_dir=url)
    assert variables(pod_env(wiring))[CHECKPOINT_DIR_ENV] == url
    bare = pod_wiring(Settings(bootstrap_servers="kafka:9092"))
    assert CHECKPOINT_DIR_ENV not in variables(pod_env(bare))
    options = kube_settings({"checkpoint_dir": url})
    assert options.checkpoint_dir == url


def test_a_variable_the_template_sets_wins() -> None:
    wiring = pod_wiring(
        Settings(bootstrap_servers="kafka:9092"), gateway_url="http://g:8470", token_secret="t"
    )
    template = {
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "t:1",
                    "env": [
                        {"name": "DLROVER_EVENTS_BOOTSTRAP_SERVERS", "value": "mine:9093"},
                        {"name": "DLROVER_EVENTS_GATEWAY_URL", "value": "http://mine:1"},
                    ],
                }
            ]
        }
    }
    got = variables(pod_env(wiring, template=template))
    assert got["DLROVER_EVENTS_BOOTSTRAP_SERVERS"] == "mine:9093"
    assert got["DLROVER_EVENTS_GATEWAY_URL"] == "http://mine:1"
    assert "DLROVER_EVENTS_GATEWAY_TOKEN" in got, "what the template does not set is added"


def test_sasl_and_tls_go_by_secret_references_never_as_values() -> None:
    settings = Settings(
        bootstrap_servers="kafka:9093",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="operator",
        sasl_password=SecretStr(PASSWORD),
        ssl_cafile="/etc/kafka/cluster-ca/ca.crt",
        ssl_check_hostname=False,
    )
    wiring = pod_wiring(
        settings,
        gateway_url="http://g:8470",
        token_secret="dlrover-events-gateway-read",
        sasl_username="training",
        sasl_password_secret="training-kafka-user:password",
        ca_secret="kafka-cluster-ca-cert",
    )
    manifest = pod_env(wiring)
    got = variables(manifest)
    assert got["DLROVER_EVENTS_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert got["DLROVER_EVENTS_SASL_MECHANISM"] == "SCRAM-SHA-512"
    assert got["DLROVER_EVENTS_SASL_USERNAME"] == "training"
    assert got["DLROVER_EVENTS_SASL_PASSWORD"] == {
        "secretKeyRef": {"name": "training-kafka-user", "key": "password"}
    }
    assert got["DLROVER_EVENTS_SSL_CAFILE"] == f"{CA_DIR}/ca.crt"
    assert got["DLROVER_EVENTS_SSL_CHECK_HOSTNAME"] == "false"
    assert PASSWORD not in json.dumps(manifest), "the operator's password is no pod's value"
    # beside the job's peers file (a downward-API volume every pod of a job has)
    assert [v for v in manifest["spec"]["volumes"] if v["name"] != PEERS_VOLUME] == [
        {"name": "dlrover-events-kafka-ca", "secret": {"secretName": "kafka-cluster-ca-cert"}}
    ]
    mounts = manifest["spec"]["containers"][0]["volumeMounts"]
    assert [m for m in mounts if m["name"] != PEERS_VOLUME] == [
        {"name": "dlrover-events-kafka-ca", "mountPath": CA_DIR, "readOnly": True}
    ]


def test_the_pods_variables_make_settings_that_connect_as_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pod's environment, Secret references resolved, is what the SDK's Settings read."""
    settings = Settings(
        bootstrap_servers="kafka:9093",
        security_protocol="SSL",
        ssl_cafile="/etc/kafka/ca.pem",
        ssl_certfile="/etc/kafka/user.crt",
        ssl_keyfile="/etc/kafka/user.key",
    )
    wiring = pod_wiring(settings, ca_secret="kafka-ca", cert_secret="kafka-user")
    got = variables(pod_env(wiring))
    for name, value in got.items():
        if isinstance(value, str):
            monkeypatch.setenv(name, value)
    pod_settings = Settings()
    assert pod_settings.security_protocol == "SSL"
    assert str(pod_settings.ssl_cafile) == f"{CA_DIR}/ca.pem"
    assert str(pod_settings.ssl_certfile) == f"{CERT_DIR}/user.crt"
    assert str(pod_settings.ssl_keyfile) == f"{CERT_DIR}/user.key"
    assert pod_settings.bootstrap_servers == "kafka:9093"


@pytest.mark.parametrize(
    ("settings", "options", "says"),
    [
        (
            {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN"}
            | {"sasl_username": "u", "sasl_password": SecretStr("p")},
            {},
            "DLROVER_EVENTS_OPERATOR_POD_SASL_PASSWORD_SECRET=SECRET:KEY",
        ),
        (
            {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN"}
            | {"sasl_username": "u", "sasl_password": SecretStr("p")},
            {"sasl_password_secret": "no-key"},
            "give it as SECRET:KEY",
        ),
        (
            {"security_protocol": "SSL", "ssl_certfile": "/c", "ssl_keyfile": "/k"},
            {},
            "DLROVER_EVENTS_OPERATOR_POD_KAFKA_CERT_SECRET",
        ),
        ({}, {"ca_secret": "kafka-ca"}, "does not use it"),
        ({}, {"sasl_password_secret": "a:b"}, "does not use it"),
    ],
)
def test_settings_that_leave_pods_unable_to_connect_are_one_line(
    settings: dict[str, Any], options: dict[str, Any], says: str
) -> None:
    with pytest.raises(UserError) as err:
        pod_wiring(Settings(**settings), gateway_url="http://g:1", **options)
    assert says in str(err.value) and "\n" not in str(err.value)
