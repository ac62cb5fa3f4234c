"""OptimizePlan -> ScalePlan: diff, limits, cooldowns, pins, determinism."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.env_settings import LimitSettings
from schemas.jobs import NodeRef, NodeStarted
from schemas.plans import (
    NodeGroupResource,
    NodeResource,
    OptimizePlan,
    ResourcePlan,
    ScalePlan,
    ScaleResult,
    ScaleStatus,
)
from streams.brain.core.decide import JobDecision, decide
from streams.brain.core.folds import fold
from streams.brain.core.optimizers import REGISTRY, NoParams, OptimizeContext, Proposal
from streams.brain.core.optimizers.api import group_plan
from streams.brain.core.planner import (
    DEFAULT_LIMITS,
    MAX_ROLE_REPLICAS,
    PENDING_ANSWER_S,
    plan_id,
    plan_scale,
)
from streams.brain.core.state import PS, WORKER, JobState, NodeStatus, Pinned, RoleResources, Stage
from tests.unit.brain.builders import ENV, T0, GiB, meta, node, nodes, oom, plan_one, state

LIMITS = DEFAULT_LIMITS


def optimize_plan(
    groups: dict[str, NodeGroupResource] | None = None,
    per_node: dict[str, NodeResource] | None = None,
    training: dict[str, object] | None = None,
    optimizer: str = "worker-resource",
    stage: str = "running",
    caused_by: str = "event-1",
) -> OptimizePlan:
    return OptimizePlan(
        env=ENV,
        job=meta(),
        plan_id="o-1",
        stage=stage,
        optimizer=optimizer,
        reason="test",
        caused_by=caused_by,
        resource=ResourcePlan(
            node_group_resources=groups or {},
            node_resources=per_node or {},
            training=training or {},
        ),
    )


def job(workers: int = 4, ps: int = 0, **fields: object) -> JobState:
    roles = {WORKER: RoleResources(replicas=workers, cpu=8, memory=16 * GiB, max_replicas=100)}
    items = [node(WORKER, i, cpu=8, memory=16 * GiB) for i in range(workers)]
    if ps:
        roles[PS] = RoleResources(replicas=ps, cpu=8, memory=16 * GiB)
        items += [node(PS, i, cpu=8, memory=16 * GiB) for i in range(ps)]
    fields.setdefault("stage", Stage.RUNNING.value)
    return state(roles=roles, nodes=nodes(*items), **fields)


def scale(
    j: JobState, plan: OptimizePlan, now: datetime = T0, limits: LimitSettings = LIMITS
) -> ScalePlan | None:
    return plan_one(j, plan, now, limits).scale_plan


def count(n: int, **res: float) -> dict[str, NodeGroupResource]:
    return {WORKER: NodeGroupResource(count=n, node_resource=NodeResource(**res))}


def test_nothing_changes_no_plan() -> None:
    planned = plan_one(job(), optimize_plan(count(4, cpu=8, memory=16 * GiB)), T0)
    assert planned.scale_plan is None
    assert "nothing changes" in planned.notes


def test_the_change_pending_with_the_operator_is_not_planned_again() -> None:
    first = scale(job(), optimize_plan(count(6), caused_by="event-1"))
    assert first is not None
    waiting = job(pending_scale_plan=first)
    planned = plan_one(waiting, optimize_plan(count(6), caused_by="event-2"), T0)
    assert planned.scale_plan is None
    assert f"the same change is pending (plan {first.plan_id})" in planned.notes
    # another change waits for the answer (it would diff against the job as it was)
    held = plan_one(waiting, optimize_plan(count(7), caused_by="event-2"), T0)
    assert held.scale_plan is None
    assert f"plan {first.plan_id} is not answered yet (0 s)" in held.notes[-1]


def test_a_plan_waits_for_the_pending_ones_answer_and_starts_from_what_it_leaves() -> None:
    """Seen on the local platform: a worker-resource resize (1 cpu -> 4) pending, goodput's
    "explore 4" half a second later was planned from the role's old resources, and the
    platform applied it after the resize: the workers went back to 1 cpu."""
    j = job(workers=2)
    resize = scale(j, optimize_plan(count(0, cpu=12), caused_by="e-1"))
    assert resize is not None and resize.node_group_resources[WORKER].node_resource.cpu == 12
    waiting = j.model_copy(update={"pending_scale_plan": resize})
    explore = optimize_plan(count(4), optimizer="goodput", caused_by="e-2")
    assert plan_one(waiting, explore, T0 + timedelta(seconds=1)).scale_plan is None
    result = ScaleResult(
        env=ENV, job=j.job, occurred_at=T0, plan_id=resize.plan_id, status=ScaleStatus.APPLIED
    )
    answered = fold(waiting, result)
    assert answered is not None and answered.pending_scale_plan is None
    grown = scale(answered, explore, T0 + timedelta(seconds=2))
    assert grown is not None
    assert grown.node_group_resources[WORKER].count == 4
    assert grown.node_group_resources[WORKER].node_resource.cpu == 12  # (not back to 8)
    assert [(n.id, n.resource.cpu) for n in grown.launch_nodes] == [(2, 12), (3, 12)]


def test_an_answer_that_never_came_or_an_urgent_plan_is_not_waited_for() -> None:
    first = scale(job(), optimize_plan(count(6), caused_by="event-1"))
    assert first is not None
    waiting = job(pending_scale_plan=first)
    later = T0 + timedelta(seconds=PENDING_ANSWER_S)
    other = scale(waiting, optimize_plan(count(7), caused_by="event-2"), later)
    assert other is not None and other.node_group_resources[WORKER].count == 7
    oom = optimize_plan(per_node={"worker-1": NodeResource(memory=32 * GiB)}, optimizer="host-oom")
    urgent = scale(waiting, oom)
    assert urgent is not None and [m.node.id for m in urgent.migrate_nodes] == [1]


def test_scale_up_launches_the_lowest_ids_no_node_holds() -> None:
    """As the platforms number a role's nodes (the lowest rank free): a removed node's id
    is free again, a failed node's is not (its pod is there until it is removed)."""
    j = job()
    more = j.nodes | {
        "worker-2": node(WORKER, 2, status=NodeStatus.REMOVED),
        "worker-3": node(WORKER, 3, status=NodeStatus.FAILED),
        "worker-9": node(WORKER, 9, status=NodeStatus.REMOVED),
    }
    result = scale(j.model_copy(update={"nodes": more}), optimize_plan(count(6)))
    assert result is not None
    # alive: 0, 1 (2 removed, 3 failed): 4 more, in the lowest ids free
    assert [n.id for n in result.launch_nodes] == [2, 4, 5, 6]
    assert result.launch_nodes[0].resource == NodeResource(cpu=8, memory=16 * GiB)
    assert result.node_group_resources[WORKER].count == 6


