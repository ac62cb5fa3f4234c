"""Grid and random search through their whole life, with trials that follow a known
loss curve; the median-stop assessor stopping the bad ones."""

from __future__ import annotations

import statistics

from schemas.experiments import DecisionKind
from streams.searcher.core.api import TrialStatus
from streams.searcher.core.space import grid_axes, grid_point, sample
from tests.unit.searcher.core.driver import SPACE, Sim, loss, spec

SMALL_GRID = {
    "lr": {"type": "log", "base": 10, "minval": -3, "maxval": -2, "count": 2},
    "width": {"type": "int", "minval": 16, "maxval": 64, "count": 2},
    "act": {"type": "categorical", "vals": ["relu", "tanh"]},
    "epochs": {"type": "const", "val": 3},
}


def test_grid_runs_every_point_once_in_order_to_the_maximum_budget() -> None:
    sim = Sim.start(spec("grid", SMALL_GRID))
    assert sim.kinds() == [("create", i) for i in range(4)]  # 4 at once
    sim.run()
    axes = grid_axes(sim.state.spec.hyperparameters)
    creates = sim.of("create")
    assert [d.hparams for d in creates] == [grid_point(axes, i) for i in range(8)]
    assert len({repr(d.hparams) for d in creates}) == 8
    assert all(d.budget == 800 and d.rung is None for d in creates)
    assert sorted(d.trial for d in sim.of("complete")) == list(range(8))
    assert sim.max_running == 4
    best = min(range(8), key=lambda t: (loss(sim.hparams[t], 800), t))
    done = sim.decisions[-1]
    assert done.decision is DecisionKind.DONE and done.trial is None
    assert done.reason.startswith("done: 8 trials (8 completed); best: trial ")
    assert f"best: trial {best}, val_loss " in done.reason
    assert sim.state.status == "completed" and sim.best_trial() == best


def test_grid_stops_at_max_trials_and_starts_all_without_a_limit() -> None:
    sim = Sim.start(spec("grid", SMALL_GRID, max_trials=5, max_concurrent_trials=0))
    assert sim.kinds() == [("create", i) for i in range(5)]
    sim.run()
    assert len(sim.of("create")) == 5 and sim.state.status == "completed"


def test_random_is_reproducible_with_its_seed_and_differs_with_another() -> None:
    one, two = Sim.start(spec("random")), Sim.start(spec("random"))
    one.run()
    two.run()
    assert [d.model_dump() for d in one.decisions] == [d.model_dump() for d in two.decisions]
    assert [d.hparams for d in one.of("create")] == [
        sample(one.state.spec.hyperparameters, 7, i) for i in range(16)
    ]
    other = Sim.start(spec("random", seed=8))
    other.run()
    assert [d.hparams for d in other.of("create")] != [d.hparams for d in one.of("create")]
    assert len(one.of("complete")) == 16 and one.max_running == 4


def test_a_failed_trial_counts_and_the_next_one_takes_its_slot() -> None:
    sim = Sim.start(spec("random", max_trials=6, max_concurrent_trials=2))
    assert sim.end(1, "failed", "OOMKilled") == sim.decisions[-1:]
    assert sim.kinds(sim.decisions[-1:]) == [("create", 2)]
    assert sim.state.trials[1].status is TrialStatus.FAILED
    assert sim.state.trials[1].ended == "its job failed: OOMKilled"
    # trial 0 ends well before its budget: its last validation value is its final one
    sim.report(0, 300)
    assert sim.end(0, "succeeded") == sim.decisions[-1:]
    assert sim.kinds(sim.decisions[-1:]) == [("create", 3)]
    assert sim.state.trials[0].status is TrialStatus.COMPLETED
    assert "its last val_loss" in sim.state.trials[0].ended
    sim.run()
    assert len(sim.of("create")) == 6
    assert sim.decisions[-1].reason.startswith("done: 6 trials (5 completed, 1 failed); best: ")


def test_median_stop_stops_the_trials_worse_than_the_median() -> None:
    rule = {"name": "median", "min_trials": 3, "start_fraction": 0.25}
    sim = Sim.start(
        spec("random", SPACE, max_trials=10, max_concurrent_trials=0, early_stopping=rule)
    )
    assert len(sim.of("create")) == 10
    for budget in (100.0, 200.0, 400.0, 800.0):
        for t in range(10):
            if sim.state.trials[t].live:
                sim.report(t, budget)
    stopped = {d.trial: d for d in sim.of("stop")}
    assert stopped, "some trial is worse than the median"
    for t, d in stopped.items():
        assert t is not None
        mine = sim.state.trials[t]
        at = mine.validations[-1][0]
        assert at >= 200, "nothing is stopped before start_fraction of the budget"
        others = [o.value_at(at) for o in sim.state.trials if o.index != t]
        median = statistics.median(v for v in others if v is not None)
        assert min(v for _, v in mine.validations) > median
        assert d.reason.startswith("median stop: val_loss ")
    best = min(range(10), key=lambda t: (loss(sim.hparams[t], 800), t))
    assert best not in stopped and sim.state.trials[best].status is TrialStatus.COMPLETED
    assert sim.done and f"best: trial {best}," in sim.decisions[-1].reason
    assert len(stopped) + len(sim.of("complete")) == 10
