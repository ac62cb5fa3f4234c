"""An Experiment's status, pure: folded from what its searcher and its trials said on the
bus (``<env>.experiments``, ``<env>.trial.decisions``, ``<env>.trial.metrics``), by the
rules every door shows experiments by (dlrover_events.experiments.rows: the status an
action or ``done`` leads to, a trial's state after each decision, the ranking of trials),
so the resource says what `experiment describe` says. The operator folds the topics rather
than reading the recorder's tables: it holds no experiment tables of its own, and the
status then follows the bus without waiting on another service.

A decision published twice (a restarted searcher: the same ``seq``) is applied once. A
trial's value is the best validation value it reported of the searcher's metric; both
directions are kept per trial until the submission says which is better, since the three
topics are read in no fixed order across each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dlrover_events.experiments.rows import (
    TRIAL_STATUS,
    ExperimentStatus,
    TrialView,
    ranked,
    status_after,
)
from handlers.operator.kube.experiment import Phase
from schemas.envelope import Event
from schemas.experiments import (
    DecisionKind,
    ExperimentAction,
    ExperimentSubmitted,
    TrialDecision,
    TrialMetrics,
    trial_job_name,
)

#: Trials listed in status.trials (the CRD's maxItems): an object in etcd is bounded.
MAX_STATUS_TRIALS = 100
#: The trial states counted in status.counts (besides ``created``).
COUNTED = ("running", "paused", "stopped", "completed")
_PHASES = {
    ExperimentStatus.PAUSED: Phase.PAUSED,
    ExperimentStatus.COMPLETED: Phase.DONE,
    ExperimentStatus.KILLED: Phase.KILLED,
    ExperimentStatus.REFUSED: Phase.REFUSED,
}


@dataclass
class Trial:
    view: TrialView
    created: bool = False
    #: per metric: (lowest value, its budget), (highest value, its budget)
    lows: dict[str, tuple[float, float]] = field(default_factory=dict)
    highs: dict[str, tuple[float, float]] = field(default_factory=dict)

    def report(self, metrics: TrialMetrics) -> None:
        for name, value in metrics.metrics.items():
            low, high = self.lows.get(name), self.highs.get(name)
            if low is None or value < low[0]:
                self.lows[name] = (value, metrics.budget)
            if high is None or value > high[0]:
                self.highs[name] = (value, metrics.budget)

    def best(self, metric: str, smaller: bool) -> tuple[float, float] | None:
        """The best value of ``metric`` it reported, and the budget it had used then."""
        return (self.lows if smaller else self.highs).get(metric)


@dataclass
class ExperimentLog:
    """One experiment, as far as the bus has told."""

    name: str
    metric: str | None = None
    smaller_is_better: bool = True
    submitted: bool = False
    status: ExperimentStatus = ExperimentStatus.ACTIVE
    reason: str = ""
    decisions: int = 0
    next_seq: int = 0
    last: TrialDecision | None = None
    trials: dict[int, Trial] = field(default_factory=dict)

    def apply(self, event: Event) -> bool:
        """Fold one event of this experiment in; False when it changes nothing shown."""
        if isinstance(event, ExperimentSubmitted):
            if self.submitted:
                return False
            self.submitted = True
            self.metric = event.spec.searcher.metric
            self.smaller_is_better = event.spec.searcher.smaller_is_better
            return True
        if isinstance(event, ExperimentAction):
            return self._change(event)
        if isinstance(event, TrialDecision):
            return self._decide(event)
        if isinstance(event, TrialMetrics):
            if not event.validation:
                return False
            self._trial(event.trial).report(event)
            return self.metric is None or self.metric in event.metrics
        return False

    def _change(self, event: ExperimentAction | TrialDecision) -> bool:
        after = status_after(self.status, event)
        if after is None:
            return False
        self.status, self.reason = after
        return True

    def _decide(self, decision: TrialDecision) -> bool:
        if decision.seq < self.next_seq:
            return False  # published again: applied already
        self.next_seq = decision.seq + 1
        self.decisions += 1
        self.last = decision
        self._change(decision)
        if decision.trial is None:
            return True
        trial = self._trial(decision.trial)
        view = trial.view
        view.status = TRIAL_STATUS.get(decision.decision, view.status)
        if decision.decision is DecisionKind.CREATE:
            trial.created = True
            view.hparams = dict(decision.hparams)
        if decision.budget is not None:
            view.budget = decision.budget
        if decision.rung is not None:
            view.rung = decision.rung
        return True

    def _trial(self, index: int) -> Trial:
        found = self.trials.get(index)
        if found is None:
            found = self.trials[index] = Trial(TrialView(index))
        return found

    def phase(self) -> Phase:
        if self.status is ExperimentStatus.ACTIVE:
            return Phase.RUNNING if self.decisions else Phase.SUBMITTED
        return _PHASES[self.status]

    def _views(self) -> list[TrialView]:
        """The trials as rows.TrialView, their best value of the metric filled in."""
        views = []
        for index in sorted(self.trials):
            trial = self.trials[index]
            got = trial.best(self.metric, self.smaller_is_better) if self.metric else None
            trial.view.best_value = got[0] if got is not None else None
            views.append(trial.view)
        return views

    def status_fields(self) -> dict[str, Any]:
        """status as the CRD has it (the submission's own fields aside: experiment.py
        writes those). A field this fold has nothing for is null, which a merge patch
        removes; an empty text too (the v1.20 API server takes an empty string in a merge
        patch of a custom resource's status for a null, which its schema then refuses)."""
        views = self._views()
        created = [v for v in views if self.trials[v.trial].created]
        counts = {"created": len(created)} | dict.fromkeys(COUNTED, 0)
        for view in created:
            if view.status in counts:
                counts[view.status] += 1
        best = ranked(views, self.smaller_is_better)
        out: dict[str, Any] = {
            "phase": self.phase().value,
            "message": self.reason or None,
            "decisions": self.decisions,
            "counts": counts,
            "trials": [self._row(v) for v in created[:MAX_STATUS_TRIALS]],
            "lastDecision": None,
            "bestTrial": None,
        }
        if self.last is not None:
            last: dict[str, Any] = {"seq": self.last.seq, "decision": self.last.decision.value}
            if self.last.reason:
                last["reason"] = self.last.reason
            if self.last.trial is not None:
                last["trial"] = self.last.trial
            out["lastDecision"] = last
        if best and self.metric is not None:
            top = best[0]
            got = self.trials[top.trial].best(self.metric, self.smaller_is_better)
            assert got is not None  # ranked lists only trials with a value
            out["bestTrial"] = {
                "trial": top.trial,
                "job": trial_job_name(self.name, top.trial),
                "value": got[0],
                "budget": got[1],
                "hparams": dict(top.hparams),
            }
        return out

    def _row(self, view: TrialView) -> dict[str, Any]:
        row: dict[str, Any] = {
            "trial": view.trial,
            "job": trial_job_name(self.name, view.trial),
            "state": view.status,
            "hparams": dict(view.hparams),
        }
        if view.budget is not None:
            row["budget"] = view.budget
        if view.rung is not None:
            row["rung"] = view.rung
        if view.best_value is not None:
            row["value"] = view.best_value
        return row


@dataclass
class ExperimentLogs:
    """Every experiment of an env the bus has told of, by name."""

    logs: dict[str, ExperimentLog] = field(default_factory=dict)

    def apply(self, event: Event) -> str | None:
        """Fold an event in; the experiment whose shown status it changed, else None."""
        name = getattr(event, "experiment", None)
        if not isinstance(name, str):
            return None
        log = self.logs.get(name)
        if log is None:
            log = self.logs[name] = ExperimentLog(name)
        return name if log.apply(event) else None

    def status(self, name: str) -> dict[str, Any] | None:
        """The experiment's status fields; None until its submission was read."""
        log = self.logs.get(name)
        return log.status_fields() if log is not None and log.submitted else None


__all__ = ["COUNTED", "MAX_STATUS_TRIALS", "ExperimentLog", "ExperimentLogs", "Trial"]
