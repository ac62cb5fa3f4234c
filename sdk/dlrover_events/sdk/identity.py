"""Who a training process is, as the operator tells it through environment variables.

The operator sets these on every pod of a job, so a training script needs no arguments to
report: the same image runs under any job, role and rank. Names are spelled out here once;
the operator and the docs use these constants.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dlrover_events.config.matching import job_attributes
from schemas.bounds import MAX_NODES
from schemas.envelope import _check_env
from schemas.jobs import JobMeta, NodeRef

JOB_ID_ENV = "DLROVER_EVENTS_JOB_ID"
JOB_NAME_ENV = "DLROVER_EVENTS_JOB_NAME"
ROLE_ENV = "DLROVER_EVENTS_ROLE"
RANK_ENV = "DLROVER_EVENTS_RANK"
WORLD_SIZE_ENV = "DLROVER_EVENTS_WORLD_SIZE"
ENV_ENV = "DLROVER_EVENTS_ENV"
NAMESPACE_ENV = "DLROVER_EVENTS_NAMESPACE"
CLUSTER_ENV = "DLROVER_EVENTS_CLUSTER"
USER_ENV = "DLROVER_EVENTS_USER"
GROUP_ENV = "DLROVER_EVENTS_GROUP"
SCENARIO_ENV = "DLROVER_EVENTS_SCENARIO"
APP_ENV = "DLROVER_EVENTS_APP"
#: ``k1=v1,k2=v2``: the job's labels, which config documents may target (``labels.k1``).
LABELS_ENV = "DLROVER_EVENTS_LABELS"

#: torchrun and most launchers set these per rendezvous. RANK is the process's rank in the
#: torch world (``process_rank``), and the node id only when the operator gave none: under
#: torchrun it changes at each re-rendezvous, while DLROVER_EVENTS_RANK (the pod's node
#: rank) stays. WORLD_SIZE is the torch world of this rendezvous, so it wins over
#: DLROVER_EVENTS_WORLD_SIZE (the operator's replica count, for roles without torchrun).
LAUNCHER_RANK_ENV = "RANK"
LAUNCHER_WORLD_SIZE_ENV = "WORLD_SIZE"
#: Machines the job trains on: torchrun's agents in this rendezvous (GROUP_WORLD_SIZE), or
#: what a launcher without torchrun says (DLROVER_EVENTS_NUM_NODES). Samples carry it: a
#: step's all-reduce crosses the network only between nodes.
LAUNCHER_NUM_NODES_ENV = "GROUP_WORLD_SIZE"
NUM_NODES_ENV = "DLROVER_EVENTS_NUM_NODES"

#: A directory the platform gives a job's processes for their checkpoints (the local
#: platform sets it); a job's file there is named after the job, so a resubmitted job
#: (a new uuid) does not resume another's training.
CHECKPOINT_DIR_ENV = "DLROVER_EVENTS_CHECKPOINT_DIR"

#: An in-place elastic role (``elastic.mode: inPlace``): the job's membership store
#: (``host:port``), which the process with ELASTIC_STORE_HOST_ENV=1 hosts; how many
#: members the first generation waits for; and, for a warm spare, the file the platform
#: writes to admit it (the pod's variables it takes on). See dlrover_events.sdk.torch.inplace.
ELASTIC_STORE_ENV = "DLROVER_EVENTS_ELASTIC_STORE"
ELASTIC_STORE_HOST_ENV = "DLROVER_EVENTS_ELASTIC_STORE_HOST"
ELASTIC_EXPECT_ENV = "DLROVER_EVENTS_ELASTIC_EXPECT"
ELASTIC_ADMIT_ENV = "DLROVER_EVENTS_ELASTIC_ADMIT"

#: Where a job's roles find each other (dlrover_events.sdk.cluster): one variable per role,
#: DLROVER_EVENTS_PEERS_<ROLE> (the role upper-cased, '-' as '_'), its pods' stable
#: addresses (``host:port``, rank order, comma-separated); a JSON file the platform keeps
#: current as the job is scaled (its path in DLROVER_EVENTS_PEERS_FILE); this pod's own
#: address and the port it listens on.
PEERS_ENV_PREFIX = "DLROVER_EVENTS_PEERS_"
PEERS_FILE_ENV = "DLROVER_EVENTS_PEERS_FILE"
ADDRESS_ENV = "DLROVER_EVENTS_ADDRESS"
PORT_ENV = "DLROVER_EVENTS_PORT"
#: The file whose existence says this pod is ready (the SDK's ``ready()`` writes it): a
#: role that starts after this one waits for it (or for the pod's readiness probe).
READY_FILE_ENV = "DLROVER_EVENTS_READY_FILE"
#: A role allowed to scale others of its job (``scales``): the platform's jobs API and a
#: token scoped to this job alone (dlrover_events.sdk.cluster.scale).
JOBS_API_ENV = "DLROVER_EVENTS_JOBS_API"
JOB_TOKEN_ENV = "DLROVER_EVENTS_JOB_TOKEN"
#: A job volume the role names: DLROVER_EVENTS_VOLUME_<NAME> is where it is seen (its
#: mountPath on a cluster, its host directory on the local platform).
VOLUME_ENV_PREFIX = "DLROVER_EVENTS_VOLUME_"


def env_suffix(name: str) -> str:
    """A role's or volume's name as a variable's suffix: upper-cased, '-' as '_'."""
    return name.upper().replace("-", "_").replace(".", "_")


