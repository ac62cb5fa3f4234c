"""Gang admission and packing on the simulated cluster."""

from __future__ import annotations

from handlers.simulator.cluster import Cluster, GiB, PodRequest


def workers(n: int, gpu: int = 1, memory: int = 0) -> list[PodRequest]:
    return [PodRequest("worker", i, gpu=gpu, memory=memory) for i in range(n)]


def test_a_job_starts_only_when_all_its_pods_fit() -> None:
    cluster = Cluster(2, 4)
    assert cluster.admit("a", workers(6)) is not None
    assert cluster.free_gpus == 2
    assert cluster.admit("b", workers(4)) is None
    assert cluster.free_gpus == 2, "a rejected gang holds nothing"
    assert cluster.allocation("b") is None
    cluster.release("a")
    allocation = cluster.admit("b", workers(4))
    assert allocation is not None
    assert allocation.gpus_per_node() == (4,)


def test_pods_pack_onto_as_few_nodes_as_possible() -> None:
    cluster = Cluster(16, 4)
    six = cluster.admit("six", workers(6))
    assert six is not None
    assert sorted(six.gpus_per_node()) == [2, 4]
    # A 2-GPU job fills the half-used node instead of opening a fresh one.
    two = cluster.admit("two", workers(2))
    assert two is not None
    assert set(two.nodes.values()) <= set(six.nodes.values())
    big = cluster.admit("big", workers(48))
    assert big is not None
    assert big.gpus_per_node() == (4,) * 12


def test_memory_is_a_capacity_too() -> None:
    cluster = Cluster(2, 4, memory_per_node=64 * GiB)
    pods = workers(4, memory=30 * GiB)  # two per node by memory, not four
    assert cluster.can_ever_fit(pods)
    allocation = cluster.admit("a", pods)
    assert allocation is not None
    assert len(set(allocation.nodes.values())) == 2
    assert not cluster.can_ever_fit(workers(1, memory=65 * GiB))


def test_scale_down_releases_only_the_removed_pods() -> None:
    cluster = Cluster(1, 4)
    cluster.admit("a", workers(4))
    cluster.release("a", [("worker", 3), ("worker", 2)])
    assert cluster.free_gpus == 2
    allocation = cluster.allocation("a")
    assert allocation is not None
    assert set(allocation.pods) == {("worker", 0), ("worker", 1)}


def test_re_admission_of_a_running_job_keeps_it_when_the_new_gang_does_not_fit() -> None:
    cluster = Cluster(2, 4)
    cluster.admit("a", workers(4))
    cluster.admit("b", workers(2))
    assert cluster.admit("a", workers(8)) is None
    assert cluster.free_gpus == 2
    assert cluster.allocation("a") is not None
    assert cluster.admit("a", workers(6)) is not None
    assert cluster.free_gpus == 0
