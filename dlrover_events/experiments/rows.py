"""An experiment's life as rows, pure: the status its actions and decisions lead to, what
each trial is (from what it was told and what it reported), the best trial, and the
plain-JSON rows every door prints or serves. No I/O: `store` reads, this shapes.

The status of an experiment follows two topics: a user's actions on
``<env>.experiments`` (pause, activate, kill) and the searcher's ``done`` decision on
``<env>.trial.decisions``. ``completed``, ``killed`` and ``refused`` are final: nothing
after them changes the status (a kill of a completed experiment leaves it completed; the
``done`` the searcher says after a kill leaves it killed). A ``done`` whose reason begins
with ``refused`` is the searcher refusing the experiment (an unknown searcher, a space it
cannot search): the status is ``refused``, with that reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from schemas.experiments import (
    DecisionKind,
    ExperimentAction,
    ExperimentActionKind,
    TrialDecision,
)


class ExperimentStatus(StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"
    COMPLETED = "completed"
    KILLED = "killed"
    REFUSED = "refused"


FINAL = frozenset({ExperimentStatus.COMPLETED, ExperimentStatus.KILLED, ExperimentStatus.REFUSED})
#: how the reason of a ``done`` decision that refuses an experiment begins
REFUSED_PREFIX = "refused"


def status_after(
    current: ExperimentStatus, event: ExperimentAction | TrialDecision
) -> tuple[ExperimentStatus, str] | None:
    """The status after ``event``, with its reason; None when the event changes nothing."""
    if current in FINAL:
        return None
    if isinstance(event, TrialDecision):
        if event.decision is not DecisionKind.DONE:
            return None
        refused = event.reason.lower().startswith(REFUSED_PREFIX)
        done = ExperimentStatus.REFUSED if refused else ExperimentStatus.COMPLETED
        return done, event.reason or "done"
    reason = event.reason or f"{event.action.value} asked" + (
        f" by {event.source}" if event.source else ""
    )
    match event.action:
        case ExperimentActionKind.KILL:
            return ExperimentStatus.KILLED, reason
        case ExperimentActionKind.PAUSE if current is ExperimentStatus.ACTIVE:
            return ExperimentStatus.PAUSED, reason
        case ExperimentActionKind.ACTIVATE if current is ExperimentStatus.PAUSED:
            return ExperimentStatus.ACTIVE, reason
    return None


_NONE: Mapping[int, Mapping[str, Any]] = MappingProxyType({})

#: what a trial is after each decision about it
TRIAL_STATUS: Mapping[DecisionKind, str] = {
    DecisionKind.CREATE: "running",
    DecisionKind.RUN: "running",
    DecisionKind.RESUME: "running",
    DecisionKind.PAUSE: "paused",
    DecisionKind.STOP: "stopped",
    DecisionKind.COMPLETE: "completed",
}


def plain(value: Any) -> Any:
    """A value of a row as JSON holds it (a datetime as ISO 8601)."""
    return value.isoformat() if isinstance(value, datetime) else value


def decision_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """One decision as it is shown: what the trial was told, and why."""
    return {
        "seq": row["seq"],
        "decision": row["decision"],
        "trial": row["trial"],
        "budget": row["budget"],
        "rung": row["rung"],
        "reason": row["reason"],
        "occurred_at": plain(row["occurred_at"]),
    }


@dataclass
class TrialView:
    """One trial: what it was told (its decisions) and what it reported."""

    trial: int
    status: str = "unknown"
    hparams: dict[str, Any] = field(default_factory=dict)
    #: the budget its last budgeted decision gave it, and the rung of its last decision
    budget: float | None = None
    rung: int | None = None
    #: its last report: the step and the budget it had used
    step: int | None = None
    budget_used: float | None = None
    #: the experiment's metric in its latest validation report, and the best of them
    last_value: float | None = None
    best_value: float | None = None
    validations: int = 0
    decisions: list[dict[str, Any]] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        return {
            "trial": self.trial,
            "status": self.status,
            "hparams": self.hparams,
            "budget": self.budget,
            "rung": self.rung,
            "step": self.step,
            "budget_used": self.budget_used,
            "last_value": self.last_value,
            "best_value": self.best_value,
            "validations": self.validations,
            "decisions": self.decisions,
        }


def trials_of(
    decisions: Iterable[Mapping[str, Any]],
    progress: Mapping[int, Mapping[str, Any]] = _NONE,
    validation: Mapping[int, Mapping[str, Any]] = _NONE,
) -> list[TrialView]:
    """The trials of an experiment from its decisions in ``seq`` order, the last report of
    each trial (``progress``: step, budget) and its validation summary (``validation``:
    last, best, count), by trial index; a trial that reported without any decision (a
    report read before its ``create``) is listed too, its status unknown."""
    trials: dict[int, TrialView] = {}
    for row in sorted(decisions, key=lambda r: r["seq"]):
        index = row["trial"]
        if index is None:
            continue
        view = trials.setdefault(index, TrialView(index))
        kind = DecisionKind(row["decision"])
        view.status = TRIAL_STATUS.get(kind, view.status)
        if kind is DecisionKind.CREATE:
            view.hparams = dict(row["hparams"] or {})
        if row["budget"] is not None:
            view.budget = row["budget"]
        if row["rung"] is not None:
            view.rung = row["rung"]
        view.decisions.append(decision_row(row))
    for index, last in progress.items():
        view = trials.setdefault(index, TrialView(index))
        view.step, view.budget_used = last["step"], last["budget"]
    for index, seen in validation.items():
        view = trials.setdefault(index, TrialView(index))
        view.last_value = seen["last"]
        view.best_value = seen["best"]
        view.validations = seen["count"]
    return [trials[i] for i in sorted(trials)]


def ranked(trials: Sequence[TrialView], smaller_is_better: bool) -> list[TrialView]:
    """The trials with a validation value, best first (a tie: the lower index first)."""
    scored = [t for t in trials if t.best_value is not None]
    sign = 1.0 if smaller_is_better else -1.0
    return sorted(scored, key=lambda t: (sign * (t.best_value or 0.0), t.trial))


def rungs_of(trials: Sequence[TrialView]) -> list[dict[str, Any]]:
    """Each rung a decision named: the trials told about it and the largest budget given
    there (ASHA's ladder; a searcher without rungs has none)."""
    rungs: dict[int, dict[str, Any]] = {}
    for view in trials:
        for told in view.decisions:
            if told["rung"] is None:
                continue
            rung = rungs.setdefault(
                told["rung"], {"rung": told["rung"], "budget": None, "trials": []}
            )
            if told["budget"] is not None:
                rung["budget"] = max(rung["budget"] or told["budget"], told["budget"])
            if view.trial not in rung["trials"]:
                rung["trials"].append(view.trial)
    return [rungs[r] for r in sorted(rungs)]


def searcher_of(spec: Mapping[str, Any] | None) -> tuple[str | None, str | None, bool]:
    """(searcher name, metric, smaller_is_better) of a stored spec (None: not yet stored)."""
    searcher = (spec or {}).get("searcher") or {}
    return (
        searcher.get("name"),
        searcher.get("metric"),
        bool(searcher.get("smaller_is_better", True)),
    )


def experiment_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """An experiment as `experiment list` and ``GET /v1/experiments`` show it."""
    name, metric, smaller = searcher_of(row["spec"])
    spec = row["spec"] or {}
    return {
        "name": row["name"],
        "status": row["status"],
        "status_reason": row["status_reason"],
        "searcher": name,
        "metric": metric,
        "smaller_is_better": smaller,
        "max_trials": (spec.get("searcher") or {}).get("max_trials"),
        "trials": row["trials"],
        "best_trial": row["best_trial"],
        "best_value": row["best_value"],
        "submitted_at": plain(row["submitted_at"]),
        "updated_at": plain(row["updated_at"]),
    }


def described(
    experiment: Mapping[str, Any],
    decisions: Sequence[Mapping[str, Any]],
    progress: Mapping[int, Mapping[str, Any]],
    validation: Mapping[int, Mapping[str, Any]],
) -> dict[str, Any]:
    """One experiment as `experiment describe` and ``GET /v1/experiments/{name}`` show
    it: its spec and status, every trial with what it was told and reported, the rungs,
    the trials best first, and the decisions about the experiment itself (``done``)."""
    name, metric, smaller = searcher_of(experiment["spec"])
    trials = trials_of(decisions, progress, validation)
    best = ranked(trials, smaller)
    return {
        "name": experiment["name"],
        "status": experiment["status"],
        "status_reason": experiment["status_reason"],
        "submitted_at": plain(experiment["submitted_at"]),
        "updated_at": plain(experiment["updated_at"]),
        "searcher": name,
        "metric": metric,
        "smaller_is_better": smaller,
        "spec": experiment["spec"],
        "trials": [t.row() for t in trials],
        "best_trial": (
            {"trial": best[0].trial, "value": best[0].best_value, "hparams": best[0].hparams}
            if best
            else None
        ),
        "ranking": [t.trial for t in best],
        "rungs": rungs_of(trials),
        "decisions": [decision_row(d) for d in decisions if d["trial"] is None],
    }


def metric_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """One report of a trial, as `trial metrics` and its REST twin show it."""
    return {
        "step": row["step"],
        "budget": row["budget"],
        "validation": row["validation"],
        "metrics": dict(row["metrics"]),
        "occurred_at": plain(row["occurred_at"]),
    }


__all__ = [
    "FINAL",
    "REFUSED_PREFIX",
    "TRIAL_STATUS",
    "ExperimentStatus",
    "TrialView",
    "decision_row",
    "described",
    "experiment_row",
    "metric_row",
    "ranked",
    "rungs_of",
    "searcher_of",
    "status_after",
    "trials_of",
]
