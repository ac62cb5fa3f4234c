"""Experiments in virtual envs, in one process: the searcher's pure core and step
(streams/searcher/runtime/step.py), the virtual operator's rules for its requests and its
one order for the searcher's inputs (handlers/operator/virtual/trials.py), the simulated
cluster with its trials (handlers/simulator), and, under a cluster scheduler, the brain's
processor in lockstep (streams/brain/core/processor.py): what `ab run`'s arms do over the
bus, the same functions in the same order, without the broker. The measurements of
docs/experiments.md ("Measured") come from here; `ab run --experiment` runs the same arms
over the bus.

The order is the virtual operator's (handlers/operator/virtual/operator.py):

- as fast as possible (no brain): everything the searcher decides on (a trial's report,
  an answer to its request, a trial's end) is decided before the clock moves on; the
  searcher's inputs are then taken in one order (trials.canonical), and the clock jumps to
  the next event;
- in lockstep with a brain (a cluster scheduler owns admission): the same between ticks;
  each tick's events then go to the brain with a barrier, and its plans are applied at the
  tick's end, by apply_order.

`python -m tests.unit.ab.experiments_in_lockstep asha-vs-random [SEEDS]` and `...
elastic [SEEDS [TARGET [WORKLOAD JOBS]]]` print the measurements with their intervals
(SEEDS: `0,1,2`; a minute each).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dlrover_events.bus.topics import topic, topic_of
from dlrover_events.domain.workloads import read_trace
from handlers.operator.reconcile import requests
from handlers.operator.virtual import trials
from handlers.simulator.cluster import Cluster, GiB
from handlers.simulator.curves import ParametricCurve
from handlers.simulator.fleet import VirtualCluster
from handlers.simulator.lockstep import TickClock, apply_order
from handlers.simulator.workload import workload_path
from schemas.codec import encode
from schemas.envelope import Event
from schemas.experiments import DecisionKind, ExperimentDocument, ExperimentSubmitted, TrialDecision
from schemas.jobs import JobSubmitted
from schemas.lockstep import Barrier
from schemas.plans import ScalePlan, ScaleResult
from schemas.requests import JobDeletion, JobRequest
from streams.brain.core.policy import Policy
from streams.brain.core.processor import BrainProcessor
from streams.evaluators import kpis
from streams.evaluators.compare import bootstrap_mean
from streams.evaluators.ledger import JobRecord, Ledger
from streams.searcher.runtime.step import SOURCE, Experiment, experiment_of, start, step
from tests.unit.brain.builders import Rec

ENV = "lockstep"
OPERATOR = "virtual-operator"
BRAIN_TOPICS = ("job.events", "job.metrics", "scale.results")
EXPERIMENT = "sweep"


@dataclass(frozen=True)
class Setup:
    """One arm's experiment, cluster and policy."""

    searcher: str = "asha"
    #: trials may grow from 1 to this many GPUs (1: fixed-size trials)
    max_gpus: int = 1
    #: a cluster scheduler of the brain (owns admission, in lockstep), or none
    scheduler: str | None = None
    tick_s: float = 60.0
    nodes: int = 4
    gpus_per_node: int = 4
    max_trials: int = 32
    concurrent: int = 8
    budget: float = 3200.0
    divisor: int = 4
    max_rungs: int = 4
    mode: str = "aggressive"
    seed: int = 0
    curve_seed: int = 0
    curve_scale: float = 100.0
    #: other jobs sharing the cluster: the first ``jobs`` of a Pollux workload
    workload: str = "workloads/workload-6"
    jobs: int = 0
    #: the env's name (what its events say)
    env: str = ENV


