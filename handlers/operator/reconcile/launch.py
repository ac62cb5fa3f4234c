"""What a new pod of a job runs, on any platform: its training command (under torchrun's
elastic agent for an elastic role) and the variables that tell its SDK who it is.

Pure and platform-neutral: Kubernetes puts a ``Launch`` into a pod manifest (the command
on the role's container, the variables on every container), the local platform hands it
to the shim that runs the node. Only where an elastic role's pods find their rendezvous
store differs (``rendezvous_host``: a per-job Service on a cluster, 127.0.0.1 here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dlrover_events.sdk.identity import (
    APP_ENV,
    CLUSTER_ENV,
    ELASTIC_EXPECT_ENV,
    ELASTIC_STORE_ENV,
    ELASTIC_STORE_HOST_ENV,
    ENV_ENV,
    GROUP_ENV,
    JOB_ID_ENV,
    JOB_NAME_ENV,
    LABELS_ENV,
    NAMESPACE_ENV,
    RANK_ENV,
    ROLE_ENV,
    SCENARIO_ENV,
    USER_ENV,
    WORLD_SIZE_ENV,
)
from handlers.operator.platform.bodies import JobView, NewPod, RoleView
from handlers.operator.reconcile.peers import Addressing, peer_env

#: The job's identity labels -> the SDK's variables (dlrover_events.sdk.identity).
IDENTITY_ENV = {
    "user": USER_ENV,
    "group": GROUP_ENV,
    "cluster": CLUSTER_ENV,
    "scenario": SCENARIO_ENV,
    "app": APP_ENV,
}

#: Seconds a rendezvous waits for more nodes once it has its minimum (torch's default is
#: 30): a resize is one node more or fewer, and every second here is a second the whole
#: job does not train.
LAST_CALL_S = 3
#: A removed node's agent leaves without a word; the others wait for its heartbeat to
#: lapse (torch's default 5 s x 3) before they re-rendezvous smaller: 2 s x 3 here.
KEEP_ALIVE_S = 2
KEEP_ALIVE_MISSES = 3
#: How often torchrun's agent looks at its workers (torch's default 0.1 s): a worker that
#: ended (its peer lost, say) is restarted up to this much later, and the survivors of a
#: loss join the next round this far apart, inside the last call. A look is a process poll
#: and a cached read of the rendezvous state (torch syncs it at most once a second).
MONITOR_S = 0.5

#: The commands ``forked_script`` runs in the agent's own Python.
PYTHONS = frozenset({"python", "python3"})
#: How a forked launch starts its workers. Not ``forkserver``: Python's server preloads
#: nothing for a console script like torchrun (no main path is passed to it), so each
#: worker imported torch anew; measured in test_hosts_netns, a new worker's start to its
#: group took 8.6-14.6 s so and 1.0-1.1 s forked from the agent. A forked worker inherits
#: the agent's memory, not its threads: it uses none of the agent's objects, and the SDK's
#: rendezvous handler does not leave the round from it (``LeavingRendezvousHandler``).
FORK = "fork"

#: torchrun's own c10d rendezvous, which any training image with torch has.
C10D = "c10d"
#: The SDK's (dlrover_events.sdk.torch.rendezvous.BACKEND): c10d where a stopped node
#: leaves at once; torchrun finds it only where the SDK is installed.
DLROVER_C10D = "dlrover-c10d"

#: torchrun's agents otherwise share the rendezvous store with the workers, and then a
#: node that joins a running job waits for ever for a worker-store address the old rank-0
#: agent never publishes again (torch 2.13: RendezvousStoreInfo.build in the new round's
#: prefix); a scale-up hung, measured on the local platform, until the store timed out.
ELASTIC_AGENT_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


@dataclass(frozen=True)
class Launch:
    """What one new pod runs: ``command`` on the role's training container (None: the
    container's own command and args, unchanged), ``env`` on top of every container's."""

    command: tuple[str, ...] | None
    env: dict[str, str]


def elastic_command(
    job: JobView,
    role: RoleView,
    pod: NewPod,
    rendezvous_host: str,
    command: Sequence[str],
    rendezvous_backend: str = C10D,
    forked: bool = False,
) -> list[str]:
    """torchrun's elastic agent around the training command: ``--nnodes=MIN:MAX`` and a c10d
    rendezvous, never a frozen world size. The role's host rank binds the store
    (``is_host=1``); the others only connect, so the store lives as long as that pod.
    ``rendezvous_backend``: ``c10d``, or the SDK's ``dlrover-c10d`` where the pods have the
    SDK (a stopped node leaves the rendezvous at once: dlrover_events.sdk.torch.rendezvous).
    ``forked``: a ``python SCRIPT.py ...`` command runs as torchrun's ``--run-path`` with
    the fork start method (``forked_script``), other commands as they are.

    In place, each pod's agent only supervises its own workers (``--standalone``: a
    rendezvous of its own, restarting a worker that fails); the workers form the job's
    group themselves (``in_place_env``)."""
    policy = role.elastic
    assert policy is not None
    if policy.in_place:
        return [
            "torchrun",
            "--standalone",
            "--nnodes=1",
            f"--nproc-per-node={policy.nproc_per_node}",
            f"--max-restarts={policy.max_restarts}",
            f"--monitor-interval={MONITOR_S}",
            "--no-python",
            *command,
        ]
    low = role.min_replicas if role.min_replicas is not None else role.replicas
    high = role.max_replicas if role.max_replicas is not None else max(role.replicas, low)
    is_host = 1 if pod.rank == policy.host_rank else 0
    return [
        "torchrun",
        f"--nnodes={max(1, low)}:{max(1, low, high)}",
        f"--nproc-per-node={policy.nproc_per_node}",
        f"--rdzv-backend={rendezvous_backend}",
        f"--rdzv-endpoint={rendezvous_host}:{policy.rendezvous_port}",
        f"--rdzv-id={job.uid}",
        f"--rdzv-conf=is_host={is_host},last_call_timeout={LAST_CALL_S},"
        f"keep_alive_interval={KEEP_ALIVE_S},keep_alive_max_attempt={KEEP_ALIVE_MISSES}",
        f"--max-restarts={policy.max_restarts}",
        f"--monitor-interval={MONITOR_S}",
        *((forked_script(command) if forked else None) or ("--no-python", *command)),
    ]


def forked_script(command: Sequence[str]) -> tuple[str, ...] | None:
    """torchrun's arguments that run ``python SCRIPT.py ARGS`` in worker processes forked
    from the agent (``--run-path``, the ``FORK`` start method), which has imported torch
    and the SDK's rendezvous already: a new worker skips torch's import, the biggest part
    of its start on a loaded machine (docs/platforms.md, A lost host). None for any other
    command, which runs as it is (``--no-python``)."""
    if len(command) < 2 or Path(command[0]).name not in PYTHONS or not command[1].endswith(".py"):
        return None
    return ("--run-path", f"--start-method={FORK}", *command[1:])


def in_place_env(role: RoleView, rank: int, rendezvous_host: str) -> dict[str, str]:
    """What an in-place role's workers need to form the job's group: its membership store
    (hosted by the host rank's worker, on the rendezvous port), and how many members the
    first generation waits for."""
    policy = role.elastic
    assert policy is not None
    assert policy.in_place
    env = {
        ELASTIC_STORE_ENV: f"{rendezvous_host}:{policy.rendezvous_port}",
        ELASTIC_EXPECT_ENV: str(max(role.replicas, 1) * policy.nproc_per_node),
    }
    if rank == policy.host_rank:
        env[ELASTIC_STORE_HOST_ENV] = "1"
    return env


def launch(
    job: JobView,
    pod: NewPod,
    env: str,
    rendezvous_host: str,
    rendezvous_backend: str = C10D,
    addressing: Addressing | None = None,
    forked: bool = False,
) -> Launch:
    """What ``pod`` of ``job`` in ``env`` runs (pure: the same inputs give the same launch).

    An elastic role's pod runs its training command under torchrun, which sets RANK and
    WORLD_SIZE per rendezvous: the pod gets no world size of its own, only its node rank
    (the brain's node id), which stays the same across re-rendezvous. ``addressing``: how
    the platform names its pods, for the variables that say where every role's pods are
    (``peers.peer_env``; None: none said). ``forked``: as ``elastic_command``'s.
    """
    role = job.roles[pod.role]
    variables = {
        JOB_ID_ENV: job.uid,
        JOB_NAME_ENV: job.name,
        ROLE_ENV: pod.role,
        RANK_ENV: str(pod.rank),
        ENV_ENV: env,
        NAMESPACE_ENV: job.namespace,
    }
    for attr, value in job.identity().items():
        variables[IDENTITY_ENV[attr]] = value
    if job.labels:
        variables[LABELS_ENV] = ",".join(f"{k}={v}" for k, v in sorted(job.labels.items()))
    if addressing is not None:
        variables.update(peer_env(job, pod.role, pod.rank, addressing))
    if role.elastic is None:
        variables[WORLD_SIZE_ENV] = str(role.replicas)
        return Launch(None, variables)
    if role.elastic.in_place:
        variables.update(in_place_env(role, pod.rank, rendezvous_host))
    else:
        variables.update(ELASTIC_AGENT_ENV)
    training = role.elastic.command or role.command
    return Launch(
        tuple(
            elastic_command(
                job, role, pod, rendezvous_host, training, rendezvous_backend, forked=forked
            )
        ),
        variables,
    )


__all__ = [
    "C10D",
    "DLROVER_C10D",
    "ELASTIC_AGENT_ENV",
    "FORK",
    "IDENTITY_ENV",
    "KEEP_ALIVE_MISSES",
    "KEEP_ALIVE_S",
    "LAST_CALL_S",
    "MONITOR_S",
    "Launch",
    "elastic_command",
    "forked_script",
    "in_place_env",
    "launch",
]
