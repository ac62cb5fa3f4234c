"""The cheaper ways decide() takes give what the straightforward ones gave: plan ids,
the merge of proposals, the router's OOM condition."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.codec import encode
from schemas.jobs import OOMKind
from schemas.plans import NodeGroupResource, NodeResource, OptimizePlan, ResourcePlan
from streams.brain.core.decide import Merged, merge
from streams.brain.core.optimizers import Proposal
from streams.brain.core.planner import PLAN_NAMESPACE, plan_event_id, plan_id
from streams.brain.core.router import Condition, condition
from streams.brain.core.state import WORKER, Stage
from tests.unit.brain.builders import ENV, T0, meta, oom, sample, state, use

# -- plan ids -----------------------------------------------------------------------------


def test_plan_ids_are_those_of_earlier_releases() -> None:
    """Ids are stable across releases: a replay after an upgrade must give the same ids."""
    assert plan_id("job-1", "e1") == "06077281-7e70-527b-8670-8db4d0c64ead"
    assert plan_id("job-1", "e1", "optimize") == "9d948645-750f-5907-958a-880814605bcd"
    assert plan_event_id(plan_id("job-1", "e1")) == uuid.UUID(
        "082cc37a-eb36-5742-ab42-723377924f56"
    )
    assert plan_id("jöb-ü", "€") == "ed1ba1c7-4b44-5c03-946c-323cf3436738"


@given(st.text(), st.text(), st.sampled_from(["scale", "optimize", "x/y"]))
def test_plan_ids_are_uuid5_in_the_plan_namespace(job: str, cause: str, kind: str) -> None:
    want = uuid.uuid5(PLAN_NAMESPACE, f"{kind}/{job}/{cause}")
    got = plan_id(job, cause, kind)
    assert got == str(want)
    event_id = plan_event_id(got)
    assert event_id == uuid.uuid5(PLAN_NAMESPACE, f"event/{got}")
    assert (event_id.version, event_id.variant) == (5, uuid.RFC_4122)
    assert repr(event_id) == repr(uuid.uuid5(PLAN_NAMESPACE, f"event/{got}"))


def test_plan_id_of_text_that_is_not_utf8_fails_as_uuid5_does() -> None:
    with pytest.raises(UnicodeEncodeError):
        uuid.uuid5(PLAN_NAMESPACE, "scale/job/\ud800")
    with pytest.raises(UnicodeEncodeError):
        plan_id("job", "\ud800")


# -- merge -------------------------------------------------------------------------------


def _plain_overlay(base: NodeResource, more: NodeResource) -> NodeResource:
    return base.model_copy(update={k: v for k, v in more.model_dump().items() if v not in (0, "")})


def _plain_merge(proposals: list[Proposal]) -> Merged:
    groups: dict[str, NodeGroupResource] = {}
    nodes: dict[str, NodeResource] = {}
    training: dict[str, object] = {}
    for proposal in proposals:
        for role, group in proposal.resource.node_group_resources.items():
            old = groups.get(role, NodeGroupResource())
            groups[role] = NodeGroupResource(
                count=group.count or old.count,
                node_resource=_plain_overlay(old.node_resource, group.node_resource),
            )
        for key, res in proposal.resource.node_resources.items():
            nodes[key] = _plain_overlay(nodes.get(key, NodeResource()), res)
        training.update(proposal.resource.training)
    return Merged(
        reason="; ".join(f"{p.optimizer}: {p.reason}" for p in proposals),
        resource=ResourcePlan(node_group_resources=groups, node_resources=nodes, training=training),
        handled_ooms=tuple(dict.fromkeys(i for p in proposals for i in p.handled_ooms)),
        optimizers=tuple(p.optimizer for p in proposals),
    )


def _as_plan(proposal: Merged) -> bytes:
    """How a merged proposal goes out: what differs here differs on the bus."""
    return encode(
        OptimizePlan(
            env=ENV,
            job=meta(),
            occurred_at=T0,
            event_id=uuid.UUID(int=1),
            plan_id="p",
            stage="running",
            optimizer=proposal.label,
            reason=proposal.reason,
            resource=proposal.resource,
        )
    )


_RESOURCES = st.builds(
    NodeResource,
    cpu=st.sampled_from([0, 0.0, 2, 2.5]),
    memory=st.sampled_from([0, 8, 16]),
    gpu_type=st.sampled_from(["", "a100"]),
    gpu_memory=st.sampled_from([0, 40]),
)
_PROPOSALS = st.builds(
    Proposal,
    reason=st.sampled_from(["r", "s"]),
    resource=st.builds(
        ResourcePlan,
        node_group_resources=st.dictionaries(
            st.sampled_from([WORKER, "ps"]),
            st.builds(NodeGroupResource, count=st.integers(0, 3), node_resource=_RESOURCES),
            max_size=2,
        ),
        node_resources=st.dictionaries(st.sampled_from(["worker-0", "ps-1"]), _RESOURCES),
        training=st.dictionaries(st.sampled_from(["local_batch_size", "x"]), st.integers(1, 4)),
    ),
    handled_ooms=st.lists(st.sampled_from(["o1", "o2"])).map(tuple),
    optimizer=st.sampled_from(["a", "b"]),
)


def _fields_set(resource: ResourcePlan) -> list[object]:
    """Which fields each model of a merged plan says were set: equal values aside, what
    `model_dump(exclude_unset=True)` would see."""
    return [
        resource.model_fields_set,
        [
            (role, g.model_fields_set, g.node_resource.model_fields_set)
            for role, g in resource.node_group_resources.items()
        ],
        [(key, r.model_fields_set) for key, r in resource.node_resources.items()],
    ]


@given(st.lists(_PROPOSALS, max_size=3))
def test_merge_is_the_plain_merge(proposals: list[Proposal]) -> None:
    got, want = merge(proposals), _plain_merge(proposals)
    assert got == want
    assert _as_plan(got) == _as_plan(want)
    assert _fields_set(got.resource) == _fields_set(want.resource)


def test_merge_keeps_values_as_proposed() -> None:
    """A value set without validation (an int cpu) goes out as it was proposed, and a
    zero of another type (0.0) as the default's 0."""
    cpu_int = NodeResource().model_copy(update={"cpu": 12})
    zero_float = NodeResource(cpu=0.0, memory=8)
    proposals = [
        Proposal("r", ResourcePlan(node_group_resources={WORKER: NodeGroupResource(count=2)})),
        Proposal(
            "s",
            ResourcePlan(
                node_group_resources={WORKER: NodeGroupResource(node_resource=cpu_int)},
                node_resources={"worker-0": zero_float},
            ),
        ),
    ]
    got = merge(proposals)
    assert _as_plan(got) == _as_plan(_plain_merge(proposals))
    group = got.resource.node_group_resources[WORKER]
    assert (group.count, repr(group.node_resource.cpu)) == (2, "12")
    assert repr(got.resource.node_resources["worker-0"].cpu) == "0"