def experiment_document(setup: Setup) -> ExperimentDocument:
    """An experiment over lr and width of a cifar10-speed trial (its curve: the built-in
    family), its trials' workers elastic up to ``setup.max_gpus``."""
    worker: dict[str, Any] = {
        "replicas": 1,
        "resources": {"cpu": 1, "memory": "4Gi", "nvidia.com/gpu": 1},
        "template": {"spec": {"containers": [{"name": "main", "image": "trial"}]}},
    }
    # a fixed-size trial says so: a scheduler may resize a job that says its batch
    worker |= {"minReplicas": 1, "maxReplicas": setup.max_gpus}
    searcher: dict[str, Any] = {
        "name": setup.searcher,
        "metric": "val_loss",
        "max_trials": setup.max_trials,
        "max_concurrent_trials": setup.concurrent,
        "budget": {"unit": "steps", "max": setup.budget},
        "seed": setup.seed,
    }
    if setup.searcher == "asha":
        searcher |= {"divisor": setup.divisor, "max_rungs": setup.max_rungs, "mode": setup.mode}
    return ExperimentDocument.model_validate(
        {
            "metadata": {"name": EXPERIMENT},
            "spec": {
                "hyperparameters": {
                    "lr": {"type": "log", "minval": -4, "maxval": -1},
                    "width": {"type": "int", "minval": 8, "maxval": 256},
                },
                "searcher": searcher,
                "trial": {
                    "apiVersion": "dlrover-events.io/v1alpha1",
                    "kind": "TrainingJob",
                    "metadata": {"labels": {"dlrover-events.io/app": "cifar10"}},
                    "spec": {"batch": {"size": 128}, "roles": {"worker": worker}},
                },
            },
        }
    )


@dataclass
class Result:
    setup: Setup
    jobs: list[JobRecord]
    decisions: list[TrialDecision]
    wall_s: float

    @property
    def trials(self) -> list[JobRecord]:
        return kpis.trials_of(self.jobs)

    @property
    def others(self) -> list[JobRecord]:
        return [j for j in self.jobs if j.experiment is None]

    def time_to_target(self, target: float) -> float | None:
        return kpis.time_to_target(self.jobs, target)

    def other_jct_mean(self) -> float:
        values = [v for j in self.others if (v := j.jct_s()) is not None]
        return statistics.fmean(values) if values else 0.0


class Brain(BrainProcessor):
    """The brain's processor, knowing the full names of the topics it reads."""

    @property
    def topics(self) -> frozenset[str]:
        return frozenset(topic(self.env, name) for name in BRAIN_TOPICS)


class Searcher:
    """The searcher's runtime without its I/O: each input it decides on stepped through
    the core, in the order given (the processor's order within a batch)."""

    def __init__(self) -> None:
        self.experiment: Experiment | None = None

    def take(self, event: Event) -> list[Event]:
        if experiment_of(event, source=SOURCE) is None:
            return []
        if isinstance(event, ExperimentSubmitted):
            if self.experiment is not None:
                return []
            self.experiment, out = start(event)
            return out
        if self.experiment is None:
            return []
        self.experiment, out = step(self.experiment, event)
        return out


