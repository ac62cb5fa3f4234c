"""Jobs of several roles (issue 40), pure: where each pod is (peers), in what order roles
start (startAfter), what a job may ask of itself with its own token (scales), and what a
TrainingJob may say of them and of its volumes."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover_events.sdk.cluster import cluster_info
from dlrover_events.sdk.identity import PEERS_FILE_ENV
from handlers.operator.document.submission import submission
from handlers.operator.document.trainingjob import parse_job
from handlers.operator.doors.jobs import JobRequestError, ScaleForbidden, check_job_scale
from handlers.operator.kube.trainingjob import pod_manifest, role_services
from handlers.operator.local.cluster import ANN_PORTS, check_volumes, port_blocks, with_peer_ports
from handlers.operator.platform.bodies import PENDING, RUNNING, NewPod, PodView, Resources
from handlers.operator.platform.errors import Invalid, InvalidJob
from handlers.operator.reconcile.peers import (
    Addressing,
    address,
    peer_env,
    peers,
    peers_document,
    peers_env_name,
    service_name,
    tf_config,
)
from handlers.operator.reconcile.planning import diff, waiting


def role(replicas: int, **more: Any) -> dict[str, Any]:
    return {
        "replicas": replicas,
        "template": {"spec": {"containers": [{"name": "main", "command": ["run"]}]}},
        **more,
    }


def doc(roles: dict[str, Any], name: str = "rl", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "dlrover-events.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": "ns", "uid": "u-1"},
        "spec": {"roles": roles, **spec},
    }


DI = doc(
    {
        "coordinator": role(1, port=9000, scales=["collector"]),
        "collector": role(
            2,
            minReplicas=1,
            maxReplicas=4,
            startAfter=["coordinator"],
            volumes=[{"name": "data", "mountPath": "/data"}],
        ),
        "learner": role(1, startAfter=["coordinator"]),
    },
    volumes=[{"name": "data", "emptyDir": {}}],
)
DNS = Addressing("dns", "/etc/peers.json")


def pod(role: str, rank: int, *, phase: str = RUNNING, ready: bool = True) -> PodView:
    return PodView(
        name=f"rl-{role}-{rank}",
        uid=f"p-{role}-{rank}",
        job="rl",
        job_uid="u-1",
        role=role,
        rank=rank,
        index=rank,
        phase=phase,
        deleting=False,
        resources=Resources(),
        ready=ready,
    )


# -- peers -----------------------------------------------------------------------------


def test_every_role_has_a_stable_address_per_rank_on_a_cluster() -> None:
    job = parse_job(DI)
    got = peers(job, DNS)
    assert got["coordinator"] == ["coordinator-0.rl-coordinator.ns.svc:9000"]
    assert got["collector"] == [
        "collector-0.rl-collector.ns.svc:2222",
        "collector-1.rl-collector.ns.svc:2222",
    ]
    env = peer_env(job, "collector", 1, DNS)
    assert env["DLROVER_EVENTS_PEERS_COLLECTOR"] == ",".join(got["collector"])
    assert env["DLROVER_EVENTS_ADDRESS"] == got["collector"][1]
    assert env["DLROVER_EVENTS_PORT"] == "2222"
    assert env[PEERS_FILE_ENV] == "/etc/peers.json"
    assert "TF_CONFIG" not in env  # not TensorFlow's roles


def test_one_machine_gives_each_rank_a_port_of_its_own() -> None:
    job = parse_job(DI)
    here = Addressing(
        "ports", "/tmp/p.json", ports={"coordinator": 21000, "collector": 21010, "learner": 21020}
    )
    assert peers(job, here)["collector"] == ["127.0.0.1:21010", "127.0.0.1:21011"]
    assert peer_env(job, "collector", 1, here)["DLROVER_EVENTS_PORT"] == "21011"


def test_tf_config_for_a_parameter_server_job() -> None:
    job = parse_job(doc({"ps": role(2), "worker": role(3), "chief": role(1), "evaluator": role(1)}))
    env = peer_env(job, "worker", 2, DNS)
    config = json.loads(env["TF_CONFIG"])
    assert config["task"] == {"type": "worker", "index": 2}
    assert config["cluster"]["ps"] == [
        "ps-0.rl-ps.ns.svc:2222",
        "ps-1.rl-ps.ns.svc:2222",
    ]
    assert len(config["cluster"]["worker"]) == 3 and len(config["cluster"]["chief"]) == 1
    assert "evaluator" not in config["cluster"]  # no member of the training cluster


role_names = st.from_regex(r"\A[a-z][a-z0-9]{0,8}(-[a-z0-9]{1,8})?\Z")


@given(
    job_name=st.from_regex(r"\A[a-z][a-z0-9.-]{0,80}[a-z0-9]\Z"),
    roles=st.dictionaries(role_names, st.integers(0, 6), min_size=1, max_size=5),
    port=st.integers(1, 65535),
)
def test_addresses_are_distinct_dns_names_that_depend_on_rank_alone(
    job_name: str, roles: dict[str, int], port: int
) -> None:
    job = parse_job(doc({r: role(n, port=port) for r, n in roles.items()}, name=job_name))
    # every role 3 replicas bigger: the ranks there before keep their addresses
    bigger = parse_job(doc({r: role(n + 3, port=port) for r, n in roles.items()}, name=job_name))
    got = peers(job, DNS)
    flat = [a for addrs in got.values() for a in addrs]
    assert len(flat) == len(set(flat)) == sum(roles.values())
    for name, n in roles.items():
        svc = service_name(job_name, name)
        assert len(svc) <= 63 and svc[0].isalpha()
        assert peers(bigger, DNS)[name][:n] == got[name]
        for rank in range(n):
            host, _, p = got[name][rank].rpartition(":")
            assert int(p) == port
            labels = host.split(".")
            assert labels[:2] == [f"{name}-{rank}", svc] and all(len(x) <= 63 for x in labels)
            assert address(bigger, name, rank, DNS) == got[name][rank]
    assert set(peer_env(job, next(iter(roles)), 0, DNS)) >= {peers_env_name(r) for r in roles}


@given(
    roles=st.dictionaries(
        st.sampled_from(["chief", "worker", "ps"]), st.integers(1, 4), min_size=1
    ),
    data=st.data(),
)
def test_tf_config_names_every_member_once(roles: dict[str, int], data: st.DataObject) -> None:
    job = parse_job(doc({r: role(n) for r, n in roles.items()}))
    me = data.draw(st.sampled_from(sorted(roles)))
    rank = data.draw(st.integers(0, roles[me] - 1))
    config = json.loads(peer_env(job, me, rank, DNS)["TF_CONFIG"])
    assert {r: len(a) for r, a in config["cluster"].items()} == roles
    assert config["cluster"][me][rank] == address(job, me, rank, DNS)
    assert config == tf_config(peers(job, DNS), me, rank)


def test_the_sdk_reads_the_peers_file_first(tmp_path: Any) -> None:
    job = parse_job(DI)
    path = tmp_path / "peers.json"
    path.write_text(json.dumps(peers_document(job, DNS)))
    env = {**peer_env(job, "learner", 0, DNS), PEERS_FILE_ENV: str(path)}
    env.update({"DLROVER_EVENTS_ROLE": "learner", "DLROVER_EVENTS_RANK": "0"})
    info = cluster_info(env)
    assert info.addresses("collector") == tuple(peers(job, DNS)["collector"])
    assert info.port == 2222 and info.role == "learner" and info.generation == job.generation
    # without the file: the variables it started with, the same addresses
    path.unlink()
    assert cluster_info(env).peers == {r: tuple(a) for r, a in peers(job, DNS).items()}


# -- Kubernetes: a Service per role, each pod under it, volumes ------------------------


def test_a_pod_is_its_rank_under_its_roles_service_with_its_volumes() -> None:
    job = parse_job(DI)
    services = {s["metadata"]["name"]: s for s in role_services(job)}
    assert set(services) == {"rl-coordinator", "rl-collector", "rl-learner"}
    assert services["rl-coordinator"]["spec"]["clusterIP"] == "None"
    assert services["rl-coordinator"]["spec"]["ports"][0]["port"] == 9000
    manifest = pod_manifest(job, NewPod("collector", 1, 5, Resources()), "prod")
    spec = manifest["spec"]
    assert (spec["hostname"], spec["subdomain"]) == ("collector-1", "rl-collector")
    assert {"name": "data", "emptyDir": {}} in spec["volumes"]
    (container,) = spec["containers"]
    assert {"name": "data", "mountPath": "/data"} in container["volumeMounts"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["DLROVER_EVENTS_VOLUME_DATA"] == "/data"
    assert env["DLROVER_EVENTS_ADDRESS"] == "collector-1.rl-collector.ns.svc:2222"
    # the coordinator is waited for: it gets a readiness probe on the SDK's ready file
    coordinator = pod_manifest(job, NewPod("coordinator", 0, 0, Resources()), "prod")
    assert "readinessProbe" in coordinator["spec"]["containers"][0]
    assert "readinessProbe" not in container


# -- startAfter -------------------------------------------------------------------------


def test_roles_after_the_coordinator_wait_until_it_is_ready() -> None:
    job = parse_job(DI)
    first = diff(job, [])
    assert [p.role for p in first.create] == ["coordinator"]
    pending = [pod("coordinator", 0, phase=PENDING, ready=False)]
    assert waiting(job, pending) == {"collector": ("coordinator",), "learner": ("coordinator",)}
    assert not diff(job, pending).create
    running = [pod("coordinator", 0, ready=False)]
    assert not diff(job, running).create
    ready = [pod("coordinator", 0)]
    assert sorted((p.role, p.rank) for p in diff(job, ready).create) == [
        ("collector", 0),
        ("collector", 1),
        ("learner", 0),
    ]


# -- what a TrainingJob may say ----------------------------------------------------------


@pytest.mark.parametrize(
    ("roles", "spec", "message"),
    [
        ({"a": role(1, startAfter=["b"])}, {}, "startAfter names role(s) b"),
        ({"a": role(1, startAfter=["a"])}, {}, "names the role itself"),
        (
            {"a": role(1, startAfter=["b"]), "b": role(1, startAfter=["a"])},
            {},
            "startAfter makes a cycle",
        ),
        ({"a": role(1, scales=["b"]), "b": role(1)}, {}, "declares no maxReplicas"),
        ({"a": role(1, port=0)}, {}, "port must be"),
        (
            {"a": role(1, volumes=[{"name": "x", "mountPath": "/x"}])},
            {},
            "volume(s) x not in spec.volumes",
        ),
        (
            {"a": role(1, volumes=[{"name": "x", "mountPath": "x"}])},
            {"volumes": [{"name": "x", "emptyDir": {}}]},
            "mountPath must be an absolute path",
        ),
        ({"a": role(1)}, {"volumes": [{"name": "x"}]}, "exactly one source"),
        (
            {"a": role(1)},
            {"volumes": [{"name": "x", "emptyDir": {}}, {"name": "x", "emptyDir": {}}]},
            "given twice",
        ),
    ],
)
def test_what_a_job_says_of_its_roles_is_checked(
    roles: dict[str, Any], spec: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidJob, match=re.escape(message)):
        parse_job(doc(roles, **spec))


def test_a_job_scales_itself_only_within_its_bounds() -> None:
    job = parse_job(DI)
    check_job_scale(job, "collector", 4)
    check_job_scale(job, "collector", 1)
    with pytest.raises(JobRequestError, match=r"beyond trainingjob rl's bounds for it: 1\.\.4"):
        check_job_scale(job, "collector", 5)
    with pytest.raises(ScaleForbidden, match="no role of trainingjob rl may scale learner"):
        check_job_scale(job, "learner", 1)
    with pytest.raises(JobRequestError, match="no role 'nope'"):
        check_job_scale(job, "nope", 1)


def test_a_field_the_api_server_would_drop_is_refused_at_submission() -> None:
    body = doc({"a": role(1, startafter=["b"])}, volume=[])
    with pytest.raises(JobRequestError) as info:
        submission(body)
    assert str(info.value).startswith(
        "spec.volume, spec.roles.a.startafter: no such field of a TrainingJob"
    )
    assert submission(DI)["spec"] == DI["spec"]


@given(low=st.integers(0, 8), span=st.integers(0, 8), asked=st.integers(-2, 20))
def test_a_job_scale_is_accepted_exactly_within_the_bounds(low: int, span: int, asked: int) -> None:
    job = parse_job(
        doc(
            {
                "boss": role(1, scales=["crew"]),
                "crew": role(low, minReplicas=low, maxReplicas=low + span),
            }
        )
    )
    within = max(low, 1) <= asked <= low + span
    try:
        check_job_scale(job, "crew", asked)
    except ScaleForbidden:
        raise
    except JobRequestError:
        assert not within
    else:
        assert within


# -- the local platform: port blocks, volumes it can give ---------------------------------


def test_each_local_role_gets_a_block_of_its_own_ports() -> None:
    held = set(range(20000, 32000, 2))  # every other port another job's: no block of 4 fits
    with pytest.raises(Invalid, match="free ports in a row"):
        with_peer_ports(DI, held)
    first = with_peer_ports(DI)
    ports = json.loads(first["metadata"]["annotations"][ANN_PORTS])
    assert set(ports) == {"coordinator", "collector", "learner"}
    job = parse_job(first)
    blocks = port_blocks([job])
    assert len(blocks) == 12  # 4 each: collector's maxReplicas, at least 4 for the others
    assert with_peer_ports(first) == first  # kept: a pod's port is its rank's for good
    second = json.loads(with_peer_ports(DI, blocks)["metadata"]["annotations"][ANN_PORTS])
    assert not blocks & {p + r for p in second.values() for r in range(4)}


def test_the_local_platform_refuses_a_volume_it_cannot_give() -> None:
    check_volumes(parse_job(DI))
    config = doc({"a": role(1)}, volumes=[{"name": "c", "configMap": {"name": "x"}}])
    with pytest.raises(Invalid, match="not configMap"):
        check_volumes(parse_job(config))
    relative = doc({"a": role(1)}, volumes=[{"name": "h", "hostPath": {"path": "data"}}])
    with pytest.raises(Invalid, match=r"hostPath\.path must be an absolute path"):
        check_volumes(parse_job(relative))