# -- the router's condition ----------------------------------------------------------------


def _plain_condition(ooms: dict[str, Any]) -> Condition:
    job = state(stage="running", ooms=ooms)
    if job.unhandled_ooms(OOMKind.HOST_MEMORY):
        return Condition.HOST_OOM
    if job.unhandled_ooms(OOMKind.GPU_MEMORY):
        return Condition.GPU_OOM
    return Condition.HEALTHY


@pytest.mark.parametrize(
    "records",
    [
        {},
        {"worker-0": []},
        {"worker-0": [oom("h")]},
        {"worker-0": [oom("h").model_copy(update={"handled": True})]},
        {"worker-0": [oom("g", OOMKind.GPU_MEMORY)]},
        {"worker-0": [oom("g", OOMKind.GPU_MEMORY)], "worker-1": [oom("h")]},
        {
            "worker-0": [
                oom("h").model_copy(update={"handled": True}),
                oom("g", OOMKind.GPU_MEMORY),
            ]
        },
    ],
)
def test_condition_is_that_of_the_unhandled_ooms(records: dict[str, Any]) -> None:
    assert condition(state(stage="running", ooms=records), Stage.RUNNING) == _plain_condition(
        records
    )


def test_condition_straggler_only_in_the_running_stage() -> None:
    rows = [
        sample([use(WORKER, i, step_time=1.0) for i in range(4)] + [use(WORKER, 4, step_time=3)], j)
        for j in range(3)
    ]
    job = state(stage="running", samples=rows)
    assert condition(job, Stage.RUNNING) == Condition.STRAGGLER
    assert condition(job, Stage.WORKER_INITIAL) == Condition.HEALTHY
