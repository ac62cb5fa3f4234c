"""A Kubernetes Node as the port's ``Host``: the GPUs it can give pods, whether it takes
new ones, its GPU type.

GPUs are the Node's ``status.allocatable`` of the GPU resource (``nvidia.com/gpu`` unless
the operator is told another: DLROVER_EVENTS_OPERATOR_GPU_RESOURCE), what the scheduler
hands out, not its capacity. A Node cordoned (``spec.unschedulable``) or not Ready (its
``Ready`` condition not True, or none yet) takes no new pods: it is reported, with its
GPUs, as not schedulable, so a scheduler neither counts on it nor forgets what runs there.
Its GPU type is the value of the operator's GPU type label (NVIDIA's GPU feature discovery
writes ``nvidia.com/gpu.product``). A Node without that resource, or with none of it, is
no host for GPU jobs and is left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from handlers.operator.document.quantity import GPU, QuantityError, parse_quantity
from handlers.operator.platform.bodies import Host

DEFAULT_GPU_RESOURCE = GPU


def ready(node: Mapping[str, Any]) -> bool:
    """The kubelet says the Node is Ready."""
    for cond in (node.get("status") or {}).get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def allocatable_gpus(node: Mapping[str, Any], resource: str = DEFAULT_GPU_RESOURCE) -> int:
    """Whole GPUs of ``resource`` the Node can give pods (0: none, or not a quantity)."""
    value = ((node.get("status") or {}).get("allocatable") or {}).get(resource)
    if value is None:
        return 0
    try:
        return max(0, int(parse_quantity(value)))
    except QuantityError:
        return 0


def parse_node(
    node: Mapping[str, Any],
    *,
    gpu_resource: str = DEFAULT_GPU_RESOURCE,
    gpu_type_label: str | None = None,
) -> Host | None:
    """The Node as a host of GPU jobs; None when it has no GPUs of ``gpu_resource``."""
    meta = node.get("metadata") or {}
    gpus = allocatable_gpus(node, gpu_resource)
    if gpus <= 0:
        return None
    cordoned = bool((node.get("spec") or {}).get("unschedulable"))
    labels = meta.get("labels") or {}
    gpu_type = labels.get(gpu_type_label) if gpu_type_label else None
    return Host(
        name=str(meta.get("name", "")),
        gpus=gpus,
        schedulable=ready(node) and not cordoned,
        gpu_type=str(gpu_type) if gpu_type else None,
        resource_version=str(meta.get("resourceVersion") or ""),
    )


__all__ = ["DEFAULT_GPU_RESOURCE", "allocatable_gpus", "parse_node", "ready"]