def test_a_shrink_after_a_regrow_removes_only_nodes_the_platform_started() -> None:
    """Seen on the local platform: workers 2 and 3 removed, the regrow to 4 launched
    worker-4 and worker-5, the platform started worker-2 and worker-3 (the lowest ranks
    free), the brain kept 4 and 5 as pending nodes, and its next shrink removed worker-5:
    rejected, "cannot remove worker-5: no such node"."""
    at = T0

    def answered(j: JobState, plan: ScalePlan) -> JobState:
        result = ScaleResult(
            env=ENV, job=j.job, occurred_at=at, plan_id=plan.plan_id, status=ScaleStatus.APPLIED
        )
        after = fold(j.model_copy(update={"pending_scale_plan": plan}), result)
        assert after is not None
        return after

    j = job(workers=4)
    shrink = scale(j, optimize_plan(count(2), optimizer="goodput", caused_by="e-1"))
    assert shrink is not None and [n.id for n in shrink.remove_nodes] == [3, 2]
    j = answered(j, shrink)
    grow = scale(j, optimize_plan(count(4), optimizer="goodput", caused_by="e-2"))
    assert grow is not None
    assert [n.id for n in grow.launch_nodes] == [2, 3]  # (before: 4 and 5)
    j = answered(j, grow)
    for rank in (2, 3):  # the platform's pods for them run
        started = fold(
            j, NodeStarted(env=ENV, job=j.job, occurred_at=at, node=NodeRef(type=WORKER, id=rank))
        )
        assert started is not None
        j = started
    assert [n.id for n in j.alive_nodes(WORKER)] == [0, 1, 2, 3]
    again = scale(j, optimize_plan(count(2), optimizer="goodput", caused_by="e-3"))
    assert again is not None
    assert [n.id for n in again.remove_nodes] == [3, 2]


