"""OptimizePlan -> ScalePlan: what the brain wants, made into what the operator applies.

The planner is where the limits live (DLRover's master applied them, not its Brain), so
no optimizer, built-in or a user's, can ask the operator for more than the cluster rules
allow: per-node cpu and memory bounds, replica caps, the job's min/max, cooldowns, and
the values a user pinned. When nothing is left to change, there is no ScalePlan at all;
nor when the change is the one still pending, or the one the platform last rejected while
the job is as it was (`JobState.rejected`); nor, an urgent plan aside, while another plan
is not answered yet (`PENDING_ANSWER_S`): the next one is made from what it leaves.

A node named in `ResourcePlan.node_resources` is relaunched with the resources given
(fields at 0 keep the node's own); a node named with all fields at 0 is relaunched as it
is, which is how a straggler is replaced.

What the platform cannot apply is not planned (its `PlatformCapabilities`, published with
the cluster's capacity): where it migrates no node, a resized role's nodes keep their
resources (the role's new ones go to the nodes it starts later), and where it cannot
replace the node that hosts an elastic role's rendezvous (the local platform and
Kubernetes: every other node meets at its c10d store), that node is neither migrated nor
removed by name: the plan resizes the role, migrates its other nodes, and says so in its
notes. Such a plan used to be rejected whole, and the job kept the resources it had.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any

from dlrover_events.domain.units import human_bytes
from schemas.bounds import MAX_REPLICAS
from schemas.cluster import PlatformCapabilities
from schemas.env_settings import LimitSettings
from schemas.jobs import NodeRef
from schemas.plans import (
    MigrateNode,
    Node,
    NodeGroupResource,
    NodeResource,
    OptimizePlan,
    ScalePlan,
)
from streams.brain.core.state import (
    PS,
    WORKER,
    JobState,
    NodeState,
    NodeStatus,
    Pinned,
    RoleResources,
    Stage,
    parse_node_key,
)

#: Namespace of every plan id, so ids are stable across processes and releases.
PLAN_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "plans.brain.dlrover-events")

SOURCE = "brain"

#: Optimizers that recover a failing job; cooldowns must not delay them.
URGENT_OPTIMIZERS = frozenset({"host-oom", "gpu-oom", "ps-oom", "worker-create-oom", "straggler"})

#: The most replicas a plan gives a role, whatever the job's own maximum says.
MAX_ROLE_REPLICAS: Mapping[str, int] = MappingProxyType({WORKER: 60, PS: 15})

#: Seconds an unanswered ScalePlan holds the job's next plans back (urgent ones aside).
#: A plan made before the answer diffs against the job as it was before the pending one,
#: and the platform applies it on top of the pending one: under the local platform a
#: worker-resource resize was undone half a second later by goodput's "explore 4",
#: planned from the role's old resources. The operator answers every plan, a suspend's
#: after its pods' grace period and a margin (30 s); past this an answer that never
#: came (a lost result) no longer holds the job.
PENDING_ANSWER_S = 120.0

#: The limits of a planner not given any (an env whose settings set none).
DEFAULT_LIMITS = LimitSettings()


@dataclass(frozen=True)
class Planned:
    scale_plan: ScalePlan | None
    notes: tuple[str, ...] = ()


_NAMESPACE_BYTES = PLAN_NAMESPACE.bytes


def _uuid5(name: str) -> bytes:
    """The bytes of `uuid.uuid5(PLAN_NAMESPACE, name)`: a decision makes three or four
    ids, and `uuid.uuid5` and `str(UUID)` validate and convert more than a hash needs."""
    digest = bytearray(hashlib.sha1(_NAMESPACE_BYTES + name.encode()).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 4122 variant
    return bytes(digest)


def plan_id(job_uuid: str, caused_by: str, kind: str = "scale") -> str:
    """Same job, same input event, same kind of plan: same id, on any replay or restart."""
    h = _uuid5(f"{kind}/{job_uuid}/{caused_by}").hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def plan_event_id(plan: str) -> uuid.UUID:
    """The envelope id of a plan event, derived from its plan id, so the archive (which
    dedupes by event_id) keeps one copy of a plan however often it is replayed."""
    return uuid.UUID(bytes=_uuid5(f"event/{plan}"))


def plan_envelope(state: JobState, plan: str, now: datetime) -> dict[str, Any]:
    """What every plan of the brain says besides its content: for the job's env and job,
    at `now`, from the brain, with its envelope id derived from its plan id (one place,
    so per-job decisions and the cluster scheduler's plans cannot drift apart)."""
    return {
        "event_id": plan_event_id(plan),
        "env": state.env,
        "job": state.job,
        "occurred_at": now,
        "source": SOURCE,
        "plan_id": plan,
    }


_ZERO = NodeResource()


def _is_zero(res: NodeResource) -> bool:
    # what `res == _ZERO` compares, without pydantic's generic __eq__
    return res.__class__ is NodeResource and res.__dict__ == _ZERO.__dict__


def _resource_of(role: RoleResources | NodeState) -> NodeResource:
    return NodeResource(
        cpu=role.cpu, memory=role.memory, gpu_num=role.gpu_num, gpu_memory=role.gpu_memory
    )


def _same(a: NodeResource, b: NodeResource) -> bool:
    return (a.cpu, a.memory, a.gpu_num, a.gpu_memory) == (b.cpu, b.memory, b.gpu_num, b.gpu_memory)


def memory_step(current: int, memory: int, limits: LimitSettings) -> int:
    """`memory` raised from `current` by at most the step limit (never below the minimum
    per node: a node under it breaks the cluster's rules whatever the step)."""
    if current > 0 and memory > current + limits.max_memory_step:
        return max(current + limits.max_memory_step, int(limits.min_memory))
    return memory


def _target(
    current: NodeResource,
    wanted: NodeResource,
    pinned: Pinned | None,
    limits: LimitSettings,
    notes: list[str] | None = None,
    name: str = "",
    step_from: int | None = None,
) -> NodeResource:
    """Current resources with the fields the plan sets, bounded, and pinned values winning
    over any field the plan tries to change. Memory rises by at most a step from
    `step_from` (default: the current memory), what the node has before this plan."""
    cpu, memory, gpu_memory = current.cpu, current.memory, current.gpu_memory
    if wanted.cpu > 0:
        cpu = min(max(wanted.cpu, limits.min_cpu), limits.max_cpu)
        if pinned is not None and pinned.cpu is not None:
            cpu = pinned.cpu
    if wanted.memory > 0:
        memory = min(max(wanted.memory, limits.min_memory), limits.max_memory)
        before = current.memory if step_from is None else step_from
        stepped = memory_step(before, memory, limits)
        if stepped != memory and notes is not None:
            notes.append(
                f"{name} memory {human_bytes(memory)} is more than {human_bytes(before)} + "
                f"{human_bytes(limits.max_memory_step)} in one step: {human_bytes(stepped)}"
            )
        memory = stepped
        if pinned is not None and pinned.memory is not None:
            memory = pinned.memory
    if wanted.gpu_memory > 0:
        gpu_memory = wanted.gpu_memory
        if pinned is not None and pinned.gpu_memory is not None:
            gpu_memory = pinned.gpu_memory
    return current.model_copy(
        update={
            "cpu": cpu,
            "memory": memory,
            "gpu_num": wanted.gpu_num or current.gpu_num,
            "gpu_type": wanted.gpu_type or current.gpu_type,
            "gpu_memory": gpu_memory,
            "priority": wanted.priority or current.priority,
        }
    )


def _overlay(
    own: NodeResource, group: NodeResource, limits: LimitSettings, pinned: bool
) -> NodeResource:
    """A node of a resized group: the group's (already bounded) resources where set, its
    memory raised by at most a step from the node's own (unless the user pinned it)."""
    update = {k: v for k, v in group.model_dump().items() if v not in (0, "")}
    if "memory" in update and not pinned:
        update["memory"] = memory_step(own.memory, update["memory"], limits)
    return own.model_copy(update=update)


def bound_count(state: JobState, role: str, wanted: int, limits: LimitSettings) -> int:
    return _bound_count(state, role, state.role(role), wanted, limits)


def _bound_count(
    state: JobState, role: str, spec: RoleResources, wanted: int, limits: LimitSettings
) -> int:
    count = max(wanted, spec.min_replicas or 0)
    if spec.max_replicas is not None:
        count = min(count, spec.max_replicas)
    cap = MAX_ROLE_REPLICAS.get(role)
    if cap is not None:
        count = min(count, cap)
    pinned = state.pinned.get(role)
    if pinned is not None and pinned.replicas is not None:
        count = pinned.replicas
    # the contract's bound, whatever the state says: a plan launches at most this many
    return min(count, MAX_REPLICAS)


def _alive(state: JobState, spec: RoleResources, role: str) -> tuple[list[NodeState], int, bool]:
    """The role's live nodes, how many, and whether the brain tracks them. Before any node
    of the job is known (create stage) the job's replicas (`spec`) stand in, as a count
    only: only group resources are planned then, and a count is never made into one
    object per replica (a state read from anywhere may hold any count)."""
    if state.nodes:
        alive = state.alive_nodes(role)
        return alive, len(alive), True
    return [], spec.replicas, False


def _seconds(since: datetime | None, now: datetime) -> float | None:
    return None if since is None else (now - since).total_seconds()


def _training_change(state: JobState, wanted: Mapping[str, Any]) -> dict[str, Any]:
    """The knobs that differ from what the job trains with, less those an accepted plan
    already asked for and the job has not confirmed yet: asking again would only churn
    (the job applies them at its next step boundary, or never, and says which)."""
    awaited = state.awaiting_training.training if state.awaiting_training is not None else {}
    return {
        k: v
        for k, v in wanted.items()
        if state.training.get(k) != v and (k not in awaited or awaited[k] != v)
    }


def kept_as_is(state: JobState, platform: PlatformCapabilities | None, node: NodeRef) -> str | None:
    """Why the platform cannot migrate `node` (replace it with a pod of other resources),
    None when it can, or when the platform has not said (`platform` None: a virtual env,
    an operator older than its capabilities)."""
    if platform is None:
        return None
    if not platform.migrates_nodes:
        return "the platform migrates no node"
    return keeps_host(state, platform, node)


def keeps_host(state: JobState, platform: PlatformCapabilities | None, node: NodeRef) -> str | None:
    """Why the platform cannot replace or remove `node` by name: it hosts its role's
    rendezvous, and the platform cannot replace that node (None: it can)."""
    if platform is None or platform.replaces_rendezvous_host:
        return None
    role = state.roles.get(node.type)
    if role is None or role.rendezvous_host != node.id:
        return None
    return f"it hosts the job's rendezvous (the store every {node.type} meets at)"


def launch_ids(state: JobState, role: str, n: int) -> list[int]:
    """The ids of `n` nodes a plan adds to `role`: the lowest that no node of the role
    holds, a node the brain saw removed holding none.

    The platforms number a role's nodes as ranks and give a node they add the lowest
    rank free (`handlers.operator.reconcile.planning.plan_change`, local and
    Kubernetes), and the brain's state keeps a launched node under the id its plan gave
    it: an id the platform does not use is a node the state keeps alive that never
    starts, and a later shrink removes it by name. So a clean-clone CI run's shrink of
    the example job (at most 4 workers, ranks 0-3) was rejected, "cannot remove
    worker-5: no such node": after workers 2 and 3 were removed, the brain launched
    worker-4 and worker-5 (the highest id it knew + 1), the platform started ranks 2
    and 3. A node that failed or exited still holds its id: its pod is there until the
    platform deletes it, which only a removal says."""
    held = {
        node.id
        for node in state.nodes.values()
        if node.type == role and node.status != NodeStatus.REMOVED
    }
    ids: list[int] = []
    candidate = 0
    while len(ids) < n:
        if candidate not in held:
            ids.append(candidate)
        candidate += 1
    return ids


def plan_scale(
    state: JobState,
    plan: OptimizePlan,
    now: datetime,
    limits: LimitSettings = DEFAULT_LIMITS,
    *,
    optimizers: Collection[str],
    platform: PlatformCapabilities | None = None,
) -> Planned:
    """The ScalePlan for `plan` against the job's current resources, or None with notes
    saying what held it back. `optimizers` made the plan: one that recovers a failing
    job (`URGENT_OPTIMIZERS`) is not held back by a cooldown. `platform`: what the
    platform can apply (None: not said, anything): a node it cannot migrate or remove by
    name is left out of the plan, with a note."""
    notes: list[str] = []
    urgent = not URGENT_OPTIMIZERS.isdisjoint(optimizers)
    if not urgent and plan.stage == Stage.RUNNING:  # (the brain writes a Stage's value)
        since = _seconds(state.last_running_plan_at, now)
        if since is not None and since < limits.running_cooldown_s:
            notes.append(
                f"running-stage plan {since:.0f} s after the last, "
                f"< {limits.running_cooldown_s:g} s"
            )
            return Planned(None, tuple(notes))
    since_ps = _seconds(state.last_ps_change_at, now)
    ps_cooling = not urgent and since_ps is not None and since_ps < limits.ps_cooldown_s

    groups: dict[str, NodeGroupResource] = {}
    launch: list[Node] = []
    remove: list[NodeRef] = []
    migrate: dict[str, MigrateNode] = {}

    for role, group in sorted(plan.resource.node_group_resources.items()):
        if role == PS and ps_cooling:
            notes.append(f"PS changed {since_ps:.0f} s ago, < {limits.ps_cooldown_s:g} s")
            continue
        spec = state.role(role)
        alive, current_count, tracked = _alive(state, spec, role)
        current = _resource_of(spec)
        pinned = state.pinned.get(role)
        target = _target(current, group.node_resource, pinned, limits, notes, role)
        count = _bound_count(state, role, spec, group.count or current_count, limits)
        resized = not _same(target, current)
        if count == current_count and (not resized or count == 0):
            continue  # a role without replicas before and after has nothing to resize
        groups[role] = NodeGroupResource(count=count, node_resource=target)
        if not tracked:
            continue
        if count > current_count:
            launch.extend(
                Node(type=role, id=i, resource=target)
                for i in launch_ids(state, role, count - current_count)
            )
        gone = (
            sorted(alive, key=lambda n: n.id, reverse=True)[: current_count - count]
            if count < current_count
            else []
        )
        for n in gone:
            ref = NodeRef(type=n.type, id=n.id)
            why = keeps_host(state, platform, ref)
            if why is None:
                remove.append(ref)
            else:  # the count removes it, the platform choosing when (its host: last)
                notes.append(f"node {n.key} is not removed by name: {why}")
        if resized:
            # by identity: the live nodes are distinct nodes (pydantic's == is slow)
            gone_ids = {id(n) for n in gone}
            kept = [n for n in alive if id(n) not in gone_ids]
            for kept_node in kept:
                own = _resource_of(kept_node)
                new = _overlay(
                    own, target, limits, pinned is not None and pinned.memory is not None
                )
                if not _same(new, own):
                    ref = NodeRef(type=kept_node.type, id=kept_node.id)
                    why = kept_as_is(state, platform, ref)
                    if why is not None:
                        notes.append(
                            f"node {kept_node.key} keeps its resources: {why}; the role's "
                            "new resources go to the nodes it starts from now on"
                        )
                        continue
                    migrate[kept_node.key] = MigrateNode(node=ref, resource=new)

    removed = {f"{r.type}-{r.id}" for r in remove}
    for key, wanted in sorted(plan.resource.node_resources.items()):
        parsed = parse_node_key(key)
        node = state.nodes.get(key)
        if parsed is None or node is None or not node.alive or key in removed:
            notes.append(f"node {key} is not a live node of the job: left out")
            continue
        if node.type == PS and ps_cooling:
            notes.append(f"PS node {key} changed within {limits.ps_cooldown_s:g} s: left out")
            continue
        why = kept_as_is(state, platform, NodeRef(type=node.type, id=node.id))
        if why is not None:
            notes.append(f"node {key} cannot be migrated: {why}; left out")
            continue
        base = migrate[key].resource if key in migrate else _resource_of(node)
        if _is_zero(wanted):
            migrate[key] = MigrateNode(node=NodeRef(type=node.type, id=node.id), resource=base)
            continue
        pinned_node = state.pinned.get(node.type)
        new = _target(base, wanted, pinned_node, limits, notes, key, node.memory)
        if _same(new, _resource_of(node)):
            notes.append(f"node {key} already has what the plan asks within limits")
            continue
        migrate[key] = MigrateNode(node=NodeRef(type=node.type, id=node.id), resource=new)

    training = _training_change(state, plan.resource.training)
    if not (groups or launch or remove or migrate or training):
        notes.append("nothing changes")
        return Planned(None, tuple(notes))
    migrating = [migrate[k] for k in sorted(migrate)]
    change = (groups, launch, remove, migrating, training)
    pending = state.pending_scale_plan
    if pending is not None and change == _change_of(pending):
        # the operator has not answered the same change yet: asking again adds nothing
        notes.append(f"the same change is pending (plan {pending.plan_id})")
        return Planned(None, tuple(notes))
    if pending is not None and not urgent:
        waited = (now - pending.occurred_at).total_seconds()
        if waited < PENDING_ANSWER_S:
            notes.append(
                f"plan {pending.plan_id} is not answered yet ({waited:.0f} s): the next "
                "plan starts from what it leaves"
            )
            return Planned(None, tuple(notes))
    rejected = state.rejected
    if rejected is not None and change == _change_of(rejected.plan):
        # the platform would refuse it again: the job is as it was when it did
        notes.append(
            f"the platform rejected the same change (plan {rejected.plan.plan_id}): "
            f"{rejected.reason or 'no reason given'}"
        )
        return Planned(None, tuple(notes))
    caused_by = plan.caused_by or state.last_event_id or plan.plan_id
    scale_id = plan_id(state.job.uuid, caused_by, "scale")
    scale = ScalePlan(
        **plan_envelope(state, scale_id, now),
        source_plan=plan.plan_id,
        node_group_resources=groups,
        launch_nodes=launch,
        remove_nodes=remove,
        migrate_nodes=migrating,
        training=training,
    )
    return Planned(scale, tuple(notes))


def _change_of(plan: ScalePlan) -> tuple[Any, ...]:
    """What a ScalePlan changes, as `plan_scale` builds it, to compare a new one with."""
    return (
        plan.node_group_resources,
        plan.launch_nodes,
        plan.remove_nodes,
        plan.migrate_nodes,
        plan.training,
    )
