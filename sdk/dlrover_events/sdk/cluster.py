"""Where this pod's job is: every role's pods by address, this pod's own, and the two
things a role of a multi-role job asks of its platform: "I am ready" and "scale that role".

    from dlrover_events.sdk.cluster import cluster_info, ready, scale

    info = cluster_info()               # Determined's ClusterInfo is the model
    serve_on(info.port)                 # where this pod listens for the others
    ready()                             # roles that start after this one may start now
    learner = info.addresses("learner")[0]
    scale("collector", 4)               # a role whose spec `scales` collector, in bounds

The platform sets it all on the pod (``handlers.operator.reconcile.peers``): one variable
per role, DLROVER_EVENTS_PEERS_<ROLE>, of ``host:port`` addresses in rank order; and a JSON
file (DLROVER_EVENTS_PEERS_FILE) it keeps current as the job is scaled, which
``cluster_info`` reads first, so a coordinator sees the collectors it asked for. An
address belongs to a role and rank, not to a pod: a pod replaced comes back at it.
Standard library only: a training image needs nothing more.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlrover_events.sdk.identity import (
    ADDRESS_ENV,
    JOB_NAME_ENV,
    JOB_TOKEN_ENV,
    JOBS_API_ENV,
    PEERS_ENV_PREFIX,
    PEERS_FILE_ENV,
    PORT_ENV,
    RANK_ENV,
    READY_FILE_ENV,
    ROLE_ENV,
    VOLUME_ENV_PREFIX,
    env_suffix,
)


class ClusterError(RuntimeError):
    """What the platform did not say, or refused; the message says which."""


class ScaleRefused(ClusterError):
    """The platform refused a scale request: ``status`` is its HTTP status (403: no role
    of the job may scale that one, or the token is not this job's; 422: beyond the
    role's bounds)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


@dataclass(frozen=True)
class ClusterInfo:
    """This pod's job as its platform says it now."""

    job: str
    role: str
    rank: int
    #: this pod's address, ``host:port`` (None: the platform gave none)
    address: str | None
    #: the port this pod listens on for its peers (None: none given)
    port: int | None
    #: every role's addresses, rank order, for its replicas now
    peers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: the job's generation the peers are of (None: read from the variables)
    generation: int | None = None

    def addresses(self, role: str) -> tuple[str, ...]:
        """The addresses of ``role``'s pods (empty: the job has none of it now)."""
        return self.peers.get(role, ())

    @property
    def container_addrs(self) -> list[str]:
        """Every pod's address, role by role (Determined's name)."""
        return [a for role in sorted(self.peers) for a in self.peers[role]]

    def volume(self, name: str, environ: Mapping[str, str] | None = None) -> Path | None:
        """Where the job volume ``name`` is seen (None: this role does not mount it)."""
        env = os.environ if environ is None else environ
        value = env.get(VOLUME_ENV_PREFIX + env_suffix(name))
        return Path(value) if value else None


def _from_file(path: str) -> tuple[dict[str, tuple[str, ...]], int | None] | None:
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    roles = raw.get("roles") if isinstance(raw, dict) else None
    if not isinstance(roles, dict):
        return None
    peers = {
        str(role): tuple(str(a) for a in (entry or {}).get("addresses") or ())
        for role, entry in roles.items()
    }
    generation = raw.get("generation")
    return peers, generation if isinstance(generation, int) else None


def _from_variables(env: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """The variables name roles upper-cased; the roles' own names are in the file only, so
    here a role is its variable's suffix, lower-cased and with '-' (role names are DNS
    labels: no '_' to lose)."""
    out = {}
    for key, value in env.items():
        if key.startswith(PEERS_ENV_PREFIX) and key != PEERS_FILE_ENV:
            role = key[len(PEERS_ENV_PREFIX) :].lower().replace("_", "-")
            out[role] = tuple(a for a in value.split(",") if a)
    return out


def cluster_info(environ: Mapping[str, str] | None = None) -> ClusterInfo:
    """Where this pod's job is now: the peers file when the platform keeps one (current
    after a scale), else the variables the pod started with. ClusterError when the
    platform said nothing of the kind (a process not started by it)."""
    env = os.environ if environ is None else environ
    read = _from_file(env[PEERS_FILE_ENV]) if env.get(PEERS_FILE_ENV) else None
    peers, generation = read if read is not None else (_from_variables(env), None)
    if not peers and not env.get(ADDRESS_ENV):
        raise ClusterError(
            f"no peers: {PEERS_FILE_ENV} and {PEERS_ENV_PREFIX}<ROLE> are not set (the "
            "platform sets them on a job's pods)"
        )
    port = env.get(PORT_ENV, "").strip()
    try:
        rank = int(env.get(RANK_ENV, "0") or 0)
    except ValueError:
        raise ClusterError(f"{RANK_ENV} must be an integer") from None
    return ClusterInfo(
        job=env.get(JOB_NAME_ENV, ""),
        role=env.get(ROLE_ENV, ""),
        rank=rank,
        address=env.get(ADDRESS_ENV) or None,
        port=int(port) if port.isdigit() else None,
        peers=peers,
        generation=generation,
    )


def ready(environ: Mapping[str, str] | None = None) -> bool:
    """Say this pod is ready: the roles that start after its role (``startAfter``) start
    once every pod of it has. False where the platform gave no ready file (a cluster pod
    whose template has its own readiness probe: the probe says it)."""
    env = os.environ if environ is None else environ
    path = env.get(READY_FILE_ENV)
    if not path:
        return False
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("ready\n")
    return True


def scale(
    role: str, replicas: int, environ: Mapping[str, str] | None = None, timeout_s: float = 10.0
) -> dict[str, Any]:
    """Ask the platform for ``replicas`` pods of ``role`` of this job, with the job's own
    token (given to the pods of a role whose spec ``scales`` that role): published as a
    ScalePlan whose source names this pod. Returns the answer (``plan_id``, ``source``);
    ScaleRefused says why not (beyond the role's bounds, a role this job may not scale)."""
    env = os.environ if environ is None else environ
    api, token, job = env.get(JOBS_API_ENV), env.get(JOB_TOKEN_ENV), env.get(JOB_NAME_ENV)
    if not api or not token or not job:
        raise ClusterError(
            f"{JOBS_API_ENV}, {JOB_TOKEN_ENV} and {JOB_NAME_ENV} must be set: the platform "
            "sets them on the pods of a role whose spec `scales` others"
        )
    by = f"{env.get(ROLE_ENV, 'pod')}-{env.get(RANK_ENV, '0')}"
    body = json.dumps({"role": role, "replicas": replicas, "by": by}).encode()
    request = urllib.request.Request(
        f"{api.rstrip('/')}/v1/jobs/{job}/scale",
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            return dict(json.loads(answer.read()))
    except urllib.error.HTTPError as e:
        try:
            message = str(json.loads(e.read()).get("error") or e.reason)
        except (ValueError, AttributeError):
            message = str(e.reason)
        raise ScaleRefused(e.code, message) from None
    except (urllib.error.URLError, OSError) as e:
        raise ClusterError(f"the jobs API at {api} did not answer: {e}") from None


__all__ = ["ClusterError", "ClusterInfo", "ScaleRefused", "cluster_info", "ready", "scale"]