def test_scale_down_removes_highest_index_first() -> None:
    result = scale(job(workers=5), optimize_plan(count(2)))
    assert result is not None
    assert [n.id for n in result.remove_nodes] == [4, 3, 2]
    assert result.launch_nodes == []


def test_group_resource_change_migrates_the_kept_nodes() -> None:
    result = scale(job(workers=3), optimize_plan(count(2, memory=20 * GiB)))
    assert result is not None
    assert [n.id for n in result.remove_nodes] == [2]
    assert [(m.node.id, m.resource.memory) for m in result.migrate_nodes] == [
        (0, 20 * GiB),
        (1, 20 * GiB),
    ]


def test_create_stage_plans_group_resources_only() -> None:
    j = state(roles={WORKER: RoleResources(replicas=2, cpu=8, memory=8 * GiB)}, stage="create")
    result = scale(j, optimize_plan(count(1, cpu=12, memory=16 * GiB), stage="create"))
    assert result is not None
    assert result.node_group_resources[WORKER] == NodeGroupResource(
        count=1, node_resource=NodeResource(cpu=12, memory=16 * GiB)
    )
    assert (result.launch_nodes, result.remove_nodes, result.migrate_nodes) == ([], [], [])


def test_cpu_and_memory_bounds() -> None:
    wide_step = LimitSettings(max_memory_step=1024 * GiB)
    low = scale(job(), optimize_plan(count(0, cpu=1, memory=GiB)))
    high = scale(job(), optimize_plan(count(0, cpu=100, memory=500 * GiB)), limits=wide_step)
    assert low is not None and high is not None
    assert low.node_group_resources[WORKER].node_resource.cpu == 4
    assert low.node_group_resources[WORKER].node_resource.memory == 6 * GiB
    assert high.node_group_resources[WORKER].node_resource.cpu == 32
    assert high.node_group_resources[WORKER].node_resource.memory == 64 * GiB


@pytest.mark.parametrize("optimizer", ["ps-oom", "host-oom", "worker-resource", "my-own"])
def test_one_plan_raises_memory_by_at_most_8_gib_whoever_asked(optimizer: str) -> None:
    # a group of PS at 10 GiB doubled to 20 GiB, and one node asked for 40 GiB
    j = job(workers=2, ps=2)
    j = j.model_copy(
        update={"roles": {**j.roles, PS: j.roles[PS].model_copy(update={"memory": 10 * GiB})}}
    )
    j = j.model_copy(
        update={
            "nodes": {
                **j.nodes,
                "ps-0": j.nodes["ps-0"].model_copy(update={"memory": 10 * GiB}),
                "ps-1": j.nodes["ps-1"].model_copy(update={"memory": 10 * GiB}),
            }
        }
    )
    wanted = optimize_plan(
        {PS: NodeGroupResource(node_resource=NodeResource(memory=20 * GiB))},
        {"worker-0": NodeResource(memory=40 * GiB)},
        optimizer=optimizer,
    )
    planned = plan_one(j, wanted, T0, LIMITS)
    plan = planned.scale_plan
    assert plan is not None
    assert plan.node_group_resources[PS].node_resource.memory == 18 * GiB
    memories = {f"{m.node.type}-{m.node.id}": m.resource.memory for m in plan.migrate_nodes}
    assert memories == {"ps-0": 18 * GiB, "ps-1": 18 * GiB, "worker-0": 24 * GiB}
    assert any("in one step: 18 GiB" in note for note in planned.notes)


