"""The evaluators: one KPI family each, a pure function of a window's jobs and its end
(the contract: `api.py`; each is named in `registry.py`)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from datetime import datetime

from streams.evaluators.api import Metrics
from streams.evaluators.ledger import JobRecord


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def _p(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def jct(jobs: Sequence[JobRecord], _: datetime | None) -> Metrics:
    values = [v for j in jobs if (v := j.jct_s()) is not None]
    return {
        "jct_mean_s": _mean(values),
        "jct_p50_s": _p(values, 0.5),
        "jct_p95_s": _p(values, 0.95),
        "jobs_completed": float(sum(1 for j in jobs if j.done and not j.failed)),
    }


def queueing(jobs: Sequence[JobRecord], _: datetime | None) -> Metrics:
    values = [v for j in jobs if (v := j.queueing_s()) is not None]
    return {"queueing_mean_s": _mean(values), "queueing_p95_s": _p(values, 0.95)}


def gpu_hours(jobs: Sequence[JobRecord], until: datetime | None) -> Metrics:
    return {"gpu_hours": sum(j.gpu_seconds(until) for j in jobs) / 3600.0}


def throughput(jobs: Sequence[JobRecord], _: datetime | None) -> Metrics:
    values = [v for j in jobs for v in j.throughput_per_gpu()]
    return {"throughput_per_gpu": _mean(values)}


def oom(jobs: Sequence[JobRecord], _: datetime | None) -> Metrics:
    total = sum(len(j.ooms) for j in jobs)
    distinct = sum(len(set(j.ooms)) for j in jobs)
    return {"ooms": float(total), "oom_recurrences": float(total - distinct)}


def churn(jobs: Sequence[JobRecord], until: datetime | None) -> Metrics:
    hours = sum(j.run_s(until) for j in jobs) / 3600.0
    plans = sum(len(j.applied) for j in jobs)
    return {"plans_per_job_hour": plans / hours if hours > 0 else 0.0}


def failures(jobs: Sequence[JobRecord], _: datetime | None) -> Metrics:
    finished = [j for j in jobs if j.done]
    failed = sum(1 for j in finished if j.failed)
    return {
        "failed_jobs": float(failed),
        "failed_rate": failed / len(finished) if finished else 0.0,
    }


# -- experiments ----------------------------------------------------------------------------


def trials_of(jobs: Sequence[JobRecord]) -> list[JobRecord]:
    """The jobs that are trials of an experiment (their name and label say so)."""
    return [j for j in jobs if j.experiment is not None]


def experiment_start(jobs: Sequence[JobRecord]) -> datetime | None:
    """When the experiment began: its first trial's submission."""
    return min((j.submitted_at for j in trials_of(jobs) if j.submitted_at), default=None)


def progress(jobs: Sequence[JobRecord]) -> list[tuple[float, float]]:
    """The experiment's best value so far after each validation report that improved it:
    (seconds since the experiment began, best value), in time order. One experiment's
    trials (the objective of the first trial that knows its own)."""
    trials = trials_of(jobs)
    start = experiment_start(trials)
    objective = next((j.objective for j in trials if j.objective is not None), None)
    if start is None or objective is None:
        return []
    values = sorted(
        (r.at, r.metrics[objective.metric])
        for j in trials
        for r in j.reports
        if objective.metric in r.metrics
    )
    out: list[tuple[float, float]] = []
    for at, value in values:
        if not out or objective.better(value, out[-1][1]):
            out.append(((at - start).total_seconds(), value))
    return out


def time_to_target(jobs: Sequence[JobRecord], target: float) -> float | None:
    """Seconds from the experiment's start to the first validation report at the target
    or better; None if no trial reached it."""
    trials = trials_of(jobs)
    objective = next((j.objective for j in trials if j.objective is not None), None)
    if objective is None:
        return None
    for at_s, value in progress(trials):
        if value == target or objective.better(value, target):
            return at_s
    return None


def best_by(jobs: Sequence[JobRecord], deadline_s: float) -> float | None:
    """The best validation value reported within ``deadline_s`` of the experiment's start
    (None: nothing reported by then)."""
    reached = [value for at_s, value in progress(jobs) if at_s <= deadline_s]
    return reached[-1] if reached else None


def experiments(jobs: Sequence[JobRecord], until: datetime | None) -> Metrics:
    """An experiment's trials against the other jobs of the env: the best validation value
    of its metric and when it was first reached, the trials' GPU-hours, and the other
    jobs' completion times (what sharing the cluster with the trials cost them)."""
    trials = trials_of(jobs)
    others = [j for j in jobs if j.experiment is None]
    other_jct = [v for j in others if (v := j.jct_s()) is not None and not j.failed]
    reached = progress(trials)
    out: Metrics = {
        "trials": float(len(trials)),
        "trial_gpu_hours": sum(j.gpu_seconds(until) for j in trials) / 3600.0,
        "other_jct_mean_s": _mean(other_jct),
        "other_jobs_completed": float(len(other_jct)),
    }
    if reached:
        out["best_metric"] = reached[-1][1]
        out["time_to_best_s"] = reached[-1][0]
    return out