@dataclass
class Arm:
    """One virtual env: the simulated cluster, the operator's side, the searcher, the
    brain (a scheduler's arm), and the ledger of everything said."""

    setup: Setup
    fleet: VirtualCluster
    searcher: Searcher = field(default_factory=Searcher)
    ledger: Ledger = field(default_factory=Ledger)
    brain: Brain | None = None
    #: what the searcher is to decide on, in the order said
    inbox: list[Event] = field(default_factory=list)
    #: the searcher's inputs read and not yet taken
    pending: list[Event] = field(default_factory=list)
    #: what the brain has not read yet (job topics), in the order said
    carried: list[Event] = field(default_factory=list)
    decisions: list[TrialDecision] = field(default_factory=list)
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)

    def say(self, events: Iterable[Event]) -> None:
        for event in [*events, *self.fleet.take_reports()]:
            self.ledger.observe(event)
            if trials.searcher_decides_on(event):
                self.inbox.append(event)
            if self.brain is not None and topic_of(event) in self.brain.topics:
                self.carried.append(event)

    def settle(self) -> None:
        """The searcher decides everything it was told; what it says is read."""
        while self.inbox:
            for out in self.searcher.take(self.inbox.pop(0)):
                self.read(out)

    def read(self, event: Event) -> None:
        """What the operator does on reading one of the searcher's events."""
        self.ledger.observe(event)
        if isinstance(event, TrialDecision):
            self.decisions.append(event)
        if isinstance(event, JobRequest):
            existing = trials.existing_job(self.setup.env, self.fleet, event.name, self.pending)
            made = trials.decide_request(self.setup.env, event, existing)
            if isinstance(made, trials.Creation):
                self.pending.append(event)
                answer = made.answer
            else:
                answer = made
            self.say([requests.result(self.setup.env, event, answer, OPERATOR)])
        elif trials.is_searchers(event):
            self.pending.append(event)

    def take_pending(self) -> None:
        pending, self.pending = trials.canonical(self.pending), []
        for event in pending:
            if isinstance(event, JobRequest):
                made = trials.decide_request(self.setup.env, event, None)
                assert isinstance(made, trials.Creation)
                sub = trials.submission(self.setup.env, made, self.fleet, "cifar10", OPERATOR)
                self.say([sub])
                self.say(self.fleet.request(sub, made.document, made.trial))
            elif isinstance(event, TrialDecision):
                self.say(self.fleet.decide(event))
            elif isinstance(event, ScalePlan):
                self.apply(event)
            elif isinstance(event, JobDeletion):
                answer = trials.decide_deletion(
                    event, trials.existing_job(self.setup.env, self.fleet, event.name)
                )
                if answer.status is requests.JobRequestStatus.DELETED:
                    self.say(self.fleet.delete(event.name))
                self.say([requests.result(self.setup.env, event, answer, OPERATOR)])

    def apply(self, plan: ScalePlan) -> None:
        outcome = self.fleet.apply(plan)
        self.ledger.observe(plan)
        self.say(outcome.events)
        self.say(
            [
                ScaleResult(
                    env=self.setup.env,
                    source=OPERATOR,
                    job=plan.job,
                    occurred_at=self.fleet.at(),
                    plan_id=plan.plan_id,
                    status=outcome.status,
                    reason=outcome.reason,
                    observed=self.fleet.observed(plan.job.uuid),
                    not_applied=list(outcome.not_applied),
                )
            ]
        )

    def done(self) -> bool:
        ended = any(d.decision is DecisionKind.DONE for d in self.decisions)
        others = [j for j in self.ledger.jobs.values() if j.experiment is None]
        return ended and all(j.done for j in others) and not self.fleet.active_experiments()

    # -- the brain's side (a scheduler's arm) ------------------------------------------------

    def record(self, event: Event) -> Rec:
        tp = (topic_of(event), 0)
        self.offsets[tp] = self.offsets.get(tp, 0) + 1
        return Rec(tp[0], tp[1], self.offsets[tp] - 1, None, encode(event))


def arm(setup: Setup) -> Arm:
    admission = "brain" if setup.scheduler else "cluster"
    fleet = VirtualCluster(
        Cluster(setup.nodes, setup.gpus_per_node, cpu_per_node=64.0, memory_per_node=256 * GiB),
        origin=None,
        admission=admission,  # type: ignore[arg-type]
        curve=ParametricCurve(seed=setup.curve_seed, scale=setup.curve_scale),
        source=OPERATOR,
    )
    made = Arm(setup, fleet)
    if setup.scheduler:
        policy = Policy.from_settings(
            {
                "lockstep": True,
                "cluster_gpus": setup.nodes * setup.gpus_per_node,
                "scheduler": {
                    "name": setup.scheduler,
                    "nodes": setup.nodes,
                    "gpus_per_node": setup.gpus_per_node,
                    "params": {"hysteresis": 0.05, "rescale_mode": "restart"},
                },
            }
        )
        made.brain = Brain(setup.env, f"{setup.env}.brain", policy)
        made.brain.inputs = {(topic(setup.env, name), 0) for name in BRAIN_TOPICS}
        made.offsets = dict.fromkeys(made.brain.inputs, 0)
    return made


def run(setup: Setup, *, limit_s: float = 30 * 86400.0) -> Result:
    """One arm to the experiment's done and every other job's end."""
    started = time.perf_counter()
    a = arm(setup)
    others = _submissions(setup) if setup.jobs else []
    for sub in others:
        a.fleet.submit(sub)
    a.say(others)
    a.say(a.fleet.start(None))
    doc = experiment_document(setup)
    submitted = ExperimentSubmitted(
        env=setup.env, source="ab", experiment=EXPERIMENT, spec=doc.spec, occurred_at=a.fleet.at()
    )
    a.ledger.observe(submitted)
    a.fleet.experiment(submitted)
    a.inbox.append(submitted)
    if a.brain is None:
        _fast(a, limit_s)
    else:
        _lockstep(a, limit_s)
    jobs = a.ledger.in_window(None, None)
    return Result(setup, jobs, a.decisions, time.perf_counter() - started)


