"""The machinery every searcher shares: refusals, bad and late inputs, the experiment's
pause, activate and kill, decisions' numbers and ids, and a state that restarts from its
JSON at any point deciding exactly as one that never stopped."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from schemas.experiments import DecisionKind, ExperimentAction, TrialMetrics
from streams.searcher.core.api import TrialStatus
from streams.searcher.core.state import (
    DECISIONS,
    ExperimentState,
    ExperimentStatus,
    TrialEnded,
    begin,
    decide,
)
from tests.unit.searcher.core.driver import (
    ENV,
    EXPERIMENT,
    SOURCE,
    SPACE,
    T0,
    Sim,
    spec,
    submitted,
)


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (spec("bayes"), "spec.searcher.name: unknown searcher 'bayes' (known: asha, grid, random)"),
        (
            spec("grid", {**SPACE, "drop": {"type": "double", "minval": 0, "maxval": 1}}),
            "spec.hyperparameters.drop.count: grid search needs a count",
        ),
        (
            spec("asha", early_stopping={"name": "median"}),
            "spec.searcher.early_stopping: asha stops trials itself",
        ),
        (
            spec("random", {"eps": {"type": "log", "base": 1000, "minval": -200, "maxval": 0}}),
            "spec.hyperparameters.eps.minval: ",
        ),
    ],
)
def test_an_experiment_that_cannot_run_gets_one_done_naming_the_field(
    raw: dict[str, Any], field: str
) -> None:
    state, decisions = begin(submitted(raw), source=SOURCE)
    [done] = decisions
    assert done.decision is DecisionKind.DONE and done.trial is None and done.seq == 0
    assert done.reason.startswith(f"refused: {field}")
    assert done.event_id == uuid.uuid5(DECISIONS, f"{ENV}/{EXPERIMENT}/0")
    assert done.occurred_at == T0 and done.source == SOURCE
    assert state.status is ExperimentStatus.REFUSED and state.trials == () and state.seq == 1
    again = ExperimentState.from_json(json.loads(json.dumps(state.to_json())))
    assert again == state
    later = TrialMetrics(
        env=ENV, experiment=EXPERIMENT, trial=0, step=1, budget=1, metrics={"val_loss": 1.0}
    )
    assert decide(state, later, source=SOURCE) == (state, [])


def _inputs(sim: Sim) -> list[tuple[str, Callable[[], list[Any]]]]:
    at = T0 + timedelta(hours=1)
    metrics = {"env": ENV, "experiment": EXPERIMENT, "step": 1, "budget": 800.0, "occurred_at": at}
    return [
        ("unknown trial", lambda: sim.report(99, 800, 0.1)),
        ("another metric", lambda: sim.report(0, 800, 0.1, metric="accuracy")),
        ("a training report", lambda: sim.report(0, 800, 0.1, validation=False)),
        (
            "another experiment",
            lambda: sim.feed(
                TrialMetrics(
                    **{**metrics, "experiment": "other"}, trial=0, metrics={"val_loss": 0.1}
                )
            ),
        ),
        (
            "another env",
            lambda: sim.feed(
                TrialMetrics(**{**metrics, "env": "staging"}, trial=0, metrics={"val_loss": 0.1})
            ),
        ),
        ("activate while active", lambda: sim.act("activate")),
        ("an unknown trial's end", lambda: sim.end(99, "failed")),
        ("a submission again", lambda: sim.feed(submitted(spec("grid")))),  # type: ignore[arg-type]
    ]


def test_bad_and_late_inputs_decide_nothing() -> None:
    sim = Sim.start(spec("random", max_trials=3, max_concurrent_trials=1))
    for name, feed in _inputs(sim):
        assert feed() == [], name
    # a training report marked the created trial running, nothing else
    assert sim.state.trials[0].status is TrialStatus.RUNNING
    assert sim.state.trials[0].validations == ()
    assert sim.kinds(sim.report(0, 800, 0.2)) == [("complete", 0), ("create", 1)]
    before = sim.state
    assert sim.report(0, 800, 0.1) == []  # a completed trial's metric
    assert sim.end(0, "succeeded") == []  # its job's end
    assert sim.state == before
    assert sim.kinds(sim.act("pause")) == [("pause", 1)]
    assert sim.act("pause") == []  # a second pause
    assert sim.kinds(sim.act("kill", "wrong space")) == [("stop", 1), ("done", None)]
    assert sim.decisions[-1].reason.startswith(
        "killed: wrong space; 2 trials (1 stopped, 1 completed)"
    )
    after = sim.state
    for feed in (
        lambda: sim.act("activate"),
        lambda: sim.act("kill"),
        lambda: sim.report(1, 800, 0.0),
    ):
        assert feed() == []
    assert sim.state == after and after.status is ExperimentStatus.KILLED


def test_pause_holds_every_running_trial_and_activate_goes_on() -> None:
    sim = Sim.start(spec("random", max_trials=5, max_concurrent_trials=2))
    sim.report(0, 400)
    decisions = sim.act("pause", "maintenance")
    assert sim.kinds(decisions) == [("pause", 0), ("pause", 1)]
    assert all(d.reason == "experiment paused: maintenance" for d in decisions)
    assert sim.state.status is ExperimentStatus.PAUSED
    assert [t.held for t in sim.state.trials] == [True, True]
    # a held trial that reaches its budget meanwhile completes; nothing starts in its place
    assert sim.kinds(sim.report(1, 800)) == [("complete", 1)]
    decisions = sim.act("activate")
    assert sim.kinds(decisions) == [("resume", 0), ("create", 2)]
    assert decisions[0].budget == 800 and decisions[0].hparams == sim.hparams[0]
    assert sim.state.status is ExperimentStatus.ACTIVE
    sim.run()
    assert len(sim.of("complete")) == 5


def test_a_held_asha_trial_promoted_while_paused_resumes_to_its_next_rung() -> None:
    raw = spec(
        "asha",
        mode="aggressive",
        divisor=2,
        max_trials=4,
        max_concurrent_trials=4,
        budget={"max": 4},
    )
    sim = Sim.start(raw)
    sim.report(0, 1, 0.5)  # waits at rung 0
    assert sim.kinds(sim.act("pause")) == [("pause", 1), ("pause", 2), ("pause", 3)]
    assert sim.report(1, 1, 0.1) == []  # promoted, but it stays held: no run while paused
    held = sim.state.trials[1]
    assert held.held and held.budget == 2.0 and held.rung == 1
    assert sim.report(2, 1, 0.9) == []  # not promoted: it now waits at its rung, not held
    assert not sim.state.trials[2].held and sim.state.trials[2].status is TrialStatus.PAUSED
    decisions = sim.act("activate")
    assert sim.kinds(decisions) == [("resume", 1), ("resume", 3)]
    assert [(d.budget, d.rung) for d in decisions] == [(2.0, 1), (1.0, 0)]
    sim.run()
    assert sim.state.status is ExperimentStatus.COMPLETED


def test_kill_stops_every_live_trial_paused_ones_too() -> None:
    sim = Sim.start(spec("asha", mode="aggressive", divisor=2, max_concurrent_trials=3))
    sim.step()
    sim.step()
    live = [t.index for t in sim.state.trials if t.live]
    assert any(sim.state.trials[t].status is TrialStatus.PAUSED for t in live)
    decisions = sim.act("kill")
    assert sim.kinds(decisions) == [*(("stop", t) for t in live), ("done", None)]
    assert all(d.reason == "experiment killed" for d in decisions[:-1])
    assert sim.state.status is ExperimentStatus.KILLED
    assert not any(t.live for t in sim.state.trials)


def test_decisions_carry_their_number_id_and_the_inputs_time() -> None:
    sim = Sim.start(spec("random", max_trials=2))
    event = TrialMetrics(
        env=ENV,
        experiment=EXPERIMENT,
        trial=0,
        step=800,
        budget=800.0,
        validation=True,
        metrics={"val_loss": 0.5},
        occurred_at=T0 + timedelta(minutes=5),
    )
    state, decisions = decide(sim.state, event, source="searcher-1")
    [complete] = decisions
    assert complete.seq == 2 and state.seq == 3
    assert complete.event_id == uuid.uuid5(DECISIONS, "prod/sweep/2")
    assert complete.occurred_at == T0 + timedelta(minutes=5) and complete.source == "searcher-1"
    assert complete.budget == 800.0 and complete.key == EXPERIMENT
    # pure: the same input on the same state decides the same again
    assert decide(sim.state, event, source="searcher-1") == (state, decisions)


def test_a_trial_ended_carries_its_env() -> None:
    ended = TrialEnded(env=ENV, experiment=EXPERIMENT, trial=0, outcome="deleted", occurred_at=T0)
    assert ended.reason == "" and ended.env == ENV
    with pytest.raises(TypeError):
        TrialEnded(ENV, EXPERIMENT, 0, "failed", "", T0)  # type: ignore[misc]


def _play(sim: Sim, script: str) -> None:
    """A fixed life: steps, a pause and activate, failures (one while paused: a promotion
    waits for activate), a job that ends early."""
    for op in script:
        if sim.done:
            return
        if op == "s" and sim.running:
            sim.step()
        elif op == "p":
            sim.act("pause")
        elif op == "a":
            sim.act("activate")
        elif op == "f" and sim.running:
            sim.end(max(sim.running), "failed", "Error")
        elif op == "F":  # the last live trial fails, held or waiting at a rung too
            live = [t.index for t in sim.state.trials if t.live]
            if live:
                sim.end(live[-1], "failed", "Error")
        elif op == "e" and sim.running:
            trial = min(sim.running)
            sim.report(trial, sim.target[trial] / 2)
            sim.end(trial, "succeeded")
    sim.run()


SCRIPT = "sss" + "pa" + "ssf" + "sssss" + "e" + "ss" + "pFFa" + "f" + "s" * 20


@pytest.mark.parametrize(
    "raw",
    [
        spec("asha", mode="standard"),
        spec("asha", mode="conservative", max_concurrent_trials=2),
        spec("asha", mode="aggressive", max_concurrent_trials=0, divisor=2),
        spec("random", early_stopping={"min_trials": 2, "start_fraction": 0.0}),
        spec("grid", max_trials=10),
    ],
    ids=["asha-standard", "asha-conservative", "asha-aggressive", "random-median", "grid"],
)
def test_a_state_restarted_from_its_json_at_every_input_decides_as_one_never_stopped(
    raw: dict[str, Any],
) -> None:
    straight = Sim.start(raw)
    _play(straight, SCRIPT)
    restarted = Sim.start(raw, restart=True)
    _play(restarted, SCRIPT)
    assert straight.done and straight.state.status is ExperimentStatus.COMPLETED
    assert [d.model_dump() for d in restarted.decisions] == [
        d.model_dump() for d in straight.decisions
    ]
    assert restarted.state == straight.state


def test_the_json_does_not_depend_on_key_order() -> None:
    """Postgres jsonb keeps no key order: a state read back from keys in another order
    decides the same."""
    sim = Sim.start(spec("asha", mode="standard"))
    for _ in range(12):
        sim.step()
    raw = json.loads(json.dumps(sim.state.to_json(), sort_keys=True))
    reordered = ExperimentState.from_json(_reverse_keys(raw))
    assert reordered == sim.state
    event = ExperimentAction(env=ENV, experiment=EXPERIMENT, action="pause", occurred_at=T0)
    assert decide(reordered, event, source=SOURCE) == decide(sim.state, event, source=SOURCE)


def _reverse_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _reverse_keys(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reverse_keys(v) for v in value]
    return value
