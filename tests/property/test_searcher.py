"""The searcher's core under inputs nobody planned: random metric values, random
interleavings of reports, job ends, pauses and junk, for grid, random and ASHA. What must
hold whatever comes (the driver checks it after every input, the state restarted from its
JSON each time): never more trials running than ``max_concurrent_trials`` allows, each
trial created once and in order, never more than ``max_trials``, ``seq`` from 0 with no
gap, every decision a valid TrialDecision, nothing after ``done``; and, once the trials
simply report at their budgets, the experiment ends. Then the median-stop rule against
Optuna's MedianPruner wherever both apply."""

from __future__ import annotations

import logging
from typing import Any

import optuna
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from optuna.pruners import MedianPruner
from optuna.trial import TrialState, create_trial

from schemas.experiments import SearcherSpec
from streams.searcher.core.api import Trial, TrialStatus
from streams.searcher.core.median import median_stop
from streams.searcher.core.state import ExperimentStatus
from tests.unit.searcher.core.driver import Sim, spec

SPACE = {
    "lr": {"type": "log", "base": 10, "minval": -4, "maxval": -1, "count": 3},
    "width": {"type": "int", "minval": 1, "maxval": 4, "count": 2},
    "act": {"type": "categorical", "vals": ["relu", "tanh"]},
}


@st.composite
def experiments(draw: st.DrawFn) -> dict[str, Any]:
    name = draw(st.sampled_from(["grid", "random", "asha"]))
    fields: dict[str, Any] = {
        "max_trials": draw(st.integers(1, 12)),
        "max_concurrent_trials": draw(st.integers(0, 4)),
        "budget": {"max": draw(st.sampled_from([0.5, 1, 8, 100, 1000]))},
        "seed": draw(st.integers(0, 3)),
        "smaller_is_better": draw(st.booleans()),
    }
    if name == "asha":
        fields["divisor"] = draw(st.integers(2, 4))
        fields["max_rungs"] = draw(st.integers(1, 5))
        fields["mode"] = draw(st.sampled_from(["aggressive", "standard", "conservative"]))
    elif draw(st.booleans()):
        fields["early_stopping"] = {
            "min_trials": draw(st.integers(1, 3)),
            "start_fraction": draw(st.sampled_from([0.0, 0.25, 0.5])),
        }
    return spec(name, SPACE, **fields)


moves = st.lists(
    st.tuples(
        st.sampled_from(
            ["report"] * 8
            + ["at-budget"] * 8
            + ["train", "end", "end", "pause", "activate", "junk", "kill"]
        ),
        st.integers(0, 50),
        st.floats(0, 1.5),
        st.floats(-10, 10, allow_nan=False),
    ),
    max_size=60,
)


def _move(sim: Sim, kind: str, pick: int, fraction: float, value: float) -> None:
    trials = sim.state.trials
    if kind in ("pause", "activate", "kill"):
        sim.act(kind)
        return
    if kind == "junk":
        sim.report(len(trials) + pick, 1.0, value)
        return
    if not trials:
        return
    trial = trials[pick % len(trials)]  # ended ones too: a late input
    target = sim.target[trial.index]
    if kind == "end":
        sim.end(trial.index, ["succeeded", "failed", "deleted"][pick % 3])
    elif kind == "train":
        sim.report(trial.index, target * fraction, value, validation=False)
    elif kind == "at-budget":
        sim.report(trial.index, target, value)
    else:
        sim.report(trial.index, target * fraction, value)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(experiments(), moves)
def test_whatever_comes_the_decisions_keep_their_invariants_and_the_search_ends(
    raw: dict[str, Any], script: list[tuple[str, int, float, float]]
) -> None:
    sim = Sim.start(raw, restart=True)
    budgets: dict[int, float] = {}
    for kind, pick, fraction, value in script:
        if sim.done:
            break
        _move(sim, kind, pick, fraction, value)
        for trial in sim.state.trials:
            assert trial.budget >= budgets.get(trial.index, 0.0), "a budget never shrinks"
            budgets[trial.index] = trial.budget
    if sim.state.status is ExperimentStatus.PAUSED:
        sim.act("activate")
    if not sim.done:
        sim.run(lambda h, b: float(h["width"]) / (b + 1))
    event(f"{sim.state.spec.searcher.name} {sim.state.status.value}")
    event(f"decisions: {'> 20' if len(sim.decisions) > 20 else '<= 20'}")
    assert sim.state.status in (ExperimentStatus.COMPLETED, ExperimentStatus.KILLED)
    assert not any(t.live for t in sim.state.trials)
    assert len(sim.of("done")) == 1


# -- the median rule and Optuna's MedianPruner -----------------------------------------

#: exact binary fractions, so that both medians (numpy's interpolation, statistics'
#: mean of the middle two) are the same double
values = st.integers(0, 40).map(lambda x: x / 4)


@st.composite
def median_cases(draw: st.DrawFn) -> tuple[int, int, int, bool, list[list[float]], list[float]]:
    steps = draw(st.sampled_from([1, 2, 4, 8]))
    warmup = draw(st.integers(0, steps))
    min_trials = draw(st.integers(1, 4))
    smaller = draw(st.booleans())
    others = draw(st.lists(st.lists(values, min_size=steps, max_size=steps), max_size=6))
    mine = draw(st.lists(values, min_size=1, max_size=steps))
    return steps, warmup, min_trials, smaller, others, mine


@settings(max_examples=300, deadline=None)
@given(median_cases())
def test_median_stop_answers_as_optunas_median_pruner(
    case: tuple[int, int, int, bool, list[list[float]], list[float]],
) -> None:
    """Where both apply (the other trials completed, every trial reporting at steps 1, 2,
    ...), the median-stop rule stops exactly the trials Optuna's MedianPruner prunes."""
    steps, warmup, min_trials, smaller, others, mine = case
    searcher = SearcherSpec.model_validate(
        {
            "name": "random",
            "metric": "loss",
            "smaller_is_better": smaller,
            "budget": {"max": steps},
            "early_stopping": {"min_trials": min_trials, "start_fraction": warmup / steps},
        }
    )

    def reports(vals: list[float]) -> tuple[tuple[float, float], ...]:
        return tuple((float(step), v) for step, v in enumerate(vals, 1))

    done = [
        Trial(i, {}, float(steps), TrialStatus.COMPLETED, validations=reports(v))
        for i, v in enumerate(others)
    ]
    trial = Trial(len(others), {}, float(steps), TrialStatus.RUNNING, validations=reports(mine))
    ours = median_stop(searcher, [*done, trial], trial) is not None

    previous = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(logging.WARNING)
    try:
        direction = "minimize" if smaller else "maximize"
        pruner = MedianPruner(n_startup_trials=0, n_warmup_steps=warmup, n_min_trials=min_trials)
        study = optuna.create_study(direction=direction, pruner=pruner)
    finally:
        optuna.logging.set_verbosity(previous)
    for v in others:
        study.add_trial(
            create_trial(
                state=TrialState.COMPLETE,
                value=v[-1],
                intermediate_values=dict(enumerate(v, 1)),
            )
        )
    running = create_trial(state=TrialState.RUNNING, intermediate_values=dict(enumerate(mine, 1)))
    event(f"stopped: {ours}")
    assert ours == pruner.prune(study, running)
