"""Kubernetes Nodes as the capacity's hosts: allocatable GPUs of the configured resource,
cordoned or NotReady ones not schedulable, the GPU type from the configured label, and a
Node without GPUs left out; and the capacity report built from them."""

from __future__ import annotations

from typing import Any

from handlers.operator.kube.nodes import parse_node
from handlers.operator.platform.bodies import Host
from handlers.operator.reconcile.capacity import report

PRODUCT = "nvidia.com/gpu.product"


def node(
    name: str = "n1",
    *,
    gpus: Any = "8",
    ready: str | None = "True",
    cordoned: bool = False,
    labels: dict[str, str] | None = None,
    resource: str = "nvidia.com/gpu",
) -> dict[str, Any]:
    conditions = [] if ready is None else [{"type": "Ready", "status": ready}]
    allocatable = {"cpu": "64", "memory": "512Gi"}
    if gpus is not None:
        allocatable[resource] = gpus
    return {
        "metadata": {"name": name, "resourceVersion": "42", "labels": labels or {}},
        "spec": {"unschedulable": True} if cordoned else {},
        "status": {"allocatable": allocatable, "capacity": allocatable, "conditions": conditions},
    }


def test_a_ready_node_is_its_allocatable_gpus_and_type() -> None:
    host = parse_node(node(labels={PRODUCT: "NVIDIA-A100"}), gpu_type_label=PRODUCT)
    assert host == Host("n1", 8, True, "NVIDIA-A100")
    assert host is not None and host.resource_version == "42"
    assert parse_node(node(labels={PRODUCT: "NVIDIA-A100"})) == Host("n1", 8, True, None)


def test_cordoned_or_not_ready_nodes_are_not_schedulable() -> None:
    for unschedulable in (
        node(cordoned=True),
        node(ready="False"),
        node(ready="Unknown"),
        node(ready=None),
    ):
        host = parse_node(unschedulable)
        assert host is not None and not host.schedulable and host.gpus == 8


def test_nodes_without_gpus_of_the_resource_are_no_hosts() -> None:
    assert parse_node(node(gpus=None)) is None
    assert parse_node(node(gpus="0")) is None
    assert parse_node(node(gpus="lots")) is None
    other = node(resource="amd.com/gpu", gpus="4")
    assert parse_node(other) is None
    assert parse_node(other, gpu_resource="amd.com/gpu") == Host("n1", 4)


def test_the_report_is_the_whole_picture_sorted_and_counts_schedulable_gpus() -> None:
    hosts = {"b": Host("b", 4), "a": Host("a", 8, False, "H100")}
    said = report("prod", "kubernetes", hosts)
    assert [h.name for h in said.hosts] == ["a", "b"]
    assert said.gpus == 4
    assert said.key == "capacity" and said.topic == "cluster.capacity"
    assert said.hosts[0].gpu_type == "H100" and not said.hosts[0].schedulable