def test_the_memory_step_is_from_each_nodes_own_memory_and_a_pin_wins() -> None:
    j = job(workers=2)
    small = j.nodes["worker-1"].model_copy(update={"memory": 8 * GiB})
    j = j.model_copy(update={"nodes": {**j.nodes, "worker-1": small}})
    plan = scale(j, optimize_plan(count(0, memory=30 * GiB)))
    assert plan is not None
    memories = {m.node.id: m.resource.memory for m in plan.migrate_nodes}
    assert memories == {0: 24 * GiB, 1: 16 * GiB}  # 16 + 8 and 8 + 8
    pinned = j.model_copy(update={"pinned": {WORKER: Pinned(memory=40 * GiB)}})
    plan = scale(pinned, optimize_plan(count(0, memory=30 * GiB)))
    assert plan is not None
    assert plan.node_group_resources[WORKER].node_resource.memory == 40 * GiB
    assert {m.resource.memory for m in plan.migrate_nodes} == {40 * GiB}


def test_replica_caps_and_role_bounds() -> None:
    many = scale(job(), optimize_plan(count(500)))
    assert many is not None
    assert many.node_group_resources[WORKER].count == 60
    ps = scale(
        job(ps=2),
        optimize_plan({PS: NodeGroupResource(count=40)}, optimizer="ps-init-adjust"),
    )
    assert ps is not None
    assert ps.node_group_resources[PS].count == 15
    bounded = job().model_copy(
        update={"roles": {WORKER: RoleResources(replicas=4, min_replicas=3, max_replicas=5)}}
    )
    up, down = scale(bounded, optimize_plan(count(9))), scale(bounded, optimize_plan(count(1)))
    assert up is not None and down is not None
    assert up.node_group_resources[WORKER].count == 5
    assert down.node_group_resources[WORKER].count == 3


def test_user_pinned_values_win() -> None:
    pinned = job(pinned={WORKER: Pinned(replicas=4, memory=16 * GiB)})
    assert scale(pinned, optimize_plan(count(8, memory=32 * GiB))) is None
    oom_plan = optimize_plan(
        per_node={"worker-1": NodeResource(memory=24 * GiB)}, optimizer="host-oom"
    )
    assert scale(pinned, oom_plan) is None
    cpu_free = scale(pinned, optimize_plan(count(8, cpu=12)))
    assert cpu_free is not None
    assert cpu_free.node_group_resources[WORKER].count == 4
    assert cpu_free.node_group_resources[WORKER].node_resource.cpu == 12


def test_ps_changes_wait_an_hour_unless_urgent() -> None:
    recent = job(ps=2, last_ps_change_at=T0 - timedelta(minutes=30))
    ps_plan = {PS: NodeGroupResource(count=4)}
    held = plan_one(recent, optimize_plan(ps_plan, optimizer="hot-ps", stage="ps-initial"), T0)
    assert held.scale_plan is None
    assert any("PS changed" in n for n in held.notes)
    later = scale(
        recent,
        optimize_plan(ps_plan, optimizer="hot-ps", stage="ps-initial"),
        T0 + timedelta(hours=1),
    )
    assert later is not None
    assert scale(recent, optimize_plan(ps_plan, optimizer="ps-oom")) is not None


def test_running_plans_at_least_300_s_apart_unless_urgent() -> None:
    recent = job(last_running_plan_at=T0 - timedelta(seconds=100))
    assert scale(recent, optimize_plan(count(6))) is None
    assert scale(recent, optimize_plan(count(6)), now=T0 + timedelta(seconds=200)) is not None
    replace = optimize_plan(per_node={"worker-2": NodeResource()}, optimizer="straggler")
    assert scale(recent, replace) is not None
    initial = scale(recent, optimize_plan(count(6), stage="worker-initial"))
    assert initial is not None


def test_urgency_comes_from_the_optimizers_not_from_the_plans_label() -> None:
    """A user's optimizer may have "+" in its name: the plan's label joins names with
    "+" for people, and reading it back made "tune+host-oom" look like host-oom (urgent,
    past the cooldown)."""
    registry = REGISTRY.copy()

    @registry.register("tune+host-oom", "a user's optimizer with a + in its name", NoParams)
    def _grow(ctx: OptimizeContext, params: NoParams) -> Proposal:
        return Proposal("more workers", group_plan(WORKER, count=6))

    recent = job(last_running_plan_at=T0 - timedelta(seconds=100))
    result = decide(recent, T0, optimizer="tune+host-oom", registry=registry)
    assert isinstance(result, JobDecision)
    assert result.optimizers == ("tune+host-oom",)
    assert result.optimize_plan.optimizer == "tune+host-oom"
    assert result.scale_plan is None  # held back by the cooldown: not urgent
    assert any("running-stage plan" in note for note in result.notes)
    urgent = plan_scale(
        recent, optimize_plan(count(6), optimizer="anything"), T0, optimizers=("host-oom",)
    )
    assert urgent.scale_plan is not None


