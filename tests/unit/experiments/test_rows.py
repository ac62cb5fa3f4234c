"""An experiment's rows, pure: its status after actions and decisions, each trial from what
it was told and reported, the best trial, the rungs."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from dlrover_events.experiments.rows import (
    ExperimentStatus,
    described,
    ranked,
    status_after,
    trials_of,
)
from schemas.experiments import (
    DecisionKind,
    ExperimentAction,
    ExperimentActionKind,
    TrialDecision,
)

S = ExperimentStatus
A = ExperimentActionKind
WHEN = datetime(2026, 1, 1, tzinfo=UTC)


def act(kind: ExperimentActionKind, reason: str = "") -> ExperimentAction:
    return ExperimentAction(env="e", experiment="x", action=kind, reason=reason, source="cli")


def done(reason: str) -> TrialDecision:
    return TrialDecision(env="e", experiment="x", seq=9, decision=DecisionKind.DONE, reason=reason)


@pytest.mark.parametrize(
    ("current", "kind", "after"),
    [
        (S.ACTIVE, A.PAUSE, S.PAUSED),
        (S.PAUSED, A.PAUSE, None),
        (S.PAUSED, A.ACTIVATE, S.ACTIVE),
        (S.ACTIVE, A.ACTIVATE, None),
        (S.ACTIVE, A.KILL, S.KILLED),
        (S.PAUSED, A.KILL, S.KILLED),
        (S.COMPLETED, A.KILL, None),
        (S.KILLED, A.ACTIVATE, None),
        (S.REFUSED, A.PAUSE, None),
    ],
)
def test_actions(
    current: ExperimentStatus, kind: ExperimentActionKind, after: ExperimentStatus | None
) -> None:
    got = status_after(current, act(kind))
    assert (got[0] if got else None) == after


def test_an_actions_reason_is_kept_or_said() -> None:
    assert status_after(S.ACTIVE, act(A.PAUSE, "lunch")) == (S.PAUSED, "lunch")
    assert status_after(S.ACTIVE, act(A.KILL)) == (S.KILLED, "kill asked by cli")


def test_done_completes_or_refuses_and_final_stays() -> None:
    assert status_after(S.ACTIVE, done("16 trials ran")) == (S.COMPLETED, "16 trials ran")
    refused = status_after(S.PAUSED, done("refused: unknown searcher 'x'"))
    assert refused is not None and refused[0] == S.REFUSED
    assert status_after(S.KILLED, done("killed")) is None
    run = TrialDecision(
        env="e", experiment="x", seq=1, decision=DecisionKind.RUN, trial=0, budget=5
    )
    assert status_after(S.ACTIVE, run) is None


def row(seq: int, decision: str, trial: int | None, **more: Any) -> dict[str, Any]:
    return {
        "seq": seq,
        "decision": decision,
        "trial": trial,
        "hparams": more.get("hparams", {}),
        "budget": more.get("budget"),
        "rung": more.get("rung"),
        "reason": more.get("reason", ""),
        "occurred_at": WHEN,
    }


DECISIONS = [
    row(0, "create", 0, hparams={"lr": 0.1}, budget=10, rung=0),
    row(1, "create", 1, hparams={"lr": 0.2}, budget=10, rung=0),
    row(2, "create", 2, hparams={"lr": 0.3}, budget=10, rung=0),
    row(3, "pause", 1, rung=0, reason="below the top quarter"),
    row(4, "run", 0, budget=40, rung=1, reason="promoted"),
    row(5, "stop", 2, reason="median stop"),
    row(6, "complete", 0, rung=1),
    row(7, "resume", 1, budget=40, rung=1),
    row(8, "done", None, reason="no trials left"),
]


def test_a_trial_is_what_it_was_told_last() -> None:
    trials = trials_of(reversed(DECISIONS))  # any order: by seq
    assert [(t.trial, t.status) for t in trials] == [
        (0, "completed"),
        (1, "running"),
        (2, "stopped"),
    ]
    zero, one, _ = trials
    assert (zero.hparams, zero.budget, zero.rung) == ({"lr": 0.1}, 40, 1)
    assert [d["decision"] for d in one.decisions] == ["create", "pause", "resume"]
    assert one.decisions[1]["reason"] == "below the top quarter"
    assert one.decisions[1]["occurred_at"] == WHEN.isoformat()


def test_reports_without_a_decision_make_a_trial_of_unknown_status() -> None:
    trials = trials_of([], {3: {"step": 7, "budget": 7.0}}, {})
    assert [(t.trial, t.status, t.step) for t in trials] == [(3, "unknown", 7)]


def test_the_best_trial_follows_the_metrics_direction() -> None:
    validation = {
        0: {"last": 0.4, "best": 0.3, "count": 2},
        1: {"last": 0.3, "best": 0.3, "count": 1},
        2: {"last": 0.9, "best": 0.9, "count": 1},
    }
    trials = trials_of(DECISIONS, {}, validation)
    assert [t.trial for t in ranked(trials, smaller_is_better=True)] == [0, 1, 2]  # a tie: 0
    assert [t.trial for t in ranked(trials, smaller_is_better=False)] == [2, 0, 1]


def test_described_experiment() -> None:
    spec = {"searcher": {"name": "asha", "metric": "acc", "smaller_is_better": False}}
    experiment = {
        "name": "x",
        "spec": spec,
        "status": "completed",
        "status_reason": "no trials left",
        "submitted_at": WHEN,
        "updated_at": WHEN,
    }
    seen = described(
        experiment,
        DECISIONS,
        {0: {"step": 40, "budget": 40.0}},
        {0: {"last": 0.7, "best": 0.8, "count": 2}, 1: {"last": 0.6, "best": 0.6, "count": 1}},
    )
    assert (seen["searcher"], seen["metric"], seen["smaller_is_better"]) == ("asha", "acc", False)
    assert seen["best_trial"] == {"trial": 0, "value": 0.8, "hparams": {"lr": 0.1}}
    assert seen["ranking"] == [0, 1]
    assert seen["rungs"] == [
        {"rung": 0, "budget": 10, "trials": [0, 1, 2]},
        {"rung": 1, "budget": 40, "trials": [0, 1]},
    ]
    assert [d["decision"] for d in seen["decisions"]] == ["done"]
    assert seen["trials"][0]["budget_used"] == 40.0 and seen["submitted_at"] == WHEN.isoformat()


def test_an_experiment_known_only_by_its_decisions() -> None:
    """A `done` read before the submission: no spec yet, nothing to rank by."""
    experiment = {
        "name": "x",
        "spec": None,
        "status": "completed",
        "status_reason": "",
        "submitted_at": None,
        "updated_at": WHEN,
    }
    seen = described(experiment, [row(0, "done", None)], {}, {})
    assert (seen["searcher"], seen["metric"], seen["best_trial"]) == (None, None, None)
