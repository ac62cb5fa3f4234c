"""The examples of spec/dlrover-optimizers.md, as the spec states them."""

from __future__ import annotations

from schemas.plans import NodeGroupResource, NodeResource
from streams.brain.core.state import PS, WORKER, NodeStatus, RoleResources
from streams.brain.runtime.dry_run import dry_run, parse_state
from tests.unit.brain.builders import T0, GiB, completed, node, nodes, oom, run, samples, state, use


def test_ps_create_from_two_history_jobs() -> None:
    # job 1 PS cpu [{0:12,1:10},{0:10,1:14}], mem [{1000,1200},{1200,1400}]
    job1 = completed(
        "h1",
        [
            [use(PS, 0, cpu=12, memory=1000), use(PS, 1, cpu=10, memory=1200)],
            [use(PS, 0, cpu=10, memory=1200), use(PS, 1, cpu=14, memory=1400)],
        ],
    )
    # job 2 cpu [{6,16},{5,16}], mem [{500,600},{600,700}]
    job2 = completed(
        "h2",
        [
            [use(PS, 0, cpu=6, memory=500), use(PS, 1, cpu=16, memory=600)],
            [use(PS, 0, cpu=5, memory=600), use(PS, 1, cpu=16, memory=700)],
        ],
    )
    proposal = run("ps-create", state(distribution="ps"), history=[job1, job2])
    assert proposal is not None
    assert proposal.resource.node_group_resources == {
        PS: NodeGroupResource(count=2, node_resource=NodeResource(cpu=20, memory=1680))
    }


def test_ps_oom_without_samples_doubles_memory_of_the_largest_ps() -> None:
    # nodes Running at 110 and OOM at 100 -> memory 220, count unchanged (0)
    job = state(
        distribution="ps",
        nodes=nodes(
            node(PS, 0, memory=110, status=NodeStatus.RUNNING),
            node(PS, 1, memory=100, status=NodeStatus.OOM),
        ),
        ooms={"ps-1": [oom("oom-1")]},
    )
    proposal = run("ps-oom", job)
    assert proposal is not None
    assert proposal.resource.node_group_resources == {
        PS: NodeGroupResource(count=0, node_resource=NodeResource(memory=220))
    }
    assert proposal.handled_ooms == ("oom-1",)


def test_ps_oom_with_balanced_ps_memory_doubles_the_ps_count() -> None:
    # PS memory {100,100} -> count 4
    job = state(
        distribution="ps",
        samples=samples([[use(PS, 0, memory=100), use(PS, 1, memory=100), use(WORKER, 0)]]),
        ooms={"ps-0": [oom("oom-1")]},
    )
    proposal = run("ps-oom", job)
    assert proposal is not None
    assert proposal.resource.node_group_resources == {PS: NodeGroupResource(count=4)}


def test_ps_oom_with_imbalanced_ps_memory_doubles_the_largest_memory() -> None:
    # PS memory {100,200} -> memory 400
    job = state(
        distribution="ps",
        roles={PS: RoleResources(replicas=2)},
        samples=samples([[use(PS, 0, memory=100), use(PS, 1, memory=200)]]),
        ooms={"ps-1": [oom("oom-1")]},
    )
    proposal = run("ps-oom", job)
    assert proposal is not None
    assert proposal.resource.node_group_resources == {
        PS: NodeGroupResource(count=0, node_resource=NodeResource(memory=400))
    }


def test_ps_cold_create_defaults() -> None:
    # replicas 4, cpu 12, memory 16 GiB
    proposal = run("ps-cold-create", state(distribution="ps"))
    assert proposal is not None
    group = proposal.resource.node_group_resources[PS]
    assert group.count == 4
    assert group.node_resource == NodeResource(cpu=12, memory=16 * 1024**3)