def test_node_plans_migrate_live_nodes_only() -> None:
    j = job()
    j = j.model_copy(
        update={"nodes": j.nodes | {"worker-3": node(WORKER, 3, status=NodeStatus.FAILED)}}
    )
    plan = optimize_plan(
        per_node={
            "worker-1": NodeResource(memory=24 * GiB),
            "worker-3": NodeResource(memory=24 * GiB),
            "worker-77": NodeResource(memory=24 * GiB),
            "garbage": NodeResource(memory=24 * GiB),
            "worker-2": NodeResource(),
        },
        optimizer="host-oom",
    )
    planned = plan_one(j, plan, T0)
    assert planned.scale_plan is not None
    assert [(m.node.id, m.resource) for m in planned.scale_plan.migrate_nodes] == [
        (1, NodeResource(cpu=8, memory=24 * GiB)),
        (2, NodeResource(cpu=8, memory=16 * GiB)),  # a straggler-style replacement
    ]
    assert len([n for n in planned.notes if "not a live node" in n]) == 3


def test_training_changes_only_what_differs() -> None:
    j = job(training={"local_batch_size": 32, "accumulation_steps": 1})
    same = optimize_plan(training={"local_batch_size": 32})
    assert scale(j, same) is None
    changed = scale(j, optimize_plan(training={"local_batch_size": 16, "accumulation_steps": 2}))
    assert changed is not None
    assert changed.training == {"local_batch_size": 16, "accumulation_steps": 2}


def test_plan_id_is_derived_from_job_and_cause() -> None:
    a = scale(job(), optimize_plan(count(6), caused_by="e1"))
    b = scale(job(), optimize_plan(count(6), caused_by="e1"), now=T0 + timedelta(hours=1))
    c = scale(job(), optimize_plan(count(6), caused_by="e2"))
    assert a is not None and b is not None and c is not None
    assert a.plan_id == b.plan_id == plan_id("job-1", "e1")
    assert c.plan_id != a.plan_id
    assert plan_id("job-2", "e1") != a.plan_id
    assert a.source_plan == "o-1"
    assert a.key == "job-1"


def test_decide_is_deterministic_for_a_replayed_event() -> None:
    j = job(ooms={"worker-1": [oom("oom-1")]})
    first, second = decide(j, T0, caused_by="oom-1"), decide(j, T0, caused_by="oom-1")
    assert isinstance(first, JobDecision) and isinstance(second, JobDecision)
    assert first.scale_plan is not None and second.scale_plan is not None
    assert first.optimize_plan.plan_id == second.optimize_plan.plan_id
    assert first.scale_plan.plan_id == second.scale_plan.plan_id
    assert first.scale_plan.source_plan == first.optimize_plan.plan_id
    assert first.optimize_plan.plan_id != first.scale_plan.plan_id
    assert first.optimize_plan.event_id == second.optimize_plan.event_id
    assert first.scale_plan.event_id == second.scale_plan.event_id
    assert first.handled_ooms == ("oom-1",)


# -- properties -----------------------------------------------------------------------

