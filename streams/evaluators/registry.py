"""The evaluators, one KPI family each, in an explicit registry users can extend.

Each is a pure function of the jobs in the window (and the window's end, for jobs still
running) to named numbers. Lower is better for every KPI except those in HIGHER_IS_BETTER.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from streams.evaluators.ledger import JobRecord

Metrics = dict[str, float]
EvaluatorFn = Callable[[Sequence[JobRecord], datetime | None], Metrics]


@dataclass(frozen=True)
class Evaluator:
    name: str
    description: str
    fn: EvaluatorFn


EVALUATORS: dict[str, Evaluator] = {}

HIGHER_IS_BETTER = frozenset({"throughput_per_gpu", "jobs_completed"})


def evaluator(name: str, description: str) -> Callable[[EvaluatorFn], EvaluatorFn]:
    def register(fn: EvaluatorFn) -> EvaluatorFn:
        if name in EVALUATORS:
            raise ValueError(f"evaluator {name!r} is already registered")
        EVALUATORS[name] = Evaluator(name, description, fn)
        return fn

    return register


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def _p(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@evaluator("jct", "job completion time (submit -> finish) of the jobs that finished")
def jct(jobs: Sequence[JobRecord], _: datetime | None) -> Metrics:
    values = [v for j in jobs if (v := j.jct_s()) is not None]
    return {
        "jct_mean_s": _mean(values),
        "jct_p50_s": _p(values, 0.5),
        "jct_p95_s": _p(values, 0.95),
        "jobs_completed": float(sum(1 for j in jobs if j.done and not j.failed)),
    }


@evaluator("queueing", "delay from submission to start")
def queueing(jobs: Sequence[JobRecord], _: datetime | None) -> Metrics:
    values = [v for j in jobs if (v := j.queueing_s()) is not None]
    return {"queueing_mean_s": _mean(values), "queueing_p95_s": _p(values, 0.95)}


@evaluator("gpu_hours", "GPU-hours allocated to the jobs (running ones up to the window end)")
def gpu_hours(jobs: Sequence[JobRecord], until: datetime | None) -> Metrics:
    return {"gpu_hours": sum(j.gpu_seconds(until) for j in jobs) / 3600.0}


@evaluator("throughput", "samples/s per allocated GPU, averaged over runtime samples")
def throughput(jobs: Sequence[JobRecord], _: datetime | None) -> Metrics:
    values = [v for j in jobs for v in j.throughput_per_gpu()]
    return {"throughput_per_gpu": _mean(values)}


@evaluator("oom", "OOM events, and recurrences: OOMs of a node that had already OOMed")
def oom(jobs: Sequence[JobRecord], _: datetime | None) -> Metrics:
    total = sum(len(j.ooms) for j in jobs)
    distinct = sum(len(set(j.ooms)) for j in jobs)
    return {"ooms": float(total), "oom_recurrences": float(total - distinct)}


@evaluator("churn", "plans per job-hour of running time")
def churn(jobs: Sequence[JobRecord], until: datetime | None) -> Metrics:
    hours = sum(j.run_s(until) for j in jobs) / 3600.0
    plans = sum(len(j.applied) for j in jobs)
    return {"plans_per_job_hour": plans / hours if hours > 0 else 0.0}


@evaluator("failures", "jobs that failed, and their share of the finished jobs")
def failures(jobs: Sequence[JobRecord], _: datetime | None) -> Metrics:
    finished = [j for j in jobs if j.done]
    failed = sum(1 for j in finished if j.failed)
    return {
        "failed_jobs": float(failed),
        "failed_rate": failed / len(finished) if finished else 0.0,
    }


def evaluate(
    jobs: Sequence[JobRecord], until: datetime | None, names: Sequence[str] | None = None
) -> Metrics:
    chosen = names or list(EVALUATORS)
    unknown = [n for n in chosen if n not in EVALUATORS]
    if unknown:
        raise KeyError(f"unknown evaluator(s) {unknown}; known: {sorted(EVALUATORS)}")
    out: Metrics = {"jobs": float(len(jobs))}
    for name in chosen:
        out.update(EVALUATORS[name].fn(jobs, until))
    return out
