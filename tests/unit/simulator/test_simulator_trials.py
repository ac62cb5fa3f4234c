"""Simulated trials (handlers/simulator/trial.py) in the simulated cluster: a trial trains at
its gang's speed to the budget its decisions give it, reports what its learning curve
says there, waits for the next decision holding its GPUs, frees them when its searcher
holds it, goes on from its checkpoint once released, and ends on stop, complete or its
experiment's done; the same decisions give the same events, across a snapshot too."""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import pytest

from handlers.simulator.cluster import Cluster
from handlers.simulator.curves import ParametricCurve
from handlers.simulator.fleet import VirtualCluster
from handlers.simulator.job import JobPhase
from handlers.simulator.job_events import DEFAULT_ORIGIN
from handlers.simulator.trial import Reporting, TrialJob, TrialSpec, TrialSpecError, trial_spec
from schemas.envelope import Event
from schemas.experiments import (
    BudgetUnit,
    DecisionKind,
    ExperimentSubmitted,
    TrialDecision,
    TrialMetrics,
)
from schemas.jobs import JobCompleted, JobHeld, JobMeta, JobStarted, JobSubmitted, RoleSpec
from schemas.plans import ScalePlan, ScaleStatus

ENV = "sim"
EXP = "sweep"


def trial_submission(index: int, gpus: int = 1) -> JobSubmitted:
    name = f"{EXP}-t{index}"
    return JobSubmitted(
        env=ENV,
        job=JobMeta(uuid=f"uid-{name}", name=name, app="cifar10"),
        source="test",
        occurred_at=DEFAULT_ORIGIN,
        application="cifar10",
        roles={"worker": RoleSpec(replicas=gpus, gpu_num=1)},
    )


def spec(index: int, lr: float = 1e-2, budget: float = 100.0) -> TrialSpec:
    return TrialSpec(EXP, index, {"lr": lr, "width": 64}, budget, BudgetUnit.STEPS)


def fleet(nodes: int = 1, gpus: int = 4, **kwargs: Any) -> VirtualCluster:
    return VirtualCluster(
        Cluster(nodes, gpus),
        origin=DEFAULT_ORIGIN,
        curve=ParametricCurve(seed=3),
        restart_delay=30.0,
        sample_interval=30.0,
        **kwargs,
    )


def experiment() -> ExperimentSubmitted:
    return ExperimentSubmitted.model_validate(
        {
            "env": ENV,
            "experiment": EXP,
            "spec": {
                "hyperparameters": {"lr": {"type": "log", "minval": -4, "maxval": -1}},
                "searcher": {"name": "asha", "metric": "accuracy_loss", "budget": {"max": 1600}},
                "trial": {"spec": {"roles": {}}},
            },
        }
    )


def decision(
    seq: int, kind: DecisionKind, trial: int | None, budget: float | None = None
) -> TrialDecision:
    return TrialDecision(
        env=ENV, experiment=EXP, seq=seq, decision=kind, trial=trial, budget=budget
    )


def hold(index: int, plan_id: str, held: bool) -> ScalePlan:
    meta = trial_submission(index).job
    if held:
        return ScalePlan(env=ENV, job=meta, plan_id=plan_id, suspend=True, hold=True)
    return ScalePlan(env=ENV, job=meta, plan_id=plan_id, hold=False)


def run_until_quiet(f: VirtualCluster) -> list[Event]:
    """Every event until nothing more happens without a decision: the job events, then
    the trials' reports (which the fleet hands over apart: another topic)."""
    events: list[Event] = []
    while (step := f.step()) is not None:
        events.extend(step)
    return [*events, *f.take_reports()]


def reports(events: list[Event]) -> list[TrialMetrics]:
    return [e for e in events if isinstance(e, TrialMetrics)]


def test_a_trial_trains_to_its_budget_reports_and_waits_holding_its_gpus() -> None:
    f = fleet()
    f.experiment(experiment())
    started = f.request(trial_submission(0), {}, spec(0))
    assert any(isinstance(e, JobStarted) for e in started) is False  # restarting first
    events = run_until_quiet(f)
    said = reports(events)
    assert [(r.budget, r.validation) for r in said] == [(100.0, True)]
    report = said[0]
    curve = ParametricCurve(seed=3).metrics({"lr": 1e-2, "width": 64}, 100.0, validation=True)
    # the curve's value, under the experiment's metric too
    assert report.metrics == {"val_loss": curve["val_loss"], "accuracy_loss": curve["val_loss"]}
    assert report.trial == 0 and report.experiment == EXP and report.step >= 100
    trial = f.trials()[0]
    assert trial.waiting and trial.state is JobPhase.RUNNING
    assert f.cluster.free_gpus == 3  # it holds its GPU while it waits
    assert f.next_event_at() is None  # nothing happens until a decision
    # cifar10 at batch 128 on one GPU: the restart, then the steps at the traced speed
    per_step = trial._model.rates(trial._running_pods(), trial._placement(), 0.0).iteration
    took = (report.occurred_at - DEFAULT_ORIGIN).total_seconds()
    assert took == pytest.approx(30.0 + 100 * per_step, rel=1e-6)