resources = st.builds(
    NodeResource,
    cpu=st.sampled_from([0, 0.5, 3, 4, 12, 32, 33, 200]),
    memory=st.sampled_from([0, GiB, 6 * GiB, 20 * GiB, 64 * GiB, 65 * GiB, 10**13]),
)
groups = st.dictionaries(
    st.sampled_from([WORKER, PS]),
    st.builds(NodeGroupResource, count=st.integers(0, 200), node_resource=resources),
    max_size=2,
)
per_node = st.dictionaries(
    st.sampled_from([f"worker-{i}" for i in range(8)] + [f"ps-{i}" for i in range(4)]),
    resources,
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(
    groups=groups,
    per_node=per_node,
    workers=st.integers(0, 70),
    ps=st.integers(0, 16),
    min_workers=st.none() | st.integers(0, 10),
    max_workers=st.none() | st.integers(10, 80),
    optimizer=st.sampled_from(["worker-resource", "host-oom", "hot-ps"]),
)
def test_planner_output_is_always_within_limits(
    groups: dict[str, NodeGroupResource],
    per_node: dict[str, NodeResource],
    workers: int,
    ps: int,
    min_workers: int | None,
    max_workers: int | None,
    optimizer: str,
) -> None:
    j = job(workers=workers, ps=ps)
    j.roles[WORKER] = j.roles[WORKER].model_copy(
        update={"min_replicas": min_workers, "max_replicas": max_workers}
    )
    result = scale(j, optimize_plan(groups, per_node, optimizer=optimizer))
    if result is None:
        return
    shown = [g.node_resource for g in result.node_group_resources.values()]
    shown += [n.resource for n in result.launch_nodes] + [m.resource for m in result.migrate_nodes]
    for res in shown:  # 0 is "unchanged/unknown" in the contract: only set values count
        assert res.cpu == 0 or LIMITS.min_cpu <= res.cpu <= LIMITS.max_cpu
        assert res.memory == 0 or LIMITS.min_memory <= res.memory <= LIMITS.max_memory
    for m in result.migrate_nodes:  # one plan raises a node's memory by 8 GiB at most
        before = j.nodes[f"{m.node.type}-{m.node.id}"].memory
        assert m.resource.memory <= max(before + LIMITS.max_memory_step, LIMITS.min_memory)
    for role, group in result.node_group_resources.items():
        assert group.count <= MAX_ROLE_REPLICAS[role]
        alive = len(j.alive_nodes(role))
        launched = sum(1 for n in result.launch_nodes if n.type == role)
        removed = sum(1 for n in result.remove_nodes if n.type == role)
        if j.nodes:  # nodes known: the diff reaches the count (else group resources only)
            assert alive + launched - removed == group.count
    w = result.node_group_resources.get(WORKER)
    if w is not None:
        assert w.count >= min(min_workers or 0, 60)
        assert w.count <= (max_workers if max_workers is not None else 60)
    removed_ids = {(n.type, n.id) for n in result.remove_nodes}
    assert all((m.node.type, m.node.id) not in removed_ids for m in result.migrate_nodes)
    if result.remove_nodes:
        ids = [n.id for n in result.remove_nodes if n.type == WORKER]
        kept = [n.id for n in j.alive_nodes(WORKER) if n.id not in ids]
        assert all(i > k for i in ids for k in kept)


@settings(max_examples=150, deadline=None)
@given(
    memories=st.lists(st.integers(1, 80).map(lambda g: g * GiB), min_size=1, max_size=8),
    data=st.data(),
)
def test_host_oom_never_touches_nodes_that_did_not_oom(
    memories: list[int], data: st.DataObject
) -> None:
    oomed = data.draw(st.sets(st.integers(0, len(memories) - 1)))
    handled = data.draw(st.sets(st.sampled_from(sorted(oomed)))) if oomed else set()
    j = state(
        stage="running",
        roles={WORKER: RoleResources(replicas=len(memories), cpu=8, memory=8 * GiB)},
        nodes=nodes(*(node(WORKER, i, cpu=8, memory=m) for i, m in enumerate(memories))),
        ooms={
            f"worker-{i}": [oom(f"o{i}").model_copy(update={"handled": i in handled})]
            for i in oomed
        },
    )
    result = decide(j, T0, caused_by="e")
    open_ = oomed - handled
    if not isinstance(result, JobDecision):
        assert all(memories[i] >= 64 * GiB for i in open_)
        return
    assert result.scale_plan is not None
    plan = result.scale_plan
    assert plan.launch_nodes == [] and plan.remove_nodes == []
    assert plan.node_group_resources == {}
    for m in plan.migrate_nodes:
        assert m.node.id in open_
        before = memories[m.node.id]
        assert before < m.resource.memory <= max(64 * GiB, before)
        assert m.resource.memory - before <= 8 * GiB or m.resource.memory == 6 * GiB
    assert set(result.handled_ooms) <= {f"o{i}" for i in open_}
