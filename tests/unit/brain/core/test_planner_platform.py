"""The brain plans only what the platform can apply: a node the platform cannot replace
(an elastic role's rendezvous host on the local platform and Kubernetes; any node where
another controller owns the pods) is neither migrated nor removed by name, and the
platform's word reaches the planner from its capacity report.

Before, under `make run` with the README's example job: worker-resource's resize
migrated every worker, worker-0 included, and the local platform rejected the whole plan
("cannot migrate worker-0: it hosts the job's rendezvous"): two of the first three
ScalePlans were rejected, and the job kept the resources it had.
"""

from __future__ import annotations

from datetime import timedelta

from schemas import encode
from schemas.cluster import CapacityReported, HostCapacity, PlatformCapabilities
from schemas.envelope import Event
from schemas.jobs import JobMeta, JobStarted, JobSubmitted, NodeRef, NodeStarted, RoleSpec
from schemas.plans import NodeResource, OptimizePlan, OptimizeRequest, ResourcePlan, ScalePlan
from streams.brain.core.optimizers import REGISTRY, NoParams, OptimizeContext, Proposal
from streams.brain.core.optimizers.api import group_plan
from streams.brain.core.planner import Planned, plan_scale
from streams.brain.core.policy import Policy
from streams.brain.core.processor import BrainProcessor
from streams.brain.core.state import WORKER, JobState, RoleResources, Stage
from tests.unit.brain.builders import ENV, T0, GiB, Rec, meta, node, nodes, state

#: The local platform's and a TrainingJob's on Kubernetes: the rendezvous host stays.
KEEPS_HOST = PlatformCapabilities(suspend=True, spares=True, replaces_rendezvous_host=False)
#: A platform whose rendezvous is outside the job's nodes (a simulated cluster, say).
REPLACES_ANY = PlatformCapabilities(replaces_rendezvous_host=True)
#: A PyTorchJob's: the training-operator owns the pods, none is migrated.
MIGRATES_NONE = PlatformCapabilities(suspend=True, migrates_nodes=False)


def elastic_job(workers: int = 4, host: int | None = 0, **fields: object) -> JobState:
    """The README's example as the brain knows it: workers at cpu 1 and 4 GiB, worker-0
    hosting the rendezvous."""
    role = RoleResources(
        replicas=workers, min_replicas=0, max_replicas=8, cpu=1, memory=4 * GiB
    ).model_copy(update={"rendezvous_host": host})
    items = [node(WORKER, i, cpu=1, memory=4 * GiB) for i in range(workers)]
    fields.setdefault("stage", Stage.RUNNING.value)
    return state(roles={WORKER: role}, nodes=nodes(*items), **fields)


def wish(
    resource: ResourcePlan, optimizer: str = "worker-resource", stage: str = "worker-initial"
) -> OptimizePlan:
    return OptimizePlan(
        env=ENV,
        job=meta(),
        plan_id="o-1",
        stage=stage,
        optimizer=optimizer,
        reason="test",
        caused_by="event-1",
        resource=resource,
    )


def resize(count: int = 4) -> OptimizePlan:
    """worker-resource's resize of the example: more cpu and memory for every worker."""
    return wish(group_plan(WORKER, count=count, cpu=8, memory=6 * GiB))


def planned(job: JobState, plan: OptimizePlan, platform: PlatformCapabilities | None) -> Planned:
    return plan_scale(job, plan, T0, optimizers=(plan.optimizer,), platform=platform)


def migrated(plan: ScalePlan | None) -> list[str]:
    assert plan is not None
    return [f"{m.node.type}-{m.node.id}" for m in plan.migrate_nodes]


def test_a_resize_leaves_the_rendezvous_host_where_the_platform_cannot_replace_it() -> None:
    out = planned(elastic_job(), resize(), KEEPS_HOST)
    assert migrated(out.scale_plan) == ["worker-1", "worker-2", "worker-3"]
    assert out.scale_plan is not None
    group = out.scale_plan.node_group_resources[WORKER]
    assert (group.count, group.node_resource.cpu) == (4, 8)  # the role is resized all the same
    (note,) = [n for n in out.notes if "worker-0" in n]
    assert "keeps its resources" in note and "hosts the job's rendezvous" in note


def test_where_the_platform_has_not_said_or_can_replace_it_every_node_is_migrated() -> None:
    everyone = ["worker-0", "worker-1", "worker-2", "worker-3"]
    assert migrated(planned(elastic_job(), resize(), None).scale_plan) == everyone
    assert migrated(planned(elastic_job(), resize(), REPLACES_ANY).scale_plan) == everyone
    # a role without a rendezvous host of its own loses no node to the rule
    no_host = planned(elastic_job(host=None), resize(), KEEPS_HOST)
    assert migrated(no_host.scale_plan) == everyone


