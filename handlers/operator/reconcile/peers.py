"""Where a job's pods find each other, on any platform: a stable address per pod of every
role, as variables, as a JSON document and as TensorFlow's ``TF_CONFIG``.

Pure: a function of the job and of how its platform names pods (``Addressing``). A pod's
address is a function of its role and *rank*, never of its pod's name or index, so a pod
that is replaced (killed, migrated) comes back at the address its peers already know:

- a cluster (``dns``): every pod is its own host, ``<role>-<rank>.<service>.<namespace>.svc``
  (the pod's hostname and subdomain under its role's headless Service), on the role's
  port;
- one machine (``ports``): every pod is ``127.0.0.1``, on its role's base port plus its
  rank (the platform gives each role a block of free ports at submission).

A role's addresses are those of ranks ``0..replicas-1``: the job's desired size, so a pod
made by a scale-up has its address in the document before it runs (the platform keeps the
document current: ``peers_document``), and a peer should retry until it answers.
Determined's ``ClusterInfo.container_addrs`` is the model; the SDK reads all of this back
(``dlrover_events.sdk.cluster.cluster_info``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from dlrover_events.sdk.identity import (
    ADDRESS_ENV,
    PEERS_ENV_PREFIX,
    PEERS_FILE_ENV,
    PORT_ENV,
    env_suffix,
)
from handlers.operator.platform.bodies import JobView

#: Where a role's pods listen when it says no ``port`` (TensorFlow's customary one).
DEFAULT_PORT = 2222
#: TensorFlow's roles: a job whose roles are all among these gets TF_CONFIG.
TF_ROLES = ("chief", "worker", "ps", "evaluator")
#: TF_CONFIG's cluster leaves the evaluator out (it is no member of the training cluster).
_TF_CLUSTER_ROLES = ("chief", "worker", "ps")

_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def service_name(job: str, role: str, suffix: str = "") -> str:
    """A Service of the job's role: ``<job>-<role><suffix>``, or, where that is no DNS-1035
    label of at most 63 characters (a Service name must be one; a job's name may be longer,
    or hold dots), the job's name cut short with a digest of job and role, so that it stays
    unique and stable."""
    name = f"{job}-{role}{suffix}"
    if len(name) <= 63 and _DNS_1035.match(name):
        return name
    digest = hashlib.sha256(f"{job}/{role}".encode()).hexdigest()[:10]
    stem = re.sub(r"[^a-z0-9-]+", "-", job.lower()).strip("-")
    stem = re.sub(r"^[^a-z]+", "", stem)[: 63 - len(digest) - len(suffix) - 2]
    return f"{stem.rstrip('-') or 'job'}-{digest}{suffix}"


def hostname(role: str, rank: int) -> str:
    """A pod's hostname under its role's Service: its role and rank (a DNS label: a role is
    at most 40 characters)."""
    return f"{role}-{rank}"


@dataclass(frozen=True)
class Addressing:
    """How a platform names its pods: ``dns`` (each pod its own host, under its role's
    headless Service) or ``ports`` (one ``host``, each role from its base port in
    ``ports``, one port per rank). ``peers_file``: where a pod reads the JSON document."""

    kind: Literal["dns", "ports"]
    peers_file: str
    host: str = "127.0.0.1"
    ports: Mapping[str, int] = field(default_factory=dict)


def port_of(job: JobView, role: str, rank: int, addressing: Addressing) -> int:
    """The port the pod of ``role`` and ``rank`` listens on."""
    if addressing.kind == "ports":
        base = addressing.ports.get(role)
        if base is None:
            raise ValueError(f"role {role} of job {job.name} has no port block on this platform")
        return base + rank
    return job.roles[role].port or DEFAULT_PORT


def address(job: JobView, role: str, rank: int, addressing: Addressing) -> str:
    """``host:port`` of the pod of ``role`` and ``rank``: the same whichever pod holds it."""
    port = port_of(job, role, rank, addressing)
    if addressing.kind == "ports":
        return f"{addressing.host}:{port}"
    host = f"{hostname(role, rank)}.{service_name(job.name, role)}.{job.namespace}.svc"
    return f"{host}:{port}"


def peers(job: JobView, addressing: Addressing) -> dict[str, list[str]]:
    """Every role's addresses, rank order, for the replicas the job wants now."""
    return {
        name: [address(job, name, rank, addressing) for rank in range(role.replicas)]
        for name, role in sorted(job.roles.items())
    }


def peers_env_name(role: str) -> str:
    """``DLROVER_EVENTS_PEERS_<ROLE>``."""
    return PEERS_ENV_PREFIX + env_suffix(role)


def is_tensorflow(job: JobView) -> bool:
    """Whether the job's roles are TensorFlow's (and it has a member of the cluster)."""
    return set(job.roles) <= set(TF_ROLES) and bool(set(job.roles) & set(_TF_CLUSTER_ROLES))


def tf_config(addresses: Mapping[str, list[str]], role: str, rank: int) -> dict[str, Any]:
    """TensorFlow's TF_CONFIG for one task: the cluster (chief, worker, ps; a role with no
    replicas left out) and the task itself."""
    cluster = {r: list(addresses[r]) for r in _TF_CLUSTER_ROLES if addresses.get(r)}
    return {"cluster": cluster, "task": {"type": role, "index": rank}}


def peers_document(job: JobView, addressing: Addressing) -> dict[str, Any]:
    """The JSON a job's pods read (the file in DLROVER_EVENTS_PEERS_FILE), kept current as
    the job is scaled: its generation, each role's replicas and addresses."""
    return {
        "job": job.name,
        "uid": job.uid,
        "generation": job.generation,
        "roles": {
            name: {"replicas": len(addrs), "addresses": addrs}
            for name, addrs in peers(job, addressing).items()
        },
    }


def peer_env(job: JobView, role: str, rank: int, addressing: Addressing) -> dict[str, str]:
    """What a new pod of ``role`` and ``rank`` is told: every role's addresses, its own
    address and port, where the document is, and TF_CONFIG for a TensorFlow job."""
    addresses = peers(job, addressing)
    env = {peers_env_name(name): ",".join(addrs) for name, addrs in addresses.items()}
    env[ADDRESS_ENV] = address(job, role, rank, addressing)
    env[PORT_ENV] = str(port_of(job, role, rank, addressing))
    env[PEERS_FILE_ENV] = addressing.peers_file
    if is_tensorflow(job):
        env["TF_CONFIG"] = json.dumps(tf_config(addresses, role, rank), sort_keys=True)
    return env


__all__ = [
    "DEFAULT_PORT",
    "TF_ROLES",
    "Addressing",
    "address",
    "hostname",
    "is_tensorflow",
    "peer_env",
    "peers",
    "peers_document",
    "peers_env_name",
    "port_of",
    "service_name",
    "tf_config",
]
