"""No arm of an A/B holds more GPUs than its cluster has, at any moment (issue 26, item 8).

Each arm runs in one process as `ab run` runs it over the broker: the brain's processor
and the simulated cluster in lockstep (as tests/unit/brain/core/test_scheduler_in_lockstep.py
does), or the simulated cluster alone for the static arm. The GPUs the arm holds are read
two ways, apart:

- from the simulated cluster's own state, after everything that can move a pod (each
  event the clock stops at, each plan applied): no node holds more GPUs than it has or
  frees more than it gave, and the jobs' pods hold what the nodes lack;
- from the ledger that draws the A/B's GPU-use chart and sums the gpu_hours KPI, fed the
  events the arm's topics hold, topic after topic as `ab run` reads them back.

Both must stay within the cluster, and agree at every moment. The ledger used to read a
job's GPUs off its applied plans: on the first 20 jobs of workload-3 on 16 GPUs it drew
Tiresias holding 22 (a suspended job kept counting until its resume), and it counted a
gang only from its JobStarted, 30 s after its pods took their GPUs.
"""

from __future__ import annotations

import bisect
import itertools
from datetime import datetime, timedelta
from typing import Any

import pytest

from dlrover_events.bus.topics import topic, topic_of
from handlers.simulator.cluster import Cluster, OvercommitError, PodRequest
from handlers.simulator.fleet import VirtualCluster
from handlers.simulator.job import JobPhase, PlanOutcome
from handlers.simulator.lockstep import TickClock, apply_order
from schemas.codec import encode
from schemas.envelope import Event
from schemas.jobs import JobCompleted, JobEvent, JobFailed, JobSubmitted
from schemas.lockstep import Barrier
from schemas.plans import ScalePlan, ScaleResult
from streams.ab.arms import PRESETS
from streams.brain.core.policy import Policy
from streams.brain.core.processor import BrainProcessor
from streams.evaluators.ledger import Ledger, gpu_use, gpus_held
from streams.evaluators.registry import evaluate
from streams.evaluators.service import INPUTS
from tests.unit.brain.builders import Rec
from tests.unit.brain.core.test_scheduler_in_lockstep import ENV, TICK_S, TOPICS, submissions

NODES, GPUS = 4, 4  # 16 GPUs: the first jobs of workload-3 outnumber them for a while


class WatchedFleet(VirtualCluster):
    """The simulated cluster, its GPUs read from its nodes after every move."""

    def __init__(self, nodes: int, gpus: int, *, admission: str) -> None:
        super().__init__(Cluster(nodes, gpus), origin=None, admission=admission)  # type: ignore[arg-type]
        self.held: list[tuple[float, int]] = []  # (clock, GPUs held), after every move

    def start(self, origin: datetime | None = None) -> list[JobEvent]:
        events = super().start(origin)
        self._read()
        return events

    def _step_to(self, clock: float) -> list[JobEvent]:
        # (every event the clock stops at goes through here: advance_to and step alike)
        events = super()._step_to(clock)
        self._read()
        return events

    def apply(self, plan: ScalePlan) -> PlanOutcome:
        outcome = super().apply(plan)
        self._read()
        return outcome

    def _read(self) -> None:
        cluster = self.cluster
        for node in cluster.nodes:
            assert 0 <= node.free_gpus <= node.gpus, f"node-{node.index}: {node}"
        by_pods = 0
        for uuid in cluster.jobs():
            allocation = cluster.allocation(uuid)
            assert allocation is not None
            by_pods += sum(pod.gpu for pod in allocation.pods.values())
            job = self.job(uuid)
            assert job is not None and job.state not in (JobPhase.COMPLETED, JobPhase.FAILED)
        held = cluster.total_gpus - cluster.free_gpus
        assert held == by_pods <= cluster.total_gpus
        self.held.append((self.clock, held))


def scheduler_of(arm: str) -> dict[str, Any] | None:
    """The preset arm's cluster scheduler settings (None: the static arm, no brain)."""
    brain = PRESETS[arm]["brain"]
    return brain["scheduler"] if brain else None


