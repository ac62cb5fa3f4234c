"""The experiments evaluator (streams/evaluators/kpis.py): an experiment's best value and
when it was reached, time to a target, best by a deadline, its trials' GPU-hours and the
other jobs' JCT, folded from the events a simulated cluster says (job events and trial
reports), in any order."""

from __future__ import annotations

import itertools
import random
from datetime import timedelta

import pytest

from handlers.simulator.cluster import Cluster
from handlers.simulator.curves import ParametricCurve
from handlers.simulator.fleet import VirtualCluster
from handlers.simulator.job_events import DEFAULT_ORIGIN
from handlers.simulator.trial import TrialSpec
from schemas.envelope import Event
from schemas.experiments import (
    BudgetUnit,
    DecisionKind,
    ExperimentSubmitted,
    TrialDecision,
    TrialMetrics,
)
from schemas.jobs import JobMeta, JobSubmitted, RoleSpec
from streams.evaluators import kpis
from streams.evaluators.ledger import Ledger
from streams.evaluators.registry import EVALUATORS, evaluate

ENV = "kpi"
EXP = "sweep"


def submission(name: str, *, trial: bool, at_s: float = 0.0) -> JobSubmitted:
    labels = {"dlrover-events.io/experiment": EXP} if trial else {}
    return JobSubmitted(
        env=ENV,
        job=JobMeta(uuid=f"uid-{name}", name=name, app="cifar10", labels=labels),
        source="test",
        occurred_at=DEFAULT_ORIGIN + timedelta(seconds=at_s),
        application="cifar10",
        roles={"worker": RoleSpec(replicas=1, gpu_num=1)},
    )


def experiment() -> ExperimentSubmitted:
    return ExperimentSubmitted.model_validate(
        {
            "env": ENV,
            "experiment": EXP,
            "spec": {
                "hyperparameters": {"lr": {"type": "log", "minval": -4, "maxval": -1}},
                "searcher": {"name": "asha", "metric": "val_loss", "budget": {"max": 400}},
                "trial": {"spec": {"roles": {}}},
            },
        }
    )


def simulated() -> list[Event]:
    """Two trials (one better) to 100 then 400 steps beside an ordinary job, on a
    simulated cluster: everything it said."""
    fleet = VirtualCluster(Cluster(1, 4), origin=DEFAULT_ORIGIN, curve=ParametricCurve(seed=1))
    events: list[Event] = [experiment()]
    other = submission("train-1", trial=False)
    events += [other, *fleet.submit(other)]
    for i, lr in enumerate((1e-4, 1e-2)):
        sub = submission(f"{EXP}-t{i}", trial=True)
        spec = TrialSpec(EXP, i, {"lr": lr, "width": 64}, 100.0, BudgetUnit.STEPS)
        events += [sub, *fleet.request(sub, {}, spec)]
    seq = itertools.count()
    while True:
        step = fleet.step()
        if step is None:
            break
        events += [*step, *fleet.take_reports()]
        # a searcher that answers each report at once (the clock waits for it)
        for t in [t for t in fleet.trials() if t.waiting]:
            if t.budget < 400:
                decision = TrialDecision(
                    env=ENV,
                    experiment=EXP,
                    seq=next(seq),
                    decision=DecisionKind.RUN,
                    trial=t.spec.index,
                    budget=400.0,
                )
            else:
                decision = TrialDecision(
                    env=ENV,
                    experiment=EXP,
                    seq=next(seq),
                    decision=DecisionKind.COMPLETE,
                    trial=t.spec.index,
                )
            events += fleet.decide(decision)
    return events


def test_an_experiments_kpis_from_what_its_cluster_said() -> None:
    events = simulated()
    ledger = Ledger()
    for e in events:
        ledger.observe(e)
    jobs = ledger.in_window(None, None)
    reports = [e for e in events if isinstance(e, TrialMetrics)]
    best = min(r.metrics["val_loss"] for r in reports)
    first_best = min(r.occurred_at for r in reports if r.metrics["val_loss"] == best)
    start = DEFAULT_ORIGIN
    metrics = evaluate(jobs, ledger.last_event_at, ["experiments"])
    assert metrics["best_metric"] == best
    assert metrics["time_to_best_s"] == (first_best - start).total_seconds()
    assert metrics["trials"] == 2.0 and metrics["other_jobs_completed"] == 1.0
    other = next(j for j in jobs if j.name == "train-1")
    assert metrics["other_jct_mean_s"] == other.jct_s()
    # each trial held one GPU from its pod's start (its submission: it fit at once) to
    # its end, its checkpoint-restart included
    trials = kpis.trials_of(jobs)
    held = 0.0
    for j in trials:
        assert j.finished_at is not None and j.submitted_at is not None
        held += (j.finished_at - j.submitted_at).total_seconds()
    assert metrics["trial_gpu_hours"] == pytest.approx(held / 3600.0)
    # a target the better trial reached at its second report, and one nobody reached
    ladder = kpis.progress(jobs)
    assert ladder[-1] == (metrics["time_to_best_s"], best)
    assert kpis.time_to_target(jobs, best) == metrics["time_to_best_s"]
    assert kpis.time_to_target(jobs, best - 1.0) is None
    assert kpis.best_by(jobs, metrics["time_to_best_s"]) == best
    assert kpis.best_by(jobs, ladder[0][0] - 1.0) is None
    assert "experiments" in EVALUATORS


def test_the_kpis_do_not_depend_on_the_order_events_are_read_in() -> None:
    events = simulated()
    expected = None
    for seed in range(5):
        shuffled = list(events)
        random.Random(seed).shuffle(shuffled)
        ledger = Ledger()
        for e in shuffled:
            ledger.observe(e)
        got = evaluate(ledger.in_window(None, None), ledger.last_event_at, ["experiments"])
        assert expected is None or got == expected
        expected = got
    # a report read twice counts once
    ledger = Ledger()
    for e in [*events, *(e for e in events if isinstance(e, TrialMetrics))]:
        ledger.observe(e)
    assert evaluate(ledger.in_window(None, None), ledger.last_event_at, ["experiments"]) == expected