def test_ps_oom_doubles_10_gib_but_one_step_raises_memory_by_8_gib() -> None:
    # issue 15: `optimize` on a PS OOM at 10 GiB. ps-oom wants 20 GiB (its formula); the
    # limits apply to every optimizer's plan: the ScalePlan raises the PS by 8 GiB.
    job = state(
        distribution="ps",
        stage="running",
        roles={PS: RoleResources(replicas=2, cpu=8, memory=10 * GiB)},
        nodes=nodes(
            node(PS, 0, cpu=8, memory=10 * GiB, status=NodeStatus.RUNNING),
            node(PS, 1, cpu=8, memory=10 * GiB, status=NodeStatus.OOM),
        ),
        ooms={"ps-1": [oom("oom-1")]},
        last_event_id="oom-1",
    )
    out = dry_run(parse_state(job.model_dump_json()), T0)
    assert out["optimizers"] == ["ps-oom"]
    wanted = out["optimize_plan"]["resource"]["node_group_resources"][PS]
    assert wanted["node_resource"]["memory"] == 20 * GiB
    planned = out["scale_plan"]["node_group_resources"][PS]
    assert planned["node_resource"]["memory"] == 18 * GiB
    assert {
        m["node"]["id"]: m["resource"]["memory"] for m in out["scale_plan"]["migrate_nodes"]
    } == {
        0: 18 * GiB,
        1: 18 * GiB,
    }
    assert any("in one step" in note for note in out["notes"])
    assert out["handled_ooms"] == ["oom-1"]


def test_ps_oom_doubles_the_ps_count_at_most_to_15() -> None:
    # at 64 GiB the count doubles instead, bounded before a node is built per PS
    job = state(
        distribution="ps",
        roles={PS: RoleResources(replicas=12, memory=64 * GiB)},
        ooms={"ps-1": [oom("oom-1")]},
    )
    proposal = run("ps-oom", job)
    assert proposal is not None
    assert proposal.resource.node_group_resources[PS].count == 15


def test_optimize_at_create_runs_the_ps_create_example_and_applies_the_limits() -> None:
    # the spec's PS create example through `optimize`: routed (create: worker-create and
    # ps-create merged), then the limits: 1680 B is below the 6 GiB a node gets at least
    rows1 = [
        [use(PS, 0, cpu=12, memory=1000), use(PS, 1, cpu=10, memory=1200)],
        [use(PS, 0, cpu=10, memory=1200), use(PS, 1, cpu=14, memory=1400)],
    ]
    rows2 = [
        [use(PS, 0, cpu=6, memory=500), use(PS, 1, cpu=16, memory=600)],
        [use(PS, 0, cpu=5, memory=600), use(PS, 1, cpu=16, memory=700)],
    ]
    history = [completed("h1", rows1), completed("h2", rows2)]
    out = dry_run(parse_state(state(distribution="ps").model_dump_json()), T0, history=history)
    assert out["stage"] == "create" and out["optimizers"] == ["ps-create"]
    wanted = out["optimize_plan"]["resource"]["node_group_resources"][PS]
    assert (wanted["count"], wanted["node_resource"]["cpu"]) == (2, 20)
    assert wanted["node_resource"]["memory"] == 1680
    planned = out["scale_plan"]["node_group_resources"][PS]
    assert (planned["count"], planned["node_resource"]["cpu"]) == (2, 20)
    assert planned["node_resource"]["memory"] == 6 * GiB
    assert out["scale_plan"]["launch_nodes"] == []  # no node known yet: the group only


def test_optimize_hot_ps_with_zero_workers_plans_32_cores() -> None:
    row = [use(PS, 0, cpu=7.5, memory=GiB), use(PS, 1, cpu=2, memory=GiB)]
    job = state(
        distribution="ps",
        stage="running",
        roles={PS: RoleResources(replicas=2, cpu=8, memory=10 * GiB)},
        nodes=nodes(node(PS, 0, cpu=8, memory=10 * GiB), node(PS, 1, cpu=8, memory=10 * GiB)),
        samples=samples([row] * 3),
    )
    out = dry_run(parse_state(job.model_dump_json()), T0)
    assert out["optimizers"] == ["hot-ps"]
    migrated = {m["node"]["id"]: m["resource"]["cpu"] for m in out["scale_plan"]["migrate_nodes"]}
    assert migrated == {0: 32, 1: 9}