def test_run_goes_on_in_place_and_a_hold_frees_the_gpus_until_released() -> None:
    f = fleet()
    f.request(trial_submission(0), {}, spec(0))
    run_until_quiet(f)
    assert f.decide(decision(0, DecisionKind.RUN, 0, 400.0)) == []
    said = reports(run_until_quiet(f))
    assert [r.budget for r in said] == [400.0]
    f.decide(decision(1, DecisionKind.PAUSE, 0))
    outcome = f.apply(hold(0, "pause-1", held=True))
    assert outcome.status is ScaleStatus.APPLIED
    assert [e.held for e in outcome.events if isinstance(e, JobHeld)] == [True]
    assert f.cluster.free_gpus == 4
    # held: no other plan resumes it
    resize = ScalePlan(
        env=ENV,
        job=trial_submission(0).job,
        plan_id="grow",
        node_group_resources={"worker": {"count": 2}},
    )
    assert f.apply(resize).status is ScaleStatus.REJECTED
    f.decide(decision(2, DecisionKind.RESUME, 0, 1600.0))
    released = f.apply(hold(0, "resume-2", held=False))
    assert [e.held for e in released.events if isinstance(e, JobHeld)] == [False]
    assert f.cluster.free_gpus == 3  # the cluster's admission resumes it at once
    said = reports(run_until_quiet(f))
    # from its checkpoint: the budget it had used, not from zero
    assert [r.budget for r in said] == [1600.0]
    assert f.trials()[0].used == 1600.0


def test_periodic_validation_and_training_reports() -> None:
    f = fleet(reporting=Reporting(validate_every=50.0, train_every=25.0))
    f.request(trial_submission(0), {}, spec(0, budget=100.0))
    said = reports(run_until_quiet(f))
    assert [(r.budget, r.validation) for r in said] == [
        (25.0, False),
        (50.0, False),
        (50.0, True),
        (75.0, False),
        (100.0, False),
        (100.0, True),
    ]
    assert "loss" in said[0].metrics and "val_loss" in said[2].metrics


def test_stop_complete_and_done_end_trials() -> None:
    f = fleet()
    for i in range(3):
        f.request(trial_submission(i), {}, spec(i))
    run_until_quiet(f)
    stopped = f.decide(decision(0, DecisionKind.STOP, 0))
    assert [type(e) for e in stopped] == [JobCompleted]
    f.decide(decision(1, DecisionKind.PAUSE, 1))
    f.apply(hold(1, "pause-1", held=True))
    completed = f.decide(decision(2, DecisionKind.COMPLETE, 2))
    assert [type(e) for e in completed] == [JobCompleted]
    assert f.active_experiments() == (EXP,)
    done = f.decide(decision(3, DecisionKind.DONE, None))
    assert [(type(e), e.job.name) for e in done if isinstance(e, JobCompleted)] == [
        (JobCompleted, f"{EXP}-t1")
    ]
    assert f.active_experiments() == ()
    assert f.cluster.free_gpus == 4
    # a decision delivered again is taken once
    assert f.decide(decision(3, DecisionKind.DONE, None)) == []


def test_a_decision_before_its_trial_arrives_is_taken_at_the_arrival() -> None:
    f = fleet()
    f.decide(decision(0, DecisionKind.CREATE, 0, 100.0))
    f.decide(decision(1, DecisionKind.RUN, 0, 300.0))
    f.request(trial_submission(0), {}, spec(0))
    assert [r.budget for r in reports(run_until_quiet(f))] == [300.0]


def test_a_deleted_trial_frees_its_gpus_and_is_gone() -> None:
    f = fleet()
    f.request(trial_submission(0), {"kind": "TrainingJob"}, spec(0))
    run_until_quiet(f)
    assert f.requested(f"{EXP}-t0") == {"kind": "TrainingJob"}
    f.delete(f"{EXP}-t0")
    assert f.job_named(f"{EXP}-t0") is None and f.requested(f"{EXP}-t0") is None
    assert f.cluster.free_gpus == 4


