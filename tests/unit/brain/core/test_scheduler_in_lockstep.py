"""The cluster schedulers through the brain's processor and the simulated cluster, in one
process: the lockstep an A/B arm runs, without the broker between them.

Each tick the simulated cluster (handlers.simulator.fleet) advances to the tick's end, the
brain's processor (streams.brain.core.processor) reads the tick's events and its barrier, and
the plans it answers with are applied at the tick's end, with their results and the
events they caused read in the next tick: what the virtual operator and the brain do over
Kafka (tests/integration/ab/ runs that), the same functions and the same order, so the same
per-job JCTs. Throughput is learned from the samples: nothing here reads the traces for the
brain.

A small run is part of the suite: the first 40 jobs of workload-6 on 16 x 4 GPUs, where
goodput-cluster must beat tiresias by the issue's margin (it did not while an adaptive job
trained from its baseline's fixed batch). Whole workloads take seconds to minutes each, so
they run only when asked (`report`, below), printing each arm's mean JCT:

    .venv/bin/python -m tests.unit.brain.core.test_scheduler_in_lockstep \\
        workloads/workload-6 workloads-1.5/workload-2
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from datetime import datetime

from dlrover_events.bus.topics import topic, topic_of
from dlrover_events.domain.workloads import read_trace
from handlers.simulator.cluster import Cluster, GiB
from handlers.simulator.fleet import VirtualCluster
from handlers.simulator.lockstep import TickClock, apply_order
from handlers.simulator.workload import workload_path
from schemas.codec import encode
from schemas.envelope import Event
from schemas.jobs import JobCompleted, JobFailed, JobSubmitted
from schemas.lockstep import Barrier
from schemas.plans import ScalePlan, ScaleResult
from schemas.rescale_cost import rescale_cost_s
from streams.brain.core.policy import Policy
from streams.brain.core.processor import BrainProcessor
from tests.unit.brain.builders import Rec

ENV = "lockstep"
TOPICS = ("job.events", "job.metrics", "scale.results")
TICK_S = 60.0  # the scheduler presets' tick (examples/ab/*.yaml)


@dataclass(frozen=True)
class Run:
    jct: dict[str, float]  # per finished job, seconds from submission to completion
    jobs: int
    plans: int

    @property
    def mean(self) -> float:
        return statistics.fmean(self.jct.values())


def submissions(name: str, limit: int | None = None) -> list[JobSubmitted]:
    folder, _, workload = name.rpartition("/")
    path = workload_path(workload, folder or "workloads")
    subs = [e for _, e in read_trace(path, ENV) if isinstance(e, JobSubmitted)]
    return subs[:limit] if limit else subs


def _cluster(nodes: int, gpus: int, admission: str, rescale: str = "restart") -> VirtualCluster:
    return VirtualCluster(
        Cluster(nodes, gpus, cpu_per_node=64.0, memory_per_node=256 * GiB),
        origin=None,
        admission=admission,  # type: ignore[arg-type]
        in_place_delay=rescale_cost_s(rescale) if rescale == "in_place" else None,
    )


def _finished(events: list[Event], submitted: dict[str, datetime], jct: dict[str, float]) -> None:
    for e in events:
        if isinstance(e, JobCompleted | JobFailed):
            jct[e.job.uuid] = (e.occurred_at - submitted[e.job.uuid]).total_seconds()


def run_static(subs: list[JobSubmitted], nodes: int = 16, gpus: int = 4) -> Run:
    """No brain: the simulated cluster starts each gang as it fits, as fast as it can."""
    fleet = _cluster(nodes, gpus, "cluster")
    events: list[Event] = []
    for s in subs:
        events += fleet.submit(s)
    events += fleet.start(None)
    jct: dict[str, float] = {}
    submitted = {s.job.uuid: s.occurred_at for s in subs}
    while True:
        _finished(events, submitted, jct)
        step = fleet.step()
        if step is None:
            return Run(jct, len(subs), 0)
        events = list(step)


def run_scheduler(
    subs: list[JobSubmitted],
    scheduler: str,
    nodes: int = 16,
    gpus: int = 4,
    *,
    rescale: str | None = None,
) -> Run:
    """The brain's scheduler owns admission; one barrier per tick on every input. With
    ``rescale`` the jobs are simulated and the scheduler prices reallocations at that
    mode's cost, as an arm's ``operator.rescale_mode`` does (streams/ab/runner.py)."""
    params = {} if rescale is None else {"rescale_mode": rescale}
    policy = Policy.from_settings(
        {
            "lockstep": True,
            "cluster_gpus": nodes * gpus,
            "scheduler": {
                "name": scheduler,
                "nodes": nodes,
                "gpus_per_node": gpus,
                "params": params,
            },
        }
    )
    brain = BrainProcessor(ENV, f"{ENV}.brain", policy)
    inputs = {(topic(ENV, name), 0) for name in TOPICS}
    brain.inputs = inputs
    offsets = dict.fromkeys(inputs, 0)

    def record(tp: tuple[str, int], event: Event) -> Rec:
        offsets[tp] += 1
        return Rec(tp[0], tp[1], offsets[tp] - 1, None, encode(event))

    def records(events: list[Event]) -> list[Rec]:
        # (the brain reads no other topic)
        return [record((topic_of(e), 0), e) for e in events if (topic_of(e), 0) in offsets]

    fleet = _cluster(nodes, gpus, "brain", rescale or "restart")
    carried: list[Event] = list(subs)  # the replay publishes every submission first
    for s in subs:
        fleet.submit(s)
    carried += fleet.start(None)
    clock = TickClock(TICK_S)
    submitted = {s.job.uuid: s.occurred_at for s in subs}
    jct: dict[str, float] = {}
    plans = 0
    holding = True
    while len(jct) < len(subs):
        tick = clock.run(fleet, carrying=holding)
        if tick is None:
            break  # nothing left that could move (a job that can never fit)
        events = carried + list(tick.events)
        _finished(events, submitted, jct)
        barrier = Barrier(env=ENV, tick=tick.number, sim_at=tick.at, occurred_at=tick.at)
        tick_records = records(events)
        tick_records += [record(tp, barrier) for tp in sorted(inputs)]  # after them, everywhere
        out = brain.process(tick_records)
        due = sorted((p for p in out.plans if isinstance(p, ScalePlan)), key=apply_order)
        carried = []
        for plan in due:
            outcome = fleet.apply(plan)
            carried += outcome.events
            carried.append(
                ScaleResult(
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
            )
        plans += len(due)
        holding = bool(due)
    return Run(jct, len(subs), plans)


def test_goodput_cluster_beats_tiresias_on_the_start_of_workload_6() -> None:
    subs = submissions("workloads/workload-6", limit=40)
    tiresias = run_scheduler(subs, "tiresias")
    goodput = run_scheduler(subs, "goodput-cluster")
    assert len(tiresias.jct) == len(goodput.jct) == 40
    # the margin on the whole workload: at least 20 % below tiresias
    assert goodput.mean <= 0.8 * tiresias.mean, (goodput.mean, tiresias.mean)
    assert len(run_static(subs).jct) == 40


def test_jobs_that_rescale_in_place_finish_sooner_under_goodput_cluster() -> None:
    """The cluster-inplace arm against goodput-cluster on the start of workload-6: the
    simulator charges a resize that keeps a pod the in-place figure, and the scheduler
    reallocates at that price (whole workload-6: see docs/inplace.md)."""
    subs = submissions("workloads/workload-6", limit=40)
    restart = run_scheduler(subs, "goodput-cluster", rescale="restart")
    in_place = run_scheduler(subs, "goodput-cluster", rescale="in_place")
    assert len(restart.jct) == len(in_place.jct) == 40
    assert in_place.mean < restart.mean, (in_place.mean, restart.mean)


def test_the_same_input_gives_the_same_jcts() -> None:
    subs = submissions("workloads/workload-6", limit=12)
    assert run_scheduler(subs, "goodput-cluster").jct == run_scheduler(subs, "goodput-cluster").jct


def report(names: list[str]) -> None:
    """Whole workloads, three arms each (minutes, so not a test): `.venv/bin/python -m
    tests.unit.brain.core.test_scheduler_in_lockstep workloads/workload-6
    workloads-2.0/workload-1`."""
    for name in names:
        subs = submissions(name)
        started = time.perf_counter()
        runs = {
            "static": run_static(subs),
            "tiresias": run_scheduler(subs, "tiresias"),
            "goodput-cluster": run_scheduler(subs, "goodput-cluster"),
            "cluster-inplace": run_scheduler(subs, "goodput-cluster", rescale="in_place"),
        }
        wall = time.perf_counter() - started
        means = ", ".join(
            f"{arm} {r.mean:.1f} s ({len(r.jct)}/{r.jobs})" for arm, r in runs.items()
        )
        print(f"{name}: mean JCT {means}; {wall:.1f} s wall")


if __name__ == "__main__":
    import sys

    report(sys.argv[1:] or ["workloads/workload-6"])