def run_arm(
    subs: list[JobSubmitted], scheduler: dict[str, Any] | None
) -> tuple[WatchedFleet, list[Event]]:
    """The arm's simulated cluster after every job ended, and every event its topics got
    (submissions, the cluster's events, the brain's plans, the operator's results)."""
    fleet = WatchedFleet(NODES, GPUS, admission="cluster" if scheduler is None else "brain")
    for s in subs:
        fleet.submit(s)
    seen: list[Event] = [*subs, *fleet.start(None)]
    if scheduler is None:  # the static arm: the cluster starts each gang as it fits
        while (step := fleet.step()) is not None:
            seen += step
        return fleet, seen
    policy = Policy.from_settings(
        {
            "lockstep": True,
            "cluster_gpus": NODES * GPUS,
            "scheduler": {**scheduler, "nodes": NODES, "gpus_per_node": GPUS},
        }
    )
    brain = BrainProcessor(ENV, f"{ENV}.brain", policy)
    offsets = {(topic(ENV, name), 0): 0 for name in TOPICS}
    brain.inputs = set(offsets)

    def record(tp: tuple[str, int], event: Event) -> Rec:
        offsets[tp] += 1
        return Rec(tp[0], tp[1], offsets[tp] - 1, None, encode(event))

    carried = list(seen)
    clock = TickClock(TICK_S)
    holding = True
    while (tick := clock.run(fleet, carrying=holding)) is not None:
        seen += tick.events
        events = carried + tick.events
        barrier = Barrier(env=ENV, tick=tick.number, sim_at=tick.at, occurred_at=tick.at)
        records = [record((topic_of(e), 0), e) for e in events if (topic_of(e), 0) in offsets]
        records += [record(tp, barrier) for tp in sorted(offsets)]
        out = brain.process(records)
        seen += out.plans
        carried = []
        due = sorted((p for p in out.plans if isinstance(p, ScalePlan)), key=apply_order)
        for plan in due:
            outcome = fleet.apply(plan)
            result = ScaleResult(
                env=ENV,
                source=fleet.source,
                job=plan.job,
                occurred_at=fleet.at(),
                plan_id=plan.plan_id,
                status=outcome.status,
                reason=outcome.reason,
                observed=fleet.observed(plan.job.uuid),
                not_applied=list(outcome.not_applied),
            )
            carried += [*outcome.events, result]
        seen += carried
        holding = bool(due)
    return fleet, seen


def read_back(events: list[Event]) -> Ledger:
    """The ledger `ab run` folds: the arm's topics read one after another."""
    ledger = Ledger()
    order = {topic(ENV, name): i for i, name in enumerate(INPUTS)}
    for event in sorted(events, key=lambda e: order[topic_of(e)]):
        ledger.observe(event)
    return ledger


@pytest.mark.parametrize("arm", ["tiresias", "goodput-cluster", "static"])
def test_no_arm_ever_holds_more_gpus_than_its_cluster_has(arm: str) -> None:
    subs = submissions("workloads/workload-3", limit=20)
    fleet, events = run_arm(subs, scheduler_of(arm))
    capacity = NODES * GPUS
    ended = [e for e in events if isinstance(e, JobCompleted | JobFailed)]
    assert len(ended) == len(subs), "every job ran to its end"
    # the simulated cluster's own state, after every move
    assert max(held for _, held in fleet.held) <= capacity
    # the ledger's, exactly at every change and as the A/B's chart samples it
    ledger = read_back(events)
    jobs = ledger.in_window(None, None)
    exact = gpus_held(jobs)
    assert max(gpus for _, gpus in exact) <= capacity, max(exact, key=lambda c: c[1])
    assert max(gpus for _, gpus in gpu_use(jobs, step_s=60.0)) <= capacity
    assert max(gpus for _, gpus in gpu_use(jobs, step_s=300.0)) <= capacity
    # and the two agree at every moment: what the cluster held once it settled at each
    # clock reading is what the ledger says the jobs held then
    origin = min(s.occurred_at for s in subs)
    settled = dict(fleet.held)
    times = [since for since, _ in exact]
    for clock, held in sorted(settled.items()):
        at = origin + timedelta(seconds=clock)
        i = bisect.bisect_right(times, at) - 1
        assert (exact[i][1] if i >= 0 else 0) == held, (clock, held, exact[max(i, 0)])
    # so gpu_hours is what the simulated cluster's GPUs were busy for
    points = sorted(settled.items())
    busy = sum(h * (nxt - t) for (t, h), (nxt, _) in itertools.pairwise(points))
    kpi = evaluate(jobs, ledger.last_event_at, ["gpu_hours"])["gpu_hours"]
    assert kpi == pytest.approx(busy / 3600, rel=1e-9)


def test_a_node_refuses_more_gpus_than_it_has() -> None:
    cluster = Cluster(1, 4)
    node = cluster.nodes[0]
    node.take(PodRequest("worker", 0, gpu=3))
    with pytest.raises(OvercommitError, match="node-0 has 1 of its 4 GPUs free"):
        node.take(PodRequest("worker", 1, gpu=2))
    node.give(PodRequest("worker", 0, gpu=3))
    with pytest.raises(OvercommitError, match="given back twice"):
        node.give(PodRequest("worker", 0, gpu=3))
    assert node.free_gpus == 4
