"""What a ScalePlan asks of one simulated job: the pods it wants, the nodes it pins the
training replicas to, the batch it sets, and what of it the simulated cluster cannot do.

Pure readings of a plan against the job's current wishes: the job (job.py) decides
whether and when they take effect. A plan the simulated cluster cannot follow is refused
here with a ValueError whose text is the plan's rejection reason.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from handlers.simulator.cluster import Allocation, PodRequest
from handlers.simulator.training import TRAINING_ROLES, TrainingModel, replicas
from schemas.plans import NodeResource, ScalePlan

#: A plan's placement names nodes as the simulated cluster does: node-<index from 0>.
_NODE_NAME = re.compile(r"node-(0|[1-9][0-9]*)")

#: What a plan may ask that the simulated cluster does not model: its pods have GPUs,
#: cores and memory, and a GPU out of memory is a micro-batch beyond the traced one.
UNSUPPORTED = {
    "gpu_type": "the simulated cluster has no GPU types",
    "gpu_memory": "the simulated cluster does not model GPU memory sizes",
    "priority": "the simulated cluster has no priorities",
}

Pods = Mapping[tuple[str, int], PodRequest]
#: Node index -> GPUs of the training replicas there.
Pin = Mapping[int, int]


def desired_after(desired: Pods, plan: ScalePlan) -> dict[tuple[str, int], PodRequest]:
    """The pods the job wants once the plan's groups, removals, launches and migrations
    are applied to what it wanted; ValueError for a migration of a pod it does not have."""
    pods = dict(desired)
    for role, group in plan.node_group_resources.items():
        current = sorted((k for k in pods if k[0] == role), key=lambda k: k[1])
        template = (
            pods[current[0]] if current else PodRequest(role, 0, 1 if role in TRAINING_ROLES else 0)
        )
        template = with_resource(template, group.node_resource)
        for key in current:
            pods[key] = with_resource(pods[key], group.node_resource)
        if group.count:
            for key in current[group.count :]:  # highest index first
                del pods[key]
            next_index = (current[-1][1] + 1) if current else 0
            for index in range(next_index, next_index + max(0, group.count - len(current))):
                pods[(role, index)] = replace(template, index=index)
    for ref in plan.remove_nodes:
        pods.pop((ref.type, ref.id), None)
    for node in plan.launch_nodes:
        key = (node.type, node.id)
        siblings = [p for p in pods.values() if p.role == node.type]
        base = (
            siblings[0]
            if siblings
            else PodRequest(node.type, node.id, 1 if node.type in TRAINING_ROLES else 0)
        )
        pods[key] = with_resource(replace(base, index=node.id), node.resource)
    for move in plan.migrate_nodes:
        key = (move.node.type, move.node.id)
        if key not in pods:
            raise ValueError(f"cannot migrate {move.node.type}-{move.node.id}: no such node")
        pods[key] = with_resource(pods[key], move.resource)
    return pods


def pin_after(
    plan: ScalePlan, desired: Pods, kept: dict[int, int] | None, shape: tuple[int, int]
) -> dict[int, int] | None:
    """The nodes the plan puts the training replicas on: its placement, else the ones
    they were put on before (``kept``) while they still match the replicas; None: the
    cluster chooses. ``shape`` is the cluster's (nodes, GPUs per node). A placement it
    cannot follow is refused (ValueError)."""
    count = replicas(desired)
    if not plan.placement:
        if kept is None or sum(kept.values()) != count:
            return None
        try:
            pinned(desired, kept)
        except ValueError:
            return None
        return kept
    num_nodes, gpus_per_node = shape
    pin: dict[int, int] = {}
    for name, gpus in plan.placement.items():
        match = _NODE_NAME.fullmatch(name)
        if match is None or int(match.group(1)) >= num_nodes:
            raise ValueError(
                f"placement names {name!r}: the simulated cluster's nodes are "
                f"node-0 to node-{num_nodes - 1}"
            )
        if gpus > gpus_per_node:
            raise ValueError(f"placement puts {gpus} GPUs on {name}, which has {gpus_per_node}")
        if gpus:
            pin[int(match.group(1))] = gpus
    if sum(pin.values()) != count:
        raise ValueError(
            f"placement holds {sum(pin.values())} GPUs, the job's training replicas need {count}"
        )
    pinned(desired, pin)
    return pin


def pinned(pods: Pods, pin: Pin | None) -> dict[tuple[str, int], int] | None:
    """The node of each training pod under ``pin``: lowest node first, pods in index
    order, a node filled to its GPUs before the next. ValueError when the pods do not
    split that way (a pod of 2 GPUs cannot take one GPU here and one there)."""
    if pin is None:
        return None
    training = sorted(
        (p for p in pods.values() if p.role in TRAINING_ROLES and p.gpu),
        key=lambda p: (p.role, p.index),
    )
    nodes: dict[tuple[str, int], int] = {}
    slots = iter(sorted(pin.items()))
    node, left = next(slots, (-1, 0))
    for pod in training:
        while left == 0:
            node, left = next(slots, (-1, -1))
        if pod.gpu > left:
            raise ValueError(
                f"placement {node_names(pin)} does not split into the job's pods of "
                f"{pod.gpu} GPUs each"
            )
        nodes[pod.key] = node
        left -= pod.gpu
    return nodes


def holds(allocation: Allocation | None, pin: Pin | None) -> bool:
    """Whether the running gang already sits where ``pin`` puts it."""
    if pin is None or allocation is None:
        return True
    have: dict[int, int] = {}
    for key, node in allocation.nodes.items():
        pod = allocation.pods[key]
        if pod.role in TRAINING_ROLES and pod.gpu:
            have[node] = have.get(node, 0) + pod.gpu
    return have == dict(pin)


def override_after(
    training: Mapping[str, Any], desired: Pods, model: TrainingModel
) -> tuple[int, int] | None:
    """The (local batch, accumulation) the plan sets; a knob it leaves out is what the
    job would use at the plan's replicas."""
    if "local_batch_size" not in training and "accumulation_steps" not in training:
        return model.override
    local_bsz, accumulation = model.batch(replicas(desired))
    local_bsz = int(training.get("local_batch_size", local_bsz))
    accumulation = int(training.get("accumulation_steps", accumulation))
    if local_bsz < 1 or accumulation < 1:
        raise ValueError("local_batch_size and accumulation_steps must be >= 1")
    return (local_bsz, accumulation)


def gives_replicas(plan: ScalePlan) -> bool:
    """Whether the plan gives the job training replicas: what lets a brain's scheduler
    start (or resume) a job, as opposed to re-tuning one."""
    return (
        bool(plan.placement)
        or any(g.count for r, g in plan.node_group_resources.items() if r in TRAINING_ROLES)
        or any(n.type in TRAINING_ROLES for n in plan.launch_nodes)
    )


def node_names(pin: Pin) -> str:
    return ", ".join(f"node-{n} ({g} GPUs)" for n, g in sorted(pin.items()))


def with_resource(pod: PodRequest, resource: NodeResource) -> PodRequest:
    """Apply a plan's resources to a pod: a 0 field means unchanged."""
    return replace(
        pod,
        gpu=resource.gpu_num or pod.gpu,
        cpu=resource.cpu or pod.cpu,
        memory=resource.memory or pod.memory,
    )


__all__ = [
    "UNSUPPORTED",
    "desired_after",
    "gives_replicas",
    "holds",
    "node_names",
    "override_after",
    "pin_after",
    "pinned",
    "with_resource",
]