def test_a_platform_that_migrates_no_node_gets_the_role_resized_alone() -> None:
    out = planned(elastic_job(), resize(), MIGRATES_NONE)
    assert out.scale_plan is not None
    assert out.scale_plan.migrate_nodes == []
    assert out.scale_plan.node_group_resources[WORKER].node_resource.cpu == 8
    assert sum("the platform migrates no node" in n for n in out.notes) == 4


def test_a_node_plan_for_the_rendezvous_host_is_left_out_with_its_reason() -> None:
    # the straggler optimizer replaces a slow node by naming it with no resources
    straggler = wish(
        ResourcePlan(node_resources={"worker-0": NodeResource()}), "straggler", "running"
    )
    out = planned(elastic_job(), straggler, KEEPS_HOST)
    assert out.scale_plan is None
    assert any(n.startswith("node worker-0 cannot be migrated: it hosts") for n in out.notes)
    assert migrated(planned(elastic_job(), straggler, None).scale_plan) == ["worker-0"]
    slow_1 = wish(ResourcePlan(node_resources={"worker-1": NodeResource()}), "straggler")
    assert migrated(planned(elastic_job(), slow_1, KEEPS_HOST).scale_plan) == ["worker-1"]


def test_a_shrink_leaves_the_host_to_the_count() -> None:
    # a host at rank 2 (a TrainingJob's is rank 0, the lowest, which no shrink picks): a
    # shrink to one worker picks the highest ranks, the host among them; it is not
    # named, and the count removes another
    out = planned(elastic_job(workers=3, host=2), wish(group_plan(WORKER, count=1)), KEEPS_HOST)
    assert out.scale_plan is not None
    assert out.scale_plan.node_group_resources[WORKER].count == 1
    assert [f"{r.type}-{r.id}" for r in out.scale_plan.remove_nodes] == ["worker-1"]
    assert any(n.startswith("node worker-2 is not removed by name: it hosts") for n in out.notes)
    named = planned(elastic_job(workers=3, host=2), wish(group_plan(WORKER, count=1)), None)
    assert named.scale_plan is not None
    assert [r.id for r in named.scale_plan.remove_nodes] == [2, 1]


# -- the platform's word, from its capacity report, reaches the plans ------------------------

JOB = JobMeta(uuid="job-rdzv")
TOPIC = f"{ENV}.job.events"


def _records(events: list[Event]) -> list[Rec]:
    return [Rec(TOPIC, 0, i, JOB.uuid.encode(), encode(e)) for i, e in enumerate(events)]


def _report(capabilities: PlatformCapabilities | None, counted: bool = True) -> CapacityReported:
    hosts = [HostCapacity(name="this-machine", gpus=8)] if counted else []
    return CapacityReported(
        env=ENV, platform="local", hosts=hosts, hosts_counted=counted, capabilities=capabilities
    )


def _resizing_brain() -> BrainProcessor:
    registry = REGISTRY.copy()

    @registry.register("resize", "every worker to cpu 8 and 6 GiB", NoParams)
    def _resize(ctx: OptimizeContext, params: NoParams) -> Proposal:
        return Proposal("resize", group_plan(WORKER, cpu=8, memory=6 * GiB))

    return BrainProcessor(ENV, f"{ENV}.brain", Policy(registry=registry))


def _scale_plans(brain: BrainProcessor) -> list[ScalePlan]:
    worker = RoleSpec(replicas=2, cpu=1, memory=4 * GiB, rendezvous_host=0)
    at = T0 + timedelta(seconds=1)
    events: list[Event] = [
        JobSubmitted(env=ENV, job=JOB, occurred_at=T0, roles={WORKER: worker}),
        JobStarted(env=ENV, job=JOB, occurred_at=at),
        *(
            NodeStarted(env=ENV, job=JOB, occurred_at=at, node=NodeRef(type=WORKER, id=i))
            for i in range(2)
        ),
        OptimizeRequest(env=ENV, job=JOB, occurred_at=at, stage="running", optimizer="resize"),
    ]
    out = brain.process(_records(events))
    assert out.letters == []
    return [p for p in out.plans if isinstance(p, ScalePlan)]


def test_the_capacity_reports_capabilities_hold_the_brains_plans() -> None:
    told = _resizing_brain()
    told.set_capacity(_report(KEEPS_HOST, counted=False))
    assert told.states == {} and told.platform == KEEPS_HOST
    assert told.capacity is None  # hosts not counted: the settings' cluster stays
    (plan,) = _scale_plans(told)
    assert migrated(plan) == ["worker-1"]
    assert told.states[JOB.uuid].roles[WORKER].rendezvous_host == 0

    untold = _resizing_brain()  # a virtual env's brain, or an older operator's report
    untold.set_capacity(_report(None))
    assert untold.capacity is not None and untold.capacity.total_gpus == 8
    (plan,) = _scale_plans(untold)
    assert migrated(plan) == ["worker-0", "worker-1"]