def _submissions(setup: Setup) -> list[JobSubmitted]:
    """The workload's first jobs, submitted in the arm's env (as `ab run` replays them)."""
    folder, _, name = setup.workload.rpartition("/")
    path = workload_path(name, folder or "workloads")
    subs = [e for _, e in read_trace(path, setup.env) if isinstance(e, JobSubmitted)]
    return subs[: setup.jobs]


def _fast(a: Arm, limit_s: float) -> None:
    while not a.done():
        a.settle()
        a.take_pending()
        if a.inbox:
            continue
        moved = a.fleet.step()
        if moved is None:
            if not a.inbox and not a.pending:
                break  # nothing can move: a trial the cluster can never fit, say
            continue
        a.say(moved)
        if a.fleet.clock > limit_s:
            break


def _lockstep(a: Arm, limit_s: float) -> None:
    assert a.brain is not None
    clock = TickClock(a.setup.tick_s)
    while not a.done():
        a.settle()
        a.take_pending()
        if a.inbox:
            continue
        tick = clock.run(a.fleet, carrying=bool(a.carried))
        if tick is None:
            break
        a.say(tick.events)
        events, a.carried = a.carried, []
        barrier = Barrier(env=a.setup.env, tick=tick.number, sim_at=tick.at, occurred_at=tick.at)
        records = [a.record(e) for e in events]
        records += [
            Rec(tp[0], tp[1], _next(a, tp), None, encode(barrier)) for tp in sorted(a.offsets)
        ]
        out = a.brain.process(records)
        for plan in sorted((p for p in out.plans if isinstance(p, ScalePlan)), key=apply_order):
            a.apply(plan)
        if a.fleet.clock > limit_s:
            break


def _next(a: Arm, tp: tuple[str, int]) -> int:
    a.offsets[tp] += 1
    return a.offsets[tp] - 1


# -- measurements ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Paired:
    """A ratio per seed (baseline / arm: above 1, the arm is faster) with its mean and a
    bootstrap interval over the seeds."""

    ratios: list[float]
    low: float
    high: float

    @property
    def mean(self) -> float:
        return statistics.fmean(self.ratios)

    @property
    def geomean(self) -> float:
        return math.exp(statistics.fmean(math.log(r) for r in self.ratios))


def paired(ratios: Sequence[float]) -> Paired:
    ci = bootstrap_mean(list(ratios), resamples=4000, seed=0)
    return Paired(list(ratios), ci.low, ci.high)


def _fmt(values: Sequence[float | None]) -> str:
    return ", ".join("-" if v is None else f"{v:.0f}" for v in values)


def asha_vs_random(seeds: Sequence[int], base: Setup, target: float) -> None:
    """(a): ASHA against random search, the same trials, budget and cluster."""
    asha_t: list[float | None] = []
    random_t: list[float | None] = []
    ratios: list[float] = []
    for seed in seeds:
        a = run(replace(base, searcher="asha", seed=seed, curve_seed=seed))
        r = run(replace(base, searcher="random", seed=seed, curve_seed=seed))
        ta, tr = a.time_to_target(target), r.time_to_target(target)
        asha_t.append(ta)
        random_t.append(tr)
        if ta is not None and tr is not None:
            ratios.append(tr / ta)
        best_a = min((v for _, v in kpis.progress(a.jobs)), default=None)
        best_r = min((v for _, v in kpis.progress(r.jobs)), default=None)
        print(
            f"seed {seed}: time to val_loss <= {target}: asha {ta} s, random {tr} s; "
            f"best asha {best_a:.4f} random {best_r:.4f}; "
            f"GPU-h asha {sum(j.gpu_seconds(None) for j in a.trials) / 3600:.2f} "
            f"random {sum(j.gpu_seconds(None) for j in r.trials) / 3600:.2f}; "
            f"wall {a.wall_s + r.wall_s:.1f} s",
            flush=True,
        )
    p = paired(ratios)
    reached_a = sum(t is not None for t in asha_t)
    reached_r = sum(t is not None for t in random_t)
    print(f"reached the target: asha in {reached_a}/{len(seeds)} seeds, random in {reached_r}")
    print(
        f"asha vs random, {len(ratios)}/{len(seeds)} seeds where both reached {target:.4f}: "
        f"random/asha time-to-target mean {p.mean:.2f}x (95% CI {p.low:.2f}-{p.high:.2f}), "
        f"geomean {p.geomean:.2f}x; asha [{_fmt(asha_t)}] s, random [{_fmt(random_t)}] s"
    )


