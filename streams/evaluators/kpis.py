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