def _script(f: VirtualCluster, cut: int | None = None) -> list[str]:
    """A searcher's decisions for three trials, the same each time; with ``cut`` the
    fleet is snapshotted and restored after that many steps."""
    said: list[str] = []
    f.experiment(experiment())
    for i in range(3):
        said += [
            e.model_dump_json()
            for e in f.request(trial_submission(i), {}, spec(i, lr=10 ** -(i + 1)))
        ]
    seq = 0
    steps = 0
    budgets = {0: 100.0, 1: 100.0, 2: 100.0}
    while True:
        step = f.step()
        if step is None:
            waiting = [t for t in f.trials() if t.waiting]
            if not waiting:
                break
            for trial in waiting:
                i = trial.spec.index
                if budgets[i] >= 1600:
                    said += [
                        e.model_dump_json()
                        for e in f.decide(decision(seq, DecisionKind.COMPLETE, i))
                    ]
                else:
                    budgets[i] *= 4
                    said += [
                        e.model_dump_json()
                        for e in f.decide(decision(seq, DecisionKind.RUN, i, budgets[i]))
                    ]
                seq += 1
            continue
        said += [e.model_dump_json() for e in [*step, *f.take_reports()]]
        steps += 1
        if cut is not None and steps == cut:
            f = VirtualCluster.restore(f.snapshot(), curve=ParametricCurve(seed=3))
    return said


def test_the_same_decisions_give_the_same_events_across_a_snapshot() -> None:
    first = _script(fleet())
    assert first == _script(fleet())
    assert first == _script(fleet(), cut=5)
    assert sum('"trial.metrics"' in e for e in first) == 9  # 3 trials x 100, 400, 1600


def test_trial_variables() -> None:
    env = {
        "DLROVER_EVENTS_EXPERIMENT": EXP,
        "DLROVER_EVENTS_TRIAL": "3",
        "DLROVER_EVENTS_TRIAL_HPARAMS": '{"lr": 0.01, "act": "relu"}',
        "DLROVER_EVENTS_TRIAL_BUDGET": "50",
        "DLROVER_EVENTS_TRIAL_BUDGET_UNIT": "samples",
    }
    assert trial_spec(env) == TrialSpec(
        EXP, 3, {"lr": 0.01, "act": "relu"}, 50.0, BudgetUnit.SAMPLES
    )
    assert trial_spec({}) is None
    for broken in (
        {"DLROVER_EVENTS_TRIAL": "x"},
        {"DLROVER_EVENTS_TRIAL_BUDGET": "-1"},
        {"DLROVER_EVENTS_TRIAL_HPARAMS": "[1]"},
        {"DLROVER_EVENTS_TRIAL_BUDGET_UNIT": "epochs"},
    ):
        with pytest.raises(TrialSpecError):
            trial_spec({**env, **broken})
    with pytest.raises(TrialSpecError, match="DLROVER_EVENTS_TRIAL_BUDGET"):
        trial_spec({k: v for k, v in env.items() if k != "DLROVER_EVENTS_TRIAL_BUDGET"})


def test_a_trial_counts_samples_and_seconds_too() -> None:
    for unit, budget in ((BudgetUnit.SAMPLES, 128 * 100.0), (BudgetUnit.SECONDS, 60.0)):
        f = fleet()
        f.request(trial_submission(0), {}, TrialSpec(EXP, 0, {}, budget, unit))
        (report,) = reports(run_until_quiet(f))
        assert report.budget == budget
        if unit is BudgetUnit.SECONDS:
            # 30 s of restart, then 60 s of training
            assert report.occurred_at - DEFAULT_ORIGIN == timedelta(seconds=90)
        assert isinstance(f.trials()[0], TrialJob)


def test_a_trial_stops_at_its_budget_whatever_sample_falls_beside_it() -> None:
    """A sample due a hair before the trial reaches its budget must not carry it past
    the budget: it would train on forever, never reporting (seen once among 64 trials)."""
    probe = fleet()
    probe.request(trial_submission(0), {}, spec(0))
    run_until_quiet(probe)
    trial = probe.trials()[0]
    per_step = trial._model.rates(trial._running_pods(), trial._placement(), 0.0).iteration
    for budget, early in itertools.product((50.0, 37.3, 200.0), (5e-8, 1e-9, 0.0, -1e-9)):
        # it arrives so that it reaches its budget just after its sample at 60 s (its
        # restart, 30 s, then the steps)
        t0 = 60.0 - 30.0 - budget * per_step + early
        f = fleet()
        f.advance_to(t0)
        sub = trial_submission(0).model_copy(
            update={"occurred_at": DEFAULT_ORIGIN + timedelta(seconds=t0)}
        )
        f.request(sub, {}, spec(0, budget=budget))
        steps = 0
        while f.step() is not None:
            steps += 1
            assert steps < 1_000, (budget, early)
        (trial,) = f.trials()
        assert trial.waiting and trial.used == budget, (budget, early)
        assert [r.budget for r in f.take_reports()] == [budget]
