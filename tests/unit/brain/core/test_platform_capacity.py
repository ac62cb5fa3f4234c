"""The platform's capacity report as a round hands it out: only hosts taking new pods,
in node order, a multi-node job taking whole nodes of the largest size; the processor's
free GPUs follow the report once there is one."""

from __future__ import annotations

from schemas.cluster import CapacityReported, HostCapacity
from schemas.env_settings import BrainSettings, SchedulerSettings
from streams.brain.core.cluster_round import platform_capacity
from streams.brain.core.policy import Policy
from streams.brain.core.processor import BrainProcessor


def _report(*hosts: HostCapacity) -> CapacityReported:
    return CapacityReported(env="prod", platform="kubernetes", hosts=list(hosts))


def test_cordoned_and_empty_hosts_are_not_handed_out() -> None:
    cluster = platform_capacity(
        _report(
            HostCapacity(name="node-10", gpus=8, gpu_type="A100"),
            HostCapacity(name="node-2", gpus=4),
            HostCapacity(name="node-3", gpus=8, schedulable=False),
            HostCapacity(name="cpu-only", gpus=0),
        )
    )
    assert [(n.name, n.gpus, n.gpu_type) for n in cluster.nodes] == [
        ("node-2", 4, None),
        ("node-10", 8, "A100"),
    ]
    assert cluster.gpus_per_node == 8
    assert cluster.total_gpus == 12


def test_a_report_replaces_the_settings_cluster_in_free_gpus() -> None:
    policy = Policy(
        BrainSettings(scheduler=SchedulerSettings(name="tiresias", nodes=4, gpus_per_node=4))
    )
    processor = BrainProcessor("prod", "prod.brain", policy)
    assert processor.capacity is None
    static = processor.free_gpus()
    processor.set_capacity(_report(HostCapacity(name="this", gpus=3)))
    assert processor.free_gpus() == 3 != static
