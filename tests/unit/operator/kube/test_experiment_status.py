"""An Experiment's status folded from the bus (handlers/operator/kube/experiment_status.py):
phases by the doors' rules, trials by their decisions, the best trial, repeats applied
once, and the same status whatever the interleaving of the three topics."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from handlers.operator.kube.experiment_status import MAX_STATUS_TRIALS, ExperimentLogs
from schemas.envelope import Event
from schemas.experiments import (
    DecisionKind,
    ExperimentAction,
    ExperimentActionKind,
    ExperimentSpec,
    ExperimentSubmitted,
    TrialDecision,
    TrialMetrics,
)
from tests.unit.experiments.documents import document

NAME = "mlp-sweep"


def submitted(smaller: bool = True) -> ExperimentSubmitted:
    spec = ExperimentSpec.model_validate(document(NAME, smaller_is_better=smaller)["spec"])
    return ExperimentSubmitted(env="prod", source="operator", experiment=NAME, spec=spec)


def decision(seq: int, kind: DecisionKind, trial: int | None = None, **kw: Any) -> TrialDecision:
    return TrialDecision(
        env="prod", source="searcher", experiment=NAME, seq=seq, decision=kind, trial=trial, **kw
    )


def metrics(trial: int, budget: float, validation: bool = True, **values: float) -> TrialMetrics:
    return TrialMetrics(
        env="prod",
        source="trial",
        experiment=NAME,
        trial=trial,
        step=int(budget),
        budget=budget,
        validation=validation,
        metrics=values,
    )


def action(kind: ExperimentActionKind, reason: str = "") -> ExperimentAction:
    return ExperimentAction(env="prod", source="user", experiment=NAME, action=kind, reason=reason)


def fold(events: list[Event]) -> dict[str, Any] | None:
    logs = ExperimentLogs()
    for event in events:
        logs.apply(event)
    return logs.status(NAME)


def test_nothing_is_shown_before_the_submission_is_read() -> None:
    assert fold([decision(0, DecisionKind.CREATE, 0, budget=4, hparams={"lr": 0.1})]) is None
    assert fold([submitted()])["phase"] == "Submitted"  # type: ignore[index]


def test_trials_their_states_counts_and_the_best_trial() -> None:
    status = fold(
        [
            submitted(),
            decision(0, DecisionKind.CREATE, 0, budget=4, rung=0, hparams={"lr": 0.1}),
            decision(1, DecisionKind.CREATE, 1, budget=4, rung=0, hparams={"lr": 0.01}),
            decision(2, DecisionKind.CREATE, 2, budget=4, rung=0, hparams={"lr": 0.001}),
            metrics(0, 4, val_loss=0.9),
            metrics(1, 2, val_loss=0.5),
            metrics(1, 4, val_loss=0.7),  # its best stays 0.5, at budget 2
            metrics(2, 4, validation=False, val_loss=0.1),  # training: not a validation
            decision(3, DecisionKind.PAUSE, 0, rung=0, reason="waits"),
            decision(4, DecisionKind.STOP, 2, reason="worse than the median"),
            decision(5, DecisionKind.RUN, 1, budget=16, rung=1, reason="promoted"),
        ]
    )
    assert status is not None
    assert status["phase"] == "Running"
    assert status["message"] is None
    assert status["decisions"] == 6
    assert status["counts"] == {
        "created": 3,
        "running": 1,
        "paused": 1,
        "stopped": 1,
        "completed": 0,
    }
    assert status["bestTrial"] == {
        "trial": 1,
        "job": "mlp-sweep-t1",
        "value": 0.5,
        "budget": 2,
        "hparams": {"lr": 0.01},
    }
    assert status["trials"] == [
        {"trial": 0, "job": "mlp-sweep-t0", "state": "paused", "hparams": {"lr": 0.1},
         "budget": 4, "rung": 0, "value": 0.9},
        {"trial": 1, "job": "mlp-sweep-t1", "state": "running", "hparams": {"lr": 0.01},
         "budget": 16, "rung": 1, "value": 0.5},
        {"trial": 2, "job": "mlp-sweep-t2", "state": "stopped", "hparams": {"lr": 0.001},
         "budget": 4, "rung": 0},
    ]  # fmt: skip
    assert status["lastDecision"] == {
        "seq": 5,
        "decision": "run",
        "trial": 1,
        "reason": "promoted",
    }


def test_larger_is_better_when_the_submission_says_so() -> None:
    events: list[Event] = [
        decision(0, DecisionKind.CREATE, 0, budget=4, hparams={}),
        decision(1, DecisionKind.CREATE, 1, budget=4, hparams={}),
        metrics(0, 4, val_loss=0.9),
        metrics(1, 4, val_loss=0.5),
    ]
    smaller = fold([submitted(True), *events])
    larger = fold([*events, submitted(False)])  # the submission read last
    assert smaller is not None and larger is not None
    assert smaller["bestTrial"]["trial"] == 1
    assert larger["bestTrial"]["trial"] == 0
    assert larger["bestTrial"]["value"] == 0.9


def test_a_tie_goes_to_the_lower_index() -> None:
    status = fold(
        [
            submitted(),
            decision(0, DecisionKind.CREATE, 0, budget=4, hparams={}),
            decision(1, DecisionKind.CREATE, 1, budget=4, hparams={}),
            metrics(1, 4, val_loss=0.5),
            metrics(0, 4, val_loss=0.5),
        ]
    )
    assert status is not None and status["bestTrial"]["trial"] == 0


def test_a_decision_published_again_is_applied_once() -> None:
    logs = ExperimentLogs()
    for event in (submitted(), decision(0, DecisionKind.CREATE, 0, budget=4, hparams={})):
        logs.apply(event)
    pause = decision(1, DecisionKind.PAUSE, 0)
    assert logs.apply(pause) == NAME
    assert logs.apply(decision(0, DecisionKind.CREATE, 0, budget=4, hparams={})) is None
    assert logs.apply(pause) is None
    status = logs.status(NAME)
    assert status is not None
    assert status["decisions"] == 2
    assert status["counts"]["paused"] == 1


def test_phases_follow_the_doors_rules() -> None:
    created = [submitted(), decision(0, DecisionKind.CREATE, 0, budget=4, hparams={})]
    paused = fold([*created, action(ExperimentActionKind.PAUSE, "the cluster is needed")])
    assert paused is not None
    assert (paused["phase"], paused["message"]) == ("Paused", "the cluster is needed")
    again = fold(
        [*created, action(ExperimentActionKind.PAUSE), action(ExperimentActionKind.ACTIVATE)]
    )
    assert again is not None and again["phase"] == "Running"
    done = fold([*created, decision(1, DecisionKind.DONE, reason="max_trials reached")])
    assert done is not None
    assert (done["phase"], done["message"]) == ("Done", "max_trials reached")
    # final: a kill after the done leaves it done, the done after a kill leaves it killed
    kept = fold([*created, decision(1, DecisionKind.DONE), action(ExperimentActionKind.KILL)])
    assert kept is not None and kept["phase"] == "Done"
    killed = fold(
        [*created, action(ExperimentActionKind.KILL, "deleted"), decision(1, DecisionKind.DONE)]
    )
    assert killed is not None
    assert (killed["phase"], killed["message"]) == ("Killed", "deleted")
    refused = fold([submitted(), decision(0, DecisionKind.DONE, reason="refused: no searcher x")])
    assert refused is not None
    assert (refused["phase"], refused["message"]) == ("Refused", "refused: no searcher x")


def test_the_status_lists_a_bounded_number_of_trials() -> None:
    events: list[Event] = [submitted()]
    events += [
        decision(i, DecisionKind.CREATE, i, budget=4, hparams={})
        for i in range(MAX_STATUS_TRIALS + 5)
    ]
    status = fold(events)
    assert status is not None
    assert len(status["trials"]) == MAX_STATUS_TRIALS
    assert status["counts"]["created"] == MAX_STATUS_TRIALS + 5


def test_other_experiments_and_events_change_nothing_shown() -> None:
    logs = ExperimentLogs()
    logs.apply(submitted())
    before = logs.status(NAME)
    other = TrialMetrics(
        env="prod", source="t", experiment="other", trial=0, step=1, budget=1,
        validation=True, metrics={"val_loss": 0.0},
    )  # fmt: skip
    assert logs.apply(other) == "other"
    assert logs.apply(metrics(0, 4, val_accuracy=0.3)) is None  # not the searcher's metric
    assert logs.status(NAME) == before


#: one experiment's events by topic, each topic in its own order
_BY_TOPIC: dict[str, list[Event]] = {
    "experiments": [submitted(), action(ExperimentActionKind.PAUSE, "p")],
    "trial.decisions": [
        decision(0, DecisionKind.CREATE, 0, budget=4, rung=0, hparams={"lr": 0.1}),
        decision(1, DecisionKind.CREATE, 1, budget=4, rung=0, hparams={"lr": 0.2}),
        decision(2, DecisionKind.PAUSE, 0, rung=0),
        decision(2, DecisionKind.PAUSE, 0, rung=0),
        decision(3, DecisionKind.RUN, 1, budget=16, rung=1),
    ],
    "trial.metrics": [
        metrics(0, 4, val_loss=0.8),
        metrics(1, 4, val_loss=0.3),
        metrics(1, 16, val_loss=0.2),
    ],
}


@given(st.permutations(list(itertools.chain.from_iterable(
    [topic] * len(events) for topic, events in _BY_TOPIC.items()
))))  # fmt: skip
def test_the_status_is_the_same_in_any_interleaving_of_the_topics(order: list[str]) -> None:
    """Each topic is read in its order; across topics the reader interleaves them any way."""
    queues = {topic: list(events) for topic, events in _BY_TOPIC.items()}
    interleaved = [queues[topic].pop(0) for topic in order]
    expected = fold([e for events in _BY_TOPIC.values() for e in events])
    assert fold(interleaved) == expected