def default_checkpoint_path(job_uuid: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """``$DLROVER_EVENTS_CHECKPOINT_DIR/<job uuid>.pt``, None when no directory is given."""
    directory = (os.environ if environ is None else environ).get(CHECKPOINT_DIR_ENV, "")
    if not directory:
        return None
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in job_uuid)
    return Path(directory) / f"{safe}.pt"


DEFAULT_ENV = "prod"
DEFAULT_ROLE = "worker"


class IdentityError(ValueError):
    """The environment does not say who this process is; the message names the variable."""


@dataclass(frozen=True)
class JobIdentity:
    """One process of one job: the job, its role (node type) and its rank (node id).

    ``rank`` is the node id the brain knows the pod by; ``process_rank`` and
    ``world_size`` are this process's place in the torch world, which an elastic job
    changes at each re-rendezvous (torchrun starts new worker processes then, so a process
    reads them once).
    """

    job: JobMeta
    env: str = DEFAULT_ENV
    role: str = DEFAULT_ROLE
    rank: int = 0
    world_size: int = 1
    extra_attributes: Mapping[str, str] = field(default_factory=dict)
    process_rank: int = 0
    #: machines the job's processes run on (None: not known).
    num_nodes: int | None = None

    def __post_init__(self) -> None:
        try:
            _check_env(self.env)
        except ValueError as err:
            raise IdentityError(f"{ENV_ENV}: {err}") from None
        if not self.role:
            raise IdentityError(f"{ROLE_ENV} must not be empty")
        if self.rank < 0:
            raise IdentityError(f"{RANK_ENV} must be >= 0, got {self.rank}")
        if self.world_size < 1:
            raise IdentityError(f"{WORLD_SIZE_ENV} must be >= 1, got {self.world_size}")
        if self.process_rank < 0:
            raise IdentityError(f"{LAUNCHER_RANK_ENV} must be >= 0, got {self.process_rank}")
        if self.num_nodes is not None and not 1 <= self.num_nodes <= MAX_NODES:
            raise IdentityError(
                f"{NUM_NODES_ENV} must be within [1, {MAX_NODES}], got {self.num_nodes}"
            )

    @property
    def node(self) -> NodeRef:
        return NodeRef(type=self.role, id=self.rank)

    @property
    def source(self) -> str:
        """The envelope's ``source``: enough to find the pod that said it."""
        return f"sdk/{self.job.uuid}/{self.role}-{self.rank}"

    def attributes(self) -> dict[str, str]:
        """The job as the config gateway matches it (its query parameters): the job's
        attributes as the brain sees them too, plus this process's role and rank."""
        attrs = job_attributes(self.job)
        attrs.update({"role": self.role, "rank": str(self.rank)})
        attrs.update(self.extra_attributes)
        return {k: v for k, v in attrs.items() if v}

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, job_id: str | None = None
    ) -> JobIdentity:
        """Read the identity the operator gave this pod; ``job_id`` overrides the variable.

        Only the job id is required: a job without one could not be told apart on the bus.
        """
        env = os.environ if environ is None else environ
        uuid = job_id or env.get(JOB_ID_ENV, "").strip()
        if not uuid:
            raise IdentityError(
                f"{JOB_ID_ENV} is not set: the operator sets it on a job's pods; set it by "
                "hand (any unique id) to report from a job started another way"
            )
        meta = JobMeta(
            uuid=uuid,
            name=env.get(JOB_NAME_ENV, ""),
            namespace=env.get(NAMESPACE_ENV, "") or "default",
            cluster=env.get(CLUSTER_ENV, ""),
            user=env.get(USER_ENV, ""),
            group=env.get(GROUP_ENV, ""),
            scenario=env.get(SCENARIO_ENV, ""),
            app=env.get(APP_ENV, ""),
            labels=parse_labels(env.get(LABELS_ENV, "")),
        )
        return cls(
            job=meta,
            env=env.get(ENV_ENV, "").strip() or DEFAULT_ENV,
            role=env.get(ROLE_ENV, "").strip() or DEFAULT_ROLE,
            rank=_int(env, (RANK_ENV, LAUNCHER_RANK_ENV), 0),
            world_size=_int(env, (LAUNCHER_WORLD_SIZE_ENV, WORLD_SIZE_ENV), 1),
            process_rank=_int(env, (LAUNCHER_RANK_ENV,), 0),
            num_nodes=_optional_int(env, (LAUNCHER_NUM_NODES_ENV, NUM_NODES_ENV)),
        )


def parse_labels(text: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise IdentityError(f"{LABELS_ENV}: expected key=value, got {part.strip()!r}")
        labels[key.strip()] = value.strip()
    return labels


def _int(env: Mapping[str, str], names: tuple[str, ...], default: int) -> int:
    for name in names:
        raw = env.get(name, "").strip()
        if raw:
            try:
                return int(raw)
            except ValueError:
                raise IdentityError(f"{name} must be an integer, got {raw!r}") from None
    return default


def _optional_int(env: Mapping[str, str], names: tuple[str, ...]) -> int | None:
    if not any(env.get(name, "").strip() for name in names):
        return None
    return _int(env, names, 0)