def elastic_vs_fixed(seeds: Sequence[int], base: Setup, target: float) -> None:
    """(b): ASHA with elastic trials against fixed-size trials, both under the cluster
    scheduler, beside other jobs."""
    speed: list[float] = []
    jct: list[float] = []
    for seed in seeds:
        fixed = run(replace(base, max_gpus=1, seed=seed, curve_seed=seed))
        elastic = run(replace(base, seed=seed, curve_seed=seed))
        tf, te = fixed.time_to_target(target), elastic.time_to_target(target)
        jf, je = fixed.other_jct_mean(), elastic.other_jct_mean()
        if tf is not None and te is not None:
            speed.append(tf / te)
        jct.append(je / jf)
        print(
            f"seed {seed}: time to val_loss <= {target}: fixed {tf} s, elastic {te} s; "
            f"other jobs' mean JCT fixed {jf:.0f} s, elastic {je:.0f} s "
            f"({len(fixed.others)} jobs); trial GPU-h fixed "
            f"{sum(j.gpu_seconds(None) for j in fixed.trials) / 3600:.2f}, elastic "
            f"{sum(j.gpu_seconds(None) for j in elastic.trials) / 3600:.2f}; "
            f"wall {fixed.wall_s + elastic.wall_s:.1f} s",
            flush=True,
        )
    s, j = paired(speed), paired(jct)
    print(f"reached the target in both arms: {len(speed)}/{len(seeds)} seeds")
    print(
        f"elastic vs fixed, {len(speed)}/{len(seeds)} seeds: fixed/elastic time-to-target "
        f"mean {s.mean:.2f}x (95% CI {s.low:.2f}-{s.high:.2f}); other jobs' mean JCT "
        f"elastic/fixed {j.mean:.3f} (95% CI {j.low:.3f}-{j.high:.3f})"
    )


def target_quantile(setup: Setup, q: float, n: int = 5000) -> float:
    """The validation loss at the full budget that a fraction ``q`` of the space's
    configurations reach (a random sample of ``n``, curve seed 0): a target as hard as
    the top ``q`` of the space."""
    import random

    curve = ParametricCurve(seed=0, scale=setup.curve_scale)
    rng = random.Random(1)
    values = sorted(
        curve.metrics(
            {"lr": 10 ** rng.uniform(-4, -1), "width": rng.randint(8, 256)},
            setup.budget,
            validation=True,
        )["val_loss"]
        for _ in range(n)
    )
    return values[int(q * n)]


#: The settings of docs/experiments.md's measurements: trials of a cifar10's speed (0.1 s
#: a step on one GPU) whose full budget, 25,600 steps, is 44 minutes on one GPU; ASHA's
#: rungs at 400, 1,600, 6,400 and 25,600 steps.
BUDGET = 25600.0
SCALE = 800.0
ASHA_VS_RANDOM = Setup(
    nodes=2,
    gpus_per_node=4,
    max_trials=128,
    concurrent=8,
    budget=BUDGET,
    curve_scale=SCALE,
)
ELASTIC_VS_FIXED = Setup(
    scheduler="goodput-cluster",
    max_gpus=4,
    nodes=4,
    gpus_per_node=4,
    max_trials=16,
    concurrent=4,
    budget=BUDGET,
    curve_scale=SCALE,
    jobs=30,
    workload="workloads/workload-6",
)


def main(argv: Sequence[str]) -> None:
    what = argv[0] if argv else "asha-vs-random"
    seeds = [int(s) for s in argv[1].split(",")] if len(argv) > 1 else list(range(10))
    if what == "asha-vs-random":
        for mode in ("aggressive", "standard"):
            base = replace(ASHA_VS_RANDOM, mode=mode)
            for q in (0.01, 0.02):
                target = target_quantile(base, q)
                print(f"== ASHA ({mode}) vs random, target: the top {q:.0%} ({target:.4f})")
                asha_vs_random(seeds, base, target)
    else:
        target = float(argv[2]) if len(argv) > 2 else 0.40
        base = ELASTIC_VS_FIXED
        if len(argv) > 3:
            base = replace(base, workload=argv[3], jobs=int(argv[4]))
        print(
            f"== elastic vs fixed-size trials under goodput-cluster, target {target}, "
            f"beside the first {base.jobs} jobs of {base.workload}"
        )
        elastic_vs_fixed(seeds, base, target)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
